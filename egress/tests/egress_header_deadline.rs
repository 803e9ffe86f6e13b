//! The gateway's deadline for a request head holds on the first head of a
//! connection and on every later head of a kept-alive one, where each
//! head's deadline moves the connection's one timer entry forward.

mod egress_support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use egress_support::*;
use serde_json::json;
use sharedos_egress::GatewayLimits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const DEADLINE: Duration = Duration::from_secs(1);

async fn gateway(dir: &std::path::Path) -> (MockModel, Served) {
    let up = json_upstream(None).await;
    let policy = json!({"routes": [{"name": "m", "upstream": format!("http://127.0.0.1:{}/v1", up.port),
        "secret": key_file(dir), "api": "openai", "allow": ["loopback"]}]});
    let limits = GatewayLimits {
        header_timeout: DEADLINE,
        ..GatewayLimits::default()
    };
    let grants = vec![egress_grant("alice", "m", "request", None)];
    (up, serve(policy, grants, "alice", limits).await)
}

/// One whole request on `tcp`, and its answer's status line and body.
async fn request(tcp: &mut TcpStream) -> (String, String) {
    let body = "{\"model\":\"m\"}";
    let head = format!(
        "POST /m/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the answer: {got:?}");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).into_owned();
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            continue;
        };
        let length = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().to_owned())
            })
            .and_then(|v| v.parse::<usize>().ok())
            .expect("a sized answer");
        if body.len() >= length {
            let status = head.lines().next().unwrap_or_default().to_owned();
            return (status, body.to_owned());
        }
    }
}

/// Half a head, then nothing: how long until the gateway closes `tcp`.
async fn half_a_head_is_cut(tcp: &mut TcpStream) -> Duration {
    tcp.write_all(b"POST /m/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(20), tcp.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok(),
        "the connection outlived its header deadline"
    );
    started.elapsed()
}

async fn connect(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.unwrap()
}

#[tokio::test]
async fn a_head_that_never_ends_is_cut_at_the_deadline_on_a_fresh_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (_up, s) = gateway(dir.path()).await;
    let waited = half_a_head_is_cut(&mut connect(s.addr).await).await;
    // Not before the deadline (tokio rounds deadlines up, never down).
    assert!(waited >= DEADLINE - Duration::from_millis(50), "{waited:?}");
}

#[tokio::test]
async fn each_head_of_a_kept_alive_connection_gets_its_own_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let (up, s) = gateway(dir.path()).await;
    let mut tcp = connect(s.addr).await;
    // Five requests 300 ms apart: 1.2 s in all, longer than one deadline,
    // so a deadline not moved forward would cut the connection between
    // two of them.
    for i in 0..5 {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let (status, body) = request(&mut tcp).await;
        assert!(status.contains(" 200 "), "request {i}: {status}");
        assert!(body.contains("\"usage\""), "request {i}: {body}");
    }
    assert_eq!(up.seen().len(), 5);
    // Then the next head never ends: cut at its own deadline.
    let waited = half_a_head_is_cut(&mut tcp).await;
    assert!(waited >= DEADLINE - Duration::from_millis(50), "{waited:?}");
}

#[tokio::test]
async fn a_new_connection_after_one_that_ended_gets_its_own_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let (_up, s) = gateway(dir.path()).await;
    // One request answered, then the connection ends while the gateway
    // waits for its next head: that wait's timer entry is kept for the
    // next connection, with its deadline 1 s after the answer.
    let mut first = connect(s.addr).await;
    let (status, _) = request(&mut first).await;
    assert!(status.contains(" 200 "), "{status}");
    drop(first);
    tokio::time::sleep(Duration::from_millis(600)).await;
    // The next connection's head is cut at its own deadline, not at the
    // kept entry's (0.4 s from now).
    let waited = half_a_head_is_cut(&mut connect(s.addr).await).await;
    assert!(waited >= DEADLINE - Duration::from_millis(50), "{waited:?}");
}
