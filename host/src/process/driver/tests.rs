//! The handshake and the turn driver over `tokio::io::duplex`: a scripted
//! plugin end writes raw lines, including the hostile inputs of
//! protocol.md D that concern the handshake and the turn (the peer's own
//! suite is in `sharedos-peer`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use sharedos_plugin_sdk::{
    HostCallError, RuntimeError, RuntimeHost, Signal, SignalSource, check_annotation,
};
use sharedos_protocol::{
    ConnectionLimits, RuntimeEvent, RuntimeLimits, RuntimeManifest, Timestamp, ToolCall,
    ToolResult, TurnId,
};

use sharedos_peer::testing::{RawEnd, direct_pair};

use super::{HandshakeError, Inbox, Peer, PeerConfig, drive_turn, handshake, host_peer_config};

/// The host's configuration without the handshake rule, for tests of the
/// reader that start mid-connection.
fn config() -> PeerConfig {
    PeerConfig {
        handshake_first: false,
        ..handshake_config()
    }
}

fn handshake_config() -> PeerConfig {
    host_peer_config(PeerConfig {
        max_message_bytes: 1024,
        ..PeerConfig::default()
    })
}

// ---------------------------------------------------------------- turns

#[derive(Default)]
struct Recorder {
    log: Mutex<Vec<String>>,
    drain: Mutex<Option<SignalSource>>,
    slow_tools: bool,
}

struct TestHost(Arc<Recorder>);

