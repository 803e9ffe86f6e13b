//! Host leases and their epochs, against both backends: a new process
//! under a host id fences the old one; an expired lease is taken over
//! once, by another host, in one transaction, and its holder writes
//! nothing more (journal, run end, audit, `maxUses`, admission); a renewed
//! lease is never taken over; a version 2 database migrates forward with
//! its in-flight hosts' leases expired.

#[macro_use]
mod backend;

use std::sync::Arc;
use std::time::Duration;

use backend::Backend;
use backend::records::{self, event};
use serde_json::json;
use sharedos_kernel::{AuditKind, AuditOutcome, AuditRecord, AuditSource};
use sharedos_protocol::Timestamp;
use sharedos_store::{
    MIGRATIONS, NewRun, POSTGRES_MIGRATIONS, RunState, SessionRecord, Store, StoreError,
};

both!(a_new_process_under_the_same_host_id_fences_the_old_one);
both!(an_expired_lease_is_taken_over_once_by_another_host);
both!(a_renewed_lease_is_never_taken_over);
both!(a_version_2_database_migrates_forward_with_in_flight_hosts_expired);

const LONG: Duration = Duration::from_secs(120);

fn at() -> Timestamp {
    Timestamp::parse("2026-12-01T01:00:00Z").unwrap()
}

fn session() -> SessionRecord {
    records::session("s1")
}

fn new_run(id: &str, host: &str) -> NewRun {
    records::new_run(id, &format!("req-{id}"), "d", host)
}

fn record(trace: &str, kind: AuditKind, outcome: AuditOutcome, op: &str) -> AuditRecord {
    let context = records::context(trace);
    let mut r = AuditRecord::new(kind, outcome, &context, AuditSource::Kernel);
    r.operation_id = Some(op.into());
    r.tool = Some("files.write".into());
    r
}

fn decision(trace: &str, op: &str) -> AuditRecord {
    record(
        trace,
        AuditKind::AuthorizationChecked,
        AuditOutcome::Allowed,
        op,
    )
}

fn is_fenced(e: &StoreError, host: &str) -> bool {
    matches!(e, StoreError::Fenced { host_id, .. } if host_id == host)
}

/// Every write a fenced store may try for `run` is refused, and none of
/// them landed.
async fn assert_writes_refused(fenced: &dyn Store, reader: &dyn Store, host: &str, run: &str) {
    let trail = reader.audit_trail(run).await.unwrap().len();
    let err = fenced.append_event(run, &event(run, 50)).await.unwrap_err();
    assert!(is_fenced(&err, host), "journal: {err}");
    let err = fenced
        .end_run(run, &json!({"late": true}), "2026-12-01T02:00:00Z")
        .await
        .unwrap_err();
    assert!(is_fenced(&err, host), "run end: {err}");
    let err = fenced.append(&decision(run, "late")).await.unwrap_err();
    assert!(err.to_string().contains("was taken over"), "audit: {err}");
    let err = fenced.try_consume("g-late", 3).await.unwrap_err();
    assert!(err.contains("was taken over"), "maxUses: {err}");
    let err = fenced
        .admit_run(&new_run(&format!("{run}-late"), host))
        .await
        .unwrap_err();
    assert!(is_fenced(&err, host), "admission: {err}");
    let err = fenced.renew_lease().await.unwrap_err();
    assert!(is_fenced(&err, host), "renewal: {err}");
    let err = fenced.take_over_expired(&at()).await.unwrap_err();
    assert!(is_fenced(&err, host), "takeover: {err}");

    assert_eq!(reader.audit_trail(run).await.unwrap().len(), trail);
    let journal = reader.events_after(run, None, 100).await.unwrap();
    assert!(journal.iter().all(|e| e.sequence != 50), "{journal:?}");
    let stored = reader.run(run).await.unwrap();
    assert_eq!(stored.state, RunState::Interrupted);
    assert_eq!(reader.remaining("g-late", 3).await.unwrap(), 3);
    assert!(matches!(
        reader.run(&format!("{run}-late")).await,
        Err(StoreError::NotFound { .. })
    ));
}

async fn a_new_process_under_the_same_host_id_fences_the_old_one(backend: Backend) {
    let old = backend.open().await;
    let first = old.acquire_lease("a", LONG, &at()).await.unwrap();
    assert!(!first.was_live && first.recovered.is_empty());
    old.open_session(&session()).await.unwrap();
    old.admit_run(&new_run("r1", "a")).await.unwrap();
    old.append_event("r1", &event("r1", 0)).await.unwrap();
    old.append(&decision("r1", "call-1")).await.unwrap();
    assert!(old.try_consume("g-live", 2).await.unwrap());
    old.renew_lease().await.unwrap();

    // Its replacement, while the old lease is live: the epoch moves on,
    // the run is reconciled in the same transaction.
    let new = backend.open().await;
    let second = new.acquire_lease("a", LONG, &at()).await.unwrap();
    assert!(second.was_live, "the old lease had not expired");
    assert_eq!(second.lease.epoch, first.lease.epoch + 1);
    assert_eq!(second.recovered.len(), 1);
    assert_eq!(second.recovered[0].reason, "host_restarted");
    assert_eq!(second.recovered[0].interrupted, vec!["call-1".to_owned()]);

    assert_writes_refused(old.as_ref(), new.as_ref(), "a", "r1").await;
    // The new process writes.
    new.renew_lease().await.unwrap();
    assert!(new.try_consume("g-live", 2).await.unwrap());
}

