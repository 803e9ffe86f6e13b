//! The egress gateway against mock upstreams on the host's loopback.

mod egress_support;

use std::sync::Arc;

use egress_support::*;
use http_body_util::BodyExt;
use serde_json::json;
use sharedos_egress::mock::{Wire, plan_script};
use sharedos_egress::{EgressEvent, GatewayLimits};
use sharedos_kernel::AuditOutcome;
use tokio::sync::Notify;

fn route(name: &str, upstream: String, secret: String) -> serde_json::Value {
    json!({"name": name, "upstream": upstream, "secret": secret, "api": "openai", "allow": ["loopback"]})
}

#[tokio::test]
async fn plain_route_adds_the_real_key_and_hides_it() {
    let dir = tempfile::tempdir().unwrap();
    let up = json_upstream(None).await;
    let policy = json!({"routes": [route("openai", format!("http://127.0.0.1:{}/v1", up.port), key_file(dir.path()))]});
    let mut s = serve(
        policy,
        vec![egress_grant("alice", "openai", "request", None)],
        "alice",
        GatewayLimits::default(),
    )
    .await;
    let (status, body) = post(s.addr, "/openai/chat/completions?x=1", "{\"model\":\"m\"}").await;
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains(REAL_KEY));
    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert_eq!(
        seen[0].authorization(),
        Some(format!("Bearer {REAL_KEY}").as_str())
    );
    assert_eq!(seen[0].body, json!({"model": "m"}));
    assert_eq!(seen[0].body_len, 13);
    // The outcome is recorded once the body has ended.
    let done = wait_for(&mut s, |e| matches!(e, EgressEvent::Request { .. })).await;
    let EgressEvent::Request {
        status,
        usage,
        request_bytes,
        ..
    } = done
    else {
        unreachable!()
    };
    assert_eq!(status, Some(200));
    // The request's head (its line, query and headers) counts with its
    // 13-byte body.
    assert!(request_bytes > 13 + 100, "{request_bytes}");
    assert_eq!(usage.map(|u| (u.input, u.output)), Some((11, 7)));
    let allowed = s.records("effect.authorized");
    assert_eq!(allowed.len(), 1);
    assert_eq!(allowed[0].outcome, AuditOutcome::Allowed);
    let completed = s.records("effect.completed");
    assert_eq!(completed[0].metadata.as_ref().unwrap()["inputTokens"], 11);
    let trail = serde_json::to_string(&s.audit.records()).unwrap();
    assert!(!trail.contains(REAL_KEY) && !trail.contains(PLACEHOLDER));
}

async fn wait_for(s: &mut Served, f: impl Fn(&EgressEvent) -> bool) -> EgressEvent {
    loop {
        let e = tokio::time::timeout(std::time::Duration::from_secs(20), s.events.recv())
            .await
            .expect("no egress event within 20 s")
            .expect("event channel closed");
        if f(&e) {
            return e;
        }
    }
}

#[tokio::test]
async fn tls_upstream_with_a_test_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (acceptor, ca) = test_ca(dir.path());
    let up = json_upstream(Some(acceptor)).await;
    let policy = json!({
        "routes": [route("m", format!("https://localhost:{}/v1", up.port), key_file(dir.path()))],
        "caFile": ca,
    });
    let s = serve(
        policy,
        vec![egress_grant("alice", "m", "request", None)],
        "alice",
        GatewayLimits::default(),
    )
    .await;
    let (status, body) = post(s.addr, "/m/chat/completions", "{}").await;
    assert_eq!(status, 200, "{body}");
    let seen = up.seen();
    assert_eq!(
        seen[0].authorization(),
        Some(format!("Bearer {REAL_KEY}").as_str())
    );

    // Without the CA the same upstream is not trusted.
    let policy = json!({"routes": [route("m", format!("https://localhost:{}/v1", up.port), key_file(dir.path()))]});
    let s = serve(
        policy,
        vec![egress_grant("alice", "m", "request", None)],
        "alice",
        GatewayLimits::default(),
    )
    .await;
    let (status, body) = post(s.addr, "/m/chat/completions", "{}").await;
    assert_eq!(status, 502);
    assert!(body.contains("upstream_tls_failed"), "{body}");
    assert_eq!(up.seen().len(), 1);
}

