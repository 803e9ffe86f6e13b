//! `sharedos serve` as a real process, and a real HTTP client (hyper over
//! its unix socket) for the tests that drive it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::UnixStream;

use crate::turns::{AGENT, NAMESPACE, workspace_bin};

/// A running `sharedos serve`, killed (SIGKILL) and reaped on drop.
pub struct Server {
    pub child: Child,
    socket: PathBuf,
}

impl Server {
    pub fn socket(&self) -> PathBuf {
        self.socket.clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `host.toml` in `dir`: the testplugin (direct launcher) for `alice`,
/// admission and file grants in the `endings` namespace.
pub fn write_config(dir: &Path) {
    write_config_with(dir, "");
}

/// [`write_config`] with `extra` TOML appended (more grants).
pub fn write_config_with(dir: &Path, extra: &str) {
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
{extra}
"#,
        program = workspace_bin("sharedos-testplugin").display()
    );
    std::fs::write(dir.join("host.toml"), config).unwrap();
}

/// `sharedos serve` on `dir/serve.sock` with the SQLite store `dir/sharedos.db`.
pub fn start(dir: &Path) -> Server {
    let db = dir.join("sharedos.db");
    start_with(
        dir,
        "serve.sock",
        &["--database", &db.display().to_string()],
    )
}

/// `sharedos serve` on `dir/<socket>`, with `args` added.
pub fn start_with(dir: &Path, socket: &str, args: &[&str]) -> Server {
    start_command(dir, socket, serve_command(dir, socket, args))
}

/// The command line of `sharedos serve --config dir/host.toml --socket
/// dir/<socket>` with `args` added (to run as it is, or under `sh -c`).
pub fn serve_command(dir: &Path, socket: &str, args: &[&str]) -> Vec<String> {
    let mut command = vec![
        workspace_bin("sharedos").display().to_string(),
        "serve".into(),
        "--config".into(),
        dir.join("host.toml").display().to_string(),
        "--socket".into(),
        dir.join(socket).display().to_string(),
    ];
    command.extend(args.iter().map(|a| a.to_string()));
    command
}

/// Starts `command` (a `sharedos serve` command line, see
/// [`serve_command`]) and waits until it listens on `dir/<socket>`.
pub fn start_command(dir: &Path, socket: &str, command: Vec<String>) -> Server {
    let socket = dir.join(socket);
    let child = Command::new(&command[0])
        .args(&command[1..])
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("serve-{}.log", uuid_ish()))).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(Instant::now() < deadline, "sharedos serve did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Server { child, socket }
}

pub fn uuid_ish() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

pub fn scope(user: &str) -> String {
    json!({"namespaceId": NAMESPACE, "authority": {"kind": "service", "serviceId": "test-host"},
           "owner": {"kind": "human", "userId": user}})
    .to_string()
}

pub async fn send(socket: &Path, req: Request<Full<Bytes>>) -> Response<Incoming> {
    let stream = UnixStream::connect(socket).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender.send_request(req).await.unwrap()
}

pub async fn call(
    socket: &Path,
    method: &str,
    path: &str,
    user: &str,
    body: Value,
) -> (u16, Value) {
    call_as(socket, method, path, &scope(user), body).await
}