async fn an_expired_lease_is_taken_over_once_by_another_host(backend: Backend) {
    let a = backend.open().await;
    a.acquire_lease("a", Duration::from_millis(400), &at())
        .await
        .unwrap();
    a.open_session(&session()).await.unwrap();
    a.admit_run(&new_run("r1", "a")).await.unwrap();
    a.append_event("r1", &event("r1", 0)).await.unwrap();
    // call-1 finished; call-2 was decided, then the host stopped.
    a.append(&decision("r1", "call-1")).await.unwrap();
    a.append(&record(
        "r1",
        AuditKind::ToolInvoked,
        AuditOutcome::Succeeded,
        "call-1",
    ))
    .await
    .unwrap();
    a.append(&decision("r1", "call-2")).await.unwrap();

    let b = backend.open().await;
    let lease_b = b.acquire_lease("b", LONG, &at()).await.unwrap().lease;
    assert!(
        b.take_over_expired(&at()).await.unwrap().is_empty(),
        "a live lease is not taken over"
    );
    assert_eq!(b.run("r1").await.unwrap().state, RunState::InFlight);

    let taken = wait_for_takeover(b.as_ref()).await;
    assert_eq!(taken.len(), 1);
    let r = &taken[0];
    assert_eq!(
        (r.run_id.as_str(), r.reason, r.host_id.as_str()),
        ("r1", "host_lease_expired", "a")
    );
    assert_eq!(r.recovered_by, "b");
    assert_eq!(r.decisions, 2);
    assert_eq!(r.interrupted, vec!["call-2".to_owned()]);
    assert_eq!(r.last_sequence, Some(0));

    let run = b.run("r1").await.unwrap();
    assert_eq!(run.state, RunState::Interrupted);
    assert_eq!(run.recovery.as_ref().unwrap()["recoveredBy"], "b");
    let trail = b.audit_trail("r1").await.unwrap();
    let last = trail.last().unwrap();
    assert_eq!(
        (last.kind.as_str(), last.outcome, last.reason.as_deref()),
        (
            "tool.invoked",
            AuditOutcome::Interrupted,
            Some("host_lease_expired")
        )
    );
    assert_eq!(trail.len(), 4, "one interrupted outcome added: {trail:?}");
    let journal = b.events_after("r1", Some(0), 10).await.unwrap();
    assert_eq!(journal.len(), 1);
    assert_eq!(journal[0].kind.as_str(), "run.interrupted");

    // A (paused, not dead) comes back: everything it writes is refused.
    assert_writes_refused(a.as_ref(), b.as_ref(), "a", "r1").await;
    // Taken over once: nothing left, and B's own lease is untouched.
    assert!(b.take_over_expired(&at()).await.unwrap().is_empty());
    b.renew_lease().await.unwrap();
    assert_eq!(b.audit_trail("r1").await.unwrap().len(), 4);
    let again = backend.open().await;
    let reacquired = again.acquire_lease("b", LONG, &at()).await.unwrap();
    assert_eq!(reacquired.lease.epoch, lease_b.epoch + 1);
}

/// Takes over until something is taken (the lease expires on the
/// backend's clock); at most 30 s.
async fn wait_for_takeover(store: &dyn Store) -> Vec<sharedos_store::recovery::RecoveredRun> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let taken = store.take_over_expired(&at()).await.unwrap();
        if !taken.is_empty() {
            return taken;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "an expired lease was never taken over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn a_renewed_lease_is_never_taken_over(backend: Backend) {
    let a = backend.open().await;
    a.acquire_lease("a", Duration::from_millis(1500), &at())
        .await
        .unwrap();
    a.open_session(&session()).await.unwrap();
    a.admit_run(&new_run("r1", "a")).await.unwrap();
    let b = backend.open().await;
    b.acquire_lease("b", LONG, &at()).await.unwrap();
    // Renewed every 250 ms for twice the lease's length.
    for i in 0..12u64 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        a.renew_lease().await.unwrap();
        assert!(b.take_over_expired(&at()).await.unwrap().is_empty());
        a.append_event("r1", &event("r1", i)).await.unwrap();
    }
    let ended = a
        .end_run("r1", &json!({"ok": true}), "2026-12-01T00:00:09Z")
        .await
        .unwrap();
    assert_eq!(ended.state, RunState::Ended);
    assert_eq!(a.events_after("r1", None, 100).await.unwrap().len(), 12);
}

