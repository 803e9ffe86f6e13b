//! The embedded backend: one SQLite file in WAL mode with
//! `synchronous = FULL`, so a commit is on disk when it returns (the audit
//! trail's decision-before-effect rule depends on it).
//!
//! One connection per store, owned by one thread that runs every operation
//! in turn (worker.rs): the store's thread count does not grow with load.
//! Writes that read first (`maxUses`, admission) run in `BEGIN IMMEDIATE`
//! transactions: they hold SQLite's write lock from the start, so two
//! processes sharing the file cannot both take the last use.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde_json::Value;
use sharedos_kernel::{AuditError, AuditRecord, AuditSink, Grant, UsageStore};
use sharedos_protocol::{Address, ExecutionEvent, Timestamp};

mod changes;
mod delete;
mod fence;
mod lease;
mod listing;
mod runs;
mod settle;
mod worker;

use crate::grants::sqlite as grants;
use crate::group::AuditQueue;
use crate::lease::LeaseCell;
use crate::recovery::RecoveredRun;
use crate::tokens::{StoredToken, sqlite as tokens};
use crate::{
    Acquired, Admission, GrantImport, GrantOrigin, MIGRATIONS, NewRun, RunQuery, RunRecord,
    SCHEMA_VERSION, SessionQuery, SessionRecord, Store, StoreError, StoredGrant, SweepQuery, Swept,
};
use runs::{RUN_COLUMNS, admit, end, events, raw_run, read_run, read_session, run_of};

/// How the SQLite store behaves.
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// Events kept per ended run (the latest ones); `None` keeps all.
    pub keep_events_per_run: Option<u64>,
    /// How long a write waits for another process's lock before the
    /// store reports itself unavailable.
    pub busy_timeout: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            keep_events_per_run: None,
            busy_timeout: Duration::from_secs(5),
        }
    }
}

/// The SQLite store.
#[derive(Clone)]
pub struct SqliteStore {
    worker: Arc<worker::Worker>,
    /// Started on the first subscription (changes.rs).
    changes: Arc<OnceLock<tokio::sync::broadcast::Sender<String>>>,
    path: PathBuf,
    lease: LeaseCell,
    /// Audit records waiting for their group commit.
    audit: AuditQueue,
}

pub(crate) fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

/// Creates a missing database file with mode 0600, whatever the umask;
/// SQLite gives its `-wal` and `-shm` files the database file's mode. An
/// existing file is left as it is (`serve` checks it: docs/STORE.md).
fn create_owner_only(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    let file = match created {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => {
            return Err(unavailable(format!(
                "cannot create {}: {e}",
                path.display()
            )));
        }
    };
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(|e| unavailable(format!("cannot restrict {} to 0600: {e}", path.display())))
}

impl SqliteStore {
    /// Opens (creating) the database, applies pending migrations, and
    /// refuses a database written by a newer sharedos.
    pub fn open(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        create_owner_only(&path)?;
        let mut conn = Connection::open(&path)
            .map_err(|e| unavailable(format!("cannot open {}: {e}", path.display())))?;
        conn.busy_timeout(options.busy_timeout)
            .map_err(unavailable)?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(unavailable)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(unavailable(format!(
                "{} cannot use WAL mode (got {mode})",
                path.display()
            )));
        }
        conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")
            .map_err(unavailable)?;
        migrate(&mut conn, &path)?;
        Ok(Self {
            worker: Arc::new(worker::Worker::start(conn, options)?),
            changes: Arc::default(),
            path,
            lease: LeaseCell::default(),
            audit: AuditQueue::default(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on the connection's thread.
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection, &SqliteOptions) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.worker.run(f).await
    }
}

/// Applies the migrations the database has not seen, each in its own
/// transaction that also bumps `user_version`.
fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let found: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(unavailable)?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: path.display().to_string(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(unavailable)?;
        tx.execute_batch(sql)
            .map_err(|e| unavailable(format!("migration {}: {e}", i + 1)))?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)
            .map_err(unavailable)?;
        tx.commit().map_err(unavailable)?;
    }
    Ok(())
}

#[async_trait]
impl Store for SqliteStore {
    async fn open_session(&self, session: &SessionRecord) -> Result<(), StoreError> {
        let s = session.clone();
        self.with(move |conn, _| {
            conn.execute(
                "INSERT INTO sessions (id, agent_id, runtime_id, scope, binding, open, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6)",
                params![
                    s.id,
                    s.agent_id,
                    s.runtime_id,
                    s.scope.to_string(),
                    s.binding.to_string(),
                    s.created_at
                ],
            )
            .map_err(unavailable)?;
            Ok(())
        })
        .await
    }

