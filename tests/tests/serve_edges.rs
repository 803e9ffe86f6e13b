//! `sharedos serve` at its edges: observation from beyond the end or from
//! before what retention kept (each error names both sequences), a
//! database from a newer sharedos refused at start, and a SIGTERM drain
//! that lets a run in flight go on to its own deadline, no further.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_store::{RunState, SqliteOptions, SqliteStore, Store};
use sharedos_tests::served::{
    Events, call, open_session, run_body, start, start_with, wait_state, write_config,
};
use sharedos_tests::turns::workspace_bin;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observing_past_the_end_or_before_retention_names_both_sequences() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let db = dir.path().join("sharedos.db");
    let server = start_with(
        dir.path(),
        "serve.sock",
        &["--database", db.to_str().unwrap(), "--keep-events", "3"],
    );
    let socket = server.socket();
    let session = open_session(&socket).await;
    let script: Vec<Value> = (0..6)
        .map(|i| json!({"op": "emit", "type": "step", "data": {"i": i}}))
        .collect();
    let (_, body) = call(
        &socket,
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        "operator",
        run_body("r", Value::Array(script)),
    )
    .await;
    let run = body["run"]["id"].as_str().unwrap().to_owned();
    let ended = wait_state(&socket, &run, "ended").await;
    let dropped = ended["droppedThrough"]
        .as_u64()
        .expect("retention dropped some");
    let last = dropped + 3;
    let events = |after: u64| {
        let socket = socket.clone();
        let run = run.clone();
        async move {
            call(
                &socket,
                "GET",
                &format!("/v1/runs/{run}/events?afterSequence={after}"),
                "operator",
                Value::Null,
            )
            .await
        }
    };

    let (status, err) = events(last + 5).await;
    assert_eq!(
        (status, &err["error"]["code"]),
        (400, &json!("sequence_beyond_end"))
    );
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("afterSequence {}", last + 5))
            && message.contains(&format!("last sequence: {last}")),
        "{message}"
    );

    let (status, err) = events(dropped - 1).await;
    assert_eq!(
        (status, &err["error"]["code"]),
        (410, &json!("sequence_dropped"))
    );
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("through sequence {dropped}"))
            && message.contains(&format!("asked for {}", dropped - 1)),
        "{message}"
    );

    // From the last dropped sequence on, the kept events, then the end.
    let mut stream = Events::open(&socket, &run, Some(dropped)).await;
    let mut ids = Vec::new();
    while let Some((id, kind, _)) = stream.next().await {
        if kind == "end" {
            break;
        }
        ids.push(id.unwrap());
    }
    assert_eq!(ids, (dropped + 1..=last).collect::<Vec<_>>());
}

#[test]
fn a_database_from_a_newer_sharedos_is_refused_at_start_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let db = dir.path().join("sharedos.db");
    drop(SqliteStore::open(&db, SqliteOptions::default()).unwrap());
    let conn = rusqlite::Connection::open(&db).unwrap();
    let newer = sharedos_store::SCHEMA_VERSION + 1;
    conn.pragma_update(None, "user_version", newer).unwrap();
    drop(conn);
    let before = std::fs::read(&db).unwrap();
    let out = Command::new(workspace_bin("sharedos"))
        .args(["serve", "--config"])
        .arg(dir.path().join("host.toml"))
        .arg("--socket")
        .arg(dir.path().join("serve.sock"))
        .arg("--database")
        .arg(&db)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("schema version {newer}")) && err.contains("run a newer sharedos"),
        "{err}"
    );
    assert!(!dir.path().join("serve.sock").exists(), "never listened");
    assert_eq!(std::fs::read(&db).unwrap(), before, "never written to");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_a_run_that_stalls_to_its_own_deadline() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let mut server = start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let mut body = run_body(
        "stalls",
        json!([{"op": "emit", "type": "parked", "data": {}}, {"op": "stall"}]),
    );
    body["options"]["timeoutMs"] = json!(3000);
    let (_, body) = call(
        &socket,
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        "operator",
        body,
    )
    .await;
    let run = body["run"]["id"].as_str().unwrap().to_owned();
    let mut events = Events::open(&socket, &run, None).await;
    while events.next().await.unwrap().2["data"]["type"] != "parked" {}
    let signalled = Instant::now();
    let pid = rustix::process::Pid::from_raw(server.child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = server.child.wait().unwrap();
    let waited = signalled.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(
        waited < Duration::from_secs(60),
        "the drain stops at the run's deadline, not never: {waited:?}"
    );
    let store =
        SqliteStore::open(dir.path().join("sharedos.db"), SqliteOptions::default()).unwrap();
    let ended = store.run(&run).await.unwrap();
    assert_eq!(
        ended.state,
        RunState::Ended,
        "ended by the drain, not left in flight"
    );
    let result = ended.result.unwrap();
    assert_eq!(
        result["status"], "cancelled",
        "its deadline ended it: {result}"
    );
    let at = |key: &str| {
        sharedos_protocol::Timestamp::parse(result[key].as_str().unwrap())
            .unwrap()
            .to_offset()
    };
    let ran = (at("completedAt") - at("startedAt")).whole_milliseconds();
    assert!(
        ran >= 2900,
        "the drain let the run go on to its deadline, not cut it off at SIGTERM: {ran} ms"
    );
}
