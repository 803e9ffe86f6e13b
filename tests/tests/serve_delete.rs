//! Deleting runs and sessions at `sharedos serve`'s HTTP boundary, on
//! SQLite and on a real PostgreSQL server: an ended run goes with its
//! journal, a closed session with its runs, and their audit records stay;
//! a run in flight is `409 run_in_flight`, an open session `409
//! session_open`, another owner's `404`, a hostile id `400`, each deleting
//! nothing.

use std::path::Path;

use serde_json::{Value, json};
use sharedos_tests::both_stores;
use sharedos_tests::served::{Backend, call, open_session, run_to_end, wait_state, write_config};

both_stores!(an_ended_run_is_deleted_with_its_journal_and_its_audit_kept);
both_stores!(a_closed_session_is_purged_with_its_runs_and_their_audit_kept);

async fn delete(socket: &Path, run: &str, user: &str) -> (u16, Value) {
    call(
        socket,
        "DELETE",
        &format!("/v1/runs/{run}"),
        user,
        Value::Null,
    )
    .await
}

/// Journal rows and audit records of `run`, read behind the server.
async fn rows_of(backend: &Backend, dir: &Path, run: &str) -> (i64, i64, i64) {
    let count = |table: &str, column: &str| {
        format!("SELECT CAST(COUNT(*) AS BIGINT) FROM {table} WHERE {column} = '{run}'")
    };
    (
        backend.count(dir, &count("runs", "id")).await,
        backend.count(dir, &count("run_events", "run_id")).await,
        backend
            .count(dir, &count("audit_records", "trace_id"))
            .await,
    )
}

async fn an_ended_run_is_deleted_with_its_journal_and_its_audit_kept(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = backend.start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let script = json!([{"op": "call", "tool": "files.write", "arguments": {"path": "d.txt", "content": "1"}}]);
    let ended = run_to_end(&socket, &session, "r", script).await;
    let ended = ended["id"].as_str().unwrap().to_owned();
    let body = json!({"requestId": "held", "payload": {"script": [{"op": "stall"}], "traceFromTurn": true},
                      "options": {"timeoutMs": 600000}});
    let (status, held) = call(
        &socket,
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        "operator",
        body,
    )
    .await;
    assert_eq!(status, 201, "{held}");
    let held = held["run"]["id"].as_str().unwrap().to_owned();

    let (runs, events, audit) = rows_of(&backend, dir.path(), &ended).await;
    assert_eq!(runs, 1);
    assert!(
        events > 0 && audit > 0,
        "a journal and an audit to start with"
    );

    // Refused, and nothing deleted: another owner, a hostile id, a live run.
    let (status, answer) = delete(&socket, &ended, "mallory").await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{answer}"
    );
    for hostile in ["..%2F..%2Fsharedos.db", "%00", &"a".repeat(10_000)] {
        let (status, answer) = delete(&socket, hostile, "operator").await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (400, Some("invalid_id")),
            "{answer}"
        );
    }
    let (status, answer) = delete(&socket, &held, "operator").await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (409, Some("run_in_flight")),
        "{answer}"
    );
    assert_eq!(
        rows_of(&backend, dir.path(), &ended).await,
        (runs, events, audit)
    );
    assert_eq!(backend.rows(dir.path()).await, (1, 2));

    let (status, answer) = delete(&socket, &ended, "operator").await;
    assert_eq!((status, answer), (200, json!({"deleted": ended})));
    assert_eq!(
        rows_of(&backend, dir.path(), &ended).await,
        (0, 0, audit),
        "the audit is kept"
    );
    let (status, _) = call(
        &socket,
        "GET",
        &format!("/v1/runs/{ended}"),
        "operator",
        Value::Null,
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = call(
        &socket,
        "GET",
        &format!("/v1/runs/{ended}/events"),
        "operator",
        Value::Null,
    )
    .await;
    assert_eq!(status, 404);
    let (status, answer) = delete(&socket, &ended, "operator").await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{answer}"
    );

    // The held run, once ended, may go too; the session stays.
    let (status, _) = call(
        &socket,
        "POST",
        &format!("/v1/runs/{held}/cancel"),
        "operator",
        Value::Null,
    )
    .await;
    assert_eq!(status, 200);
    wait_state(&socket, &held, "ended").await;
    let (status, _) = delete(&socket, &held, "operator").await;
    assert_eq!(status, 200);
    assert_eq!(backend.rows(dir.path()).await, (1, 0));
}