    async fn session(&self, id: &str) -> Result<SessionRecord, StoreError> {
        let id = id.to_owned();
        self.with(move |conn, _| read_session(conn, &id)).await
    }

    async fn close_session(&self, id: &str, at: &str) -> Result<(), StoreError> {
        let (id, at) = (id.to_owned(), at.to_owned());
        self.with(move |conn, _| {
            let n = conn
                .execute(
                    "UPDATE sessions SET open = 0, closed_at = COALESCE(closed_at, ?2) WHERE id = ?1",
                    params![id, at],
                )
                .map_err(unavailable)?;
            if n == 0 {
                return Err(StoreError::NotFound { what: "session", id });
            }
            Ok(())
        })
        .await
    }

    async fn list_sessions(&self, query: &SessionQuery) -> Result<Vec<SessionRecord>, StoreError> {
        let query = query.clone();
        self.with(move |conn, _| listing::sessions(conn, &query))
            .await
    }

    async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        let query = query.clone();
        self.with(move |conn, _| listing::runs(conn, &query)).await
    }

    async fn delete_session(&self, id: &str) -> Result<SessionRecord, StoreError> {
        let id = id.to_owned();
        self.with(move |conn, _| delete::session(conn, &id)).await
    }

    async fn sweep(&self, query: &SweepQuery) -> Result<Swept, StoreError> {
        let query = *query;
        self.with(move |conn, _| delete::sweep(conn, &query)).await
    }

    async fn delete_run(&self, id: &str) -> Result<RunRecord, StoreError> {
        let id = id.to_owned();
        self.with(move |conn, _| delete::run(conn, &id)).await
    }

    async fn admit_run(&self, run: &NewRun) -> Result<Admission, StoreError> {
        let (run, lease) = (run.clone(), self.lease.get());
        self.with(move |conn, _| admit(conn, lease.as_ref(), &run))
            .await
    }

    async fn run(&self, id: &str) -> Result<RunRecord, StoreError> {
        let id = id.to_owned();
        self.with(move |conn, _| read_run(conn, &id)).await
    }

    async fn request_cancel(&self, id: &str, at: &str) -> Result<RunRecord, StoreError> {
        let (id, at) = (id.to_owned(), at.to_owned());
        self.with(move |conn, _| {
            conn.execute(
                "UPDATE runs SET cancel_requested_at = COALESCE(cancel_requested_at, ?2) \
                 WHERE id = ?1 AND state = 'in_flight'",
                [&id, &at],
            )
            .map_err(unavailable)?;
            read_run(conn, &id)
        })
        .await
    }

    async fn cancel_requests(&self, host_id: &str) -> Result<Vec<String>, StoreError> {
        let host = host_id.to_owned();
        self.with(move |conn, _| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT id FROM runs WHERE host_id = ?1 AND state = 'in_flight' \
                     AND cancel_requested_at IS NOT NULL",
                )
                .map_err(unavailable)?;
            let rows = stmt
                .query_map([host], |r| r.get::<_, String>(0))
                .map_err(unavailable)?;
            rows.map(|r| r.map_err(unavailable)).collect()
        })
        .await
    }

    async fn end_run(&self, id: &str, result: &Value, at: &str) -> Result<RunRecord, StoreError> {
        let (id, result, at) = (id.to_owned(), result.clone(), at.to_owned());
        let lease = self.lease.get();
        self.with(move |conn, options| {
            let keep = options.keep_events_per_run;
            end(conn, lease.as_ref(), keep, &id, &result, &at)
        })
        .await
    }

    async fn in_flight_runs(&self, host_id: &str) -> Result<Vec<RunRecord>, StoreError> {
        let host = host_id.to_owned();
        self.with(move |conn, _| {
            let mut stmt = conn
                .prepare(&format!(
                    "SELECT {RUN_COLUMNS} FROM runs WHERE host_id = ?1 AND state = 'in_flight' \
                     ORDER BY admitted_at, id"
                ))
                .map_err(unavailable)?;
            let rows = stmt.query_map([host], raw_run).map_err(unavailable)?;
            rows.map(|r| run_of(r.map_err(unavailable)?)).collect()
        })
        .await
    }

    async fn append_event(&self, run_id: &str, event: &ExecutionEvent) -> Result<(), StoreError> {
        let (run_id, event, lease) = (run_id.to_owned(), event.clone(), self.lease.get());
        self.with(move |conn, _| {
            fence::fenced(conn, lease.as_ref(), |tx| insert_event(tx, &run_id, &event))
        })
        .await
    }

    async fn events_after(
        &self,
        run_id: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<ExecutionEvent>, StoreError> {
        let run_id = run_id.to_owned();
        self.with(move |conn, _| events(conn, &run_id, after, limit))
            .await
    }

    async fn add_grant(
        &self,
        grant: &Grant,
        origin: GrantOrigin,
        at: &str,
    ) -> Result<(), StoreError> {
        let (grant, at) = (grant.clone(), at.to_owned());
        self.with(move |conn, _| grants::add(conn, &grant, origin, &at))
            .await
    }

    async fn revoke_grant(&self, id: &str, at: &str) -> Result<bool, StoreError> {
        let (id, at) = (id.to_owned(), at.to_owned());
        self.with(move |conn, _| grants::revoke(conn, &id, &at))
            .await
    }

    async fn grant(&self, id: &str) -> Result<Option<StoredGrant>, StoreError> {
        let id = id.to_owned();
        self.with(move |conn, _| grants::grant(conn, &id)).await
    }

    async fn grants(&self) -> Result<Vec<StoredGrant>, StoreError> {
        self.with(|conn, _| grants::all(conn)).await
    }

    async fn grants_for(
        &self,
        namespace_id: &str,
        subject: &Address,
    ) -> Result<Vec<Grant>, StoreError> {
        let (ns, subject) = (namespace_id.to_owned(), subject.clone());
        self.with(move |conn, _| grants::grants_for(conn, &ns, &subject))
            .await
    }

    async fn import_config_grants(
        &self,
        list: &[Grant],
        at: &str,
    ) -> Result<GrantImport, StoreError> {
        let (list, at) = (list.to_vec(), at.to_owned());
        self.with(move |conn, _| grants::import(conn, &list, &at))
            .await
    }

    async fn add_token(&self, token: &StoredToken) -> Result<(), StoreError> {
        let token = token.clone();
        self.with(move |conn, _| tokens::add(conn, &token)).await
    }

    async fn revoke_token(&self, id: &str, at: &str) -> Result<bool, StoreError> {
        let (id, at) = (id.to_owned(), at.to_owned());
        self.with(move |conn, _| tokens::revoke(conn, &id, &at))
            .await
    }

    async fn tokens(&self) -> Result<Vec<StoredToken>, StoreError> {
        self.with(|conn, _| tokens::all(conn)).await
    }

    async fn token_by_hash(&self, secret_sha256: &str) -> Result<Option<StoredToken>, StoreError> {
        let hash = secret_sha256.to_owned();
        self.with(move |conn, _| tokens::by_hash(conn, &hash)).await
    }

    async fn audit_trail(&self, trace_id: &str) -> Result<Vec<AuditRecord>, StoreError> {
        let trace = trace_id.to_owned();
        self.with(move |conn, _| read_trail(conn, &trace)).await
    }

    async fn settle_effect(
        &self,
        settlement: &crate::effects::Settlement,
    ) -> Result<crate::effects::Settled, StoreError> {
        let (s, lease) = (settlement.clone(), self.lease.get());
        self.with(move |conn, _| settle::settle(conn, lease.as_ref(), &s))
            .await
    }

    /// The empty string after another connection committed (changes.rs);
    /// `None` outside a tokio runtime.
    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        tokio::runtime::Handle::try_current().ok()?;
        let sender = self.changes.get_or_init(|| {
            let (sender, _) = tokio::sync::broadcast::channel(64);
            changes::spawn(Arc::downgrade(&self.worker), sender.clone());
            sender
        });
        Some(sender.subscribe())
    }

    async fn acquire_lease(
        &self,
        host_id: &str,
        duration: Duration,
        at: &Timestamp,
    ) -> Result<Acquired, StoreError> {
        let (host, at) = (host_id.to_owned(), at.clone());
        let acquired = self
            .with(move |conn, _| lease::acquire(conn, &host, duration, &at))
            .await?;
        self.lease.set(acquired.lease.clone());
        Ok(acquired)
    }

    async fn renew_lease(&self) -> Result<(), StoreError> {
        let held = self.lease.required()?;
        self.with(move |conn, _| lease::renew(conn, &held)).await
    }

    async fn take_over_expired(&self, at: &Timestamp) -> Result<Vec<RecoveredRun>, StoreError> {
        let (held, at) = (self.lease.required()?, at.clone());
        self.with(move |conn, _| lease::take_over(conn, &held, &at))
            .await
    }

    async fn release_lease(&self) -> Result<(), StoreError> {
        let held = self.lease.required()?;
        self.with(move |conn, _| lease::release(conn, &held)).await
    }
}