/// [`call`] with the whole `Sharedos-Scope` header given.
pub async fn call_as(
    socket: &Path,
    method: &str,
    path: &str,
    scope: &str,
    body: Value,
) -> (u16, Value) {
    let req = Request::builder()
        .method(method)
        .uri(format!("http://sharedos{path}"))
        .header("sharedos-scope", scope)
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
pub type Sse = (Option<u64>, String, Value);

pub struct Events {
    body: Incoming,
    buf: String,
}

impl Events {
    pub async fn open(socket: &Path, run: &str, last_event_id: Option<u64>) -> Events {
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

    pub async fn next(&mut self) -> Option<Sse> {
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

impl Events {
    /// Reads events until one whose data type is `kind`; the plugin pid if
    /// the test plugin's `emit_pid` event came first.
    pub async fn until(&mut self, kind: &str) -> Option<i64> {
        let mut pid = None;
        loop {
            let (_, _, e) = self.next().await.expect("the run's events");
            if e["data"]["type"] == "pid" {
                pid = e["data"]["data"]["pid"].as_i64();
            }
            if e["data"]["type"] == kind {
                return pid;
            }
        }
    }

    /// The kinds of the stream's remaining events, up to `end` included.
    pub async fn kinds_to_end(&mut self) -> Vec<String> {
        let mut kinds = Vec::new();
        while let Some((_, kind, _)) = self.next().await {
            let end = kind == "end";
            kinds.push(kind);
            if end {
                break;
            }
        }
        kinds
    }
}

pub fn session_spec() -> Value {
    json!({"agentId": AGENT, "purpose": "Exercise the server", "enabledToolNamespaces": ["files"],
           "tools": [{"name": "files.write", "description": "w", "namespace": "files", "source": "request",
                      "readWrite": "write", "inputSchema": {},
                      "requiredCapability": {"resource": {"namespace": "files", "path": []}, "action": "write"}},
                     {"name": "files.delete", "description": "d", "namespace": "files", "source": "request",
                      "readWrite": "write", "inputSchema": {},
                      "requiredCapability": {"resource": {"namespace": "files", "path": []}, "action": "delete"}}]})
}

pub fn run_body(request_id: &str, script: Value) -> Value {
    json!({"requestId": request_id, "payload": {"script": script, "traceFromTurn": true},
           "options": {"timeoutMs": 20000}})
}

pub async fn open_session(socket: &Path) -> String {
    let (status, body) = call(socket, "POST", "/v1/sessions", "operator", session_spec()).await;
    assert_eq!(status, 201, "{body}");
    body["session"]["id"].as_str().unwrap().to_owned()
}

pub async fn wait_state(socket: &Path, run: &str, state: &str) -> Value {
    wait_state_as(socket, run, &scope("operator"), state).await
}

/// [`wait_state`] under the whole `Sharedos-Scope` header given.
pub async fn wait_state_as(socket: &Path, run: &str, scope: &str, state: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = call_as(
            socket,
            "GET",
            &format!("/v1/runs/{run}"),
            scope,
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

/// `sharedos grants --config dir/host.toml <store_args> <action>`: its exit
/// code, stdout and stderr.
pub fn grants_cli(dir: &Path, store_args: &[&str], action: &[&str]) -> (i32, String, String) {
    let out = Command::new(workspace_bin("sharedos"))
        .args(["grants", "--config"])
        .arg(dir.join("host.toml"))
        .args(store_args)
        .args(action)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A grant of `actions` on `files` under `alice/<path>` in the test
/// namespace, as JSON for `sharedos grants add`.
pub fn files_grant(id: &str, path: &str, actions: &[&str], max_uses: Option<u64>) -> Value {
    json!({
        "id": id,
        "subject": {"kind": "agent", "agentId": AGENT},
        "issuer": {"kind": "service", "serviceId": "test-host"},
        "namespaceId": NAMESPACE,
        "maxUses": max_uses,
        "capabilities": [{"namespace": "files", "path": [AGENT, path], "scope": "descendants", "actions": actions}],
    })
}

/// The agent's file (or directory) `name` in the files tree of the hosts
/// started under `dir`.
pub fn agent_file(dir: &Path, name: &str) -> PathBuf {
    dir.join("files").join(NAMESPACE).join(AGENT).join(name)
}

/// Posts `script` as a run of `session`, asked for as `request`; the
/// answer's status and body.
pub async fn post_run(socket: &Path, session: &str, request: &str, script: Value) -> (u16, Value) {
    call(
        socket,
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        "operator",
        run_body(request, script),
    )
    .await
}

/// Starts `script` as a run; its id.
pub async fn start_run(socket: &Path, session: &str, request: &str, script: Value) -> String {
    let (status, body) = post_run(socket, session, request, script).await;
    assert_eq!(status, 201, "{body}");
    body["run"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no run id in {body}"))
        .to_owned()
}

/// Starts `script` as a run and waits until it ended; the run.
pub async fn run_to_end(socket: &Path, session: &str, request: &str, script: Value) -> Value {
    let run = start_run(socket, session, request, script).await;
    wait_state(socket, &run, "ended").await
}

/// The store a served host uses in a test: SQLite beside its config, or a
/// fresh database on a real PostgreSQL server.
pub enum Backend {
    Sqlite,
    Postgres(sharedos_store::cluster::TestDatabase),
}

impl Backend {
    /// `sharedos serve` on this store, its socket and config in `dir`.
    pub fn start(&self, dir: &Path) -> Server {
        match self {
            Backend::Sqlite => start(dir),
            Backend::Postgres(db) => start_with(dir, "serve.sock", &["--postgres", &db.conninfo]),
        }
    }

    /// One number `sql` (a `SELECT` of one `BIGINT` value) reads in the
    /// store, behind the server.
    pub async fn count(&self, dir: &Path, sql: &str) -> i64 {
        match self {
            Backend::Sqlite => {
                let conn = rusqlite::Connection::open(dir.join("sharedos.db")).unwrap();
                conn.query_row(sql, [], |r| r.get(0)).unwrap()
            }
            Backend::Postgres(db) => {
                let (client, conn) = tokio_postgres::connect(&db.conninfo, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(conn);
                client.query_one(sql, &[]).await.unwrap().get(0)
            }
        }
    }

    /// Runs `sql` (a change) on the store, behind the server.
    pub async fn execute(&self, dir: &Path, sql: &str) {
        match self {
            Backend::Sqlite => {
                let conn = rusqlite::Connection::open(dir.join("sharedos.db")).unwrap();
                conn.execute_batch(sql).unwrap();
            }
            Backend::Postgres(db) => {
                let (client, conn) = tokio_postgres::connect(&db.conninfo, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(conn);
                client.batch_execute(sql).await.unwrap();
            }
        }
    }

    /// Rows of sessions and runs in the store, read behind the server.
    pub async fn rows(&self, dir: &Path) -> (i64, i64) {
        let count = "SELECT (SELECT COUNT(*) FROM sessions), (SELECT COUNT(*) FROM runs)";
        match self {
            Backend::Sqlite => {
                let conn = rusqlite::Connection::open(dir.join("sharedos.db")).unwrap();
                conn.query_row(count, [], |r| Ok((r.get(0)?, r.get(1)?)))
                    .unwrap()
            }
            Backend::Postgres(db) => {
                let (client, conn) = tokio_postgres::connect(&db.conninfo, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(conn);
                let row = client.query_one(count, &[]).await.unwrap();
                (row.get(0), row.get(1))
            }
        }
    }
}

/// Runs one `async fn(Backend)` test body against each store: a module of
/// the body's name with a `sqlite` and a `postgres` test.
#[macro_export]
macro_rules! both_stores {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name($crate::served::Backend::Sqlite).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let db = sharedos_store::cluster::TestDatabase::new().await.unwrap();
                super::$name($crate::served::Backend::Postgres(db)).await
            }
        }
    };
}
