//! Admission control of `sharedos serve` over its real unix socket: a
//! thousand runs asked for at once against `maxLiveRuns = 50` and a queue
//! of 100 make exactly 50 live runs and 100 waiting requests; the other 850
//! are answered `429 too_many_runs` with `Retry-After`, and nothing is
//! stored for them (their requestId, asked again later, makes a new run).
//! Once the held runs go on, every admitted run ends `succeeded` and the
//! host never held more than 50 at once. A tenant at its own bound does
//! not hold another tenant out. The held runs wait on a file the test
//! creates, so nothing here depends on timing.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sharedos_tests::served::{
    call, call_as, open_session, run_body, start, wait_state, write_config_with,
};
use sharedos_tests::turns::{AGENT, NAMESPACE};
use tokio::net::UnixStream;

/// A run request on a new connection, retried while the server's backlog
/// is full: its status, `Retry-After` and body.
async fn post(
    socket: &Path,
    session: &str,
    request_id: &str,
    script: &Value,
) -> (u16, Option<String>, Value) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let stream = loop {
        match UnixStream::connect(socket).await {
            Ok(s) => break s,
            Err(e) => {
                assert!(Instant::now() < deadline, "cannot connect: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::builder()
        .method("POST")
        .uri(format!("http://sharedos/v1/sessions/{session}/runs"))
        .header("sharedos-scope", sharedos_tests::served::scope("operator"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            run_body(request_id, script.clone()).to_string(),
        )))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, retry_after, serde_json::from_slice(&bytes).unwrap())
}

async fn admission(socket: &Path) -> Value {
    let (status, body) = call(socket, "GET", "/v1/health", "operator", Value::Null).await;
    assert_eq!(status, 200, "{body}");
    body["admission"].clone()
}

/// Polls health until `pred` holds of its admission object.
async fn admission_until(socket: &Path, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let a = admission(socket).await;
        if pred(&a) {
            return a;
        }
        assert!(Instant::now() < deadline, "admission never {what}: {a}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_runs_against_fifty_slots_make_fifty_live_a_hundred_waiting_and_850_refused() {
    sharedos_host::process::raise_fd_limit().expect("raise the soft RLIMIT_NOFILE");
    let dir = tempfile::tempdir().unwrap();
    write_config_with(
        dir.path(),
        "\n[serve]\nmaxLiveRuns = 50\nadmissionQueue = 100\nadmissionWaitMs = 300000\nmaxConnections = 2048\n",
    );
    let server = start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let go = dir.path().join("go");
    let script = json!([{"op": "wait_path", "path": go.to_str().unwrap()}]);

    let mut asked = tokio::task::JoinSet::new();
    for i in 0..1000 {
        let (socket, session, script) = (socket.clone(), session.clone(), script.clone());
        asked.spawn(async move {
            (
                i,
                post(&socket, &session, &format!("req-{i}"), &script).await,
            )
        });
    }
    // 50 admitted at once and 850 refused answer now; 100 wait.
    let (mut admitted, mut refused) = (Vec::new(), Vec::new());
    while admitted.len() + refused.len() < 900 {
        let (i, (status, retry_after, body)) = asked.join_next().await.unwrap().unwrap();
        match status {
            201 => admitted.push(body["run"]["id"].as_str().unwrap().to_owned()),
            429 => {
                assert_eq!(body["error"]["code"], "too_many_runs", "{body}");
                assert_eq!(retry_after.as_deref(), Some("1"), "{body}");
                let message = body["error"]["message"].as_str().unwrap();
                assert!(
                    message.contains("maxLiveRuns") && message.contains("queue is full"),
                    "{message}"
                );
                refused.push(i);
            }
            other => panic!("run {i}: {other} {body}"),
        }
    }
    assert_eq!((admitted.len(), refused.len()), (50, 850));
    let held = admission_until(&socket, "held 50 live and 100 queued", |a| {
        a["queued"] == 100
    })
    .await;
    assert_eq!(held["live"], 50, "{held}");
    assert_eq!(held["refused"], 850, "{held}");

    std::fs::write(&go, b"").unwrap();
    while let Some(joined) = asked.join_next().await {
        let (i, (status, _, body)) = joined.unwrap();
        assert_eq!(status, 201, "run {i}: {body}");
        admitted.push(body["run"]["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(admitted.len(), 150);
    for run in &admitted {
        let ended = wait_state(&socket, run, "ended").await;
        assert_eq!(ended["result"]["status"], "succeeded", "{ended}");
    }
    let after = admission_until(&socket, "emptied", |a| a["live"] == 0).await;
    assert_eq!(after["peakLive"], 50, "{after}");
    assert_eq!(after["queued"], 0, "{after}");

    // Nothing was stored for a refused request: its requestId makes a new
    // run now.
    let (status, _, body) = post(
        &socket,
        &session,
        &format!("req-{}", refused[0]),
        &json!([]),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["repeated"], false, "{body}");
}

fn tenant_scope(namespace: &str) -> String {
    json!({"namespaceId": namespace, "authority": {"kind": "service", "serviceId": "test-host"},
           "owner": {"kind": "human", "userId": "operator"}})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_at_its_bound_is_refused_at_once_and_another_tenant_is_admitted() {
    let dir = tempfile::tempdir().unwrap();
    let other = "quiet";
    write_config_with(
        dir.path(),
        &format!(
            r#"
[serve]
maxLiveRuns = 10
maxLiveRunsPerTenant = 2
admissionQueue = 0

[[kernel.grants]]
id = "admission-quiet"
subject = {{ kind = "agent", agentId = "{AGENT}" }}
issuer = {{ kind = "service", serviceId = "test-host" }}
namespaceId = "{other}"
capabilities = [{{ namespace = "sharedos.execution", path = ["agent", "{AGENT}"], scope = "exact", actions = ["invoke"] }}]
"#
        ),
    );
    let server = start(dir.path());
    let socket = server.socket();
    let busy = open_session(&socket).await;
    let go = dir.path().join("go");
    let hold = json!([{"op": "wait_path", "path": go.to_str().unwrap()}]);
    let mut held = Vec::new();
    for i in 0..2 {
        let (status, _, body) = post(&socket, &busy, &format!("busy-{i}"), &hold).await;
        assert_eq!(status, 201, "{body}");
        held.push(body["run"]["id"].as_str().unwrap().to_owned());
    }
    let (status, retry_after, body) = post(&socket, &busy, "busy-2", &hold).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(NAMESPACE) && message.contains("maxLiveRunsPerTenant"),
        "{message}"
    );

    let quiet = tenant_scope(other);
    let (status, body) = call_as(
        &socket,
        "POST",
        "/v1/sessions",
        &quiet,
        sharedos_tests::served::session_spec(),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let session = body["session"]["id"].as_str().unwrap().to_owned();
    let (status, body) = call_as(
        &socket,
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        &quiet,
        run_body("quiet-0", json!([])),
    )
    .await;
    assert_eq!(status, 201, "{body}");

    std::fs::write(&go, b"").unwrap();
    for run in &held {
        let ended = wait_state(&socket, run, "ended").await;
        assert_eq!(ended["result"]["status"], "succeeded", "{ended}");
    }
    admission_until(&socket, "emptied", |a| a["live"] == 0).await;
    let (status, _, body) = post(&socket, &busy, "busy-2", &json!([])).await;
    assert_eq!(status, 201, "a slot freed admits the tenant again: {body}");
}