#[tokio::test]
async fn no_grant_and_unknown_routes_are_refused_and_audited() {
    let dir = tempfile::tempdir().unwrap();
    let up = json_upstream(None).await;
    // A second loopback listener the policy does not name.
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    other.set_nonblocking(true).unwrap();
    let other_addr = other.local_addr().unwrap();
    let policy = json!({"routes": [route("openai", format!("http://127.0.0.1:{}/v1", up.port), key_file(dir.path()))]});
    // bob's grant names another route: no grant covers `openai` for bob.
    let s = serve(
        policy,
        vec![egress_grant("bob", "other", "request", None)],
        "bob",
        GatewayLimits::default(),
    )
    .await;
    let (status, body) = post(s.addr, "/openai/chat/completions", "{}").await;
    assert_eq!(status, 403);
    assert!(body.contains("no_matching_grant"), "{body}");
    let denied = s.records("effect.authorized");
    assert_eq!(denied[0].outcome, AuditOutcome::Denied);
    assert_eq!(denied[0].reason.as_deref(), Some("no_matching_grant"));

    let (status, body) = post(s.addr, &format!("/127.0.0.1:{}/x", other_addr.port()), "{}").await;
    assert_eq!(status, 404);
    assert!(body.contains("egress_route_unknown"), "{body}");
    assert_eq!(
        s.records("effect.completed")[0].outcome,
        AuditOutcome::Failed
    );
    let (status, body) = connect(s.addr, &other_addr.to_string()).await;
    assert_eq!(status, 403, "{body}");
    assert!(up.seen().is_empty(), "the upstream saw a refused request");
    // Nothing ever connected to the listener the policy does not name.
    let e = other.accept().unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
}

async fn connect(addr: std::net::SocketAddr, target: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tcp.read(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

#[tokio::test]
async fn server_sent_events_pass_through_before_the_upstream_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let release = Arc::new(Notify::new());
    let up = sse_upstream(release.clone()).await;
    let policy = json!({"routes": [route("openai", format!("http://127.0.0.1:{}/v1", up.port), key_file(dir.path()))]});
    let mut s = serve(
        policy,
        vec![egress_grant("alice", "openai", "request", None)],
        "alice",
        GatewayLimits::default(),
    )
    .await;
    let (status, mut body) = open(
        s.addr,
        "/openai/chat/completions",
        "{\"stream\":true}".into(),
    )
    .await;
    assert_eq!(status, 200);
    // The upstream holds its second event until the first has arrived
    // here: a buffering gateway never delivers it.
    let first = tokio::time::timeout(std::time::Duration::from_secs(20), body.frame())
        .await
        .expect("the first event did not arrive while the upstream was still streaming")
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(first.data_ref().unwrap()).contains("\"he\""));
    release.notify_one();
    let rest = body.collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&rest).contains("[DONE]"));
    let done = wait_for(&mut s, |e| matches!(e, EgressEvent::Request { .. })).await;
    let EgressEvent::Request { usage, .. } = done else {
        unreachable!()
    };
    assert_eq!(usage.map(|u| (u.input, u.output)), Some((3, 2)));
}

#[tokio::test]
async fn budgets_and_body_cap_end_requests_with_a_code() {
    let dir = tempfile::tempdir().unwrap();
    let up = json_upstream(None).await;
    let policy = json!({
        "routes": [route("openai", format!("http://127.0.0.1:{}/v1", up.port), key_file(dir.path()))],
        "budget": {"requests": 2},
    });
    let limits = GatewayLimits {
        max_body_bytes: 1024,
        ..GatewayLimits::default()
    };
    let mut s = serve(
        policy,
        vec![egress_grant("alice", "openai", "request", Some(10))],
        "alice",
        limits,
    )
    .await;
    let big = "x".repeat(4096);
    let (status, body) = post(s.addr, "/openai/chat/completions", &big).await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("egress_body_too_large"));
    assert!(up.seen().is_empty());
    assert_eq!(post(s.addr, "/openai/chat/completions", "{}").await.0, 200);
    let (status, body) = post(s.addr, "/openai/chat/completions", "{}").await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("egress_budget_exceeded"));
    assert_eq!(up.seen().len(), 1);
    let events = s.drain_events();
    assert!(
        events.contains(&EgressEvent::BudgetExceeded { budget: "requests" }),
        "{events:?}"
    );
}

