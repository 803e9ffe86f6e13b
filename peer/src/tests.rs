//! The peer with the host's configuration over `tokio::io::duplex`: a
//! scripted plugin end writes raw lines, including every hostile input of
//! protocol.md D that concerns the peer (its hostile-input suite; the
//! handshake and turn driver have theirs in the host).

use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;

use crate::testing::{RawEnd, direct_pair};
use sharedos_protocol::method::{Side, to_host, to_plugin};

use crate::{HostInbound as Inbound, Peer, PeerConfig, Violation, ViolationReason};

/// The host's configuration without the handshake rule, for tests of the
/// reader that start mid-connection.
fn config() -> PeerConfig {
    PeerConfig {
        max_message_bytes: 1024,
        ..PeerConfig::default()
    }
}

/// A peer whose inbox is pulled ahead into a queue by a task: a consumer
/// that is always waiting for the next message, so a test can script the
/// plugin's side first and look at what was delivered after.
fn pair(config: PeerConfig) -> (Peer, mpsc::Receiver<Inbound>, RawEnd) {
    pair_as::<to_host::Host>(config)
}

/// [`pair`] for either side.
fn pair_as<S: Side>(config: PeerConfig) -> (Peer, mpsc::Receiver<crate::Inbound<S>>, RawEnd) {
    let (peer, mut inbox, plugin) = direct_pair::<S>(config);
    let (tx, rx) = mpsc::channel(1024);
    tokio::spawn(async move {
        while let Some(item) = inbox.recv().await {
            if tx.send(item).await.is_err() {
                return;
            }
        }
    });
    (peer, rx, plugin)
}

async fn next(inbound: &mut mpsc::Receiver<Inbound>) -> Inbound {
    tokio::time::timeout(Duration::from_secs(5), inbound.recv())
        .await
        .unwrap()
        .unwrap()
}

async fn fatal(bytes: &[u8]) -> Violation {
    let (_peer, mut inbound, mut plugin) = pair(config());
    plugin.write(bytes).await;
    match next(&mut inbound).await {
        Inbound::Closed(v) => v,
        other => panic!("expected a fatal violation, got {other:?}"),
    }
}

#[tokio::test]
async fn non_json_line_is_fatal_with_an_escaped_sample() {
    let v = fatal(b"hello \x1b[31mworld\n").await;
    assert_eq!(v.reason, ViolationReason::InvalidJson);
    assert_eq!(v.sample, "hello \\u{1b}[31mworld");
}

#[tokio::test]
async fn line_over_the_limit_is_fatal() {
    let mut long = vec![b'a'; 3000];
    long.push(b'\n');
    let v = fatal(&long).await;
    assert_eq!(v.reason, ViolationReason::FrameTooLarge);
    assert_eq!(v.sample, format!("{}…", "a".repeat(200)));
}

#[tokio::test]
async fn invalid_utf8_is_fatal() {
    let v = fatal(b"{\"jsonrpc\":\"2.0\",\"method\":\"\xff\xfe\"}\n{}\n").await;
    assert_eq!(v.reason, ViolationReason::InvalidUtf8);
    assert_eq!(v.sample, "{\"jsonrpc\":\"2.0\",\"method\":\"\\xff\\xfe\"}");
}

#[tokio::test]
async fn batch_is_fatal() {
    let v = fatal(b"[{\"jsonrpc\":\"2.0\",\"method\":\"host/emit\",\"params\":{}}]\n").await;
    assert_eq!(v.reason, ViolationReason::BatchNotSupported);
}

