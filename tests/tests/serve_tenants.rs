//! Tenants of `sharedos serve`, at the HTTP boundary of a real server on
//! both stores: tokens added with `sharedos tokens add` bind each tenant's
//! requests to its namespace and authority (another tenant's ids are 404,
//! a header naming another namespace is 403), no or an unknown token is
//! 401 with `WWW-Authenticate: Bearer`, a revoked token is 401 from the
//! next request, the operator's token still names any scope; a store
//! outage during the check is 503, never a pass; a bad token scope is
//! refused by the CLI; a unix peer mapped by `[[serve.peers]]` is bound
//! like a token. TLS: serve_tenants_tls.rs.
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_tests::both_stores;
use sharedos_tests::served::{
    Backend, call_as, run_body, session_spec, start_with, write_config, write_config_with,
};
use sharedos_tests::tenants::{
    OPERATOR, Tcp, add_token, free_port, full_scope, owner_only, start_tcp, store_args, tokens_cli,
};
use sharedos_tests::turns::NAMESPACE;

both_stores!(each_tenant_sees_only_its_own_and_a_revoked_token_is_refused_at_once);

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
    // A second host on the same store, which reads the same tokens.
    let addr_2 = free_port();
    let mut store_2 = store.clone();
    store_2.extend(["--host-id".to_owned(), "host-2".to_owned()]);
    let _server_2 = start_tcp(dir.path(), addr_2, &store_2);
    let tcp_2 = Tcp(addr_2);

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

    // The other host knows A's token and A's session.
    let session_path = format!("/v1/sessions/{session_a}");
    let (status, _, body) = tcp_2
        .call(
            "GET",
            &session_path,
            Some(&a),
            &owner_only("u"),
            Value::Null,
        )
        .await;
    assert_eq!(status, 200, "{body}");

    // Revoked through the CLI (another process): A's very next request is
    // 401 on both hosts; B goes on.
    let (code, out, err) = tokens_cli(dir.path(), &store, &["revoke", &a_id]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), format!("revoked {a_id}"));
    for host in [&tcp, &tcp_2] {
        let (status, challenge, body) = host
            .call(
                "GET",
                &session_path,
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
    }
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

/// `curl` as `uid` over the unix socket: the status and the JSON body.
fn curl_as(uid: u32, socket: &Path, method: &str, path: &str, scope: &Value) -> (u16, Value) {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new("curl");
    command
        .uid(uid)
        .gid(uid)
        .env("HOME", "/nonexistent")
        .args([
            "-q",
            "-s",
            "-w",
            "\n%{http_code}",
            "-X",
            method,
            "--unix-socket",
        ])
        .arg(socket)
        .args(["-H", &format!("Sharedos-Scope: {scope}")]);
    if method == "POST" {
        command.args(["-H", "Content-Type: application/json", "--data"]);
        command.arg(session_spec().to_string());
    }
    let out = command
        .arg(format!("http://sharedos{path}"))
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').expect("a status line");
    (
        status.trim().parse().unwrap_or(0),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

/// Another uid on the socket, which the operator opened to it: mapped in
/// `[[serve.peers]]`, it is bound to its tenant; the socket's owner, not
/// mapped, still names any scope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_uid_mapped_to_a_tenant_is_bound_and_the_unmapped_owner_is_not() {
    use std::os::unix::fs::PermissionsExt;
    const NOBODY: u32 = 65534;
    if !sharedos_tests::needs_root(
        "serve_tenants::another_uid_mapped_to_a_tenant_is_bound_and_the_unmapped_owner_is_not",
        "connecting as another uid (curl run as nobody) needs root",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write_config_with(
        dir.path(),
        &format!(
            "[[serve.peers]]\nuid = {NOBODY}\nnamespaceId = \"tenant-p\"\nauthority = {{ kind = \"service\", serviceId = \"app-p\" }}\n"
        ),
    );
    let db = dir.path().join("sharedos.db").display().to_string();
    let server = start_with(dir.path(), "serve.sock", &["--database", &db]);
    let socket = server.socket();
    // The operator's choice: the socket's directory and the socket open to the peer.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();

    let (status, body) = curl_as(NOBODY, &socket, "POST", "/v1/sessions", &owner_only("u"));
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["session"]["scope"]["namespaceId"], "tenant-p");
    let session = body["session"]["id"].as_str().unwrap().to_owned();
    let theirs = full_scope(NAMESPACE, "test-host", "u");
    let (status, body) = curl_as(NOBODY, &socket, "POST", "/v1/sessions", &theirs);
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (403, json!("scope_not_permitted"))
    );
    let (status, _) = curl_as(NOBODY, &socket, "GET", "/metrics", &owner_only("u"));
    assert_eq!(status, 403);

    // The owner (uid 0 here, unmapped) names the whole scope, any namespace.
    let path = format!("/v1/sessions/{session}");
    let tenant = full_scope("tenant-p", "app-p", "u").to_string();
    let (status, body) = call_as(&socket, "GET", &path, &tenant, Value::Null).await;
    assert_eq!(status, 200, "{body}");
    let owner = owner_only("u").to_string();
    let (status, body) = call_as(&socket, "GET", &path, &owner, Value::Null).await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (400, json!("invalid_scope"))
    );
}