#[tokio::test]
async fn connections_over_the_cap_are_closed_and_the_gateway_still_serves() {
    let dir = tempfile::tempdir().unwrap();
    let up = json_upstream(None).await;
    let policy = json!({"routes": [route("openai", format!("http://127.0.0.1:{}/v1", up.port), key_file(dir.path()))]});
    let limits = GatewayLimits {
        max_connections: 8,
        ..GatewayLimits::default()
    };
    let s = serve(
        policy,
        vec![egress_grant("alice", "openai", "request", None)],
        "alice",
        limits,
    )
    .await;
    // Idle connections fill the slots; the rest are closed on accept.
    let mut held = Vec::new();
    for _ in 0..400 {
        held.push(tokio::net::TcpStream::connect(s.addr).await.unwrap());
    }
    // One more, while the slots are full: closed without an answer.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut extra = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        let _ = extra
            .write_all(b"POST /openai/x HTTP/1.1\r\nHost: a\r\ncontent-length: 0\r\n\r\n")
            .await;
        let mut buf = [0u8; 64];
        let n = extra.read(&mut buf).await.unwrap_or(0);
        assert_eq!(n, 0, "a connection over the cap was answered");
    }
    drop(held);
    // Slots come back as the idle connections close.
    let mut ok = false;
    for _ in 0..200 {
        if try_post(s.addr).await == Some(200) {
            ok = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(ok, "the gateway did not serve after a connection flood");
}

/// A request that may meet a closed connection (`None`).
async fn try_post(addr: std::net::SocketAddr) -> Option<u16> {
    use http_body_util::Full;
    let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .ok()?;
    tokio::spawn(conn);
    let req = hyper::Request::post("/openai/chat/completions")
        .header("host", "127.0.0.1")
        .body(Full::new(bytes::Bytes::from_static(b"{}")))
        .ok()?;
    Some(sender.send_request(req).await.ok()?.status().as_u16())
}

#[tokio::test]
async fn connect_reaches_an_allowed_destination_only_with_the_grant() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dest = echo.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let policy = json!({"destinations": [{"address": dest, "allow": ["loopback"]}]});
    let grants = vec![egress_grant("alice", &dest, "connect", None)];
    let mut s = serve(policy.clone(), grants, "alice", GatewayLimits::default()).await;
    let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let req = format!("CONNECT {dest} HTTP/1.1\r\nHost: {dest}\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut head = vec![0u8; 1024];
    let n = tcp.read(&mut head).await.unwrap();
    assert!(String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"));
    tcp.write_all(b"ping").await.unwrap();
    let mut pong = [0u8; 4];
    tcp.read_exact(&mut pong).await.unwrap();
    assert_eq!(&pong, b"ping");
    drop(tcp);
    let e = wait_for(&mut s, |e| matches!(e, EgressEvent::Connection { .. })).await;
    assert!(
        matches!(
            e,
            EgressEvent::Connection {
                bytes_up: 4,
                bytes_down: 4,
                code: None,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        s.records("effect.completed")[0].outcome,
        AuditOutcome::Succeeded
    );

    // The same destination for an agent whose grant is for requests only.
    let grants = vec![egress_grant("bob", &dest, "request", None)];
    let s = serve(policy, grants, "bob", GatewayLimits::default()).await;
    let (status, body) = connect(s.addr, &dest).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        s.records("effect.authorized")[0].outcome,
        AuditOutcome::Denied
    );
}

#[tokio::test]
async fn upstream_connections_are_kept_alive_per_route() {
    let dir = tempfile::tempdir().unwrap();
    let model = MockModel::start(plan_script(Wire::OpenaiChat))
        .await
        .unwrap();
    let policy = serde_json::json!({"routes": [{"name": "m", "upstream": model.base_url(),
        "secret": key_file(dir.path()), "api": "openai", "allow": ["loopback"]}]});
    let s = serve(
        policy,
        vec![egress_grant("alice", "m", "request", None)],
        "alice",
        GatewayLimits::default(),
    )
    .await;
    // Three requests, each on a fresh client connection: one upstream
    // connection carries them all, each with the real key.
    for _ in 0..3 {
        let (status, body) = post(s.addr, "/m/chat/completions", "{}").await;
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("[DONE]"), "{body}");
    }
    assert_eq!(model.seen().len(), 3);
    assert_eq!(model.connections(), 1);
    for seen in model.seen() {
        assert_eq!(
            seen.authorization(),
            Some(format!("Bearer {REAL_KEY}").as_str())
        );
    }
}

#[tokio::test]
async fn connect_bytes_count_in_the_byte_budget() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dest = echo.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let policy = json!({"destinations": [{"address": dest, "allow": ["loopback"]}],
        "budget": {"bytes": 10_000}});
    let grants = vec![egress_grant("alice", &dest, "connect", None)];
    let mut s = serve(policy, grants, "alice", GatewayLimits::default()).await;
    let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let req = format!("CONNECT {dest} HTTP/1.1\r\nHost: {dest}\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut head = vec![0u8; 1024];
    let n = tcp.read(&mut head).await.unwrap();
    assert!(String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"));
    // 4 KiB echoed (8 KiB counted) fits; the next 4 KiB does not.
    let chunk = vec![b'x'; 4096];
    tcp.write_all(&chunk).await.unwrap();
    let mut back = vec![0u8; 4096];
    tcp.read_exact(&mut back).await.unwrap();
    let _ = tcp.write_all(&chunk).await;
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tcp.read_to_end(&mut rest),
    )
    .await
    .expect("the tunnel is cut");
    assert!(rest.len() < 4096, "{} bytes came back", rest.len());
    let e = wait_for(&mut s, |e| matches!(e, EgressEvent::BudgetExceeded { .. })).await;
    assert_eq!(e, EgressEvent::BudgetExceeded { budget: "bytes" });
    let e = wait_for(&mut s, |e| matches!(e, EgressEvent::Connection { .. })).await;
    assert!(
        matches!(&e, EgressEvent::Connection { code: Some(c), .. } if c == "egress_budget_exceeded"),
        "{e:?}"
    );
}

#[tokio::test]
async fn a_refused_or_silent_upstream_ends_the_request_with_a_code() {
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on: the connection is refused.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let silent = MockModel::start(vec![Reply::Hang]).await.unwrap();
    let limits = GatewayLimits {
        upstream_timeout: std::time::Duration::from_secs(1),
        ..GatewayLimits::default()
    };
    for (upstream, code) in [
        (
            format!("http://127.0.0.1:{port}/v1"),
            "upstream_unreachable",
        ),
        (silent.base_url(), "upstream_timeout"),
    ] {
        let policy = json!({"routes": [route("m", upstream, key_file(dir.path()))]});
        let grants = vec![egress_grant("alice", "m", "request", None)];
        let mut s = serve(policy, grants, "alice", limits.clone()).await;
        let started = std::time::Instant::now();
        let (status, body) = post(s.addr, "/m/chat/completions", "{}").await;
        assert_eq!(status, 502, "{code}: {body}");
        assert!(body.contains(code), "{code}: {body}");
        // Generous: the limit is 1 s; the bound only catches a hang.
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
        let e = wait_for(&mut s, |e| matches!(e, EgressEvent::Request { .. })).await;
        assert!(
            matches!(&e, EgressEvent::Request { code: Some(c), status: None, .. } if c == code),
            "{e:?}"
        );
        let completed = s.records("effect.completed");
        assert_eq!(completed.len(), 1, "{code}");
        assert_ne!(completed[0].outcome, AuditOutcome::Succeeded, "{code}");
    }
    // The silent upstream did get the request (it may log it after the
    // gateway gave up on it, under load).
    for _ in 0..200 {
        if !silent.seen().is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(silent.seen().len(), 1);
}

#[tokio::test]
async fn a_plugin_that_hangs_up_mid_answer_is_recorded_and_its_upstream_closed() {
    let dir = tempfile::tempdir().unwrap();
    let first = "data: {\"choices\":[{\"delta\":{\"content\":\"he\"}}]}\n\n".to_owned();
    let held = Reply::Gated {
        before: vec![first],
        gate: Arc::new(Notify::new()),
        after: vec!["data: [DONE]\n\n".to_owned()],
    };
    let whole = Reply::Stream(vec!["data: [DONE]\n\n".to_owned()]);
    let up = MockModel::start(vec![held, whole]).await.unwrap();
    let policy = json!({"routes": [route("openai", up.base_url(), key_file(dir.path()))]});
    let mut s = serve(
        policy,
        vec![egress_grant("alice", "openai", "request", None)],
        "alice",
        GatewayLimits::default(),
    )
    .await;
    let (status, mut body) = open(s.addr, "/openai/chat/completions", "{}".into()).await;
    assert_eq!(status, 200);
    body.frame().await.unwrap().unwrap();
    // The plugin goes away with the answer half read.
    drop(body);
    let done = wait_for(&mut s, |e| matches!(e, EgressEvent::Request { .. })).await;
    let EgressEvent::Request { code, .. } = done else {
        unreachable!()
    };
    assert_eq!(code.as_deref(), Some("client_closed"));
    let completed = s.records("effect.completed");
    assert_eq!(completed.len(), 1);
    assert_eq!(completed[0].outcome, AuditOutcome::Failed);
    // The half-read upstream connection is not given to the next request.
    let (status, body) = post(s.addr, "/openai/chat/completions", "{}").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(up.connections(), 2);
}

#[tokio::test]
async fn a_stream_that_stalls_or_is_cut_mid_answer_ends_with_its_code() {
    let dir = tempfile::tempdir().unwrap();
    let first = "data: {\"choices\":[{\"delta\":{\"content\":\"he\"}}]}\n\n".to_owned();
    let stalled = Reply::Gated {
        before: vec![first.clone()],
        gate: Arc::new(Notify::new()),
        after: vec!["data: [DONE]\n\n".to_owned()],
    };
    let cut = Reply::Cut(vec![first]);
    let up = MockModel::start(vec![stalled, cut]).await.unwrap();
    let policy = json!({"routes": [route("openai", up.base_url(), key_file(dir.path()))]});
    let limits = GatewayLimits {
        upstream_timeout: std::time::Duration::from_secs(1),
        ..GatewayLimits::default()
    };
    let grants = vec![egress_grant("alice", "openai", "request", None)];
    let mut s = serve(policy, grants, "alice", limits).await;
    for (i, expected) in ["upstream_timeout", "upstream_stream_cut"]
        .into_iter()
        .enumerate()
    {
        let (status, mut body) = open(s.addr, "/openai/chat/completions", "{}".into()).await;
        assert_eq!(status, 200, "{expected}");
        if expected == "upstream_timeout" {
            // The first event passes; the rest never comes.
            let head = body.frame().await.unwrap().unwrap();
            assert!(String::from_utf8_lossy(head.data_ref().unwrap()).contains("\"he\""));
        }
        // The plugin sees its stream end with an error, not a clean end.
        assert!(body.collect().await.is_err(), "{expected}");
        let done = wait_for(&mut s, |e| matches!(e, EgressEvent::Request { .. })).await;
        let EgressEvent::Request { code, status, .. } = done else {
            unreachable!()
        };
        assert_eq!((code.as_deref(), status), (Some(expected), Some(200)));
        let completed = s.records("effect.completed");
        assert_eq!(completed.len(), i + 1);
        assert_eq!(completed[i].outcome, AuditOutcome::Failed);
    }
}