async fn a_closed_session_is_purged_with_its_runs_and_their_audit_kept(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = backend.start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let kept = open_session(&socket).await;
    let script = json!([{"op": "call", "tool": "files.write", "arguments": {"path": "p.txt", "content": "1"}}]);
    let mut runs = Vec::new();
    for request in ["a", "b"] {
        let run = run_to_end(&socket, &session, request, script.clone()).await;
        runs.push(run["id"].as_str().unwrap().to_owned());
    }
    run_to_end(&socket, &kept, "other", script).await;
    let body = json!({"requestId": "held", "payload": {"script": [{"op": "stall"}], "traceFromTurn": true},
                      "options": {"timeoutMs": 600000}});
    let (status, held) = call(
        &socket,
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        "operator",
        body,
    )
    .await;
    assert_eq!(status, 201, "{held}");
    let held = held["run"]["id"].as_str().unwrap().to_owned();
    let mut before = Vec::new();
    for run in &runs {
        before.push(rows_of(&backend, dir.path(), run).await);
    }
    let path = format!("/v1/sessions/{session}");
    let purge = format!("{path}?purge=true");
    let code = |answer: &Value| answer["error"]["code"].as_str().map(str::to_owned);

    // Refused, and nothing deleted.
    let (status, answer) = call(&socket, "DELETE", &purge, "operator", Value::Null).await;
    assert_eq!(
        (status, code(&answer)),
        (409, Some("session_open".into())),
        "{answer}"
    );
    let (status, answer) = call(&socket, "DELETE", &path, "operator", Value::Null).await;
    assert_eq!((status, answer), (200, json!({"closed": session})));
    let (status, answer) = call(&socket, "DELETE", &purge, "operator", Value::Null).await;
    assert_eq!(
        (status, code(&answer)),
        (409, Some("run_in_flight".into())),
        "{answer}"
    );
    let (status, answer) = call(&socket, "DELETE", &purge, "mallory", Value::Null).await;
    assert_eq!(
        (status, code(&answer)),
        (404, Some("not_found".into())),
        "{answer}"
    );
    for (query, refusal) in [
        ("?purge=yes", "invalid_query"),
        ("?purge=true&all=1", "unknown_parameter"),
    ] {
        let (status, answer) = call(
            &socket,
            "DELETE",
            &format!("{path}{query}"),
            "operator",
            Value::Null,
        )
        .await;
        assert_eq!(
            (status, code(&answer)),
            (400, Some(refusal.into())),
            "{query}: {answer}"
        );
    }
    let (status, answer) = call(
        &socket,
        "DELETE",
        "/v1/sessions/..%2F?purge=true",
        "operator",
        Value::Null,
    )
    .await;
    assert_eq!(
        (status, code(&answer)),
        (400, Some("invalid_id".into())),
        "{answer}"
    );
    assert_eq!(backend.rows(dir.path()).await, (2, 4));
    for (run, counts) in runs.iter().zip(&before) {
        assert_eq!(rows_of(&backend, dir.path(), run).await, *counts);
    }

    let (status, _) = call(
        &socket,
        "POST",
        &format!("/v1/runs/{held}/cancel"),
        "operator",
        Value::Null,
    )
    .await;
    assert_eq!(status, 200);
    wait_state(&socket, &held, "ended").await;
    let (status, answer) = call(&socket, "DELETE", &purge, "operator", Value::Null).await;
    assert_eq!((status, answer), (200, json!({"deleted": session})));
    assert_eq!(
        backend.rows(dir.path()).await,
        (1, 1),
        "the other session and its run stay"
    );
    for (run, (_, _, audit)) in runs.iter().zip(&before) {
        assert_eq!(
            rows_of(&backend, dir.path(), run).await,
            (0, 0, *audit),
            "the audit is kept"
        );
    }
    for gone in [
        path.clone(),
        format!("{path}/runs"),
        format!("/v1/runs/{}", runs[0]),
    ] {
        let (status, _) = call(&socket, "GET", &gone, "operator", Value::Null).await;
        assert_eq!(status, 404, "{gone}");
    }
    let (status, _) = call(&socket, "DELETE", &purge, "operator", Value::Null).await;
    assert_eq!(status, 404);
}
