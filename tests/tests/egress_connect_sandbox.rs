//! CONNECT destinations end to end: the testplugin in the full sandbox
//! opens an HTTP CONNECT through the gateway's listener in its own network
//! namespace to a TLS server on the host's loopback (allowed explicitly as
//! `loopback`) and completes a TLS handshake with it, trusting only the
//! test CA: the gateway copies bytes and TLS runs end to end. Observed
//! from the host: what the TLS server and a bystander listener accepted,
//! the events, the audit file and the turn's ending.

#[path = "../../egress/tests/egress_support/ca.rs"]
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

/// A TCP echo server on 127.0.0.1 that never hangs up: once a client
/// stops sending it keeps its socket open until `release` is sent. Its
/// port, how many connections it holds, and the release.
async fn tcp_echo() -> (u16, Arc<AtomicUsize>, tokio::sync::watch::Sender<bool>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let live = Arc::<AtomicUsize>::default();
    let counter = live.clone();
    let (release, released) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (live, mut released) = (counter.clone(), released.clone());
            live.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let (mut r, mut w) = tcp.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = released.wait_for(|r| *r).await;
                live.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (port, live, release)
}

/// How many TCP sockets this process holds that are connected to
/// `127.0.0.1:<port>` (the gateway's side of a tunnel to it).
fn sockets_to(port: u16) -> usize {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(str::to_owned)
        })
        .collect();
    let table = std::fs::read_to_string("/proc/self/net/tcp").unwrap_or_default();
    let remote = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() > 9 && f[2] == remote && inodes.contains(f[9]))
        .count()
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

async fn eventually(what: &str, f: impl Fn() -> bool) {
    for _ in 0..400 {
        if f() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("not within 20 s: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_tunnel_attempts_leave_the_host_its_descriptors() {
    use sharedos_egress::mock::{MockModel, Wire, plan_script};
    let dir = tempfile::tempdir().unwrap();
    let (port, live, release) = tcp_echo().await;
    let model = MockModel::start(plan_script(Wire::OpenaiChat))
        .await
        .unwrap();
    let dest = format!("127.0.0.1:{port}");
    let key = sharedos_tests::egress::key_file(dir.path());
    let route = format!(
        "routes = [{{ name = \"openai\", upstream = \"{}\", secret = \"file:{}\", api = \"openai\", allow = [\"loopback\"] }}], ",
        model.base_url(),
        key.display()
    );
    let text = config(&dest, "").replace("network = { ", &format!("network = {{ {route}"))
        + &egress_grant("alice-model", "openai", "request");
    let fds_before = open_fds();
    // The count of the host's sockets to the destination sees one.
    let probe = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    assert_eq!(sockets_to(port), 1);
    drop(probe);

    // One turn: 10,000 CONNECT attempts, every answered tunnel held open,
    // then a files.write of the same turn.
    let script = json!([
        {"op": "egress_tunnels", "n": 10_000, "target": dest},
        {"op": "call", "tool": "files.write", "arguments": {"path": "after-tunnels.txt", "content": "ok"}},
    ]);
    let first = request("egress-tunnels-1", script, &["files.write"], 120_000).to_string();
    let turn = run_request(dir.path(), &text, "sharedos-testplugin", &first, None).await;
    assert_eq!(
        turn.result.status,
        ExecutionStatus::Succeeded,
        "{:#?}",
        turn.result
    );
    let flood = emitted(&turn, "egress_tunnels");
    let flood = &flood[0];
    assert_eq!(flood["attempts"], 10_000, "{flood}");
    // At most the gateway's connection cap (64) of them became tunnels;
    // the rest were closed unanswered.
    let tunnels = flood["tunnels"].as_u64().unwrap();
    assert!(tunnels > 0 && tunnels <= 64, "{flood}");
    assert_eq!(
        tunnels + flood["closed"].as_u64().unwrap(),
        10_000,
        "{flood}"
    );
    let written = turn.events_of("tool.completed");
    assert_eq!(written.len(), 1, "{written:?}");
    assert_eq!(written[0]["status"], "succeeded", "{written:?}");
    // The turn's end closed every tunnel in the host, although the
    // destination never hangs up.
    assert!(live.load(Ordering::SeqCst) > 0);
    eventually("no socket of the host to the destination", || {
        sockets_to(port) == 0
    })
    .await;
    release.send_replace(true);
    eventually("the destination's sockets released", || {
        live.load(Ordering::SeqCst) == 0
    })
    .await;

    // A second turn's model request is served.
    let script = json!([{"op": "egress_flood", "n": 0, "path": "/openai/chat/completions"}]);
    let next = request("egress-tunnels-2", script, &[], 60_000).to_string();
    let second = run_request(dir.path(), &text, "sharedos-testplugin", &next, None).await;
    assert_eq!(
        second.result.status,
        ExecutionStatus::Succeeded,
        "{:#?}",
        second.result
    );
    assert_eq!(emitted(&second, "egress_flood")[0]["status"], "200");
    assert_eq!(model.seen().len(), 1);

    // And the host's descriptors are back where they were.
    eventually("the host's fd count back at its baseline", || {
        open_fds() <= fds_before + 8
    })
    .await;
}