/// The audit records of one trace, in commit order.
pub(crate) fn read_trail(conn: &Connection, trace: &str) -> Result<Vec<AuditRecord>, StoreError> {
    let mut stmt = conn
        .prepare_cached("SELECT record FROM audit_records WHERE trace_id = ?1 ORDER BY seq")
        .map_err(unavailable)?;
    let rows = stmt
        .query_map([trace], |r| r.get::<_, String>(0))
        .map_err(unavailable)?;
    rows.map(|r| serde_json::from_str(&r.map_err(unavailable)?).map_err(corrupt))
        .collect()
}

pub(crate) fn insert_audit(conn: &Connection, r: &AuditRecord) -> Result<(), StoreError> {
    let text = serde_json::to_string(r).map_err(corrupt)?;
    let outcome = serde_json::to_value(r.outcome)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    conn.prepare_cached(
        "INSERT INTO audit_records (id, trace_id, kind, outcome, operation_id, record) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .and_then(|mut s| {
        s.execute(params![
            r.id,
            r.trace_id,
            r.kind.as_str(),
            outcome,
            r.operation_id,
            text
        ])
    })
    .map_err(unavailable)?;
    Ok(())
}

pub(crate) fn insert_event(
    conn: &Connection,
    run_id: &str,
    event: &ExecutionEvent,
) -> Result<(), StoreError> {
    let text = serde_json::to_string(event).map_err(corrupt)?;
    conn.prepare_cached("INSERT INTO run_events (run_id, sequence, event) VALUES (?1, ?2, ?3)")
        .and_then(|mut s| s.execute(params![run_id, event.sequence as i64, text]))
        .map_err(unavailable)?;
    Ok(())
}

