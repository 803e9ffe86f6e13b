//! TLS for `sharedos serve --listen` (docs/SERVE.md, "Tenants"): a round
//! trip with a self-signed certificate generated here, tokens checked over
//! it, plain HTTP to the TLS port unanswered; TLS files that cannot serve
//! and plain TCP off loopback refuse the start before anything is created.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use serde_json::Value;
use sharedos_tests::served::{session_spec, write_config};
use sharedos_tests::tenants::{
    OPERATOR, add_token, free_port, owner_only, request, send_over, start_tcp,
};
use sharedos_tests::turns::{NAMESPACE, workspace_bin};
use tokio::net::TcpStream;

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
