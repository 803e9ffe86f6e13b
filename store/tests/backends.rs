//! Every store test against both backends: SQLite on real files and a
//! real PostgreSQL server (`sharedos_store::cluster`): migrations,
//! counters, the audit trail, sessions, runs, the journal and recovery.

#[macro_use]
mod backend;

use backend::Backend;
use backend::records::{context, event, new_run, session};
use serde_json::{Value, json};
use sharedos_kernel::{AuditKind, AuditOutcome, AuditRecord, AuditSource};
use sharedos_protocol::Timestamp;
use sharedos_store::cluster::TestDatabase;
use sharedos_store::{
    Admission, PostgresStore, RunState, SCHEMA_VERSION, SqliteOptions, SqliteStore, StoreError,
};

both!(max_uses_is_exact_across_two_connections_and_survives_reopen);
both!(audit_records_are_durable_and_read_back_by_trace);
both!(a_repeated_request_id_returns_the_original_and_a_different_payload_is_refused);
both!(the_journal_replays_in_order_and_names_bad_sequences);
both!(recovery_marks_in_flight_runs_without_replaying_and_only_once);

#[tokio::test]
async fn a_postgres_database_from_a_newer_version_is_refused_at_start() {
    let db = TestDatabase::new().await.unwrap();
    drop(PostgresStore::connect(&db.conninfo, None).await.unwrap());
    let (client, conn) = tokio_postgres::connect(&db.conninfo, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let version: i64 = client
        .query_one("SELECT version FROM sharedos_schema", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, SCHEMA_VERSION, "migrations applied at start");
    client
        .execute("UPDATE sharedos_schema SET version = version + 1", &[])
        .await
        .unwrap();
    let err = PostgresStore::connect(&db.conninfo, None)
        .await
        .err()
        .expect("a newer schema must be refused");
    assert!(matches!(err, StoreError::NewerSchema { found, .. } if found == SCHEMA_VERSION + 1));
}

#[tokio::test]
async fn a_sqlite_database_from_a_newer_version_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    drop(SqliteStore::open(dir.path().join("sharedos.db"), SqliteOptions::default()).unwrap());
    let path = dir.path().join("sharedos.db");
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION, "migrations applied at open");
    conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    drop(conn);
    let err = SqliteStore::open(&path, SqliteOptions::default())
        .err()
        .expect("a newer schema must be refused");
    assert!(matches!(err, StoreError::NewerSchema { found, .. } if found == SCHEMA_VERSION + 1));
    assert!(
        err.to_string()
            .contains("newer than this sharedos supports")
    );
}

async fn max_uses_is_exact_across_two_connections_and_survives_reopen(backend: Backend) {
    let a = backend.open().await;
    let b = backend.open().await;
    let mut tasks = Vec::new();
    for i in 0..40 {
        let s = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            s.try_consume("g-last", 7).await.unwrap()
        }));
    }
    let mut won = 0;
    for t in tasks {
        won += t.await.unwrap() as usize;
    }
    assert_eq!(won, 7, "exactly maxUses consumes win");
    drop((a, b));
    let reopened = backend.open().await;
    assert_eq!(reopened.remaining("g-last", 7).await.unwrap(), 0);
    assert!(!reopened.try_consume("g-last", 7).await.unwrap());
    assert_eq!(reopened.remaining("g-other", 3).await.unwrap(), 3);
}

async fn audit_records_are_durable_and_read_back_by_trace(backend: Backend) {
    let store = backend.open().await;
    let mut r = AuditRecord::new(
        AuditKind::AuthorizationChecked,
        AuditOutcome::Allowed,
        &context("t-1"),
        AuditSource::Kernel,
    );
    r.operation_id = Some("call-1".into());
    store.append(&r).await.unwrap();
    let other = AuditRecord::new(
        AuditKind::TurnEnded,
        AuditOutcome::Succeeded,
        &context("t-2"),
        AuditSource::Kernel,
    );
    store.append(&other).await.unwrap();
    drop(store);
    let trail = backend.open().await.audit_trail("t-1").await.unwrap();
    assert_eq!(trail, vec![r]);
}

