//! CONNECT tunnels under `sharedos serve` end with their run, as under
//! `sharedos run`: a run of the sandboxed testplugin makes 2,000 tunnel
//! attempts to a destination that never hangs up, then writes a file;
//! once it has ended the serving process holds no socket to the
//! destination, its descriptor count is back at its baseline, and the next
//! run's model request is served.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use sharedos_egress::mock::{MockModel, Wire, plan_script};
use sharedos_tests::egress::{egress_grant, key_file};
use sharedos_tests::served::{
    agent_file, call, open_session, start, wait_state, write_config_with,
};

/// A TCP server on 127.0.0.1 that accepts and never hangs up (until the
/// test ends): its port and how many connections it holds.
async fn holding_server() -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let live = Arc::<AtomicUsize>::default();
    let counter = live.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let (mut r, mut w) = tcp.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                // Held open: the reading half ended, the socket stays.
                std::future::pending::<()>().await;
                drop(w);
            });
        }
    });
    (port, live)
}

fn fds_of(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .map(|l| l.to_string_lossy().into_owned())
        .collect()
}

/// The TCP sockets `pid` holds connected to `127.0.0.1:<port>`.
fn sockets_to(pid: u32, port: u16) -> usize {
    let inodes: std::collections::HashSet<String> = fds_of(pid)
        .into_iter()
        .filter_map(|l| Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned()))
        .collect();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    let remote = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() > 9 && f[2] == remote && inodes.contains(f[9]))
        .count()
}

async fn eventually(what: &str, f: impl Fn() -> bool) {
    for _ in 0..600 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("not within 30 s: {what}");
}

/// The testplugin in the full sandbox with the model route and `dest`.
fn config(dir: &Path, model: &str, dest: &str) {
    let key = key_file(dir);
    let network = format!(
        "launcher = \"sandbox\"\nnetwork = {{ routes = [{{ name = \"openai\", upstream = \"{model}\", secret = \"file:{}\", api = \"openai\", allow = [\"loopback\"] }}], destinations = [{{ address = \"{dest}\", allow = [\"loopback\"] }}] }}\n",
        key.display()
    );
    let grants = egress_grant("alice-model", "openai", "request")
        + &egress_grant("alice-destination", dest, "connect");
    write_config_with(dir, &grants);
    let path = dir.join("host.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("launcher = \"direct\"\n"));
    std::fs::write(&path, text.replace("launcher = \"direct\"\n", &network)).unwrap();
}

async fn run(socket: &Path, session: &str, request: &str, script: Value) -> Value {
    let body = json!({"requestId": request, "payload": {"script": script, "traceFromTurn": true},
                      "options": {"timeoutMs": 120_000}});
    let path = format!("/v1/sessions/{session}/runs");
    let (status, started) = call(socket, "POST", &path, "operator", body).await;
    assert_eq!(status, 201, "{started}");
    let id = started["run"]["id"].as_str().expect("a run id").to_owned();
    wait_state(socket, &id, "ended").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_end_with_their_run_under_serve_and_the_next_run_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let (port, live) = holding_server().await;
    let model = MockModel::start(plan_script(Wire::OpenaiChat))
        .await
        .unwrap();
    let dest = format!("127.0.0.1:{port}");
    config(dir.path(), &model.base_url(), &dest);
    let server = start(dir.path());
    let (socket, pid) = (server.socket(), server.child.id());
    let session = open_session(&socket).await;
    // The baseline: a served run without tunnels has come and gone.
    let warm = run(&socket, &session, "warm", json!([])).await;
    assert_eq!(warm["result"]["status"], "succeeded", "{warm}");
    let baseline = fds_of(pid).len();

    let script = json!([
        {"op": "egress_tunnels", "n": 2_000, "target": dest},
        {"op": "call", "tool": "files.write", "arguments": {"path": "after-tunnels.txt", "content": "ok"}},
    ]);
    let first = run(&socket, &session, "tunnels", script).await;
    assert_eq!(first["result"]["status"], "succeeded", "{first}");
    assert!(agent_file(dir.path(), "after-tunnels.txt").exists());
    assert!(
        live.load(Ordering::SeqCst) > 0,
        "no tunnel reached the destination"
    );
    // The run's end closed every tunnel in the serving process, although
    // the destination never hangs up.
    eventually("no socket of serve to the destination", || {
        sockets_to(pid, port) == 0
    })
    .await;
    eventually("serve's fd count back at its baseline", || {
        fds_of(pid).len() <= baseline + 8
    })
    .await;

    // The next run's model request is served.
    let script = json!([{"op": "egress_flood", "n": 0, "path": "/openai/chat/completions"}]);
    let second = run(&socket, &session, "model", script).await;
    assert_eq!(second["result"]["status"], "succeeded", "{second}");
    assert_eq!(model.seen().len(), 1, "{second}");
    eventually("serve's fd count back at its baseline", || {
        fds_of(pid).len() <= baseline + 8
    })
    .await;
}