#[tokio::test]
async fn envelope_violations_are_fatal() {
    for bad in [
        &b"{\"jsonrpc\":\"2.0\",\"id\":1,\"id\":2,\"result\":1}\n"[..],
        b"{\"jsonrpc\":\"1.0\",\"id\":1,\"result\":1}\n",
        b"{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"host/invokeTool\"}\n",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":1,\"error\":{\"code\":1,\"message\":\"m\"}}\n",
        b"42\n",
    ] {
        assert_eq!(
            fatal(bad).await.reason,
            ViolationReason::InvalidEnvelope,
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    // BOM, two objects on a line, NaN
    for bad in [
        &b"\xef\xbb\xbf{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":1}\n"[..],
        b"{} {}\n",
        b"{\"a\":NaN}\n",
    ] {
        assert_eq!(fatal(bad).await.reason, ViolationReason::InvalidJson);
    }
}

#[tokio::test]
async fn eof_is_death() {
    let (_peer, mut inbound, plugin) = pair(config());
    drop(plugin);
    match next(&mut inbound).await {
        Inbound::Closed(v) => assert_eq!(v.reason, ViolationReason::PluginExited),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn response_to_an_id_never_sent_is_dropped_and_counted() {
    let (peer, mut inbound, mut plugin) = pair(config());
    plugin
        .line(json!({"jsonrpc":"2.0","id":999,"result":{}}))
        .await;
    plugin
        .line(json!({"jsonrpc":"2.0","id":"1","result":{}}))
        .await;
    plugin.write(b"\r\n").await; // empty line: ignored and counted
    plugin
        .line(json!({"jsonrpc":"2.0","method":"host/emit","params":{}}))
        .await;
    assert!(matches!(
        next(&mut inbound).await,
        Inbound::Notification { .. }
    ));
    assert_eq!(peer.violations_counted(), 3);
    peer.count_violation("invalid_emit").unwrap();
    let by_name: Vec<(String, u32)> = peer.violations_by_name().into_iter().collect();
    assert_eq!(
        by_name,
        [
            ("empty_line".to_owned(), 1),
            ("invalid_emit".to_owned(), 1),
            ("unknown_response_id".to_owned(), 2),
        ]
    );
}

#[tokio::test]
async fn late_and_duplicate_responses_are_dropped() {
    let (peer, mut inbound, mut plugin) = pair(config());
    let id = peer.request("initialize", &json!({})).await.unwrap();
    let _ = plugin.read().await;
    plugin
        .line(json!({"jsonrpc":"2.0","id":id,"result":1}))
        .await;
    plugin
        .line(json!({"jsonrpc":"2.0","id":id,"result":2}))
        .await;
    plugin
        .line(json!({"jsonrpc":"2.0","method":"host/emit","params":{}}))
        .await;
    assert!(matches!(next(&mut inbound).await, Inbound::Response { id: got, .. } if got == id));
    assert!(matches!(
        next(&mut inbound).await,
        Inbound::Notification { .. }
    ));
    assert_eq!(peer.violations_counted(), 1);
    let late = peer.request("initialize", &json!({})).await.unwrap();
    peer.forget(late);
    plugin
        .line(json!({"jsonrpc":"2.0","id":late,"result":1}))
        .await;
    plugin
        .line(json!({"jsonrpc":"2.0","method":"host/emit","params":{}}))
        .await;
    assert!(matches!(
        next(&mut inbound).await,
        Inbound::Notification { .. }
    ));
    assert_eq!(peer.violations_counted(), 2);
}

#[tokio::test]
async fn unknown_request_method_gets_32601_and_unknown_notification_is_dropped() {
    let (peer, mut inbound, mut plugin) = pair(config());
    plugin
        .line(json!({"jsonrpc":"2.0","id":"x","method":"turn/run","params":{}}))
        .await;
    let answer = plugin.read().await;
    assert_eq!(answer["id"], "x");
    assert_eq!(answer["error"]["code"], -32601);
    assert_eq!(answer["error"]["data"]["kind"], "method_not_found");
    plugin
        .line(json!({"jsonrpc":"2.0","method":"a\u{0}b","params":{}}))
        .await;
    plugin
        .line(json!({"jsonrpc":"2.0","method":"host\\/emit"}))
        .await;
    plugin
        .write(b"{\"jsonrpc\":\"2.0\",\"method\":\"host\\/emit\"}\n")
        .await;
    match next(&mut inbound).await {
        Inbound::Notification { method, .. } => {
            assert_eq!(method, to_host::Notification::Emit)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(peer.violations_counted(), 3);
}

#[tokio::test]
async fn duplicate_inflight_request_id_is_fatal() {
    let (_peer, mut inbound, mut plugin) = pair(config());
    let req = json!({"jsonrpc":"2.0","id":7,"method":"host/invokeTool","params":{}});
    plugin.line(req.clone()).await;
    plugin.line(req).await;
    let first = next(&mut inbound).await;
    assert!(matches!(first, Inbound::Request { .. }));
    match next(&mut inbound).await {
        Inbound::Closed(v) => assert_eq!(v.reason, ViolationReason::DuplicateInflightId),
        other => panic!("{other:?}"),
    }
    drop(first);
}

/// Pulled directly (no task between the pipe and the consumer), the inbox
/// answers what it refuses itself, in wire order, before it hands out the
/// next message; and it reads nothing the consumer did not ask for.
#[tokio::test]
async fn the_inbox_answers_refusals_in_order_when_pulled() {
    let (peer, mut inbox, mut plugin) = direct_pair::<to_host::Host>(config());
    plugin
        .line(json!({"jsonrpc":"2.0","id":"x","method":"turn/run","params":{}}))
        .await;
    plugin
        .line(json!({"jsonrpc":"2.0","method":"host/emit","params":{"n":1}}))
        .await;
    plugin
        .line(json!({"jsonrpc":"2.0","id":5,"method":"host/invokeTool","params":{}}))
        .await;
    // Nothing is read until the consumer asks.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(peer.violations_counted(), 0);
    let first = tokio::time::timeout(Duration::from_secs(5), inbox.recv())
        .await
        .unwrap();
    match first {
        Some(Inbound::Notification { method, params }) => {
            assert_eq!(method, to_host::Notification::Emit);
            assert_eq!(params.unwrap().get(), r#"{"n":1}"#);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(peer.violations_counted(), 1);
    let answer = plugin.read().await;
    assert_eq!(answer["id"], "x");
    assert_eq!(answer["error"]["code"], -32601);
    match tokio::time::timeout(Duration::from_secs(5), inbox.recv())
        .await
        .unwrap()
    {
        Some(Inbound::Request { method, reply, .. }) => {
            assert_eq!(method, to_host::Request::InvokeTool);
            reply.result(&json!(2)).await.unwrap();
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(plugin.read().await["id"], 5);
    drop(plugin);
    assert!(matches!(
        inbox.recv().await,
        Some(Inbound::Closed(v)) if v.reason == ViolationReason::PluginExited
    ));
    assert!(inbox.recv().await.is_none(), "nothing after Closed");
}

#[tokio::test]
async fn requests_over_the_inflight_cap_get_32055_without_being_taken() {
    let (_peer, mut inbound, mut plugin) = pair(PeerConfig {
        max_inflight_requests: 2,
        ..config()
    });
    for id in 1..=3 {
        plugin
            .line(json!({"jsonrpc":"2.0","id":id,"method":"host/invokeTool","params":{}}))
            .await;
    }
    let answer = plugin.read().await;
    assert_eq!(answer["id"], 3);
    assert_eq!(answer["error"]["code"], -32055);
    assert_eq!(answer["error"]["data"]["kind"], "overloaded");
    let a = next(&mut inbound).await;
    let b = next(&mut inbound).await;
    // Answering one frees a slot.
    if let Inbound::Request { reply, .. } = a {
        reply.result(&json!(1)).await.unwrap();
    }
    assert_eq!(plugin.read().await["id"], 1);
    plugin
        .line(json!({"jsonrpc":"2.0","id":4,"method":"host/invokeTool","params":{}}))
        .await;
    assert!(matches!(next(&mut inbound).await, Inbound::Request { .. }));
    drop(b);
}

#[tokio::test]
async fn notification_flood_is_fatal_rate_limit_exceeded() {
    let (_peer, mut inbound, mut plugin) = pair(PeerConfig {
        notification_rate: (10, 10),
        ..config()
    });
    let writer = tokio::spawn(async move {
        for _ in 0..50 {
            plugin
                .line(json!({"jsonrpc":"2.0","method":"host/emit","params":{}}))
                .await;
        }
        plugin
    });
    let mut seen = 0;
    loop {
        match next(&mut inbound).await {
            Inbound::Notification { .. } => seen += 1,
            Inbound::Closed(v) => {
                assert_eq!(v.reason, ViolationReason::RateLimitExceeded);
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(seen, 10);
    writer.abort();
}

#[tokio::test]
async fn dropped_messages_over_the_budget_are_fatal() {
    let (_peer, mut inbound, mut plugin) = pair(PeerConfig {
        violation_budget: 3,
        ..config()
    });
    for _ in 0..4 {
        plugin.line(json!({"jsonrpc":"2.0","method":"nope"})).await;
    }
    match next(&mut inbound).await {
        Inbound::Closed(v) => assert_eq!(v.reason, ViolationReason::ViolationBudgetExceeded),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_plugin_that_never_reads_stdin_is_a_write_stall() {
    let (host, _plugin) = tokio::io::duplex(256);
    let (hr, hw) = tokio::io::split(host);
    let (peer, _inbound): (_, crate::HostInbox) = Peer::spawn(
        hr,
        hw,
        PeerConfig {
            write_stall_timeout: Duration::from_millis(100),
            ..config()
        },
    );
    let big = "x".repeat(900);
    for _ in 0..4 {
        if peer.notify("turn/draining", &big).await.is_err() {
            break;
        }
    }
    let v = tokio::time::timeout(Duration::from_secs(5), peer.dead())
        .await
        .unwrap();
    assert_eq!(v.reason, ViolationReason::WriteStall);
}

#[tokio::test]
async fn outgoing_lines_over_the_limit_are_refused() {
    let (peer, _inbound, _plugin) = pair(config());
    let v = peer
        .notify("turn/draining", &"x".repeat(2000))
        .await
        .unwrap_err();
    assert_eq!(v.reason, ViolationReason::FrameTooLarge);
}

/// Requests take from the same per-turn budgets as notifications: refused
/// ones (over the in-flight cap, unknown methods) included.
#[tokio::test]
async fn requests_count_against_the_message_budgets() {
    for (budget, expect) in [
        (
            PeerConfig {
                notification_bytes_budget: 4096,
                violation_budget: 10_000,
                max_inflight_requests: 1,
                ..config()
            },
            "bytes",
        ),
        (
            PeerConfig {
                notification_budget: 20,
                violation_budget: 10_000,
                max_inflight_requests: 1,
                ..config()
            },
            "more than 20",
        ),
    ] {
        let (_peer, mut inbound, mut plugin) = pair(budget);
        let pad = "p".repeat(200);
        let writer = tokio::spawn(async move {
            for id in 0..200 {
                let method = if id % 2 == 0 {
                    "host/invokeTool"
                } else {
                    "probe/unknown"
                };
                plugin
                    .line(json!({"jsonrpc":"2.0","id":id,"method":method,"params":{"pad":pad}}))
                    .await;
            }
            // Keep reading the refusals so the host never stalls on us.
            plugin.drain().await;
        });
        let mut taken = Vec::new();
        let v = loop {
            match next(&mut inbound).await {
                // Never answered: the rest are refused as overloaded.
                Inbound::Request { reply, .. } => taken.push(reply),
                Inbound::Closed(v) => break v,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(v.reason, ViolationReason::RateLimitExceeded, "{v}");
        assert!(v.detail.contains(expect), "{v}");
        assert_eq!(taken.len(), 1);
        writer.abort();
    }
}

/// `host/invokeTool` without an id cannot be answered: it is counted (and
/// logged), never served, never silently dropped.
#[tokio::test]
async fn a_request_sent_as_a_notification_is_counted() {
    let (_peer, mut inbound, mut plugin) = pair(PeerConfig {
        violation_budget: 2,
        ..config()
    });
    for _ in 0..3 {
        plugin
            .line(json!({"jsonrpc":"2.0","method":"host/invokeTool","params":{}}))
            .await;
    }
    match next(&mut inbound).await {
        Inbound::Closed(v) => {
            assert_eq!(v.reason, ViolationReason::ViolationBudgetExceeded);
            assert!(v.detail.contains("request_without_id"), "{v}");
        }
        other => panic!("a request without an id reached the consumer: {other:?}"),
    }
}

/// An answer to [`Peer::call`] goes to its caller, never through the
/// inbox; a second answer to the same id is an unknown id; a call still
/// waiting when the connection dies is answered `cancelled`.
#[tokio::test]
async fn call_answers_go_to_the_caller_and_a_dead_peer_cancels_them() {
    use sharedos_protocol::method::InvokeTool;
    let (peer, mut inbox, mut plugin) = direct_pair::<to_plugin::Plugin>(config());
    let params = serde_json::from_value(json!({
        "turnId": "t", "call": {"id": "c1", "tool": "echo", "arguments": {},
        "traceId": "tr", "requestedAt": "2026-01-01T00:00:00Z"}
    }))
    .unwrap();
    let call = peer.call::<InvokeTool>(&params);
    let answer = async {
        let sent = plugin.read().await;
        assert_eq!(sent["method"], "host/invokeTool");
        let reply = json!({"jsonrpc":"2.0","id":sent["id"],"result":{"ok":1}});
        plugin.line(reply.clone()).await;
        plugin.line(reply).await;
        plugin.write(b"not json\n").await;
    };
    // The reader routes answers to callers only while it is pulled.
    let (got, closed, ()) = tokio::join!(call, inbox.recv(), answer);
    assert_eq!(got.unwrap().unwrap().get(), r#"{"ok":1}"#);
    assert!(
        matches!(closed, Some(crate::Inbound::Closed(v)) if v.reason == ViolationReason::InvalidJson)
    );
    assert_eq!(peer.violations_counted(), 1);
    let late = tokio::time::timeout(Duration::from_secs(5), peer.call::<InvokeTool>(&params))
        .await
        .expect("a call on a dead peer does not wait for an answer");
    assert!(late.is_err(), "a call on a dead peer is refused: {late:?}");
}

/// The SDK's `emit` is synchronous: a burst of emits the host accepts
/// (its default burst is 10,000 notifications) is queued whole by the
/// plugin's end, not refused because the writer had no turn to run yet,
/// and goes out in order.
#[tokio::test]
async fn a_plugin_queues_a_burst_of_notifications_the_host_accepts() {
    let (peer, _inbox, mut host) = direct_pair::<to_plugin::Plugin>(PeerConfig::plugin());
    let burst = PeerConfig::default().notification_rate.1;
    for i in 0..burst {
        // No await in between: the writer cannot drain meanwhile.
        peer.notify_now("host/emit", &json!({"i": i}))
            .unwrap_or_else(|v| panic!("emit {i} of the burst was refused: {v}"));
    }
    for i in 0..burst {
        assert_eq!(host.read().await["params"]["i"], json!(i));
    }
}

/// A refused request (unknown method, over the in-flight cap) does not
/// keep its id: the same id is taken again, not fatal as reused. A tool
/// call in the SDKs' member order arrives with its params parsed, the
/// same value as parsing the text sent.
#[tokio::test]
async fn refused_ids_are_free_and_calls_arrive_parsed() {
    use crate::RequestParams;
    let (_peer, mut inbound, mut plugin) = pair(PeerConfig {
        max_inflight_requests: 1,
        ..config()
    });
    let params = json!({"turnId":"t-1","call":{"id":"c-1","tool":"echo","arguments":{"q":1},
        "traceId":"tr","requestedAt":"2026-01-01T00:00:00Z"}});
    let call =
        |id: u64| json!({"jsonrpc":"2.0","id":id,"method":"host/invokeTool","params":params});
    plugin
        .line(json!({"jsonrpc":"2.0","id":9,"method":"nope","params":{}}))
        .await;
    assert_eq!(plugin.read().await["error"]["code"], -32601);
    plugin.line(call(1)).await;
    plugin.line(call(9)).await;
    assert_eq!(plugin.read().await["error"]["code"], -32055);
    match next(&mut inbound).await {
        Inbound::Request { params, reply, .. } => {
            let Some(RequestParams::InvokeTool(p)) = params else {
                panic!("{params:?}");
            };
            assert_eq!(*p, serde_json::from_value(params_of(&call(1))).unwrap());
            reply.result(&json!(1)).await.unwrap();
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(plugin.read().await["id"], 1);
    plugin.line(call(9)).await;
    match next(&mut inbound).await {
        Inbound::Request { reply, .. } => reply.result(&json!(9)).await.unwrap(),
        other => panic!("{other:?}"),
    }
    assert_eq!(plugin.read().await["id"], 9);
}

fn params_of(line: &serde_json::Value) -> serde_json::Value {
    line["params"].clone()
}

/// Answers sent while the plugin reads nothing fill the pipe, then the
/// write queue: the later ones wait for a slot instead of being queued at
/// once, and every answer still arrives whole, in the order it was sent.
#[tokio::test]
async fn answers_beyond_a_full_write_queue_wait_and_keep_their_order() {
    const CALLS: u64 = 24;
    let (_peer, mut inbound, mut plugin) = pair(PeerConfig {
        write_queue: 1,
        max_inflight_requests: 32,
        ..config()
    });
    for id in 0..CALLS {
        plugin
            .line(json!({"jsonrpc":"2.0","id":id,"method":"host/invokeTool","params":{}}))
            .await;
    }
    let mut replies = Vec::new();
    for _ in 0..CALLS {
        match next(&mut inbound).await {
            Inbound::Request { reply, .. } => replies.push(reply),
            other => panic!("{other:?}"),
        }
    }
    // About 900 bytes each: 24 of them are five times the pipe's 4 KiB.
    let filler = "x".repeat(880);
    let answering = tokio::spawn(async move {
        for (n, reply) in replies.into_iter().enumerate() {
            reply.result(&json!([n, filler])).await.unwrap();
        }
    });
    for id in 0..CALLS {
        let line = plugin.read().await;
        assert_eq!(line["id"], id);
        assert_eq!(line["result"][0], id);
        assert_eq!(line["result"][1].as_str().map(str::len), Some(880));
    }
    answering.await.unwrap();
}

/// Tool calls one at a time, as a plugin makes them, answered by a
/// scripted host. A profiler runs 20,000 (`SHAREDOS_PROFILE_ROUNDS=20000
/// cargo test --release -p sharedos-peer calls_one_at_a_time`), the peer's
/// own work per call being the difference between two runs; the suite
/// runs a few, which check every answer reaches its call.
#[tokio::test(flavor = "current_thread")]
async fn calls_one_at_a_time() {
    let (peer, _inbound, mut host) = pair_as::<to_plugin::Plugin>(PeerConfig::default());
    let params = json!({
        "turnId": "t", "call": {"id": "c1", "tool": "echo", "arguments": {"text": "hello"},
        "traceId": "tr", "requestedAt": "2026-01-01T00:00:00Z"}
    });
    let rounds: u64 = std::env::var("SHAREDOS_PROFILE_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100);
    for _ in 0..rounds {
        let answer = async {
            let sent = host.read().await;
            let reply = json!({"jsonrpc": "2.0", "id": sent["id"], "result": {"ok": 1}});
            host.line(reply).await;
        };
        let (got, ()) = tokio::join!(peer.call_written("host/invokeTool", &params), answer);
        assert_eq!(got.unwrap().unwrap().get(), r#"{"ok":1}"#);
    }
}
