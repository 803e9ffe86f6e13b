//! What a model route exposes and what it charges, seen from the plugin's
//! side of the real gateway against a reflecting upstream on the host's
//! loopback: a raw HTTP/1.1 server that records every byte it receives
//! and answers with the whole request it got (its key header included),
//! in seven-byte chunks so the key is split across chunks, and the key in
//! an answer header besides.

mod egress_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_support::*;
use serde_json::json;
use sharedos_egress::{EgressEvent, GatewayLimits};
use sharedos_kernel::AuditOutcome;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the reflecting upstream received: every byte, and each request
/// (its head and body as text).
#[derive(Clone, Default)]
struct Reflector {
    port: u16,
    received: Arc<Mutex<Vec<u8>>>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Reflector {
    fn received(&self) -> usize {
        self.received.lock().unwrap().len()
    }
    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

/// Reads one request (head and `content-length` body) off `tcp`,
/// recording every byte read; `None` at the end of the connection.
async fn read_request(tcp: &mut TcpStream, r: &Reflector) -> Option<String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 16384];
    let head_end = loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tcp.read(&mut buf).await.ok().filter(|n| *n > 0)?;
        r.received.lock().unwrap().extend_from_slice(&buf[..n]);
        got.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_lowercase();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    while got.len() < head_end + length {
        let n = tcp.read(&mut buf).await.ok().filter(|n| *n > 0)?;
        r.received.lock().unwrap().extend_from_slice(&buf[..n]);
        got.extend_from_slice(&buf[..n]);
    }
    Some(String::from_utf8_lossy(&got).into_owned())
}

