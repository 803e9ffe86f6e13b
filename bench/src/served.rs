//! Real `sharedos serve` hosts for the `serve` family: their config, their
//! processes (killed and reaped on drop), and an HTTP/1 client over their
//! unix sockets.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sharedos_protocol::EventKind;
use tokio::net::UnixStream;

/// The agent every run of the family is for.
pub const AGENT: &str = "alice";
/// The tenant namespace of every run.
pub const NAMESPACE: &str = "bench";
/// Prepared sandboxes the runtime keeps ahead of turns (the config's
/// maximum).
pub const WARM: u32 = 8;

/// The store the hosts share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    Sqlite,
    Postgres,
}

impl Store {
    pub fn name(self) -> &'static str {
        match self {
            Store::Sqlite => "SQLite",
            Store::Postgres => "PostgreSQL",
        }
    }
}

/// `sharedos` and `sharedos-testplugin` next to the bench's binary `exe`.
pub fn binaries(exe: &Path) -> Result<(PathBuf, PathBuf), String> {
    let sibling = |name: &str| exe.with_file_name(name);
    let (sharedos, testplugin) = (sibling("sharedos"), sibling("sharedos-testplugin"));
    for bin in [&sharedos, &testplugin] {
        if !bin.is_file() {
            return Err(format!(
                "{} is missing: build it with the bench",
                bin.display()
            ));
        }
    }
    Ok((sharedos, testplugin))
}

/// `host.toml` in `dir`: `sharedos-testplugin` as the echo runtime in the
/// full sandbox with [`WARM`] prepared sandboxes, and admission limits
/// high enough that `runs` concurrent runs are never refused.
pub fn write_config(dir: &Path, testplugin: &Path, runs: usize) -> std::io::Result<()> {
    let live = runs.clamp(64, 100_000);
    let serve = format!(
        "[serve]\nmaxLiveRuns = {live}\nmaxLiveRunsPerTenant = {live}\nadmissionQueue = {queue}\n\
         admissionWaitMs = 120000\nmaxConnections = {connections}\n",
        queue = runs * 2,
        connections = (runs * 4).max(1024),
    );
    let config = testplugin_config(
        testplugin,
        60_000,
        &serve,
        "sandbox",
        &format!("[runtimes.sandbox]\nwarm = {WARM}\n"),
    );
    std::fs::write(dir.join("host.toml"), config)
}

/// A `host.toml` of `sharedos-testplugin` (launched by `launcher`) for
/// [`AGENT`], admitted in [`NAMESPACE`], with `sections` after `[host]`
/// and `runtime` after the runtime's entry.
pub fn testplugin_config(
    testplugin: &Path,
    timeout_ms: u64,
    sections: &str,
    launcher: &str,
    runtime: &str,
) -> String {
    format!(
        r#"
[host]
defaultTimeoutMs = {timeout_ms}
auditPath = "audit.jsonl"
filesRoot = "files"

{sections}
[[runtimes]]
id = "sharedos-testplugin"
version = "0.1.0"
program = "{program}"
launcher = "{launcher}"

{runtime}
[[agents]]
agentId = "{AGENT}"
runtime = "sharedos-testplugin"

[[kernel.grants]]
id = "admission"
subject = {{ kind = "agent", agentId = "{AGENT}" }}
issuer = {{ kind = "service", serviceId = "bench" }}
namespaceId = "{NAMESPACE}"
capabilities = [{{ namespace = "sharedos.execution", path = ["agent", "{AGENT}"], scope = "exact", actions = ["invoke"] }}]
"#,
        program = testplugin.display()
    )
}

