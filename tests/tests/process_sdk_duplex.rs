//! The SDK's `serve_io` against the host's peer and turn driver, both in
//! this process over `tokio::io::duplex`: the two ends of the wire path
//! meet without a child process.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use sharedos_host::process::driver::{Peer, PeerConfig, drive_turn, handshake, host_peer_config};
use sharedos_plugin_sdk::protocol::{
    ConnectionLimits, ErrorKind, Identifier, RuntimeEvent, Timestamp, TurnId,
};
use sharedos_plugin_sdk::{
    RuntimeError, RuntimeHost, RuntimeManifest, RuntimePlugin, RuntimeTurnOutcome,
    RuntimeTurnRequest, Signal, SignalSource, ToolCall, serve_io,
};
use sharedos_tests::{Record, RecordingHost, turn_request};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// A plugin that exercises every `RuntimeHost` member and reports what
/// the SDK answered. Not the shared test plugin: what is under test is the
/// SDK's side of each member (its limits, a refused annotation, an emit
/// and a call after the abort), answers a script step turns into the end
/// of the turn instead of recording.
struct Probe {
    seen: Arc<Mutex<Vec<String>>>,
    /// The host handed to the last turn, kept past its end.
    kept: Arc<Mutex<Option<Arc<dyn RuntimeHost>>>>,
}

fn call(tool: &str) -> ToolCall {
    ToolCall {
        id: Identifier::new(format!("c-{tool}")).unwrap(),
        tool: Identifier::new(tool).unwrap(),
        arguments: Default::default(),
        trace_id: Identifier::new("tr").unwrap(),
        requested_at: Timestamp::now(),
    }
}

#[async_trait::async_trait]
impl RuntimePlugin for Probe {
    fn manifest(&self) -> RuntimeManifest {
        RuntimeManifest::new("probe", "1.0.0").unwrap()
    }
    async fn run(
        &self,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
    ) -> Result<RuntimeTurnOutcome, RuntimeError> {
        *self.kept.lock().unwrap() = Some(host.clone());
        let note = |s: String| self.seen.lock().unwrap().push(s);
        note(format!("limits:{}", host.limits().max_tool_calls));
        let ok = host.invoke_tool(call("echo"), Some(0)).await.unwrap();
        note(format!("echo:{}", ok.status().as_str()));
        let denied = host.invoke_tool(call("forbidden"), None).await.unwrap();
        note(format!("forbidden:{}", denied.status().as_str()));
        host.emit(RuntimeEvent {
            kind: Identifier::new("progress").unwrap(),
            data: json!(1),
        })
        .unwrap();
        host.annotate("k", json!({"v": 1})).unwrap();
        note(format!(
            "annotate runtime:{}",
            host.annotate("runtime", json!(1)).is_err()
        ));
        if request.message.payload["wait_abort"] == true {
            let slow = host.invoke_tool(call("slow"), None).await;
            note(format!("slow:{:?}", slow.map_err(|e| e.kind)));
            note(format!("abort seen:{}", abort.is_raised()));
            note(format!(
                "emit after abort:{:?}",
                host.emit(RuntimeEvent {
                    kind: Identifier::new("x").unwrap(),
                    data: Value::Null
                })
                .map_err(|e| e.kind)
            ));
            note(format!(
                "call after abort:{:?}",
                host.invoke_tool(call("echo"), None)
                    .await
                    .map_err(|e| e.kind)
            ));
        }
        note(format!("draining:{}", host.draining().is_raised()));
        Ok(RuntimeTurnOutcome::complete(json!("done")))
    }
}