/// Answers each request with itself: chunked in 7-byte chunks, or sized
/// when its path holds `sized`; the request's `authorization` (the real
/// key) in the answer header `x-echo`.
async fn reflector() -> Reflector {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let r = Reflector {
        port: listener.local_addr().unwrap().port(),
        ..Reflector::default()
    };
    let state = r.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let r = state.clone();
            tokio::spawn(async move {
                while let Some(request) = read_request(&mut tcp, &r).await {
                    r.requests.lock().unwrap().push(request.clone());
                    if tcp.write_all(&reflection(&request)).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    r
}

fn reflection(request: &str) -> Vec<u8> {
    let echo = request
        .lines()
        .find_map(|l| l.strip_prefix("authorization: "))
        .unwrap_or("none")
        .trim();
    let sized = request.lines().next().unwrap_or("").contains("sized");
    let mut out = format!("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nx-echo: {echo}\r\n");
    if sized {
        out.push_str(&format!(
            "content-length: {}\r\n\r\n{request}",
            request.len()
        ));
        return out.into_bytes();
    }
    out.push_str("transfer-encoding: chunked\r\n\r\n");
    for chunk in request.as_bytes().chunks(7) {
        out.push_str(&format!(
            "{:x}\r\n{}\r\n",
            chunk.len(),
            String::from_utf8_lossy(chunk)
        ));
    }
    out.push_str("0\r\n\r\n");
    out.into_bytes()
}

/// One request written by hand, as a plugin may write it: the whole
/// answer (head and body) as text.
async fn raw(addr: std::net::SocketAddr, method: &str, target: &str, headers: &str) -> String {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {target} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {PLACEHOLDER}\r\n\
         {headers}content-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let read = tcp.read_to_end(&mut answer);
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("an answer within 20 s")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// The data of a chunked body.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

fn status_of(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

async fn served(up: &Reflector, dir: &std::path::Path, extra: serde_json::Value) -> Served {
    let mut route = json!({"name": "openai", "upstream": format!("http://127.0.0.1:{}/v1", up.port),
        "secret": key_file(dir), "api": "openai", "allow": ["loopback"]});
    let mut policy = json!({});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        if k == "budget" {
            policy["budget"] = v;
        } else {
            route[k] = v;
        }
    }
    policy["routes"] = json!([route]);
    let grants = vec![egress_grant("alice", "openai", "request", None)];
    serve(policy, grants, "alice", GatewayLimits::default()).await
}

#[tokio::test]
async fn other_methods_admin_paths_and_traversal_are_refused_before_the_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let up = reflector().await;
    let mut s = served(&up, dir.path(), json!({})).await;
    let cases = [
        (
            "TRACE",
            "/openai/chat/completions",
            403,
            "egress_endpoint_refused",
        ),
        (
            "DELETE",
            "/openai/models/gpt-4o",
            403,
            "egress_endpoint_refused",
        ),
        (
            "GET",
            "/openai/organization/admin_api_keys",
            403,
            "egress_endpoint_refused",
        ),
        ("POST", "/openai/files", 403, "egress_endpoint_refused"),
        ("POST", "/openai/../admin", 400, "egress_path_invalid"),
        ("POST", "/openai/v1/../../admin", 400, "egress_path_invalid"),
        ("POST", "/openai/%2e%2e/admin", 400, "egress_path_invalid"),
        (
            "POST",
            "/openai/%2E%2e/%2E%2E/admin",
            400,
            "egress_path_invalid",
        ),
        (
            "POST",
            "/openai/chat%2fcompletions",
            400,
            "egress_path_invalid",
        ),
        ("POST", "/openai/x%5C..%5Cadmin", 400, "egress_path_invalid"),
        (
            "POST",
            "/openai//chat/completions",
            400,
            "egress_path_invalid",
        ),
    ];
    for (method, target, status, code) in cases {
        let answer = raw(s.addr, method, target, "").await;
        assert_eq!(status_of(&answer), status, "{method} {target}: {answer}");
        assert!(answer.contains(code), "{method} {target}: {answer}");
    }
    // The upstream saw nothing of any of them.
    assert_eq!(up.received(), 0, "{:?}", up.requests());
    // Each refusal is an egress.request event and an audit record with
    // its code; none reached the kernel's grant check.
    let events = s.drain_events();
    let codes: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            EgressEvent::Request { code, status, .. } if status.is_none() => code.clone(),
            _ => None,
        })
        .collect();
    let want: Vec<_> = cases.iter().map(|c| c.3.to_owned()).collect();
    assert_eq!(codes, want, "{events:?}");
    let completed = s.records("effect.completed");
    assert_eq!(completed.len(), cases.len());
    for (record, case) in completed.iter().zip(&cases) {
        assert_eq!(record.outcome, AuditOutcome::Failed);
        assert_eq!(record.metadata.as_ref().unwrap()["code"], case.3);
    }
    assert!(s.records("effect.authorized").is_empty());
    // The route's own endpoint still answers.
    let answer = raw(s.addr, "POST", "/openai/chat/completions", "").await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    assert_eq!(up.requests().len(), 1);
    assert!(up.requests()[0].starts_with("POST /v1/chat/completions HTTP/1.1\r\n"));
}

#[tokio::test]
async fn identity_headers_and_query_keys_stop_at_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let up = reflector().await;
    let s = served(
        &up,
        dir.path(),
        json!({"headers": {"OpenAI-Project": "proj_route"}}),
    )
    .await;
    let headers = "OpenAI-Organization: org-evil\r\nOpenAI-Project: proj-evil\r\n\
                   anthropic-workspace-id: wrk-evil\r\n";
    let target = "/openai/chat/completions?key=sk-evil-1&alt=sse&API_KEY=sk-evil-2&%6Bey=sk-evil-3&access_token=sk-evil-4";
    let answer = raw(s.addr, "POST", target, headers).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    let seen = up.requests();
    assert_eq!(seen.len(), 1);
    let request = &seen[0];
    assert!(
        request.starts_with("POST /v1/chat/completions?alt=sse HTTP/1.1\r\n"),
        "{request}"
    );
    let lower = request.to_lowercase();
    assert!(!lower.contains("evil"), "{request}");
    assert!(
        lower.contains("openai-project: proj_route\r\n"),
        "{request}"
    );
    assert!(!lower.contains("openai-organization"), "{request}");

    // Without `headers` on the route, no identity header passes at all.
    let up = reflector().await;
    let s = served(&up, dir.path(), json!({})).await;
    let answer = raw(s.addr, "POST", "/openai/responses", headers).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    let lower = up.requests()[0].to_lowercase();
    assert!(!lower.contains("openai-project") && !lower.contains("organization"));
}

