//! `sharedos serve` as a real process, over its unix socket, with a real
//! HTTP client (hyper): dedupe, re-attach after a disconnect, cancel, and
//! recovery after the host is SIGKILLed mid-run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sharedos_tests::turns::{AGENT, NAMESPACE, workspace_bin};
use tokio::net::UnixStream;

struct Server {
    child: Child,
    dir: PathBuf,
}

impl Server {
    fn socket(&self) -> PathBuf {
        self.dir.join("serve.sock")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write_config(dir: &Path) {
    let config = format!(
        r#"
[host]
defaultTimeoutMs = 20000
auditPath = "audit.jsonl"
filesRoot = "files"

[[runtimes]]
id = "sharedos-testplugin"
version = "0.1.0"
program = "{program}"
launcher = "direct"

[[agents]]
agentId = "{AGENT}"
runtime = "sharedos-testplugin"

[[kernel.grants]]
id = "admission"
subject = {{ kind = "agent", agentId = "{AGENT}" }}
issuer = {{ kind = "service", serviceId = "test-host" }}
namespaceId = "{NAMESPACE}"
capabilities = [{{ namespace = "sharedos.execution", path = ["agent", "{AGENT}"], scope = "exact", actions = ["invoke"] }}]

[[kernel.grants]]
id = "files"
subject = {{ kind = "agent", agentId = "{AGENT}" }}
issuer = {{ kind = "service", serviceId = "test-host" }}
namespaceId = "{NAMESPACE}"
capabilities = [{{ namespace = "files", path = ["{AGENT}"], scope = "descendants", actions = ["read", "write", "list"] }}]
"#,
        program = workspace_bin("sharedos-testplugin").display()
    );
    std::fs::write(dir.join("host.toml"), config).unwrap();
}

fn start(dir: &Path) -> Server {
    let socket = dir.join("serve.sock");
    let child = Command::new(workspace_bin("sharedos"))
        .args(["serve", "--config"])
        .arg(dir.join("host.toml"))
        .arg("--socket")
        .arg(&socket)
        .arg("--database")
        .arg(dir.join("sharedos.db"))
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("serve-{}.log", uuid_ish()))).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(Instant::now() < deadline, "sharedos serve did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Server {
        child,
        dir: dir.to_path_buf(),
    }
}

fn uuid_ish() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn scope(user: &str) -> String {
    json!({"namespaceId": NAMESPACE, "authority": {"kind": "service", "serviceId": "test-host"},
           "owner": {"kind": "human", "userId": user}})
    .to_string()
}

async fn send(socket: &Path, req: Request<Full<Bytes>>) -> Response<Incoming> {
    let stream = UnixStream::connect(socket).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender.send_request(req).await.unwrap()
}

async fn call(socket: &Path, method: &str, path: &str, user: &str, body: Value) -> (u16, Value) {
    let req = Request::builder()
        .method(method)
        .uri(format!("http://sharedos{path}"))
        .header("sharedos-scope", scope(user))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = send(socket, req).await;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// One SSE event: `id` (the sequence), `event`, `data`.
type Sse = (Option<u64>, String, Value);

struct Events {
    body: Incoming,
    buf: String,
}

impl Events {
    async fn open(socket: &Path, run: &str, last_event_id: Option<u64>) -> Events {
        let mut req = Request::builder()
            .uri(format!("http://sharedos/v1/runs/{run}/events"))
            .header("sharedos-scope", scope("operator"));
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id.to_string());
        }
        let resp = send(socket, req.body(Full::new(Bytes::new())).unwrap()).await;
        assert_eq!(resp.status().as_u16(), 200);
        Events {
            body: resp.into_body(),
            buf: String::new(),
        }
    }

    async fn next(&mut self) -> Option<Sse> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let (mut id, mut event, mut data) = (None, String::new(), Value::Null);
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id: ") {
                        id = v.parse().ok();
                    } else if let Some(v) = line.strip_prefix("event: ") {
                        event = v.to_owned();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data = serde_json::from_str(v).unwrap();
                    }
                }
                return Some((id, event, data));
            }
            let frame = self.body.frame().await?.ok()?;
            if let Ok(bytes) = frame.into_data() {
                self.buf.push_str(std::str::from_utf8(&bytes).unwrap());
            }
        }
    }
}

fn session_spec() -> Value {
    json!({"agentId": AGENT, "purpose": "Exercise the server", "enabledToolNamespaces": ["files"],
           "tools": [{"name": "files.write", "description": "w", "namespace": "files", "source": "request",
                      "readWrite": "write", "inputSchema": {},
                      "requiredCapability": {"resource": {"namespace": "files", "path": []}, "action": "write"}}]})
}

fn run_body(request_id: &str, script: Value) -> Value {
    json!({"requestId": request_id, "payload": {"script": script, "traceFromTurn": true},
           "options": {"timeoutMs": 20000}})
}

