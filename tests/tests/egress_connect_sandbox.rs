//! CONNECT destinations end to end: the testplugin in the full sandbox
//! opens an HTTP CONNECT through the gateway's listener in its own network
//! namespace to a TLS server on the host's loopback (allowed explicitly as
//! `loopback`) and completes a TLS handshake with it, trusting only the
//! test CA: the gateway copies bytes and TLS runs end to end. Observed
//! from the host: what the TLS server and a bystander listener accepted,
//! the events, the audit file and the turn's ending.

#[path = "../../host/tests/egress_support/ca.rs"]
mod ca;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use sharedos_protocol::ExecutionStatus;
use sharedos_tests::egress::{Turn, egress_grant, run_request};
use sharedos_tests::turns::{request, testplugin_host_toml};

/// A TLS echo server on 127.0.0.1 with the test CA's `localhost`
/// certificate: its port, the CA's PEM, and how many TCP connections it
/// accepted and how many handshakes completed.
struct TlsEcho {
    port: u16,
    ca_pem: String,
    accepted: Arc<AtomicUsize>,
    handshakes: Arc<AtomicUsize>,
}

async fn tls_echo(dir: &Path) -> TlsEcho {
    let (acceptor, ca_path) = ca::test_ca(dir);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (accepted, handshakes) = (Arc::<AtomicUsize>::default(), Arc::<AtomicUsize>::default());
    let (a, h) = (accepted.clone(), handshakes.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            a.fetch_add(1, Ordering::SeqCst);
            let (acceptor, h) = (acceptor.clone(), h.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    h.fetch_add(1, Ordering::SeqCst);
                    let (mut r, mut w) = tokio::io::split(tls);
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                }
            });
        }
    });
    TlsEcho {
        port,
        ca_pem: std::fs::read_to_string(ca_path).unwrap(),
        accepted,
        handshakes,
    }
}

/// A listener on the host's loopback that no policy names; counts what it
/// accepted.
async fn bystander() -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::<AtomicUsize>::default();
    let c = count.clone();
    tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            c.fetch_add(1, Ordering::SeqCst);
        }
    });
    (port, count)
}

/// The testplugin in the full sandbox with `destination` (by name) as its
/// only destination, granted to its agent, and `budget`.
fn config(destination: &str, budget: &str) -> String {
    let network = format!(
        "launcher = \"sandbox\"\nnetwork = {{ destinations = [{{ address = \"{destination}\", allow = [\"loopback\"] }}]{budget} }}\n"
    );
    let grant = egress_grant("alice-destination", destination, "connect");
    testplugin_host_toml("egress-connect", "sandbox", 60_000)
        .replace("launcher = \"sandbox\"\n", &network)
        + &grant
}

async fn turn(dir: &Path, text: &str, script: Value) -> Turn {
    let request = request("egress-connect-1", script, &[], 60_000).to_string();
    run_request(dir, text, "sharedos-testplugin", &request, None).await
}

fn emitted(turn: &Turn, op: &str) -> Vec<Value> {
    turn.events_of("runtime.event")
        .into_iter()
        .filter(|e| e["type"] == op)
        .map(|e| e["data"].clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_destination_carries_tls_end_to_end_and_others_are_refused_unresolved() {
    let dir = tempfile::tempdir().unwrap();
    let server = tls_echo(dir.path()).await;
    let (other_port, other_accepted) = bystander().await;
    let allowed = format!("localhost:{}", server.port);
    // Not listed: a name that resolves to a live listener on the host, and
    // a name that resolves nowhere.
    let unlisted = format!("localhost:{other_port}");
    let unknown = "never-resolved.sharedos.test:443";
    let script = json!([
        {"op": "egress_connect", "target": allowed, "caPem": server.ca_pem, "bytes": 4096},
        {"op": "egress_connect", "target": unlisted, "caPem": server.ca_pem},
        {"op": "egress_connect", "target": unknown},
    ]);
    let turn = turn(dir.path(), &config(&allowed, ""), script).await;
    assert_eq!(
        turn.result.status,
        ExecutionStatus::Succeeded,
        "{:#?}",
        turn.result
    );

    let seen = emitted(&turn, "egress_connect");
    assert_eq!(seen.len(), 3, "{seen:?}");
    // The handshake completed with the test CA, and 4 KiB came back
    // through the tunnel.
    assert_eq!(seen[0]["status"], "200", "{}", seen[0]);
    assert_eq!(seen[0]["tls"], "ok", "{}", seen[0]);
    assert_eq!(seen[0]["echoed"], 4096, "{}", seen[0]);
    assert_eq!(seen[1]["status"], "403", "{}", seen[1]);
    assert_eq!(seen[2]["status"], "403", "{}", seen[2]);
    // Observed on the host: one connection and one handshake at the TLS
    // server, nothing at the listener the policy does not name.
    assert_eq!(server.accepted.load(Ordering::SeqCst), 1);
    assert_eq!(server.handshakes.load(Ordering::SeqCst), 1);
    assert_eq!(other_accepted.load(Ordering::SeqCst), 0);

    // Each connection is an event of the turn, with its bytes.
    let connections = turn.events_of("egress.connection");
    assert_eq!(connections.len(), 3, "{connections:?}");
    let of = |d: &str| {
        connections
            .iter()
            .find(|c| c["destination"] == d)
            .unwrap_or_else(|| panic!("no event for {d}: {connections:?}"))
            .clone()
    };
    let ok = of(&allowed);
    assert_eq!(ok["code"], Value::Null, "{ok}");
    // The handshake and 4 KiB each way went through the tunnel.
    assert!(ok["bytesUp"].as_u64().unwrap() > 4096, "{ok}");
    assert!(ok["bytesDown"].as_u64().unwrap() > 4096, "{ok}");
    // The refusals are decided on the policy's list, before any name is
    // resolved: a resolved name would fail `upstream_unreachable` (nowhere)
    // or reach the kernel and the bystander (localhost).
    for d in [unlisted.as_str(), unknown] {
        assert_eq!(of(d)["code"], "egress_destination_unknown", "{d}");
    }
    // And an audit record each, the kernel's authorization for the one
    // allowed.
    for d in [allowed.as_str(), unlisted.as_str(), unknown] {
        assert!(turn.audit.contains(d), "{d} not audited: {}", turn.audit);
    }
    let authorized: Vec<&str> = turn
        .audit
        .lines()
        .filter(|l| l.contains("\"effect.authorized\"") && l.contains(&allowed))
        .collect();
    assert_eq!(authorized.len(), 1, "{}", turn.audit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnel_bytes_count_in_the_turns_byte_budget() {
    let dir = tempfile::tempdir().unwrap();
    let server = tls_echo(dir.path()).await;
    let allowed = format!("localhost:{}", server.port);
    let budget = ", budget = { bytes = 20000 }";
    let script = json!([
        {"op": "egress_connect", "target": allowed, "caPem": server.ca_pem, "bytes": 65536},
    ]);
    let turn = turn(dir.path(), &config(&allowed, budget), script).await;

    assert_eq!(
        turn.result.status,
        ExecutionStatus::Failed,
        "{:#?}",
        turn.result
    );
    let error = turn.result.error.as_ref().unwrap();
    assert_eq!(error.code.as_str(), "egress_budget_exceeded", "{error:?}");
    let exceeded = turn.events_of("egress.budget_exceeded");
    assert_eq!(exceeded.len(), 1, "{:?}", turn.events);
    assert_eq!(exceeded[0]["budget"], "bytes");
    // The handshake went through; the tunnel was cut at the budget.
    assert_eq!(server.handshakes.load(Ordering::SeqCst), 1);
}