#[tokio::test]
async fn the_real_key_never_reaches_the_plugin_from_a_reflecting_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let up = reflector().await;
    let mut s = served(&up, dir.path(), json!({})).await;
    // Chunked (the key split across 7-byte chunks) and sized.
    for target in ["/openai/chat/completions", "/openai/models/sized-model"] {
        let method = if target.contains("sized") {
            "GET"
        } else {
            "POST"
        };
        let answer = raw(s.addr, method, target, "").await;
        assert_eq!(status_of(&answer), 200, "{answer}");
        assert!(!answer.contains(REAL_KEY), "{answer}");
        let mask = "*".repeat(REAL_KEY.len());
        // The header and the body each held the key, masked.
        assert!(
            answer.contains(&format!("x-echo: Bearer {mask}\r\n")),
            "{answer}"
        );
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        let body = if head.contains("transfer-encoding: chunked") {
            dechunk(body)
        } else {
            body.to_owned()
        };
        assert!(body.contains(&format!("Bearer {mask}")), "{body}");
        if method == "GET" {
            let length = format!("content-length: {}\r\n", body.len());
            assert!(answer.contains(&length), "{answer}");
        }
    }
    // The upstream did get the real key.
    assert!(up.requests().iter().all(|r| r.contains(REAL_KEY)));
    let trail = serde_json::to_string(&s.audit.records()).unwrap();
    assert!(!trail.contains(REAL_KEY));
    assert!(!format!("{:?}", s.drain_events()).contains(REAL_KEY));
}

#[tokio::test]
async fn an_upstream_never_receives_more_than_the_byte_budget() {
    let dir = tempfile::tempdir().unwrap();
    let up = reflector().await;
    let budget = 20_000;
    let mut s = served(&up, dir.path(), json!({"budget": {"bytes": budget}})).await;
    // Large heads and queries, tiny bodies: what the budget missed.
    let pad = format!("x-pad: {}\r\n", "p".repeat(8_000));
    let target = format!("/openai/chat/completions?q={}", "q".repeat(4_000));
    let mut statuses = Vec::new();
    for _ in 0..40 {
        statuses.push(status_of(&raw(s.addr, "POST", &target, &pad).await));
    }
    assert!(statuses.contains(&429), "{statuses:?}");
    let received = up.received();
    assert!(
        received <= budget,
        "the upstream received {received} bytes against a budget of {budget}"
    );
    let events = s.drain_events();
    assert!(
        events.contains(&EgressEvent::BudgetExceeded { budget: "bytes" }),
        "{events:?}"
    );
    // Each event's requestBytes holds the head it sent.
    let sent: u64 = events
        .iter()
        .filter_map(|e| match e {
            EgressEvent::Request {
                status: Some(_),
                request_bytes,
                ..
            } => Some(*request_bytes),
            _ => None,
        })
        .sum();
    assert!(sent >= received as u64, "{sent} < {received}");

    // A request whose head alone is over what is left is refused before
    // a byte of it is sent.
    let up = reflector().await;
    let s = served(&up, dir.path(), json!({"budget": {"bytes": 5_000}})).await;
    let answer = raw(s.addr, "POST", "/openai/chat/completions", &pad).await;
    assert_eq!(status_of(&answer), 429, "{answer}");
    assert!(answer.contains("egress_budget_exceeded"), "{answer}");
    assert_eq!(up.received(), 0);
}

#[tokio::test]
async fn answers_without_usage_are_charged_an_estimate_against_the_token_budget() {
    let dir = tempfile::tempdir().unwrap();
    let up = reflector().await;
    let mut s = served(&up, dir.path(), json!({"budget": {"tokens": 1_000}})).await;
    let pad = format!("x-pad: {}\r\n", "p".repeat(1_000));
    let mut statuses = Vec::new();
    for _ in 0..20 {
        statuses.push(status_of(
            &raw(s.addr, "POST", "/openai/chat/completions", &pad).await,
        ));
    }
    // Each answer reports no usage and is about 1.2 KB each way: charged
    // about 600 tokens, so the second spends the budget and the rest are
    // refused.
    assert_eq!(&statuses[..2], &[200, 200], "{statuses:?}");
    assert!(statuses[2..].iter().all(|s| *s == 429), "{statuses:?}");
    assert_eq!(up.requests().len(), 2);
    let events = s.drain_events();
    let estimates: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            EgressEvent::Request {
                estimated_tokens,
                usage: None,
                request_bytes,
                response_bytes,
                status: Some(200),
                ..
            } => {
                assert_eq!(
                    *estimated_tokens,
                    Some((request_bytes + response_bytes).div_ceil(4))
                );
                *estimated_tokens
            }
            _ => None,
        })
        .collect();
    assert_eq!(estimates.len(), 2, "{events:?}");
    assert!(
        events.contains(&EgressEvent::BudgetExceeded { budget: "tokens" }),
        "{events:?}"
    );
}