async fn open_session(socket: &Path) -> String {
    let (status, body) = call(socket, "POST", "/v1/sessions", "operator", session_spec()).await;
    assert_eq!(status, 201, "{body}");
    body["session"]["id"].as_str().unwrap().to_owned()
}

async fn wait_state(socket: &Path, run: &str, state: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = call(
            socket,
            "GET",
            &format!("/v1/runs/{run}"),
            "operator",
            Value::Null,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        if body["run"]["state"] == state {
            return body["run"].clone();
        }
        assert!(
            Instant::now() < deadline,
            "run {run} never reached {state}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedupe_scope_and_close_over_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let runs = format!("/v1/sessions/{session}/runs");
    let script = json!([{"op": "call", "tool": "files.write", "arguments": {"path": "n.txt", "content": "1"}}]);
    let (status, first) = call(
        &socket,
        "POST",
        &runs,
        "operator",
        run_body("req-1", script.clone()),
    )
    .await;
    assert_eq!(status, 201, "{first}");
    let run = first["run"]["id"].as_str().unwrap().to_owned();
    let (status, again) = call(
        &socket,
        "POST",
        &runs,
        "operator",
        run_body("req-1", script),
    )
    .await;
    assert_eq!(
        (status, again["repeated"].clone()),
        (200, json!(true)),
        "{again}"
    );
    assert_eq!(again["run"]["id"], json!(run));
    let (status, conflict) = call(
        &socket,
        "POST",
        &runs,
        "operator",
        run_body("req-1", json!([])),
    )
    .await;
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(conflict["error"]["code"], "request_conflict");

    let ended = wait_state(&socket, &run, "ended").await;
    assert_eq!(ended["result"]["status"], "succeeded");
    let (status, _) = call(
        &socket,
        "GET",
        &format!("/v1/runs/{run}"),
        "mallory",
        Value::Null,
    )
    .await;
    assert_eq!(status, 404, "another scope sees nothing");
    let (status, _) = call(
        &socket,
        "GET",
        &format!("/v1/runs/{run}"),
        "operator",
        Value::Null,
    )
    .await;
    assert_eq!(status, 200);

    let (status, _) = call(
        &socket,
        "DELETE",
        &format!("/v1/sessions/{session}"),
        "mallory",
        Value::Null,
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = call(
        &socket,
        "DELETE",
        &format!("/v1/sessions/{session}"),
        "operator",
        Value::Null,
    )
    .await;
    assert_eq!(status, 200);
    let (status, closed) = call(
        &socket,
        "POST",
        &runs,
        "operator",
        run_body("req-2", json!([])),
    )
    .await;
    assert_eq!(
        (status, closed["error"]["code"].clone()),
        (409, json!("session_closed"))
    );
    let mode = std::fs::metadata(&socket).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_re_attaches_after_a_disconnect_without_gap_or_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let mut script = Vec::new();
    for i in 0..12 {
        script.push(json!({"op": "emit", "type": "step", "data": {"i": i}}));
        script.push(json!({"op": "sleep", "ms": 30}));
    }
    let (_, body) = call(
        &socket,
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        "operator",
        run_body("req-1", Value::Array(script)),
    )
    .await;
    let run = body["run"]["id"].as_str().unwrap().to_owned();

    let mut events = Events::open(&socket, &run, None).await;
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let (id, _, _) = events.next().await.unwrap();
        seen.push(id.unwrap());
    }
    drop(events); // the client goes away mid-stream
    let mut events = Events::open(&socket, &run, seen.last().copied()).await;
    loop {
        let (id, kind, data) = events
            .next()
            .await
            .expect("the stream ends with an end event");
        if kind == "end" {
            break;
        }
        assert_eq!(data["sequence"].as_u64(), id);
        seen.push(id.unwrap());
    }
    let expected: Vec<u64> = (0..seen.len() as u64).collect();
    assert_eq!(seen, expected);
    assert!(seen.len() > 12);

    let beyond = seen.len() as u64 + 10;
    let (status, err) = call(
        &socket,
        "GET",
        &format!("/v1/runs/{run}/events?afterSequence={beyond}"),
        "operator",
        Value::Null,
    )
    .await;
    assert_eq!(
        (status, err["error"]["code"].clone()),
        (400, json!("sequence_beyond_end")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_over_the_socket_ends_the_run_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let script = json!([{"op": "emit", "type": "parked", "data": {}}, {"op": "stall"}]);
    let (_, body) = call(
        &socket,
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        "operator",
        run_body("req-1", script),
    )
    .await;
    let run = body["run"]["id"].as_str().unwrap().to_owned();
    let mut events = Events::open(&socket, &run, None).await;
    while events.next().await.unwrap().2["data"]["type"] != "parked" {}
    let (status, body) = call(
        &socket,
        "POST",
        &format!("/v1/runs/{run}/cancel"),
        "operator",
        Value::Null,
    )
    .await;
    assert_eq!(
        (status, body["cancelled"].clone()),
        (200, json!(true)),
        "{body}"
    );
    let ended = wait_state(&socket, &run, "ended").await;
    assert_eq!(ended["result"]["status"], "cancelled");
    let mut kinds = Vec::new();
    while let Some((_, kind, _)) = events.next().await {
        kinds.push(kind.clone());
        if kind == "end" {
            break;
        }
    }
    assert_eq!(kinds.last().map(String::as_str), Some("end"), "{kinds:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_mid_run_is_recovered_at_restart_without_replay() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let mut server = start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let script = json!([
        {"op": "emit_pid"},
        {"op": "call", "tool": "files.write", "arguments": {"path": "effect.txt", "content": "once"}},
        {"op": "emit", "type": "written", "data": {}},
        {"op": "stall"}
    ]);
    let (_, body) = call(
        &socket,
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        "operator",
        run_body("req-1", script.clone()),
    )
    .await;
    let run = body["run"]["id"].as_str().unwrap().to_owned();
    let mut events = Events::open(&socket, &run, None).await;
    let mut plugin_pid = None;
    let mut last = None;
    loop {
        let (id, _, e) = events.next().await.expect("events before the stall");
        last = id.or(last);
        if e["data"]["type"] == "pid" {
            plugin_pid = e["data"]["data"]["pid"].as_i64();
        }
        if e["data"]["type"] == "written" {
            break;
        }
    }
    // SIGKILL: no drain, no cleanup.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    if let Some(pid) = plugin_pid {
        // The plugin we started, orphaned by the kill.
        if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
    let effect = dir
        .path()
        .join("files")
        .join(NAMESPACE)
        .join(AGENT)
        .join("effect.txt");
    assert_eq!(std::fs::read_to_string(&effect).unwrap(), "once");
    std::fs::remove_file(&effect).unwrap();

    let server = start(dir.path());
    let socket = server.socket();
    let run_now = wait_state(&socket, &run, "interrupted").await;
    let recovery = &run_now["recovery"];
    assert_eq!(recovery["reason"], "host_restarted");
    assert_eq!(recovery["calls"][0]["tool"], "files.write");
    assert_eq!(recovery["calls"][0]["outcome"], "succeeded");
    assert_eq!(recovery["interrupted"], json!([]));
    // The journal says so, after the last event the first host stored.
    let mut events = Events::open(&socket, &run, last).await;
    let (_, kind, _) = events.next().await.unwrap();
    assert_eq!(kind, "run.interrupted");
    assert_eq!(events.next().await.unwrap().1, "end");
    // Nothing was re-executed: the deleted effect stays deleted, and a
    // repeat of the request returns the interrupted run.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!effect.exists(), "the effect was replayed");
    let (status, again) = call(
        &socket,
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        "operator",
        run_body("req-1", script),
    )
    .await;
    assert_eq!(
        (status, again["run"]["state"].clone()),
        (200, json!("interrupted"))
    );
    assert!(!effect.exists());
    let store =
        sharedos_store::SqliteStore::open(dir.path().join("sharedos.db"), Default::default())
            .unwrap();
    let writes = sharedos_store::Store::audit_trail(&store, &run)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| {
            r.kind == "tool.invoked" && r.outcome == sharedos_kernel::AuditOutcome::Succeeded
        })
        .count();
    assert_eq!(writes, 1, "one successful write in the audit trail");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_runs_in_flight_before_exiting() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let mut server = start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let script = json!([{"op": "emit", "type": "parked", "data": {}}, {"op": "sleep", "ms": 1500},
                        {"op": "emit", "type": "finished", "data": {}}]);
    let (_, body) = call(
        &socket,
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        "operator",
        run_body("req-1", script),
    )
    .await;
    let run = body["run"]["id"].as_str().unwrap().to_owned();
    let mut events = Events::open(&socket, &run, None).await;
    while events.next().await.unwrap().2["data"]["type"] != "parked" {}
    let pid = rustix::process::Pid::from_raw(server.child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = server.child.wait().unwrap();
    assert!(
        status.success(),
        "serve exits cleanly after the drain: {status:?}"
    );
    let store =
        sharedos_store::SqliteStore::open(dir.path().join("sharedos.db"), Default::default())
            .unwrap();
    let ended = sharedos_store::Store::run(&store, &run).await.unwrap();
    assert_eq!(ended.state, sharedos_store::RunState::Ended);
    assert_eq!(
        ended.result.unwrap()["status"],
        "succeeded",
        "the run finished, not cut off"
    );
    assert!(!socket.exists(), "the socket is removed on exit");
}