#[tokio::test]
async fn an_sdk_plugin_and_the_host_peer_run_a_turn_over_duplex() {
    let (host_end, plugin_end) = tokio::io::duplex(64 * 1024);
    let (pr, pw) = tokio::io::split(plugin_end);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::new(Mutex::new(None));
    let plugin = tokio::spawn(serve_io(
        Probe {
            seen: seen.clone(),
            kept: kept.clone(),
        },
        pr,
        pw,
    ));
    let (hr, hw) = tokio::io::split(host_end);
    let (peer, mut inbound) = Peer::spawn(hr, hw, host_peer_config(PeerConfig::default()));
    let limits = ConnectionLimits {
        max_message_bytes: 1 << 20,
        max_inflight_tool_calls: 8,
        max_concurrent_turns: 1,
    };
    let init = handshake(
        &peer,
        &mut inbound,
        &RuntimeManifest::new("probe", "1.0.0").unwrap(),
        limits,
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert_eq!(init.protocol_version, 1);
    assert!(init.sdk.unwrap().starts_with("sharedos-rust/"));

    let host = RecordingHost::new();
    host.drain.raise();
    let turn_id = TurnId::new("t-duplex").unwrap();
    let params = json!({"turnId": "t-duplex", "request": turn_request("exec-d", json!({})), "limits": host.limits});
    let run_id = peer.request("turn/run", &params).await.unwrap();
    let out = drive_turn(
        &peer,
        run_id,
        &mut inbound,
        &turn_id,
        host.clone(),
        Signal::never(),
        std::future::pending(),
    )
    .await;
    assert_eq!(out.unwrap(), RuntimeTurnOutcome::complete(json!("done")));
    assert_eq!(
        *seen.lock().unwrap(),
        [
            "limits:64",
            "echo:succeeded",
            "forbidden:denied",
            "annotate runtime:true",
            "draining:true"
        ]
    );
    assert_eq!(host.records().len(), 4, "{:?}", host.records());
    assert!(matches!(&host.records()[3], Record::Annotate { key, .. } if key == "k"));
    assert_eq!(
        peer.violations_counted(),
        0,
        "the refused annotation never left the plugin"
    );
    // After the outcome the SDK's host is closed: emit and tool calls are
    // refused locally, annotations dropped without error.
    let late = kept.lock().unwrap().clone().unwrap();
    let event = RuntimeEvent {
        kind: Identifier::new("late").unwrap(),
        data: Value::Null,
    };
    assert_eq!(late.emit(event).unwrap_err().kind, ErrorKind::TurnNotActive);
    assert!(late.annotate("late", json!(1)).is_ok());
    assert_eq!(
        late.invoke_tool(call("echo"), None).await.unwrap_err().kind,
        ErrorKind::TurnNotActive
    );
    drop(peer);
    drop(inbound);
    assert!(
        plugin.await.unwrap().is_ok(),
        "serve_io ends cleanly on EOF"
    );
}

#[tokio::test]
async fn abort_cancels_the_sdk_call_and_closes_the_host() {
    let (host_end, plugin_end) = tokio::io::duplex(64 * 1024);
    let (pr, pw) = tokio::io::split(plugin_end);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::new(Mutex::new(None));
    let plugin = tokio::spawn(serve_io(
        Probe {
            seen: seen.clone(),
            kept: kept.clone(),
        },
        pr,
        pw,
    ));
    let (hr, hw) = tokio::io::split(host_end);
    let (peer, mut inbound) = Peer::spawn(hr, hw, host_peer_config(PeerConfig::default()));
    let limits = ConnectionLimits {
        max_message_bytes: 1 << 20,
        max_inflight_tool_calls: 8,
        max_concurrent_turns: 1,
    };
    handshake(
        &peer,
        &mut inbound,
        &RuntimeManifest::new("probe", "1.0.0").unwrap(),
        limits,
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    let host = RecordingHost::new();
    let turn_id = TurnId::new("t-abort").unwrap();
    let params = json!({"turnId": "t-abort", "request": turn_request("exec-a", json!({"wait_abort": true})), "limits": host.limits});
    let run_id = peer.request("turn/run", &params).await.unwrap();
    let abort = SignalSource::new();
    let stop = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        abort.raise();
    };
    let (out, ()) = tokio::join!(
        drive_turn(
            &peer,
            run_id,
            &mut inbound,
            &turn_id,
            host.clone(),
            abort.signal(),
            std::future::pending()
        ),
        stop
    );
    assert!(matches!(out, Err(RuntimeError::Failed(_))), "{out:?}");
    // The plugin goes on after the abort; give it a moment to record.
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(peer);
    drop(inbound);
    assert!(plugin.await.unwrap().is_ok());
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.contains(&format!("slow:{:?}", Err::<(), _>(ErrorKind::Cancelled))),
        "{seen:?}"
    );
    assert!(seen.contains(&"abort seen:true".to_owned()), "{seen:?}");
    assert!(
        seen.contains(&format!(
            "emit after abort:{:?}",
            Err::<(), _>(ErrorKind::TurnNotActive)
        )),
        "{seen:?}"
    );
    assert!(
        seen.contains(&format!(
            "call after abort:{:?}",
            Err::<(), _>(ErrorKind::TurnNotActive)
        )),
        "{seen:?}"
    );
}

#[tokio::test]
async fn serve_io_refuses_unsupported_versions_and_turns_before_initialize() {
    let (host_end, plugin_end) = tokio::io::duplex(64 * 1024);
    let (pr, pw) = tokio::io::split(plugin_end);
    let plugin = tokio::spawn(serve_io(
        Probe {
            seen: Arc::default(),
            kept: Arc::default(),
        },
        pr,
        pw,
    ));
    let (hr, mut hw) = tokio::io::split(host_end);
    let mut lines = BufReader::new(hr).lines();
    let limits =
        json!({"maxMessageBytes": 1024, "maxInflightToolCalls": 8, "maxConcurrentTurns": 1});
    for line in [
        json!({"jsonrpc":"2.0","id":1,"method":"turn/run","params":{}}),
        json!({"jsonrpc":"2.0","id":2,"method":"initialize","params":{"protocolVersions":[99],"host":{"name":"h","version":"0"},"limits":limits}}),
        json!({"jsonrpc":"2.0","id":3,"method":"nope","params":{}}),
        json!({"jsonrpc":"2.0","method":"some/newNotification","params":{}}),
        json!({"jsonrpc":"2.0","id":4,"method":"initialize","params":{"protocolVersions":[1,2],"host":{"name":"h","version":"0"},"limits":limits}}),
    ] {
        hw.write_all(format!("{line}\n").as_bytes()).await.unwrap();
    }
    let mut answers = Vec::new();
    for _ in 0..4 {
        let l = lines.next_line().await.unwrap().unwrap();
        answers.push(serde_json::from_str::<Value>(&l).unwrap());
    }
    assert_eq!(answers[0]["error"]["data"]["kind"], "not_initialized");
    assert_eq!(answers[1]["error"]["code"], -32050);
    assert_eq!(answers[1]["error"]["data"]["supported"], json!([1]));
    assert_eq!(answers[2]["error"]["code"], -32601);
    assert_eq!(answers[3]["result"]["protocolVersion"], 1);
    assert_eq!(answers[3]["result"]["manifest"]["id"], "probe");
    drop(hw);
    drop(lines);
    assert!(plugin.await.unwrap().is_ok());
}
