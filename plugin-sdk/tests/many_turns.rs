//! `serve_io` and `turns: "many"` (docs/PROTOCOL.md section 4.6), over an
//! in-memory pipe with raw protocol lines: a plugin that says
//! `many_turns` answers a second `turn/run` on the same connection once
//! the first was answered, with a fresh turn; one that does not refuses
//! it; and neither takes a second turn when the host did not offer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{Value, json};
use sharedos_plugin_sdk::{
    RuntimeError, RuntimeHost, RuntimeManifest, RuntimePlugin, RuntimeTurnOutcome,
    RuntimeTurnRequest, Signal, serve_io,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

struct Counter {
    many: bool,
    turns: AtomicU32,
}

#[async_trait::async_trait]
impl RuntimePlugin for Counter {
    fn manifest(&self) -> RuntimeManifest {
        RuntimeManifest::new("counter", "1").unwrap()
    }
    async fn run(
        &self,
        request: RuntimeTurnRequest,
        _host: Arc<dyn RuntimeHost>,
        _abort: Signal,
    ) -> Result<RuntimeTurnOutcome, RuntimeError> {
        let n = self.turns.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(RuntimeTurnOutcome::complete(
            json!({"turn": n, "execution": request.execution_id.as_str()}),
        ))
    }
    fn many_turns(&self) -> bool {
        self.many
    }
}

fn request(id: &str) -> Value {
    let agent = json!({"kind": "agent", "agentId": "a"});
    json!({
        "version": "1", "executionId": id, "agent": agent,
        "context": {"actor": agent, "owner": {"kind": "human", "userId": "u"}, "namespaceId": "n",
                    "purpose": "p", "traceId": "tr", "now": "2026-01-01T00:00:00Z",
                    "reach": {"status": "computed", "reach": []}},
        "message": {"version": "1", "id": "m", "sender": {"kind": "human", "userId": "u"},
                    "receiver": agent, "purpose": "p", "payload": {}, "traceId": "tr",
                    "createdAt": "2026-01-01T00:00:00Z"},
        "tools": []
    })
}

/// Runs the handshake (offering `turns: "many"` or not) and two
/// `turn/run`s on one connection; returns the `initialize` answer and the
/// two `turn/run` answers.
async fn two_turns(many: bool, offer: bool) -> (Value, Value, Value) {
    let (host_end, plugin_end) = tokio::io::duplex(64 * 1024);
    let (pr, pw) = tokio::io::split(plugin_end);
    let plugin = Counter {
        many,
        turns: AtomicU32::new(0),
    };
    let served = tokio::spawn(serve_io(plugin, pr, pw));
    let (hr, mut hw) = tokio::io::split(host_end);
    let mut lines = BufReader::new(hr).lines();
    let caps = if offer {
        json!({"turns": "many"})
    } else {
        json!({})
    };
    let mut send = async |v: Value| {
        let mut line = v.to_string();
        line.push('\n');
        hw.write_all(line.as_bytes()).await.unwrap();
    };
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersions": [1], "host": {"name": "t", "version": "0"},
        "limits": {"maxMessageBytes": 1048576, "maxInflightToolCalls": 8, "maxConcurrentTurns": 1},
        "capabilities": caps}}),
    )
    .await;
    let mut next = async || -> Value {
        serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap()
    };
    let init = next().await;
    let limits = json!({"maxSteps": 4, "maxToolCalls": 4, "timeoutMs": 1000});
    send(json!({"jsonrpc": "2.0", "id": 2, "method": "turn/run",
        "params": {"turnId": "t-1", "request": request("e-1"), "limits": limits}}))
    .await;
    let first = next().await;
    send(json!({"jsonrpc": "2.0", "id": 3, "method": "turn/run",
        "params": {"turnId": "t-2", "request": request("e-2"), "limits": limits}}))
    .await;
    let second = next().await;
    // Both halves of the host's end gone: the plugin reads EOF.
    drop(hw);
    drop(lines);
    served.await.unwrap().unwrap();
    (init, first, second)
}

#[tokio::test]
async fn a_plugin_with_many_turns_serves_a_second_turn_on_the_connection() {
    let (init, first, second) = two_turns(true, true).await;
    assert_eq!(init["result"]["capabilities"], json!({"turns": "many"}));
    assert_eq!(
        first["result"]["output"],
        json!({"turn": 1, "execution": "e-1"})
    );
    assert_eq!(second["id"], 3);
    assert_eq!(
        second["result"]["output"],
        json!({"turn": 2, "execution": "e-2"})
    );
}

#[tokio::test]
async fn a_plugin_without_many_turns_refuses_a_second_turn() {
    let (init, first, second) = two_turns(false, true).await;
    assert_eq!(init["result"]["capabilities"], json!({}));
    assert_eq!(first["result"]["output"]["turn"], 1);
    assert!(second["error"].is_object(), "{second}");
    assert!(second.get("result").is_none(), "{second}");
}

#[tokio::test]
async fn no_second_turn_when_the_host_did_not_offer() {
    let (init, first, second) = two_turns(true, false).await;
    // The plugin says what it can; without the host's offer it takes one.
    assert_eq!(init["result"]["capabilities"], json!({"turns": "many"}));
    assert_eq!(first["result"]["output"]["turn"], 1);
    assert!(second["error"].is_object(), "{second}");
}