async fn a_repeated_request_id_returns_the_original_and_a_different_payload_is_refused(
    backend: Backend,
) {
    let store = backend.open().await;
    store.open_session(&session("s1")).await.unwrap();
    let first = store
        .admit_run(&new_run("r1", "req-1", "d1", "host-a"))
        .await
        .unwrap();
    assert!(matches!(first, Admission::New(ref r) if r.state == RunState::InFlight));
    let again = store
        .admit_run(&new_run("r2", "req-1", "d1", "host-a"))
        .await
        .unwrap();
    assert!(matches!(again, Admission::Existing(ref r) if r.id == "r1"));
    let err = store
        .admit_run(&new_run("r3", "req-1", "d2", "host-a"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::RequestConflict { ref run_id, .. } if run_id == "r1"),
        "the conflict names the original run: {err}"
    );
    assert!(
        store.run("r3").await.is_err(),
        "the conflicting run is not stored"
    );

    let ended = store
        .end_run(
            "r1",
            &json!({"status": "succeeded"}),
            "2026-12-01T00:00:03Z",
        )
        .await
        .unwrap();
    assert_eq!(ended.state, RunState::Ended);
    store
        .close_session("s1", "2026-12-01T00:00:04Z")
        .await
        .unwrap();
    let err = store
        .admit_run(&new_run("r4", "req-2", "d1", "host-a"))
        .await
        .unwrap_err();
    assert_eq!(err, StoreError::SessionClosed("s1".into()));
    drop(store);
    let reopened = backend.open().await;
    let read = reopened.run("r1").await.unwrap();
    assert_eq!(read.result, Some(json!({"status": "succeeded"})));
    let repeat = reopened
        .admit_run(&new_run("r5", "req-1", "d1", "host-a"))
        .await
        .unwrap();
    assert!(
        matches!(repeat, Admission::Existing(ref r) if r.id == "r1"),
        "a repeat after close still returns the original run"
    );
}

async fn the_journal_replays_in_order_and_names_bad_sequences(backend: Backend) {
    let store = backend.open_keeping(Some(3)).await;
    store.open_session(&session("s1")).await.unwrap();
    store
        .admit_run(&new_run("r1", "req-1", "d1", "host-a"))
        .await
        .unwrap();
    for s in 0..6 {
        store.append_event("r1", &event("r1", s)).await.unwrap();
    }
    assert!(
        store.append_event("r1", &event("r1", 2)).await.is_err(),
        "a sequence is stored once"
    );
    let all: Vec<u64> = store
        .events_after("r1", None, 100)
        .await
        .unwrap()
        .iter()
        .map(|e| e.sequence)
        .collect();
    assert_eq!(all, vec![0, 1, 2, 3, 4, 5]);
    let tail: Vec<u64> = store
        .events_after("r1", Some(3), 100)
        .await
        .unwrap()
        .iter()
        .map(|e| e.sequence)
        .collect();
    assert_eq!(tail, vec![4, 5]);
    assert!(
        store
            .events_after("r1", Some(5), 100)
            .await
            .unwrap()
            .is_empty()
    );
    let err = store.events_after("r1", Some(9), 100).await.unwrap_err();
    assert!(
        err.to_string().contains("afterSequence 9") && err.to_string().contains("last sequence: 5"),
        "{err}"
    );
    // 2^63 and more are past the end too, never a wrapped -1 (a replay).
    for huge in [i64::MAX as u64, 1 << 63, u64::MAX] {
        let err = store.events_after("r1", Some(huge), 100).await.unwrap_err();
        assert!(
            matches!(err, StoreError::BeyondEnd { requested, .. } if requested == huge),
            "{huge}: {err}"
        );
    }

    // Retention on end: the last 3 kept, the rest dropped and said so.
    let ended = store.end_run("r1", &json!({}), "t").await.unwrap();
    assert_eq!(ended.dropped_through, Some(2));
    let err = store.events_after("r1", Some(1), 100).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Dropped { dropped_through: 2, ref requested, .. } if requested == "1"),
        "{err}"
    );
    assert!(store.events_after("r1", None, 100).await.is_err());
    let kept: Vec<u64> = store
        .events_after("r1", Some(2), 100)
        .await
        .unwrap()
        .iter()
        .map(|e| e.sequence)
        .collect();
    assert_eq!(kept, vec![3, 4, 5]);
}