#[async_trait::async_trait]
impl RuntimeHost for TestHost {
    fn limits(&self) -> RuntimeLimits {
        RuntimeLimits {
            max_steps: 8,
            max_tool_calls: 8,
            timeout_ms: 10_000,
            drain_grace_ms: None,
            drain_at_ms: None,
        }
    }
    async fn invoke_tool(
        &self,
        call: ToolCall,
        step: Option<u64>,
    ) -> Result<ToolResult, HostCallError> {
        self.0
            .log
            .lock()
            .unwrap()
            .push(format!("tool:{}:{step:?}", call.tool));
        if self.0.slow_tools {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        if call.tool.as_str() == "forbidden" {
            return Ok(ToolResult::denied(
                &call,
                "tool_unavailable",
                "not offered",
                Timestamp::now(),
            ));
        }
        if call.tool.as_str() == "closed" {
            return Err(HostCallError::closed());
        }
        Ok(ToolResult::succeeded(
            &call,
            json!({"echo": call.arguments}),
            Timestamp::now(),
        ))
    }
    fn emit(&self, event: RuntimeEvent) -> Result<(), HostCallError> {
        self.0
            .log
            .lock()
            .unwrap()
            .push(format!("emit:{}", event.kind));
        Ok(())
    }
    fn annotate(&self, key: &str, value: Value) -> Result<(), HostCallError> {
        check_annotation(key)?;
        self.0
            .log
            .lock()
            .unwrap()
            .push(format!("annotate:{key}={value}"));
        Ok(())
    }
    fn draining(&self) -> Signal {
        let mut slot = self.0.drain.lock().unwrap();
        slot.get_or_insert_with(SignalSource::new).signal()
    }
}

fn manifest() -> RuntimeManifest {
    RuntimeManifest::new("test-runtime", "1.0.0").unwrap()
}

fn limits() -> ConnectionLimits {
    ConnectionLimits {
        max_message_bytes: 1024,
        max_inflight_tool_calls: 8,
        max_concurrent_turns: 1,
    }
}

fn turn_id() -> TurnId {
    TurnId::new("t-1").unwrap()
}

fn call(id: &str, tool: &str) -> Value {
    json!({"id":id,"tool":tool,"arguments":{"n":1},"traceId":"tr","requestedAt":"2026-01-01T00:00:00Z"})
}

async fn answer_initialize(plugin: &mut RawEnd, result: Value) {
    let init = plugin.read().await;
    assert_eq!(init["method"], "initialize");
    assert_eq!(init["params"]["protocolVersions"], json!([1]));
    plugin
        .line(json!({"jsonrpc":"2.0","id":init["id"],"result":result}))
        .await;
}

fn good_init() -> Value {
    json!({"protocolVersion":1,"manifest":{"id":"test-runtime","version":"1.0.0","protocolVersion":"1"},"capabilities":{},"future":1})
}

async fn handshaken(cfg: PeerConfig) -> (Peer, Inbox, RawEnd) {
    let (peer, mut inbound, mut plugin) = direct_pair(cfg);
    let m = manifest();
    let (r, ()) = tokio::join!(
        handshake(&peer, &mut inbound, &m, limits(), Duration::from_secs(5)),
        answer_initialize(&mut plugin, good_init())
    );
    r.unwrap();
    (peer, inbound, plugin)
}

async fn handshake_error(script: impl AsyncFnOnce(&mut RawEnd)) -> HandshakeError {
    let (peer, mut inbound, mut plugin) = direct_pair(handshake_config());
    let m = manifest();
    let (r, ()) = tokio::join!(
        handshake(
            &peer,
            &mut inbound,
            &m,
            limits(),
            Duration::from_millis(300)
        ),
        script(&mut plugin)
    );
    r.unwrap_err()
}

#[tokio::test]
async fn handshake_failures_are_typed() {
    let e = handshake_error(async |p| p.write(b"Starting my plugin v1.0...\n").await).await;
    assert!(
        matches!(&e, HandshakeError::StdoutBeforeHandshake { sample, .. } if sample == "Starting my plugin v1.0...")
    );
    assert!(e.to_string().contains("log to stderr"), "{e}");
    let e = handshake_error(async |_| {}).await;
    assert!(matches!(e, HandshakeError::Timeout(_)));
    let e = handshake_error(async |p| {
        let mut init = good_init();
        init["manifest"]["id"] = json!("other-runtime");
        answer_initialize(p, init).await
    })
    .await;
    assert!(
        matches!(&e, HandshakeError::ManifestMismatch { field: "id", .. }),
        "{e}"
    );
    assert!(e.to_string().contains("other-runtime"));
    let e = handshake_error(async |p| {
        let mut init = good_init();
        init["protocolVersion"] = json!(7);
        answer_initialize(p, init).await
    })
    .await;
    assert!(matches!(
        e,
        HandshakeError::UnsupportedVersion { chosen: 7, .. }
    ));
    let e =
        handshake_error(async |p| answer_initialize(p, json!({"protocolVersion":1})).await).await;
    assert!(matches!(e, HandshakeError::InvalidResult(_)));
    let e = handshake_error(async |p| {
        p.line(json!({"jsonrpc":"2.0","method":"host/emit","params":{}}))
            .await;
    })
    .await;
    assert!(matches!(
        e,
        HandshakeError::StdoutBeforeHandshake {
            reason: "stdout_before_handshake",
            ..
        }
    ));
}

/// protocol.md 4.1: nothing before the answer to `initialize`, whatever
/// it is (an unknown-method request used to be answered -32601 and
/// tolerated).
#[tokio::test]
async fn anything_before_the_initialize_answer_breaks_the_handshake() {
    let early: [&[u8]; 5] = [
        b"{\"jsonrpc\":\"2.0\",\"id\":\"x\",\"method\":\"probe/unknown\",\"params\":{}}\n",
        b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"host/invokeTool\",\"params\":{}}\n",
        b"{\"jsonrpc\":\"2.0\",\"method\":\"probe/unknown\"}\n",
        b"{\"jsonrpc\":\"2.0\",\"id\":999,\"result\":{}}\n",
        b"\n",
    ];
    for line in early {
        let e = handshake_error(async |p| {
            p.write(line).await;
            answer_initialize(p, good_init()).await
        })
        .await;
        assert!(
            matches!(
                &e,
                HandshakeError::StdoutBeforeHandshake {
                    reason: "stdout_before_handshake",
                    ..
                }
            ),
            "{}: {e}",
            String::from_utf8_lossy(line)
        );
        assert!(e.to_string().contains("log to stderr"), "{e}");
    }
}

async fn run_turn(
    peer: &mut Peer,
    inbound: &mut Inbox,
    rec: Arc<Recorder>,
    abort: Signal,
) -> Result<sharedos_protocol::RuntimeTurnOutcome, RuntimeError> {
    let id = peer
        .request("turn/run", &json!({"turnId":"t-1"}))
        .await
        .unwrap();
    drive_turn(
        peer,
        id,
        inbound,
        &turn_id(),
        Arc::new(TestHost(rec)),
        abort,
        std::future::pending(),
    )
    .await
}

#[tokio::test]
async fn a_turn_applies_messages_in_wire_order() {
    let (mut peer, mut inbound, mut plugin) = handshaken(config()).await;
    let rec = Arc::new(Recorder::default());
    let script = async {
        let run = plugin.read().await;
        assert_eq!(run["method"], "turn/run");
        plugin.line(json!({"jsonrpc":"2.0","method":"host/emit","params":{"turnId":"t-1","event":{"type":"a","data":1}}})).await;
        plugin.line(json!({"jsonrpc":"2.0","method":"host/annotate","params":{"turnId":"t-1","key":"k","value":[1]}})).await;
        plugin.line(json!({"jsonrpc":"2.0","id":"c1","method":"host/invokeTool","params":{"turnId":"t-1","call":call("c1","echo"),"step":0}})).await;
        let r = plugin.read().await;
        assert_eq!(r["id"], "c1");
        assert_eq!(r["result"]["status"], "succeeded");
        plugin.line(json!({"jsonrpc":"2.0","id":2,"method":"host/invokeTool","params":{"turnId":"t-1","call":call("c2","forbidden")}})).await;
        let r = plugin.read().await;
        assert_eq!(r["result"]["status"], "denied", "a refusal is a result");
        plugin.line(json!({"jsonrpc":"2.0","id":3,"method":"host/invokeTool","params":{"turnId":"t-1","call":call("c3","closed")}})).await;
        assert_eq!(plugin.read().await["error"]["code"], -32052);
        // malformed call, wrong turn
        plugin.line(json!({"jsonrpc":"2.0","id":4,"method":"host/invokeTool","params":{"turnId":"t-1","call":{"id":"INPUT-7f3a","tool":{"nested":"INPUT-9c1e"}}}})).await;
        let r = plugin.read().await;
        assert_eq!(r["id"], 4);
        assert_eq!(r["error"]["code"], -32602);
        // The input is never echoed: not in the message, not in the data.
        assert!(!r["error"].to_string().contains("INPUT-"), "{r}");
        plugin.line(json!({"jsonrpc":"2.0","id":5,"method":"host/invokeTool","params":{"turnId":"t-2","call":call("c5","echo")}})).await;
        assert_eq!(plugin.read().await["error"]["code"], -32052);
        // bad notifications are dropped and counted
        plugin.line(json!({"jsonrpc":"2.0","method":"host/annotate","params":{"turnId":"t-1","key":"runtime","value":1}})).await;
        plugin.line(json!({"jsonrpc":"2.0","method":"host/emit","params":{"turnId":"t-1","event":{"type":"b","data":1,"x":1}}})).await;
        plugin.write(b"{\"jsonrpc\":\"2.0\",\"method\":\"host/annotate\",\"params\":{\"turnId\":\"t-1\",\"key\":\"big\",\"value\":1e400}}\n").await;
        // lone surrogates pass the envelope and fail the typed parse
        plugin.write(b"{\"jsonrpc\":\"2.0\",\"method\":\"host/emit\",\"params\":{\"turnId\":\"t-1\",\"event\":{\"type\":\"s\",\"data\":\"\\ud800\"}}}\n").await;
        plugin.write(b"{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"host/invokeTool\",\"params\":{\"turnId\":\"t-1\",\"call\":{\"id\":\"\\ud800\",\"tool\":\"echo\",\"arguments\":{},\"traceId\":\"tr\",\"requestedAt\":\"2026-01-01T00:00:00Z\"}}}\n").await;
        let r = plugin.read().await;
        assert_eq!(
            (r["id"].clone(), r["error"]["code"].clone()),
            (json!(6), json!(-32602))
        );
        assert!(!r["error"].to_string().contains("ud800"), "{r}");
        // the last emit is written right before the outcome, in one write
        let last = json!({"jsonrpc":"2.0","method":"host/emit","params":{"turnId":"t-1","event":{"type":"z","data":null}}});
        let outcome = json!({"jsonrpc":"2.0","id":run["id"],"result":{"type":"complete","output":{"ok":true}}});
        plugin
            .write(format!("{last}\n{outcome}\n").as_bytes())
            .await;
        plugin
    };
    let (outcome, _plugin) = tokio::join!(
        run_turn(&mut peer, &mut inbound, rec.clone(), Signal::never()),
        script
    );
    assert_eq!(
        outcome.unwrap(),
        sharedos_protocol::RuntimeTurnOutcome::complete(json!({"ok":true}))
    );
    assert_eq!(
        *rec.log.lock().unwrap(),
        [
            "emit:a",
            "annotate:k=[1]",
            "tool:echo:Some(0)",
            "tool:forbidden:None",
            "tool:closed:None",
            "emit:z"
        ]
    );
    assert_eq!(peer.violations_counted(), 7);
}

#[tokio::test]
async fn outcome_errors_map_to_runtime_errors() {
    for (result, expect) in [
        (json!({"result":{"type":"complete"}}), "invalid"),
        (
            json!({"result":{"type":"complete","output":1,"extra":1}}),
            "invalid",
        ),
        (json!({"error":{"code":-32603,"message":"boom"}}), "failed"),
    ] {
        let (mut peer, mut inbound, mut plugin) = handshaken(config()).await;
        let script = async {
            let run = plugin.read().await;
            let mut line = json!({"jsonrpc":"2.0","id":run["id"]});
            line.as_object_mut()
                .unwrap()
                .extend(result.as_object().unwrap().clone());
            plugin.line(line).await;
            plugin
        };
        let (r, _p) = tokio::join!(
            run_turn(&mut peer, &mut inbound, Arc::default(), Signal::never()),
            script
        );
        match (expect, r) {
            ("invalid", Err(RuntimeError::InvalidOutcome(_)))
            | ("failed", Err(RuntimeError::Failed(_))) => {}
            (_, other) => panic!("{expect}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn eof_mid_turn_is_a_protocol_error() {
    let (mut peer, mut inbound, mut plugin) = handshaken(config()).await;
    let script = async move {
        let _ = plugin.read().await;
        plugin.line(json!({"jsonrpc":"2.0","method":"host/emit","params":{"turnId":"t-1","event":{"type":"a","data":1}}})).await;
        drop(plugin);
    };
    let rec = Arc::new(Recorder::default());
    let (r, ()) = tokio::join!(
        run_turn(&mut peer, &mut inbound, rec.clone(), Signal::never()),
        script
    );
    assert!(
        matches!(r, Err(RuntimeError::Protocol(ref m)) if m.contains("plugin_exited")),
        "{r:?}"
    );
    assert_eq!(*rec.log.lock().unwrap(), ["emit:a"]);
}

#[tokio::test]
async fn drain_and_abort_reach_the_plugin_and_pending_calls_get_32800() {
    let (mut peer, mut inbound, mut plugin) = handshaken(config()).await;
    let rec = Arc::new(Recorder {
        slow_tools: true,
        ..Recorder::default()
    });
    let drain = SignalSource::new();
    *rec.drain.lock().unwrap() = Some(SignalSource::new());
    let abort = SignalSource::new();
    let abort_signal = abort.signal();
    let rec2 = rec.clone();
    let script = async {
        let _ = plugin.read().await;
        plugin.line(json!({"jsonrpc":"2.0","id":"slow","method":"host/invokeTool","params":{"turnId":"t-1","call":call("c1","echo")}})).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(src) = rec2.drain.lock().unwrap().as_ref() {
            src.raise();
        }
        let d = plugin.read().await;
        assert_eq!(d["method"], "turn/draining");
        assert_eq!(d["params"]["turnId"], "t-1");
        abort.raise();
        let mut seen = vec![];
        for _ in 0..2 {
            seen.push(plugin.read().await);
        }
        assert!(seen.iter().any(|m| m["method"] == "turn/abort"), "{seen:?}");
        let cancelled = seen.iter().find(|m| m["id"] == "slow").unwrap();
        assert_eq!(cancelled["error"]["code"], -32800);
        assert_eq!(cancelled["error"]["data"]["kind"], "cancelled");
    };
    let (r, ()) = tokio::join!(run_turn(&mut peer, &mut inbound, rec, abort_signal), script);
    assert!(matches!(r, Err(RuntimeError::Failed(_))), "{r:?}");
    drop(drain);
}

/// G47 on the wire: `NaN`, `Infinity`, `-Infinity` and `undefined` are not
/// JSON, so a plugin cannot annotate (or emit) them: the line is fatal
/// (`invalid_json`) and nothing of it is applied. A number JSON can write
/// but a double cannot hold (`1e400`, a bigint) is dropped and counted.
#[tokio::test]
async fn g47_non_json_values_are_unrepresentable() {
    for value in ["NaN", "Infinity", "-Infinity", "undefined"] {
        let (mut peer, mut inbound, mut plugin) = handshaken(config()).await;
        let rec = Arc::new(Recorder::default());
        let script = async {
            let run = plugin.read().await;
            let line = format!(
                "{{\"jsonrpc\":\"2.0\",\"method\":\"host/annotate\",\"params\":{{\"turnId\":\"t-1\",\"key\":\"k\",\"value\":{value}}}}}\n"
            );
            plugin.write(line.as_bytes()).await;
            let outcome =
                json!({"jsonrpc":"2.0","id":run["id"],"result":{"type":"complete","output":null}});
            plugin.line(outcome).await;
            plugin
        };
        let (outcome, _plugin) = tokio::join!(
            run_turn(&mut peer, &mut inbound, rec.clone(), Signal::never()),
            script
        );
        match outcome {
            Err(RuntimeError::Protocol(m)) => assert!(m.contains("invalid_json"), "{value}: {m}"),
            other => panic!("{value}: {other:?}"),
        }
        assert!(rec.log.lock().unwrap().is_empty(), "{value} was applied");
    }
    for value in ["1e400", "-1e400", "123456789012345678901234567890e300"] {
        let (mut peer, mut inbound, mut plugin) = handshaken(config()).await;
        let rec = Arc::new(Recorder::default());
        let script = async {
            let run = plugin.read().await;
            let line = format!(
                "{{\"jsonrpc\":\"2.0\",\"method\":\"host/annotate\",\"params\":{{\"turnId\":\"t-1\",\"key\":\"k\",\"value\":{value}}}}}\n"
            );
            plugin.write(line.as_bytes()).await;
            let outcome =
                json!({"jsonrpc":"2.0","id":run["id"],"result":{"type":"complete","output":null}});
            plugin.line(outcome).await;
            plugin
        };
        let (outcome, _plugin) = tokio::join!(
            run_turn(&mut peer, &mut inbound, rec.clone(), Signal::never()),
            script
        );
        assert!(outcome.is_ok(), "{value}: {outcome:?}");
        assert!(rec.log.lock().unwrap().is_empty(), "{value} was applied");
        assert_eq!(peer.violations_counted(), 1, "{value}");
    }
}

/// G25/G26 on the wire: a call missing `traceId`, and a step of -1, 1.5 or
/// a string, are answered -32602 and never reach the host's mediation.
#[tokio::test]
async fn g25_g26_malformed_call_and_step_are_invalid_params() {
    let (mut peer, mut inbound, mut plugin) = handshaken(config()).await;
    let rec = Arc::new(Recorder::default());
    let script = async {
        let run = plugin.read().await;
        let mut no_trace = call("c0", "echo");
        no_trace.as_object_mut().unwrap().remove("traceId");
        let mut bad = vec![json!({"turnId":"t-1","call":no_trace})];
        for step in [json!(-1), json!(1.5), json!("1"), json!(true)] {
            bad.push(json!({"turnId":"t-1","call":call("c1","echo"),"step":step}));
        }
        for (id, params) in bad.iter().enumerate() {
            plugin
                .line(json!({"jsonrpc":"2.0","id":id,"method":"host/invokeTool","params":params}))
                .await;
            let r = plugin.read().await;
            assert_eq!(
                (r["id"].clone(), r["error"]["code"].clone()),
                (json!(id), json!(-32602)),
                "{params}"
            );
        }
        // A good step goes through.
        plugin
            .line(json!({"jsonrpc":"2.0","id":99,"method":"host/invokeTool","params":{"turnId":"t-1","call":call("c2","echo"),"step":3}}))
            .await;
        assert_eq!(plugin.read().await["result"]["status"], "succeeded");
        let outcome =
            json!({"jsonrpc":"2.0","id":run["id"],"result":{"type":"complete","output":null}});
        plugin.line(outcome).await;
        plugin
    };
    let (outcome, _plugin) = tokio::join!(
        run_turn(&mut peer, &mut inbound, rec.clone(), Signal::never()),
        script
    );
    assert!(outcome.is_ok(), "{outcome:?}");
    assert_eq!(*rec.log.lock().unwrap(), ["tool:echo:Some(3)"]);
}