/// Group commit (`group.rs`): the append that finds the queue empty sends
/// the commit job to the connection's thread; every record queued by the
/// time it runs goes into one fenced transaction.
#[async_trait]
impl AuditSink for SqliteStore {
    async fn append(&self, record: &AuditRecord) -> Result<(), AuditError> {
        let (pending, first) = self.audit.push(record.clone(), self.lease.get());
        if first {
            let queue = self.audit.clone();
            let sent = self.worker.send(move |conn, _| commit_audit(conn, &queue));
            if let Err(e) = sent {
                self.audit.fail_all(&e.to_string());
            }
        }
        pending.done().await
    }
}

/// Writes every queued audit record, one fenced transaction per lease,
/// and answers each append with its transaction's result.
fn commit_audit(conn: &mut Connection, queue: &AuditQueue) {
    for batch in queue.take() {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fence::fenced(conn, batch.lease.as_ref(), |tx| {
                batch.records().try_for_each(|r| insert_audit(tx, r))
            })
        }))
        .unwrap_or_else(|_| Err(unavailable("an audit commit panicked")));
        batch.answer(result.map_err(|e| e.to_string()));
    }
}

#[async_trait]
impl UsageStore for SqliteStore {
    async fn try_consume(&self, grant_id: &str, max_uses: u64) -> Result<bool, String> {
        let (grant, lease) = (grant_id.to_owned(), self.lease.get());
        self.with(move |conn, _| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(unavailable)?;
            fence::check(&tx, lease.as_ref())?;
            let used: i64 = tx
                .query_row(
                    "SELECT used FROM usage_counters WHERE grant_id = ?1",
                    [&grant],
                    |r| r.get(0),
                )
                .optional()
                .map_err(unavailable)?
                .unwrap_or(0);
            if used as u64 >= max_uses {
                return Ok(false);
            }
            tx.execute(
                "INSERT INTO usage_counters (grant_id, used) VALUES (?1, 1) \
                 ON CONFLICT (grant_id) DO UPDATE SET used = used + 1",
                [&grant],
            )
            .map_err(unavailable)?;
            tx.commit().map_err(unavailable)?;
            Ok(true)
        })
        .await
        .map_err(|e| e.to_string())
    }

    async fn remaining(&self, grant_id: &str, max_uses: u64) -> Result<u64, String> {
        let grant = grant_id.to_owned();
        self.with(move |conn, _| {
            let used: i64 = conn
                .query_row(
                    "SELECT used FROM usage_counters WHERE grant_id = ?1",
                    [&grant],
                    |r| r.get(0),
                )
                .optional()
                .map_err(unavailable)?
                .unwrap_or(0);
            Ok(max_uses.saturating_sub(used as u64))
        })
        .await
        .map_err(|e| e.to_string())
    }
}
