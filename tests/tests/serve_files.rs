//! Files in and out of a session at `sharedos serve`'s HTTP boundary, on
//! SQLite and on a real PostgreSQL server (docs/SERVE.md, "Files in and
//! out"): bytes round trip (binary, empty, at the limit), one byte over
//! the limit is `413` with nothing written, every traversal form and a
//! planted symlink are refused with nothing written, another owner's or a
//! deleted session is `404`, the session's next run reads an uploaded
//! file through the real `files.read`, and each transfer is audited once
//! with its size and SHA-256.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use serde_json::{Value, json};
use sharedos_tests::both_stores;
use sharedos_tests::served::{
    Backend, agent_file, call, run_to_end, scope, send, write_config_with,
};
use sharedos_tests::turns::AGENT;

both_stores!(files_go_in_and_out_of_a_session_and_nothing_else_is_written);

const LIMIT: usize = 1024;

/// `PUT` (with `body`) or `GET` of `path` under the session's files, as
/// `user`: the status, the body's bytes and its content-length.
async fn file(
    socket: &Path,
    method: &str,
    session: &str,
    path: &str,
    user: &str,
    body: Vec<u8>,
) -> (u16, Vec<u8>, Option<String>) {
    let req = Request::builder()
        .method(method)
        .uri(format!(
            "http://sharedos/v1/sessions/{session}/files/{path}"
        ))
        .header("sharedos-scope", scope(user))
        .header("content-type", "application/octet-stream")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = send(socket, req).await;
    let status = resp.status().as_u16();
    let length = resp
        .headers()
        .get("content-length")
        .map(|v| v.to_str().unwrap().to_owned());
    let bytes = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, bytes, length)
}

fn json_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or(Value::Null)
}

/// The SHA-256 of `bytes` in hex, as coreutils' `sha256sum` gives it.
fn sha256(bytes: &[u8]) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

/// Every entry under `dir`, recursively (names relative to it).
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            out.push(e.path().strip_prefix(dir).unwrap().to_path_buf());
            if e.file_type().unwrap().is_dir() {
                todo.push(e.path());
            }
        }
    }
    out.sort();
    out
}

async fn files_go_in_and_out_of_a_session_and_nothing_else_is_written(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    write_config_with(
        dir.path(),
        &format!("\n[serve]\nmaxUploadBytes = {LIMIT}\n"),
    );
    let server = backend.start(dir.path());
    let socket = server.socket();
    let spec = json!({"agentId": AGENT, "purpose": "Move files", "enabledToolNamespaces": ["files"],
                      "tools": ["files.read", "files.write"]});
    let (status, opened) = call(&socket, "POST", "/v1/sessions", "operator", spec).await;
    assert_eq!(status, 201, "{opened}");
    let session = opened["session"]["id"].as_str().unwrap().to_owned();

    let uploads = round_trips(&socket, &session, dir.path()).await;
    refusals_write_nothing(&socket, &session, dir.path()).await;

    // The session's next run reads an uploaded file with the real tool.
    let text = b"hello from the host application\n".to_vec();
    let (status, _, _) = file(
        &socket,
        "PUT",
        &session,
        "notes/hello.txt",
        "operator",
        text,
    )
    .await;
    assert_eq!(status, 201);
    let script =
        json!([{"op": "call", "tool": "files.read", "arguments": {"path": "notes/hello.txt"}}]);
    let ended = run_to_end(&socket, &session, "read-it", script).await;
    let result = &ended["result"]["output"]["results"][0]["result"];
    assert_eq!(result["status"], json!("succeeded"), "{ended}");
    assert!(
        result
            .to_string()
            .contains("hello from the host application"),
        "{result}"
    );

    let audited = |kind: &str| {
        format!(
            "SELECT CAST(COUNT(*) AS BIGINT) FROM audit_records WHERE trace_id = '{session}' AND kind = '{kind}'"
        )
    };
    assert_eq!(
        backend.count(dir.path(), &audited("file.uploaded")).await,
        uploads + 1
    );
    assert_eq!(
        backend.count(dir.path(), &audited("file.downloaded")).await,
        uploads
    );
    let digest = sha256(&[]);
    let sql = format!(
        "SELECT CAST(COUNT(*) AS BIGINT) FROM audit_records WHERE trace_id = '{session}' \
         AND kind = 'file.uploaded' AND record LIKE '%\"path\":\"empty.bin\"%' AND record LIKE '%{digest}%'"
    );
    assert_eq!(backend.count(dir.path(), &sql).await, 1);

    // Another owner, and the session once deleted, are not found.
    let (status, _, _) = file(
        &socket,
        "GET",
        &session,
        "notes/hello.txt",
        "mallory",
        vec![],
    )
    .await;
    assert_eq!(status, 404);
    let (status, _, _) = file(&socket, "PUT", &session, "m.txt", "mallory", b"x".to_vec()).await;
    assert_eq!(status, 404);
    assert!(!agent_file(dir.path(), "m.txt").exists());
    let path = format!("/v1/sessions/{session}");
    assert_eq!(
        call(&socket, "DELETE", &path, "operator", Value::Null)
            .await
            .0,
        200
    );
    let purge = format!("{path}?purge=true");
    assert_eq!(
        call(&socket, "DELETE", &purge, "operator", Value::Null)
            .await
            .0,
        200
    );
    let (status, _, _) = file(
        &socket,
        "GET",
        &session,
        "notes/hello.txt",
        "operator",
        vec![],
    )
    .await;
    assert_eq!(status, 404);
    let (status, _, _) = file(
        &socket,
        "PUT",
        &session,
        "late.txt",
        "operator",
        b"x".to_vec(),
    )
    .await;
    assert_eq!(status, 404);
    assert!(!agent_file(dir.path(), "late.txt").exists());
}