/// A database at schema version 2 with a run in flight under `old`.
async fn version_2_database(backend: &Backend) {
    let insert_session = "INSERT INTO sessions (id, agent_id, runtime_id, scope, binding, open, created_at) \
                          VALUES ('s1', 'alice', 'rt', '{}', '{}', TRUE, 't')";
    let insert_run = "INSERT INTO runs (id, session_id, request_id, payload_digest, input, state, host_id, admitted_at) \
                      VALUES ('r-old', 's1', 'q', 'd', '{}', 'in_flight', 'old', 't')";
    match backend {
        Backend::Sqlite(dir) => {
            let conn = rusqlite::Connection::open(dir.path().join("sharedos.db")).unwrap();
            for sql in &MIGRATIONS[..2] {
                conn.execute_batch(sql).unwrap();
            }
            conn.execute_batch(&insert_session.replace("TRUE", "1"))
                .unwrap();
            conn.execute_batch(insert_run).unwrap();
            conn.pragma_update(None, "user_version", 2).unwrap();
        }
        Backend::Postgres(db) => {
            let (client, conn) = tokio_postgres::connect(&db.conninfo, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            client
                .batch_execute("CREATE TABLE sharedos_schema (version BIGINT NOT NULL)")
                .await
                .unwrap();
            for sql in &POSTGRES_MIGRATIONS[..2] {
                client.batch_execute(sql).await.unwrap();
            }
            client
                .batch_execute(&format!(
                    "{insert_session}; {insert_run}; INSERT INTO sharedos_schema VALUES (2)"
                ))
                .await
                .unwrap();
        }
    }
}

async fn a_version_2_database_migrates_forward_with_in_flight_hosts_expired(backend: Backend) {
    version_2_database(&backend).await;
    let b: Arc<dyn Store> = backend.open().await;
    b.acquire_lease("b", LONG, &at()).await.unwrap();
    let taken = b.take_over_expired(&at()).await.unwrap();
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert_eq!(
        (taken[0].run_id.as_str(), taken[0].host_id.as_str()),
        ("r-old", "old")
    );
    assert_eq!(b.run("r-old").await.unwrap().state, RunState::Interrupted);
}

/// Ends every session of the test's database but the caller's, as the
/// server does to a host paused inside a transaction past
/// `idle_in_transaction_session_timeout`, or an operator's
/// `pg_terminate_backend`; returns how many it ended.
async fn end_other_sessions(conninfo: &str) -> i64 {
    let (client, conn) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// The first result of `op` that is not `Unavailable`: the operation that
/// finds the session gone fails so, the next ones connect again (at most
/// 50 tries, so a store that never reconnects fails the test).
async fn past_the_lost_session<T, F, Fut>(mut op: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut last = None;
    for _ in 0..50 {
        match op().await {
            Err(StoreError::Unavailable(why)) => last = Some(why),
            other => return other,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the store never connected again: {last:?}");
}

/// A host whose session the server ended connects again: it serves reads
/// and writes, hears other hosts' notifications again, and, its lease
/// taken over meanwhile, learns so at its next renewal (`Fenced`) instead
/// of failing `Unavailable` forever.
#[tokio::test]
async fn a_postgres_session_the_server_ended_is_made_again_and_finds_its_lease_taken() {
    let db = sharedos_store::cluster::TestDatabase::new().await.unwrap();
    let paused = sharedos_store::PostgresStore::connect(&db.conninfo, None)
        .await
        .unwrap();
    paused.acquire_lease("a", LONG, &at()).await.unwrap();
    paused.open_session(&session()).await.unwrap();
    let mut changes = paused.changes().unwrap();

    assert!(end_other_sessions(&db.conninfo).await >= 1);
    // Another host takes the lease over (a new process under the id).
    let other = sharedos_store::PostgresStore::connect(&db.conninfo, None)
        .await
        .unwrap();
    other.acquire_lease("a", LONG, &at()).await.unwrap();

    let renewed = past_the_lost_session(|| paused.renew_lease()).await;
    assert!(
        matches!(&renewed, Err(e) if is_fenced(e, "a")),
        "the renewal after the session was made again: {renewed:?}"
    );
    // Reads work again on the new session.
    let read = past_the_lost_session(|| paused.session("s1")).await;
    assert_eq!(read.unwrap().id, "s1");
    // And it listens again: a notification sent now reaches it.
    let (client, conn) = tokio_postgres::connect(&db.conninfo, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .batch_execute("NOTIFY sharedos_runs, 'after-the-new-session'")
        .await
        .unwrap();
    let heard = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match changes.recv().await {
                Ok(m) if m == "after-the-new-session" => return m,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("the notifications stopped: {e}"),
            }
        }
    })
    .await;
    assert!(
        heard.is_ok(),
        "no notification after the session was made again"
    );
}
