//! CONNECT tunnels against the gateway's bounds, from the plugin's side of
//! the real gateway to an echo server on the host's loopback: a tunnel
//! holds its connection's slot under the connection cap for as long as it
//! lives, it is a request of the turn's budget, and the turn's end closes
//! it.

mod egress_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use egress_support::*;
use serde_json::json;
use sharedos_egress::{EgressEvent, GatewayLimits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An echo server: its port and how many connections it holds open.
async fn echo() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let live = Arc::<AtomicUsize>::default();
    let counter = live.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let live = counter.clone();
            live.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let (mut r, mut w) = tcp.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                live.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (port, live)
}

async fn served(dest: &str, budget: serde_json::Value, limits: GatewayLimits) -> Served {
    let policy = json!({
        "destinations": [{"address": dest, "allow": ["loopback"]}],
        "budget": budget,
    });
    let grants = vec![egress_grant("alice", dest, "connect", None)];
    serve(policy, grants, "alice", limits).await
}

/// Opens a tunnel: the status of the gateway's answer (0 when the
/// connection was closed without one) and the open stream.
async fn tunnel(addr: std::net::SocketAddr, dest: &str) -> (u16, TcpStream) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let req = format!("CONNECT {dest} HTTP/1.1\r\nhost: {dest}\r\n\r\n");
    let _ = tcp.write_all(req.as_bytes()).await;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    let read = async {
        while !head.ends_with(b"\r\n\r\n") {
            match tcp.read(&mut byte).await {
                Ok(1) => head.push(byte[0]),
                _ => break,
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("an answer or a close within 20 s");
    let text = String::from_utf8_lossy(&head).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, tcp)
}

/// Whether `tcp` carries bytes both ways through the tunnel.
async fn echoes(tcp: &mut TcpStream) -> bool {
    if tcp.write_all(b"ping").await.is_err() {
        return false;
    }
    let mut got = [0u8; 4];
    let read = tokio::time::timeout(Duration::from_secs(20), tcp.read_exact(&mut got)).await;
    matches!(read, Ok(Ok(_))) && &got == b"ping"
}

async fn eventually(what: &str, f: impl Fn() -> bool) {
    for _ in 0..400 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("not within 20 s: {what}");
}

#[tokio::test]
async fn a_tunnel_holds_its_connection_slot_under_the_cap() {
    let (port, live) = echo().await;
    let dest = format!("127.0.0.1:{port}");
    let limits = GatewayLimits {
        max_connections: 4,
        ..GatewayLimits::default()
    };
    let s = served(&dest, json!({}), limits).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        let (status, mut tcp) = tunnel(s.addr, &dest).await;
        assert_eq!(status, 200);
        assert!(echoes(&mut tcp).await);
        held.push(tcp);
    }
    // Four tunnels fill the cap: more attempts are closed unanswered and
    // reach nothing.
    for _ in 0..50 {
        let (status, _) = tunnel(s.addr, &dest).await;
        assert_eq!(status, 0, "a tunnel over the cap was answered");
    }
    assert_eq!(live.load(Ordering::SeqCst), 4);
    // A tunnel that ends gives its slot back.
    drop(held.pop());
    eventually("the echo side of the closed tunnel ends", || {
        live.load(Ordering::SeqCst) == 3
    })
    .await;
    let mut again = None;
    for _ in 0..100 {
        let (status, tcp) = tunnel(s.addr, &dest).await;
        if status == 200 {
            again = Some(tcp);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut again = again.expect("a slot freed by a closed tunnel is served again");
    assert!(echoes(&mut again).await);
}

#[tokio::test]
async fn tunnels_count_against_the_request_budget() {
    let (port, live) = echo().await;
    let dest = format!("127.0.0.1:{port}");
    let mut s = served(&dest, json!({"requests": 2}), GatewayLimits::default()).await;
    let (a, _first) = tunnel(s.addr, &dest).await;
    let (b, _second) = tunnel(s.addr, &dest).await;
    let (c, _third) = tunnel(s.addr, &dest).await;
    assert_eq!((a, b, c), (200, 200, 429));
    eventually("two tunnels at the echo server", || {
        live.load(Ordering::SeqCst) == 2
    })
    .await;
    let events = s.drain_events();
    assert!(
        events.contains(&EgressEvent::BudgetExceeded { budget: "requests" }),
        "{events:?}"
    );
}

#[tokio::test]
async fn the_turns_end_closes_its_tunnels() {
    let (port, live) = echo().await;
    let dest = format!("127.0.0.1:{port}");
    let s = served(&dest, json!({}), GatewayLimits::default()).await;
    let mut held = Vec::new();
    for _ in 0..5 {
        let (status, mut tcp) = tunnel(s.addr, &dest).await;
        assert_eq!(status, 200);
        assert!(echoes(&mut tcp).await);
        held.push(tcp);
    }
    assert_eq!(live.load(Ordering::SeqCst), 5);
    let Served {
        audit,
        mut events,
        _handle,
        ..
    } = s;
    // The turn ends: its serve handle is dropped.
    drop(_handle);
    eventually("every tunnel closed at the destination", || {
        live.load(Ordering::SeqCst) == 0
    })
    .await;
    // And on the plugin's side.
    for tcp in &mut held {
        let mut buf = [0u8; 8];
        let read = tokio::time::timeout(Duration::from_secs(20), tcp.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    }
    // Each is reported ended by the turn's end, event and audit record.
    let mut ended = 0;
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_secs(5), events.recv()).await {
        if let EgressEvent::Connection { code, .. } = e {
            assert_eq!(code.as_deref(), Some("turn_ended"));
            ended += 1;
            if ended == 5 {
                break;
            }
        }
    }
    assert_eq!(ended, 5);
    eventually("five effect.completed records", || {
        audit
            .records()
            .iter()
            .filter(|r| r.kind == "effect.completed")
            .count()
            == 5
    })
    .await;
}

#[tokio::test]
async fn a_refused_connect_leaves_its_connection_counted() {
    // A destination nothing listens on: its CONNECT is authorized, then
    // refused `502 upstream_unreachable`, and the connection stays open.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dest = format!("127.0.0.1:{}", closed.local_addr().unwrap().port());
    drop(closed);
    let limits = GatewayLimits {
        max_connections: 2,
        ..GatewayLimits::default()
    };
    let s = served(&dest, json!({}), limits).await;
    let (a, _first) = tunnel(s.addr, &dest).await;
    let (b, _second) = tunnel(s.addr, &dest).await;
    assert_eq!((a, b), (502, 502));
    // Both connections still hold their slots: a third is closed
    // unanswered.
    for _ in 0..20 {
        let (status, _) = tunnel(s.addr, &dest).await;
        assert_eq!(status, 0, "a connection over the cap was answered");
    }
}
