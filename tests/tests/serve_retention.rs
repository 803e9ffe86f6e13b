//! Retention by age (`[serve.retention]`) at `sharedos serve`, on SQLite
//! and on a real PostgreSQL server: the sweep of a host holding its lease
//! deletes the runs ended and the sessions closed longer ago than
//! configured, with their journals, keeps everything younger, and keeps
//! every audit record.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_tests::both_stores;
use sharedos_tests::served::{Backend, call, open_session, run_to_end, write_config_with};

both_stores!(the_sweep_deletes_what_is_older_than_retention_and_keeps_the_audit);

const RETENTION: &str = "[serve.retention]\nendedRunsDays = 7\nclosedSessionsDays = 30\n";

/// An RFC 3339 time `days` days ago.
fn days_ago(days: i64) -> String {
    (time::OffsetDateTime::now_utc() - time::Duration::days(days))
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

async fn audit_of(backend: &Backend, dir: &Path, run: &str) -> i64 {
    let sql =
        format!("SELECT CAST(COUNT(*) AS BIGINT) FROM audit_records WHERE trace_id = '{run}'");
    backend.count(dir, &sql).await
}

async fn the_sweep_deletes_what_is_older_than_retention_and_keeps_the_audit(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    write_config_with(dir.path(), RETENTION);
    let script = json!([{"op": "call", "tool": "files.write", "arguments": {"path": "t.txt", "content": "1"}}]);
    let (open, closed_long_ago, closed_lately, runs) = {
        let server = backend.start(dir.path());
        let socket = server.socket();
        let open = open_session(&socket).await;
        let old_closed = open_session(&socket).await;
        let new_closed = open_session(&socket).await;
        let mut runs = Vec::new();
        for (session, request) in [
            (&open, "old"),
            (&open, "young"),
            (&old_closed, "a"),
            (&new_closed, "b"),
        ] {
            let run = run_to_end(&socket, session, request, script.clone()).await;
            runs.push(run["id"].as_str().unwrap().to_owned());
        }
        for session in [&old_closed, &new_closed] {
            let (status, _) = call(
                &socket,
                "DELETE",
                &format!("/v1/sessions/{session}"),
                "operator",
                Value::Null,
            )
            .await;
            assert_eq!(status, 200);
        }
        (open, old_closed, new_closed, runs)
    };
    // Time passes, behind the stopped server: the first run ended 8 days
    // ago (past 7), the second 6 (within); one session closed 31 days ago
    // (past 30), the other 29.
    let sql = format!(
        "UPDATE runs SET ended_at = '{}' WHERE id = '{}'; UPDATE runs SET ended_at = '{}' WHERE id = '{}'; \
         UPDATE sessions SET closed_at = '{}' WHERE id = '{closed_long_ago}'; \
         UPDATE sessions SET closed_at = '{}' WHERE id = '{closed_lately}';",
        days_ago(8),
        runs[0],
        days_ago(6),
        runs[1],
        days_ago(31),
        days_ago(29)
    );
    backend.execute(dir.path(), &sql).await;
    let audits: Vec<i64> = {
        let mut a = Vec::new();
        for run in &runs {
            a.push(audit_of(&backend, dir.path(), run).await);
        }
        a
    };
    assert!(audits.iter().all(|n| *n > 0), "{audits:?}");
    assert_eq!(backend.rows(dir.path()).await, (3, 4));

    let server = backend.start(dir.path());
    let socket = server.socket();
    let deadline = Instant::now() + Duration::from_secs(60);
    while backend.rows(dir.path()).await != (2, 2) {
        assert!(
            Instant::now() < deadline,
            "no sweep: {:?}",
            backend.rows(dir.path()).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let status = |path: String| {
        let socket = socket.clone();
        async move { call(&socket, "GET", &path, "operator", Value::Null).await.0 }
    };
    assert_eq!(
        status(format!("/v1/runs/{}", runs[0])).await,
        404,
        "ended 8 days ago"
    );
    assert_eq!(
        status(format!("/v1/runs/{}", runs[1])).await,
        200,
        "ended 6 days ago"
    );
    assert_eq!(status(format!("/v1/sessions/{closed_long_ago}")).await, 404);
    assert_eq!(
        status(format!("/v1/runs/{}", runs[2])).await,
        404,
        "with its session"
    );
    assert_eq!(status(format!("/v1/sessions/{closed_lately}")).await, 200);
    assert_eq!(status(format!("/v1/runs/{}", runs[3])).await, 200);
    assert_eq!(status(format!("/v1/sessions/{open}")).await, 200);
    let journal = format!(
        "SELECT CAST(COUNT(*) AS BIGINT) FROM run_events WHERE run_id IN ('{}', '{}')",
        runs[0], runs[2]
    );
    assert_eq!(
        backend.count(dir.path(), &journal).await,
        0,
        "their journals too"
    );
    for (run, before) in runs.iter().zip(&audits) {
        assert_eq!(
            audit_of(&backend, dir.path(), run).await,
            *before,
            "the audit is kept"
        );
    }
}