async fn recovery_marks_in_flight_runs_without_replaying_and_only_once(backend: Backend) {
    let store = backend.open().await;
    store.open_session(&session("s1")).await.unwrap();
    store
        .admit_run(&new_run("r1", "req-1", "d1", "host-a"))
        .await
        .unwrap();
    store.append_event("r1", &event("r1", 0)).await.unwrap();
    // Call 1 decided and completed; call 2 decided, then the host died.
    for (op, done) in [("call-1", true), ("call-2", false)] {
        let mut d = AuditRecord::new(
            AuditKind::AuthorizationChecked,
            AuditOutcome::Allowed,
            &context("r1"),
            AuditSource::Kernel,
        );
        d.operation_id = Some(op.into());
        d.tool = Some("files.write".into());
        store.append(&d).await.unwrap();
        if done {
            let mut o = AuditRecord::new(
                AuditKind::ToolInvoked,
                AuditOutcome::Succeeded,
                &context("r1"),
                AuditSource::Kernel,
            );
            o.operation_id = Some(op.into());
            store.append(&o).await.unwrap();
        }
    }
    drop(store);
    let store = backend.open().await;
    let at = Timestamp::parse("2026-12-01T01:00:00Z").unwrap();
    // The same host id starting again takes its lease and reconciles.
    let acquired = store
        .acquire_lease("host-a", std::time::Duration::from_secs(60), &at)
        .await
        .unwrap();
    let report = acquired.recovered;
    assert_eq!(report[0].reason, "host_restarted");
    assert_eq!(report[0].epoch, acquired.lease.epoch);
    assert_eq!(report.len(), 1);
    assert_eq!(report[0].interrupted, vec!["call-2".to_owned()]);
    assert_eq!(report[0].decisions, 2);
    let run = store.run("r1").await.unwrap();
    assert_eq!(run.state, RunState::Interrupted);
    assert_eq!(
        run.recovery.as_ref().unwrap()["interrupted"],
        json!(["call-2"])
    );
    let trail = store.audit_trail("r1").await.unwrap();
    let last = trail.last().unwrap();
    assert_eq!(
        (
            last.kind.as_str(),
            last.outcome,
            last.operation_id.as_deref()
        ),
        ("tool.invoked", AuditOutcome::Interrupted, Some("call-2"))
    );
    let events = store.events_after("r1", Some(0), 10).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind.as_str(), "run.interrupted");
    assert_eq!(
        events[0].data["recovery"]["calls"][0]["outcome"],
        Value::from("succeeded")
    );

    // Nothing left to recover at the next start.
    let again = backend.open().await;
    let second = again
        .acquire_lease("host-a", std::time::Duration::from_secs(60), &at)
        .await
        .unwrap();
    assert!(second.recovered.is_empty());
    assert_eq!(second.lease.epoch, acquired.lease.epoch + 1);
    assert_eq!(store.audit_trail("r1").await.unwrap().len(), trail.len());
}

both!(a_cancel_asked_on_another_connection_reaches_the_runs_host_and_wakes_it);

/// One connection asks a cancel of a run another connection's host runs:
/// the run is marked once, the host finds it among its requests (and
/// another host does not), the host's store is woken, and a run that
/// ended is never marked.
async fn a_cancel_asked_on_another_connection_reaches_the_runs_host_and_wakes_it(backend: Backend) {
    let owner = backend.open().await;
    let other = backend.open().await;
    owner.open_session(&session("s1")).await.unwrap();
    for run in ["r1", "r2"] {
        owner
            .admit_run(&new_run(run, &format!("req-{run}"), "d", "host-a"))
            .await
            .unwrap();
    }
    let mut woken = owner.changes().expect("both backends notify");
    assert!(owner.cancel_requests("host-a").await.unwrap().is_empty());

    let asked = other
        .request_cancel("r1", "2026-12-05T00:00:00Z")
        .await
        .unwrap();
    assert_eq!(asked.state, RunState::InFlight);
    assert_eq!(asked.host_id, "host-a");
    // Asked again: still one request.
    other
        .request_cancel("r1", "2026-12-05T00:00:01Z")
        .await
        .unwrap();
    assert_eq!(owner.cancel_requests("host-a").await.unwrap(), ["r1"]);
    assert!(owner.cancel_requests("host-b").await.unwrap().is_empty());
    let message = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            let m = woken.recv().await.unwrap();
            if m == "cancel:r1" || m.is_empty() {
                return m;
            }
        }
    })
    .await
    .expect("the owner's store was woken");
    assert!(message == "cancel:r1" || message.is_empty(), "{message}");

    owner
        .end_run(
            "r1",
            &json!({"status": "cancelled"}),
            "2026-12-05T00:00:02Z",
        )
        .await
        .unwrap();
    assert!(owner.cancel_requests("host-a").await.unwrap().is_empty());
    owner
        .end_run(
            "r2",
            &json!({"status": "succeeded"}),
            "2026-12-05T00:00:03Z",
        )
        .await
        .unwrap();
    let late = other
        .request_cancel("r2", "2026-12-05T00:00:04Z")
        .await
        .unwrap();
    assert_eq!(late.state, RunState::Ended);
    assert!(owner.cancel_requests("host-a").await.unwrap().is_empty());
}