/// Binary, empty and at-the-limit files go in and come out the same, owner
/// only; returns how many were uploaded (and downloaded).
async fn round_trips(socket: &Path, session: &str, dir: &Path) -> i64 {
    let binary: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 256) as u8).collect();
    let cases = [
        ("bin/data.bin", binary),
        ("empty.bin", Vec::new()),
        ("limit.bin", vec![0xA5; LIMIT]),
    ];
    for (path, bytes) in &cases {
        let (status, body, _) = file(socket, "PUT", session, path, "operator", bytes.clone()).await;
        let answer = json_of(&body);
        assert_eq!(status, 201, "{path}: {answer}");
        assert_eq!(answer["bytes"], json!(bytes.len()), "{answer}");
        assert_eq!(answer["sha256"], json!(sha256(bytes)), "{answer}");
        let on_disk = agent_file(dir, path);
        assert_eq!(&std::fs::read(&on_disk).unwrap(), bytes);
        let mode = std::fs::metadata(&on_disk).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{path}");
        let (status, got, length) = file(socket, "GET", session, path, "operator", vec![]).await;
        assert_eq!(status, 200, "{path}");
        assert_eq!(&got, bytes, "{path}");
        assert_eq!(length, Some(bytes.len().to_string()), "{path}");
    }
    let mode = std::fs::metadata(agent_file(dir, "bin"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700);
    cases.len() as i64
}

/// One byte over the limit is `413`; traversal forms are `400
/// invalid_path`; a symlink planted in the session's files is `400
/// path_not_allowed`; none writes anything.
async fn refusals_write_nothing(socket: &Path, session: &str, dir: &Path) {
    let agent_dir = agent_file(dir, "");
    let outside = dir.join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "secret").unwrap();
    std::os::unix::fs::symlink(&outside, agent_dir.join("link")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret.txt"), agent_dir.join("leaf")).unwrap();
    let before = (tree(&agent_dir), tree(&outside));

    let (status, body, _) = file(
        socket,
        "PUT",
        session,
        "over.bin",
        "operator",
        vec![1; LIMIT + 1],
    )
    .await;
    assert_eq!(
        (status, json_of(&body)["error"]["code"].clone()),
        (413, json!("payload_too_large"))
    );
    let traversals = [
        "../x",
        "a/../x",
        "..",
        "./x",
        "a/./b",
        "a//b",
        "a/",
        "",
        "/abs",
        "%2e%2e/x",
        "%2E%2E%2Fx",
        "a%2Fb",
        "a%2fb",
        "a%5Cb",
        "x%00",
        "a%00b",
        "notes%2F..%2F..%2Fx",
        "%01x",
    ];
    for path in traversals {
        for method in ["PUT", "GET"] {
            let (status, body, _) =
                file(socket, method, session, path, "operator", b"x".to_vec()).await;
            let code = json_of(&body)["error"]["code"].clone();
            assert_eq!(
                (status, code),
                (400, json!("invalid_path")),
                "{method} {path:?}"
            );
        }
    }
    for (method, path) in [
        ("PUT", "link/x.txt"),
        ("PUT", "leaf"),
        ("GET", "leaf"),
        ("GET", "link/secret.txt"),
    ] {
        let (status, body, _) =
            file(socket, method, session, path, "operator", b"x".to_vec()).await;
        let code = json_of(&body)["error"]["code"].clone();
        assert_eq!(
            (status, code),
            (400, json!("path_not_allowed")),
            "{method} {path}"
        );
    }
    assert_eq!(
        (tree(&agent_dir), tree(&outside)),
        before,
        "nothing written"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("secret.txt")).unwrap(),
        "secret"
    );
    std::fs::remove_file(agent_dir.join("link")).unwrap();
    std::fs::remove_file(agent_dir.join("leaf")).unwrap();
}