/// A running `sharedos serve`, killed (SIGKILL) and reaped on drop.
pub struct Host {
    child: Child,
    pub socket: PathBuf,
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Host {
    /// `sharedos serve` as host `id` on `dir/<id>.sock` with `store_args`,
    /// once it listens.
    pub async fn start(
        sharedos: &Path,
        dir: &Path,
        id: &str,
        store_args: &[String],
    ) -> Result<Host, String> {
        let socket = dir.join(format!("{id}.sock"));
        let log =
            std::fs::File::create(dir.join(format!("{id}.log"))).map_err(|e| e.to_string())?;
        let child = Command::new(sharedos)
            .arg("serve")
            .arg("--config")
            .arg(dir.join("host.toml"))
            .arg("--socket")
            .arg(&socket)
            .args(["--host-id", id])
            .args(store_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", sharedos.display()))?;
        let mut host = Host { child, socket };
        let deadline = Instant::now() + Duration::from_secs(60);
        while UnixStream::connect(&host.socket).await.is_err() {
            if let Ok(Some(status)) = host.child.try_wait() {
                let log =
                    std::fs::read_to_string(dir.join(format!("{id}.log"))).unwrap_or_default();
                return Err(format!("sharedos serve ({id}) exited {status}: {log}"));
            }
            if Instant::now() > deadline {
                return Err(format!("sharedos serve ({id}) did not listen within 60 s"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(host)
    }
}

pub fn scope() -> String {
    json!({"namespaceId": NAMESPACE, "authority": {"kind": "service", "serviceId": "bench"},
           "owner": {"kind": "human", "userId": "operator"}})
    .to_string()
}

/// Sends one request on a new connection (retried while the listener's
/// backlog is full); the response's head and body stream.
pub async fn send(
    socket: &Path,
    method: &str,
    path: &str,
    body: &Value,
) -> Result<hyper::Response<Incoming>, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let stream = loop {
        match UnixStream::connect(socket).await {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => return Err(format!("cannot connect: {e}")),
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let bytes = if body.is_null() {
        Bytes::new()
    } else {
        Bytes::from(body.to_string())
    };
    let req = Request::builder()
        .method(method)
        .uri(format!("http://sharedos{path}"))
        .header("sharedos-scope", scope())
        .header("content-type", "application/json")
        .body(Full::new(bytes))
        .map_err(|e| e.to_string())?;
    sender.send_request(req).await.map_err(|e| e.to_string())
}

/// One request and its whole answer: status and JSON body.
pub async fn call(
    socket: &Path,
    method: &str,
    path: &str,
    body: &Value,
) -> Result<(u16, Value), String> {
    let resp = send(socket, method, path, body).await?;
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ))
}

/// The host's `GET /metrics` text.
pub async fn metrics(socket: &Path) -> Result<String, String> {
    let resp = send(socket, "GET", "/metrics", &Value::Null).await?;
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The mean of histogram `name` (with `labels`, e.g. `{operation="x"}`, or
/// empty) in `metrics`, in ms, from its `_sum` and `_count`.
pub fn mean_ms(metrics: &str, name: &str, labels: &str) -> Option<f64> {
    let value = |suffix: &str| {
        let key = format!("sharedos_{name}_{suffix}{labels} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let (sum, count) = (value("sum")?, value("count")?);
    (count > 0.0).then(|| sum / count * 1000.0)
}

/// Opens a session for [`AGENT`]; its id.
pub async fn open_session(socket: &Path) -> Result<String, String> {
    let spec =
        json!({"agentId": AGENT, "purpose": "Measure admission", "enabledToolNamespaces": []});
    let (status, body) = call(socket, "POST", "/v1/sessions", &spec).await?;
    match body["session"]["id"].as_str() {
        Some(id) if status == 201 => Ok(id.to_owned()),
        _ => Err(format!("opening a session: {status} {body}")),
    }
}

/// The body of a run of `script` asked for as `request_id`.
pub fn run_body(request_id: &str, script: Value) -> Value {
    json!({"requestId": request_id, "payload": {"script": script}, "options": {"timeoutMs": 60000}})
}

/// A run's SSE stream, read event by event: `(event, data, arrived)`.
pub struct Events {
    body: Incoming,
    buf: String,
}

impl Events {
    pub async fn open(socket: &Path, run: &str) -> Result<Events, String> {
        let resp = send(
            socket,
            "GET",
            &format!("/v1/runs/{run}/events"),
            &Value::Null,
        )
        .await?;
        if resp.status().as_u16() != 200 {
            return Err(format!("events of {run}: {}", resp.status()));
        }
        Ok(Events {
            body: resp.into_body(),
            buf: String::new(),
        })
    }

    /// The next event, stamped with the wall clock when its block was
    /// complete; `None` at the end of the stream.
    pub async fn next(&mut self) -> Option<(String, Value, std::time::SystemTime)> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let arrived = std::time::SystemTime::now();
                let block: String = self.buf.drain(..end + 2).collect();
                let (mut event, mut data) = (String::new(), Value::Null);
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        event = v.to_owned();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data = serde_json::from_str(v).unwrap_or(Value::Null);
                    }
                }
                return Some((event, data, arrived));
            }
            let frame = self.body.frame().await?.ok()?;
            if let Ok(bytes) = frame.into_data() {
                self.buf.push_str(&String::from_utf8_lossy(&bytes));
            }
        }
    }

    /// Reads to `event: end`: whether the turn completed (a
    /// `turn.completed` event came), or `None` if the stream closed first.
    pub async fn to_end(&mut self) -> Option<bool> {
        let mut completed = false;
        while let Some((event, _, _)) = self.next().await {
            completed |= event == EventKind::TurnCompleted.as_str();
            if event == "end" {
                return Some(completed);
            }
        }
        None
    }
}
