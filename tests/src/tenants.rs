//! `sharedos serve` on TCP with tenants: the `sharedos tokens` CLI, a
//! server with the operator's token, and a plain-TCP client that sends a
//! bearer token (docs/SERVE.md, "Tenants").

use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::served::Backend;
use crate::turns::workspace_bin;

/// The operator's token every server of these tests is started with.
pub const OPERATOR: &str = "operator-secret-0123456789abcdef0123456789";

/// The store flags of `sharedos serve` and `sharedos tokens` for `backend`.
pub fn store_args(backend: &Backend, dir: &Path) -> Vec<String> {
    match backend {
        Backend::Sqlite => vec![
            "--database".into(),
            dir.join("sharedos.db").display().to_string(),
        ],
        Backend::Postgres(db) => vec!["--postgres".into(), db.conninfo.clone()],
    }
}

/// `sharedos tokens --config dir/host.toml <store> <action>`: exit code,
/// stdout, stderr.
pub fn tokens_cli(dir: &Path, store: &[String], action: &[&str]) -> (i32, String, String) {
    let out = Command::new(workspace_bin("sharedos"))
        .args(["tokens", "--config"])
        .arg(dir.join("host.toml"))
        .args(store)
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

/// Adds a token; its id and secret.
pub fn add_token(dir: &Path, store: &[String], namespace: &str, service: &str) -> (String, String) {
    let authority = json!({"kind": "service", "serviceId": service}).to_string();
    let (code, out, err) = tokens_cli(
        dir,
        store,
        &[
            "add",
            "--namespace",
            namespace,
            "--authority",
            &authority,
            "--label",
            "test",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let (id, secret) = out.trim().split_once('\t').expect("id<TAB>secret");
    assert!(secret.starts_with("sdt_"), "{out}");
    (id.to_owned(), secret.to_owned())
}

pub fn free_port() -> SocketAddr {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// `sharedos serve --listen addr` with the operator's token and `extra`
/// flags; returns once it accepts connections.
pub fn start_tcp(dir: &Path, addr: SocketAddr, extra: &[String]) -> Running {
    std::fs::write(dir.join("operator.token"), OPERATOR).unwrap();
    let mut command = vec![
        workspace_bin("sharedos").display().to_string(),
        "serve".into(),
        "--config".into(),
        dir.join("host.toml").display().to_string(),
        "--listen".into(),
        addr.to_string(),
        "--token-file".into(),
        dir.join("operator.token").display().to_string(),
    ];
    command.extend(extra.iter().cloned());
    let log = dir.join(format!("serve-tcp-{}.log", addr.port()));
    let mut child = Command::new(&command[0])
        .args(&command[1..])
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(addr).is_err() {
        if let Some(status) = child.try_wait().unwrap() {
            let log = std::fs::read_to_string(&log).unwrap();
            panic!("sharedos serve exited ({status}): {log}");
        }
        assert!(Instant::now() < deadline, "sharedos serve did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Running(child)
}

/// A `sharedos serve` on TCP, killed (SIGKILL) and reaped on drop.
pub struct Running(pub std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One request over `io`: status, `WWW-Authenticate`, JSON body.
pub async fn send_over<S>(io: S, req: Request<Full<Bytes>>) -> (u16, Option<String>, Value)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .unwrap();
    tokio::spawn(conn);
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_owned());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, challenge, body)
}

pub fn request(
    method: &str,
    path: &str,
    token: Option<&str>,
    scope: &Value,
    body: &Value,
) -> Request<Full<Bytes>> {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://sharedos{path}"))
        .header("sharedos-scope", scope.to_string())
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    req.body(Full::new(Bytes::from(body.to_string()))).unwrap()
}

/// A plain-TCP client of one server.
pub struct Tcp(pub SocketAddr);

impl Tcp {
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        scope: &Value,
        body: Value,
    ) -> (u16, Option<String>, Value) {
        let io = TcpStream::connect(self.0).await.unwrap();
        send_over(io, request(method, path, token, scope, &body)).await
    }
}

pub fn owner_only(user: &str) -> Value {
    json!({"owner": {"kind": "human", "userId": user}})
}

pub fn full_scope(namespace: &str, service: &str, user: &str) -> Value {
    json!({"namespaceId": namespace, "authority": {"kind": "service", "serviceId": service},
           "owner": {"kind": "human", "userId": user}})
}
