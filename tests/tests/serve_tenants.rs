//! Tenants of `sharedos serve`, at the HTTP boundary of a real server on
//! both stores: tokens added with `sharedos tokens add` bind each tenant's
//! requests to its namespace and authority (another tenant's ids are 404,
//! a header naming another namespace is 403), no or an unknown token is
//! 401 with `WWW-Authenticate: Bearer`, a revoked token is 401 from the
//! next request, the operator's token still names any scope; TLS with a
//! self-signed certificate; plain TCP refused off loopback; a unix peer
//! mapped by `[[serve.peers]]` bound like a token.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sharedos_tests::both_stores;
use sharedos_tests::served::{
    Backend, call_as, run_body, session_spec, start_with, write_config, write_config_with,
};
use sharedos_tests::turns::{NAMESPACE, workspace_bin};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

const OPERATOR: &str = "operator-secret-0123456789abcdef0123456789";

both_stores!(each_tenant_sees_only_its_own_and_a_revoked_token_is_refused_at_once);

/// The store flags of `sharedos serve` and `sharedos tokens` for `backend`.
fn store_args(backend: &Backend, dir: &Path) -> Vec<String> {
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
fn tokens_cli(dir: &Path, store: &[String], action: &[&str]) -> (i32, String, String) {
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
fn add_token(dir: &Path, store: &[String], namespace: &str, service: &str) -> (String, String) {
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

fn free_port() -> SocketAddr {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// `sharedos serve --listen addr` with the operator's token and `extra`
/// flags; returns once it accepts connections.
fn start_tcp(dir: &Path, addr: SocketAddr, extra: &[String]) -> Running {
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
    let mut child = Command::new(&command[0])
        .args(&command[1..])
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(dir.join("serve-tcp.log")).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(addr).is_err() {
        if let Some(status) = child.try_wait().unwrap() {
            let log = std::fs::read_to_string(dir.join("serve-tcp.log")).unwrap();
            panic!("sharedos serve exited ({status}): {log}");
        }
        assert!(Instant::now() < deadline, "sharedos serve did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Running(child)
}

/// A `sharedos serve` on TCP, killed (SIGKILL) and reaped on drop.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One request over `io`: status, `WWW-Authenticate`, JSON body.
async fn send_over<S>(io: S, req: Request<Full<Bytes>>) -> (u16, Option<String>, Value)
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

fn request(
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
struct Tcp(SocketAddr);

impl Tcp {
    async fn call(
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

fn owner_only(user: &str) -> Value {
    json!({"owner": {"kind": "human", "userId": user}})
}

fn full_scope(namespace: &str, service: &str, user: &str) -> Value {
    json!({"namespaceId": namespace, "authority": {"kind": "service", "serviceId": service},
           "owner": {"kind": "human", "userId": user}})
}

/// Polls a run (as `token`) until it ended.
async fn ended(tcp: &Tcp, token: &str, run: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _, body) = tcp
            .call(
                "GET",
                &format!("/v1/runs/{run}"),
                Some(token),
                &owner_only("u"),
                Value::Null,
            )
            .await;
        assert_eq!(status, 200, "{body}");
        if body["run"]["state"] == "ended" {
            return body["run"].clone();
        }
        assert!(Instant::now() < deadline, "run {run} never ended: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn each_tenant_sees_only_its_own_and_a_revoked_token_is_refused_at_once(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let store = store_args(&backend, dir.path());
    let (a_id, a) = add_token(dir.path(), &store, NAMESPACE, "test-host");
    let (_, b) = add_token(dir.path(), &store, "tenant-b", "app-b");
    let addr = free_port();
    let _server = start_tcp(dir.path(), addr, &store);
    let tcp = Tcp(addr);

    // Tenant A gives only the owner; the namespace and authority come from its token.
    let (status, _, body) = tcp
        .call(
            "POST",
            "/v1/sessions",
            Some(&a),
            &owner_only("u"),
            session_spec(),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let session_a = body["session"]["id"].as_str().unwrap().to_owned();
    let (status, _, body) = tcp
        .call(
            "POST",
            &format!("/v1/sessions/{session_a}/runs"),
            Some(&a),
            &owner_only("u"),
            run_body("r1", json!([])),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let run_a = body["run"]["id"].as_str().unwrap().to_owned();
    assert!(ended(&tcp, &a, &run_a).await["result"].is_object());
    // Naming its own namespace and authority is allowed too.
    let (status, _, body) = tcp
        .call(
            "GET",
            &format!("/v1/sessions/{session_a}"),
            Some(&a),
            &full_scope(NAMESPACE, "test-host", "u"),
            Value::Null,
        )
        .await;
    assert_eq!(status, 200, "{body}");

    // Tenant B: its own session; A's ids are not found, whatever owner it names.
    let (status, _, body) = tcp
        .call(
            "POST",
            "/v1/sessions",
            Some(&b),
            &owner_only("u"),
            session_spec(),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let session_b = body["session"]["id"].as_str().unwrap().to_owned();
    for path in [
        format!("/v1/sessions/{session_a}"),
        format!("/v1/runs/{run_a}"),
    ] {
        let (status, _, body) = tcp
            .call("GET", &path, Some(&b), &owner_only("u"), Value::Null)
            .await;
        assert_eq!(
            (status, body["error"]["code"].clone()),
            (404, json!("not_found")),
            "{path}: {body}"
        );
    }
    let (status, _, body) = tcp
        .call(
            "POST",
            &format!("/v1/runs/{run_a}/cancel"),
            Some(&b),
            &owner_only("u"),
            json!({}),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    let (status, _, _) = tcp
        .call(
            "GET",
            &format!("/v1/sessions/{session_b}"),
            Some(&a),
            &owner_only("u"),
            Value::Null,
        )
        .await;
    assert_eq!(status, 404);

    // A header naming another namespace or authority is refused, nothing opened.
    let before = backend.rows(dir.path()).await;
    for scope in [
        full_scope(NAMESPACE, "test-host", "u"),
        full_scope("tenant-b", "test-host", "u"),
    ] {
        let (status, _, body) = tcp
            .call("POST", "/v1/sessions", Some(&b), &scope, session_spec())
            .await;
        assert_eq!(
            (status, body["error"]["code"].clone()),
            (403, json!("scope_not_permitted")),
            "{body}"
        );
    }
    assert_eq!(backend.rows(dir.path()).await, before, "nothing written");
    // The host's metrics are the operator's.
    let (status, _, body) = tcp
        .call("GET", "/metrics", Some(&b), &owner_only("u"), Value::Null)
        .await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (403, json!("operator_only"))
    );

    // No token, an unknown one, a lookalike of a real one: 401 with the challenge.
    let unknown = format!("sdt_{}", "0".repeat(64));
    let lookalike = format!("{}x", &a[..a.len() - 1]);
    for token in [
        None,
        Some(unknown.as_str()),
        Some(lookalike.as_str()),
        Some(""),
    ] {
        let (status, challenge, body) = tcp
            .call(
                "GET",
                &format!("/v1/sessions/{session_a}"),
                token,
                &owner_only("u"),
                Value::Null,
            )
            .await;
        assert_eq!(
            (status, challenge.as_deref()),
            (401, Some("Bearer")),
            "{token:?}: {body}"
        );
        assert_eq!(body["error"]["code"], "unauthorized");
    }

    // The operator's token names any scope, A's included.
    let (status, _, body) = tcp
        .call(
            "GET",
            &format!("/v1/runs/{run_a}"),
            Some(OPERATOR),
            &full_scope(NAMESPACE, "test-host", "u"),
            Value::Null,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, _, _) = tcp
        .call(
            "GET",
            &format!("/v1/runs/{run_a}"),
            Some(OPERATOR),
            &full_scope("tenant-b", "app-b", "u"),
            Value::Null,
        )
        .await;
    assert_eq!(
        status, 404,
        "the operator's scope is checked like any other"
    );
    let (status, _, _) = tcp
        .call(
            "GET",
            "/metrics",
            Some(OPERATOR),
            &owner_only("u"),
            Value::Null,
        )
        .await;
    assert_eq!(status, 200);

    // Revoked through the CLI (another process): A's very next request is 401; B goes on.
    let (code, out, err) = tokens_cli(dir.path(), &store, &["revoke", &a_id]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), format!("revoked {a_id}"));
    let (status, challenge, body) = tcp
        .call(
            "GET",
            &format!("/v1/sessions/{session_a}"),
            Some(&a),
            &owner_only("u"),
            Value::Null,
        )
        .await;
    assert_eq!(
        (status, challenge.as_deref()),
        (401, Some("Bearer")),
        "{body}"
    );
    let (status, _, _) = tcp
        .call(
            "GET",
            &format!("/v1/sessions/{session_b}"),
            Some(&b),
            &owner_only("u"),
            Value::Null,
        )
        .await;
    assert_eq!(status, 200);

    // The listing shows the state, never a secret.
    let (code, out, _) = tokens_cli(dir.path(), &store, &["list", "--json"]);
    assert_eq!(code, 0);
    assert!(!out.contains(&a[4..]) && !out.contains(&b[4..]), "{out}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2);
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["id"] == a_id.as_str() && t["revokedAt"].is_string())
    );
}

/// A self-signed certificate for 127.0.0.1, written as PEM in `dir`; the
/// client's root store trusting it alone.
fn self_signed(dir: &Path) -> rustls::RootCertStore {
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    std::fs::write(dir.join("cert.pem"), ck.cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), ck.signing_key.serialize_pem()).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ck.cert.der().clone()).unwrap();
    roots
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_carries_the_tokens_and_a_plain_request_gets_no_answer() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let roots = self_signed(dir.path());
    let store = vec![
        "--database".to_owned(),
        dir.path().join("sharedos.db").display().to_string(),
    ];
    let (_, tenant) = add_token(dir.path(), &store, NAMESPACE, "test-host");
    let addr = free_port();
    let mut flags = store.clone();
    for (flag, file) in [("--tls-cert", "cert.pem"), ("--tls-key", "key.pem")] {
        flags.extend([flag.to_owned(), dir.path().join(file).display().to_string()]);
    }
    let _server = start_tcp(dir.path(), addr, &flags);

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = |token: &str, path: &str, body: Value| {
        let (connector, name) = (connector.clone(), name.clone());
        let req = request(
            if body.is_null() { "GET" } else { "POST" },
            path,
            Some(token),
            &owner_only("u"),
            &body,
        );
        async move {
            let io = connector
                .connect(name, TcpStream::connect(addr).await.unwrap())
                .await
                .unwrap();
            send_over(io, req).await
        }
    };
    let (status, _, body) = tls(&tenant, "/v1/sessions", session_spec()).await;
    assert_eq!(status, 201, "{body}");
    let session = body["session"]["id"].as_str().unwrap().to_owned();
    let (status, _, body) = tls(OPERATOR, &format!("/v1/sessions/{session}"), Value::Null).await;
    assert_eq!(status, 400, "the operator names the whole scope: {body}");
    let (status, challenge, _) = tls("sdt_wrong", "/v1/health", Value::Null).await;
    assert_eq!((status, challenge.as_deref()), (401, Some("Bearer")));

    // Plain HTTP to the TLS port: the handshake fails, no HTTP answer.
    let io = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .unwrap();
    tokio::spawn(conn);
    let answer = tokio::time::timeout(
        Duration::from_secs(30),
        sender.send_request(request(
            "GET",
            "/v1/health",
            Some(OPERATOR),
            &owner_only("u"),
            &Value::Null,
        )),
    )
    .await
    .expect("the server closes a connection that is not TLS");
    assert!(answer.is_err(), "no HTTP answer in clear: {answer:?}");
}

#[test]
fn plain_tcp_off_loopback_is_refused_before_anything_is_created() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    std::fs::write(dir.path().join("operator.token"), OPERATOR).unwrap();
    let db = dir.path().join("sharedos.db");
    let out = Command::new(workspace_bin("sharedos"))
        .args(["serve", "--config"])
        .arg(dir.path().join("host.toml"))
        .args(["--listen", "0.0.0.0:0", "--token-file"])
        .arg(dir.path().join("operator.token"))
        .arg("--database")
        .arg(&db)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("not a loopback address") && err.contains("--tls-cert"),
        "{err}"
    );
    assert!(!db.exists(), "no store created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapped_unix_peer_is_bound_to_its_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let uid = rustix::process::geteuid().as_raw();
    write_config_with(
        dir.path(),
        &format!(
            "[[serve.peers]]\nuid = {uid}\nnamespaceId = \"tenant-p\"\nauthority = {{ kind = \"service\", serviceId = \"app-p\" }}\n"
        ),
    );
    let db = dir.path().join("sharedos.db").display().to_string();
    let server = start_with(dir.path(), "serve.sock", &["--database", &db]);
    let socket = server.socket();
    let owner = owner_only("u").to_string();

    let (status, body) = call_as(&socket, "POST", "/v1/sessions", &owner, session_spec()).await;
    assert_eq!(status, 201, "{body}");
    let session = body["session"]["id"].as_str().unwrap().to_owned();
    let (status, body) = call_as(
        &socket,
        "GET",
        &format!("/v1/sessions/{session}"),
        &full_scope("tenant-p", "app-p", "u").to_string(),
        Value::Null,
    )
    .await;
    assert_eq!(
        status, 200,
        "the peer's own namespace and authority: {body}"
    );
    let (status, body) = call_as(
        &socket,
        "POST",
        "/v1/sessions",
        &full_scope(NAMESPACE, "test-host", "u").to_string(),
        session_spec(),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (403, json!("scope_not_permitted")),
        "{body}"
    );
    let (status, body) = call_as(&socket, "GET", "/metrics", &owner, Value::Null).await;
    assert_eq!(status, 403, "{body}");
}

#[test]
fn tls_files_that_cannot_serve_refuse_the_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    self_signed(dir.path());
    let other = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    std::fs::write(
        dir.path().join("other-key.pem"),
        other.signing_key.serialize_pem(),
    )
    .unwrap();
    std::fs::write(dir.path().join("not.pem"), "not PEM").unwrap();
    std::fs::write(dir.path().join("operator.token"), OPERATOR).unwrap();
    let db = dir.path().join("sharedos.db");
    for (cert, key, says) in [
        ("missing.pem", "key.pem", "missing.pem"),
        ("not.pem", "key.pem", "no CERTIFICATE"),
        ("cert.pem", "not.pem", "not.pem"),
        ("cert.pem", "other-key.pem", "does not fit the certificate"),
    ] {
        let out = Command::new(workspace_bin("sharedos"))
            .args(["serve", "--config"])
            .arg(dir.path().join("host.toml"))
            .args(["--listen", &free_port().to_string(), "--token-file"])
            .arg(dir.path().join("operator.token"))
            .arg("--tls-cert")
            .arg(dir.path().join(cert))
            .arg("--tls-key")
            .arg(dir.path().join(key))
            .arg("--database")
            .arg(&db)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cert} {key}: {err}");
        assert!(
            err.contains("TLS") && err.contains(says),
            "{cert} {key}: {err}"
        );
        assert!(!db.exists(), "no store created");
    }
}

#[test]
fn a_token_with_a_bad_scope_is_refused_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let store = vec![
        "--database".to_owned(),
        dir.path().join("sharedos.db").display().to_string(),
    ];
    let service = json!({"kind": "service", "serviceId": "app"}).to_string();
    for (namespace, authority, says) in [
        ("", service.as_str(), "--namespace"),
        ("tenant\u{1}", service.as_str(), "control character"),
        (
            "tenant-a",
            "{\"kind\":\"robot\"}",
            "--authority: not an Address",
        ),
        ("tenant-a", "app", "--authority: not an Address"),
    ] {
        let (code, out, err) = tokens_cli(
            dir.path(),
            &store,
            &["add", "--namespace", namespace, "--authority", authority],
        );
        assert_eq!(code, 1, "{namespace:?} {authority}: {out} {err}");
        assert!(err.contains(says), "{err}");
        assert!(out.is_empty(), "no secret printed: {out}");
    }
    let (code, out, _) = tokens_cli(dir.path(), &store, &["list", "--json"]);
    assert_eq!((code, out.trim()), (0, "[]"));
    let (code, _, err) = tokens_cli(dir.path(), &store, &["revoke", "tok_nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("no token \"tok_nope\""), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_refuses_a_tenant_503_never_lets_it_through() {
    let mut db = sharedos_store::cluster::TestDatabase::private()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let store = vec!["--postgres".to_owned(), db.conninfo.clone()];
    let (_, tenant) = add_token(dir.path(), &store, NAMESPACE, "test-host");
    let addr = free_port();
    let _server = start_tcp(dir.path(), addr, &store);
    let tcp = Tcp(addr);
    let (status, _, body) = tcp
        .call(
            "GET",
            "/v1/health",
            Some(&tenant),
            &owner_only("u"),
            Value::Null,
        )
        .await;
    assert_eq!(status, 200, "{body}");

    db.stop();
    let (status, challenge, body) = tcp
        .call(
            "GET",
            "/v1/health",
            Some(&tenant),
            &owner_only("u"),
            Value::Null,
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (503, json!("store_unavailable")),
        "{body}"
    );
    assert_eq!(challenge, None, "not an authentication failure");
    // The operator's token needs no store to be checked.
    let (status, _, body) = tcp
        .call(
            "GET",
            "/metrics",
            Some(OPERATOR),
            &owner_only("u"),
            Value::Null,
        )
        .await;
    assert_eq!(status, 200, "{body}");
}
