//! The PostgreSQL backend, for several hosts sharing one database.
//!
//! Counters are exact under concurrent hosts: a use is one
//! `INSERT … ON CONFLICT DO UPDATE … WHERE used < max` statement, which
//! locks the grant's row and re-checks the bound on its latest version.
//! Admission locks the session's row (`FOR UPDATE`), so two hosts
//! admitting the same requestId serialize. Each journal write and each
//! run end sends `NOTIFY sharedos_runs, '<run id>'` in its transaction;
//! every store listens, so an observer on one host is woken by an event
//! another host committed. Host leases and the writes they fence are in
//! [`lease`].

mod conn;
mod delete;
mod kernel;
mod lease;
mod listing;
mod settle;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sharedos_kernel::{AuditRecord, Grant};
use sharedos_protocol::{Address, ExecutionEvent, Timestamp};
use tokio::sync::broadcast;
use tokio_postgres::{Client, GenericClient, Row};

use crate::grants::postgres as grants;
use crate::lease::LeaseCell;
use crate::recovery::RecoveredRun;
use crate::tokens::{StoredToken, postgres as tokens};
use crate::{
    Acquired, Admission, GrantImport, GrantOrigin, NewRun, POSTGRES_MIGRATIONS, RunQuery,
    RunRecord, RunState, SessionQuery, SessionRecord, Store, StoreError, StoredGrant, SweepQuery,
    Swept,
};

const CHANNEL: &str = "sharedos_runs";
/// Serializes schema migrations between hosts starting together.
const MIGRATION_LOCK: i64 = 0x5348_4152_4544;

/// The PostgreSQL store.
#[derive(Clone)]
pub struct PostgresStore {
    conn: Arc<conn::Connection>,
    keep_events_per_run: Option<u64>,
    lease: LeaseCell,
    /// Audit records waiting for their group commit (`kernel.rs`).
    audit: crate::group::AuditQueue,
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// A PostgreSQL error with the server's own message, when it sent one.
fn pg(e: tokio_postgres::Error) -> StoreError {
    StoreError::Unavailable(pg_text(&e))
}

fn pg_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("PostgreSQL {}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

impl PostgresStore {
    /// Connects (a libpq connection string, e.g. `host=/run/pg dbname=sharedos
    /// user=sharedos`), applies pending migrations, refuses a newer schema,
    /// and starts listening for other hosts' changes.
    pub async fn connect(
        config: &str,
        keep_events_per_run: Option<u64>,
    ) -> Result<Self, StoreError> {
        let (changes, _) = broadcast::channel(4096);
        let mut client = conn::Connection::connect(config, &changes).await?;
        // Migrating waits on the other hosts' migrations as long as they
        // take; only then are lock waits bounded.
        migrate(&mut client, config).await?;
        conn::Connection::ready(&client).await?;
        Ok(Self {
            conn: Arc::new(conn::Connection::new(config, client, changes)),
            keep_events_per_run,
            audit: crate::group::AuditQueue::default(),
            lease: LeaseCell::default(),
        })
    }
}

/// How long a statement waits for a lock another session holds (a table
/// locked by an operator, a row held by a stuck transaction) before it
/// fails `StoreError::Unavailable`: the same 5 s as SQLite's busy timeout.
/// Without it a write would wait forever with the store's one connection,
/// and every turn of the host behind it.
pub const LOCK_TIMEOUT: &str = "5s";

/// How long a transaction of this host may sit idle before the server
/// ends its session: a host paused (SIGSTOP, a frozen VM) inside a
/// transaction would otherwise hold its lease row, and every other host's
/// takeover of it, for as long as it is paused.
pub const IDLE_IN_TRANSACTION_TIMEOUT: &str = "10s";

/// Sets `lock_timeout` and `idle_in_transaction_session_timeout` for this
/// connection unless the connection string set them (`options='-c
/// lock_timeout=…'`), which is kept.
async fn bound_lock_waits(client: &Client) -> Result<(), StoreError> {
    for (setting, bound) in [
        ("lock_timeout", LOCK_TIMEOUT),
        (
            "idle_in_transaction_session_timeout",
            IDLE_IN_TRANSACTION_TIMEOUT,
        ),
    ] {
        let current: String = client
            .query_one(&format!("SHOW {setting}"), &[])
            .await
            .map_err(pg)?
            .get(0);
        if current == "0" {
            client
                .batch_execute(&format!("SET {setting} = '{bound}'"))
                .await
                .map_err(pg)?;
        }
    }
    Ok(())
}

async fn migrate(client: &mut Client, config: &str) -> Result<(), StoreError> {
    let tx = client.transaction().await.map_err(pg)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(pg)?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS sharedos_schema (version BIGINT NOT NULL)")
        .await
        .map_err(pg)?;
    let found: i64 = tx
        .query_opt("SELECT version FROM sharedos_schema", &[])
        .await
        .map_err(pg)?
        .map_or(0, |r| r.get(0));
    let supported = POSTGRES_MIGRATIONS.len() as i64;
    if found > supported {
        return Err(StoreError::NewerSchema {
            path: redact(config),
            found,
            supported,
        });
    }
    for (i, sql) in POSTGRES_MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.batch_execute(sql)
            .await
            .map_err(|e| unavailable(format!("migration {}: {}", i + 1, pg_text(&e))))?;
    }
    if found < supported {
        tx.execute("DELETE FROM sharedos_schema", &[])
            .await
            .map_err(pg)?;
        tx.execute(
            "INSERT INTO sharedos_schema (version) VALUES ($1)",
            &[&supported],
        )
        .await
        .map_err(pg)?;
    }
    tx.commit().await.map_err(pg)
}

/// The connection string without its password, for error messages.
fn redact(config: &str) -> String {
    config
        .split_whitespace()
        .filter(|kv| !kv.starts_with("password="))
        .collect::<Vec<_>>()
        .join(" ")
}

const RUN_COLUMNS: &str = "id, session_id, request_id, payload_digest, input, state, host_id, \
     result, recovery, dropped_through, admitted_at, ended_at";

fn run_of(row: &Row) -> Result<RunRecord, StoreError> {
    let text = |i: usize| -> Result<Option<Value>, StoreError> {
        row.get::<_, Option<String>>(i)
            .map(|t| serde_json::from_str(&t).map_err(corrupt))
            .transpose()
    };
    Ok(RunRecord {
        id: row.get(0),
        session_id: row.get(1),
        request_id: row.get(2),
        payload_digest: row.get(3),
        input: text(4)?.unwrap_or(Value::Null),
        state: RunState::parse(row.get(5))?,
        host_id: row.get(6),
        result: text(7)?,
        recovery: text(8)?,
        dropped_through: row.get::<_, Option<i64>>(9).map(|d| d as u64),
        admitted_at: row.get(10),
        ended_at: row.get(11),
    })
}

async fn read_run(c: &impl GenericClient, id: &str) -> Result<RunRecord, StoreError> {
    let row = c
        .query_opt(
            &format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = $1"),
            &[&id],
        )
        .await
        .map_err(pg)?
        .ok_or_else(|| StoreError::NotFound {
            what: "run",
            id: id.to_owned(),
        })?;
    run_of(&row)
}

async fn notify(c: &impl GenericClient, run_id: &str) -> Result<(), StoreError> {
    c.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &run_id])
        .await
        .map_err(pg)?;
    Ok(())
}

/// The audit records of one trace, in commit order.
async fn read_trail(
    c: &impl GenericClient,
    trace_id: &str,
) -> Result<Vec<AuditRecord>, StoreError> {
    let rows = c
        .query(
            "SELECT record FROM audit_records WHERE trace_id = $1 ORDER BY seq",
            &[&trace_id],
        )
        .await
        .map_err(pg)?;
    rows.iter()
        .map(|r| serde_json::from_str(r.get::<_, &str>(0)).map_err(corrupt))
        .collect()
}

async fn last_sequence(c: &impl GenericClient, run_id: &str) -> Result<Option<i64>, StoreError> {
    Ok(c.query_one(
        "SELECT MAX(sequence) FROM run_events WHERE run_id = $1",
        &[&run_id],
    )
    .await
    .map_err(pg)?
    .get(0))
}

#[async_trait]
impl Store for PostgresStore {
    async fn open_session(&self, s: &SessionRecord) -> Result<(), StoreError> {
        let client = self.conn.lock().await?;
        client
            .execute(
                "INSERT INTO sessions (id, agent_id, runtime_id, scope, binding, open, created_at) \
                 VALUES ($1, $2, $3, $4, $5, TRUE, $6)",
                &[
                    &s.id,
                    &s.agent_id,
                    &s.runtime_id,
                    &s.scope.to_string(),
                    &s.binding.to_string(),
                    &s.created_at,
                ],
            )
            .await
            .map_err(pg)?;
        Ok(())
    }

    async fn session(&self, id: &str) -> Result<SessionRecord, StoreError> {
        let client = self.conn.lock().await?;
        let row = client
            .query_opt(
                "SELECT id, agent_id, runtime_id, scope, binding, open, created_at, closed_at \
                 FROM sessions WHERE id = $1",
                &[&id],
            )
            .await
            .map_err(pg)?
            .ok_or_else(|| StoreError::NotFound {
                what: "session",
                id: id.to_owned(),
            })?;
        Ok(SessionRecord {
            id: row.get(0),
            agent_id: row.get(1),
            runtime_id: row.get(2),
            scope: serde_json::from_str(row.get(3)).map_err(corrupt)?,
            binding: serde_json::from_str(row.get(4)).map_err(corrupt)?,
            open: row.get(5),
            created_at: row.get(6),
            closed_at: row.get(7),
        })
    }

    async fn close_session(&self, id: &str, at: &str) -> Result<(), StoreError> {
        let client = self.conn.lock().await?;
        let n = client
            .execute(
                "UPDATE sessions SET open = FALSE, closed_at = COALESCE(closed_at, $2) WHERE id = $1",
                &[&id, &at],
            )
            .await
            .map_err(pg)?;
        if n == 0 {
            return Err(StoreError::NotFound {
                what: "session",
                id: id.to_owned(),
            });
        }
        Ok(())
    }

    async fn list_sessions(&self, query: &SessionQuery) -> Result<Vec<SessionRecord>, StoreError> {
        listing::sessions(&*self.conn.lock().await?, query).await
    }

    async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        listing::runs(&*self.conn.lock().await?, query).await
    }

    async fn delete_session(&self, id: &str) -> Result<SessionRecord, StoreError> {
        delete::session(&mut *self.conn.lock().await?, id).await
    }

    async fn sweep(&self, query: &SweepQuery) -> Result<Swept, StoreError> {
        delete::sweep(&mut *self.conn.lock().await?, query).await
    }

    async fn delete_run(&self, id: &str) -> Result<RunRecord, StoreError> {
        delete::run(&mut *self.conn.lock().await?, id).await
    }

    async fn admit_run(&self, run: &NewRun) -> Result<Admission, StoreError> {
        let lease = self.lease.get();
        let mut client = self.conn.lock().await?;
        let tx = client.transaction().await.map_err(pg)?;
        lease::check(&tx, lease.as_ref()).await?;
        let open: bool = tx
            .query_opt(
                "SELECT open FROM sessions WHERE id = $1 FOR UPDATE",
                &[&run.session_id],
            )
            .await
            .map_err(pg)?
            .ok_or_else(|| StoreError::NotFound {
                what: "session",
                id: run.session_id.clone(),
            })?
            .get(0);
        let existing = tx
            .query_opt(
                &format!(
                    "SELECT {RUN_COLUMNS} FROM runs WHERE session_id = $1 AND request_id = $2"
                ),
                &[&run.session_id, &run.request_id],
            )
            .await
            .map_err(pg)?;
        if let Some(row) = existing {
            let original = run_of(&row)?;
            if original.payload_digest != run.payload_digest {
                return Err(StoreError::RequestConflict {
                    session_id: run.session_id.clone(),
                    request_id: run.request_id.clone(),
                    run_id: original.id,
                });
            }
            return Ok(Admission::Existing(original));
        }
        if !open {
            return Err(StoreError::SessionClosed(run.session_id.clone()));
        }
        tx.execute(
            "INSERT INTO runs (id, session_id, request_id, payload_digest, input, state, host_id, admitted_at) \
             VALUES ($1, $2, $3, $4, $5, 'in_flight', $6, $7)",
            &[
                &run.id,
                &run.session_id,
                &run.request_id,
                &run.payload_digest,
                &run.input.to_string(),
                &run.host_id,
                &run.admitted_at,
            ],
        )
        .await
        .map_err(pg)?;
        let stored = read_run(&tx, &run.id).await?;
        tx.commit().await.map_err(pg)?;
        Ok(Admission::New(stored))
    }

    async fn run(&self, id: &str) -> Result<RunRecord, StoreError> {
        let client = self.conn.lock().await?;
        read_run(&*client, id).await
    }

    async fn end_run(&self, id: &str, result: &Value, at: &str) -> Result<RunRecord, StoreError> {
        let lease = self.lease.get();
        let mut client = self.conn.lock().await?;
        let tx = client.transaction().await.map_err(pg)?;
        lease::check(&tx, lease.as_ref()).await?;
        let n = tx
            .execute(
                "UPDATE runs SET state = 'ended', result = $2, ended_at = $3 \
                 WHERE id = $1 AND state = 'in_flight'",
                &[&id, &result.to_string(), &at],
            )
            .await
            .map_err(pg)?;
        if n == 0 {
            read_run(&tx, id).await?;
            return Err(StoreError::RunEnded(id.to_owned()));
        }
        if let (Some(keep), Some(last)) = (self.keep_events_per_run, last_sequence(&tx, id).await?)
            && last + 1 > keep as i64
        {
            let through = last - keep as i64;
            tx.execute(
                "DELETE FROM run_events WHERE run_id = $1 AND sequence <= $2",
                &[&id, &through],
            )
            .await
            .map_err(pg)?;
            tx.execute(
                "UPDATE runs SET dropped_through = $2 WHERE id = $1",
                &[&id, &through],
            )
            .await
            .map_err(pg)?;
        }
        notify(&tx, id).await?;
        let stored = read_run(&tx, id).await?;
        tx.commit().await.map_err(pg)?;
        Ok(stored)
    }

    async fn request_cancel(&self, id: &str, at: &str) -> Result<RunRecord, StoreError> {
        let mut client = self.conn.lock().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let marked = tx
            .execute(
                "UPDATE runs SET cancel_requested_at = COALESCE(cancel_requested_at, $2) \
                 WHERE id = $1 AND state = 'in_flight'",
                &[&id, &at],
            )
            .await
            .map_err(pg)?;
        if marked > 0 {
            notify(&tx, &format!("{}{id}", crate::CANCEL_PREFIX)).await?;
        }
        let run = read_run(&tx, id).await?;
        tx.commit().await.map_err(pg)?;
        Ok(run)
    }

    async fn cancel_requests(&self, host_id: &str) -> Result<Vec<String>, StoreError> {
        let client = self.conn.lock().await?;
        let rows = client
            .query(
                "SELECT id FROM runs WHERE host_id = $1 AND state = 'in_flight' \
                 AND cancel_requested_at IS NOT NULL",
                &[&host_id],
            )
            .await
            .map_err(pg)?;
        Ok(rows.iter().map(|r| r.get::<_, String>(0)).collect())
    }

    async fn in_flight_runs(&self, host_id: &str) -> Result<Vec<RunRecord>, StoreError> {
        let client = self.conn.lock().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT {RUN_COLUMNS} FROM runs WHERE host_id = $1 AND state = 'in_flight' \
                     ORDER BY admitted_at, id"
                ),
                &[&host_id],
            )
            .await
            .map_err(pg)?;
        rows.iter().map(run_of).collect()
    }

    async fn append_event(&self, run_id: &str, event: &ExecutionEvent) -> Result<(), StoreError> {
        let lease = self.lease.get();
        let mut client = self.conn.lock().await?;
        let tx = client.transaction().await.map_err(pg)?;
        lease::insert_event(&tx, run_id, event, lease.as_ref()).await?;
        notify(&tx, run_id).await?;
        tx.commit().await.map_err(pg)
    }

    async fn events_after(
        &self,
        run_id: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<ExecutionEvent>, StoreError> {
        let client = self.conn.lock().await?;
        let run = read_run(&*client, run_id).await?;
        if let Some(dropped) = run.dropped_through
            && after.is_none_or(|a| a < dropped)
        {
            return Err(StoreError::Dropped {
                run_id: run_id.to_owned(),
                requested: after.map_or_else(|| "the start".to_owned(), |a| a.to_string()),
                dropped_through: dropped,
            });
        }
        let last = last_sequence(&*client, run_id).await?;
        // A sequence is never above i64::MAX: anything beyond the last stored
        // one (2^63 and more included) is past the end, never a wrapped -1.
        let from = match after {
            None => -1,
            Some(a) => match (i64::try_from(a), last) {
                (Ok(from), Some(l)) if from <= l => from,
                _ => {
                    return Err(StoreError::BeyondEnd {
                        run_id: run_id.to_owned(),
                        requested: a,
                        last: last.map_or_else(|| "none".to_owned(), |l| l.to_string()),
                    });
                }
            },
        };
        let rows = client
            .query(
                "SELECT event FROM run_events WHERE run_id = $1 AND sequence > $2 \
                 ORDER BY sequence LIMIT $3",
                &[&run_id, &from, &(limit as i64)],
            )
            .await
            .map_err(pg)?;
        rows.iter()
            .map(|r| serde_json::from_str(r.get::<_, &str>(0)).map_err(corrupt))
            .collect()
    }

    async fn add_grant(
        &self,
        grant: &Grant,
        origin: GrantOrigin,
        at: &str,
    ) -> Result<(), StoreError> {
        grants::add(&mut *self.conn.lock().await?, grant, origin, at).await
    }

    async fn revoke_grant(&self, id: &str, at: &str) -> Result<bool, StoreError> {
        grants::revoke(&mut *self.conn.lock().await?, id, at).await
    }

    async fn add_token(&self, token: &StoredToken) -> Result<(), StoreError> {
        tokens::add(&*self.conn.lock().await?, token).await
    }

    async fn revoke_token(&self, id: &str, at: &str) -> Result<bool, StoreError> {
        tokens::revoke(&*self.conn.lock().await?, id, at).await
    }

    async fn tokens(&self) -> Result<Vec<StoredToken>, StoreError> {
        tokens::all(&*self.conn.lock().await?).await
    }

    async fn token_by_hash(&self, secret_sha256: &str) -> Result<Option<StoredToken>, StoreError> {
        tokens::by_hash(&*self.conn.lock().await?, secret_sha256).await
    }

    async fn grant(&self, id: &str) -> Result<Option<StoredGrant>, StoreError> {
        grants::grant(&*self.conn.lock().await?, id).await
    }

    async fn grants(&self) -> Result<Vec<StoredGrant>, StoreError> {
        grants::all(&*self.conn.lock().await?).await
    }

    async fn grants_for(
        &self,
        namespace_id: &str,
        subject: &Address,
    ) -> Result<Vec<Grant>, StoreError> {
        grants::grants_for(&*self.conn.lock().await?, namespace_id, subject).await
    }

    async fn import_config_grants(
        &self,
        list: &[Grant],
        at: &str,
    ) -> Result<GrantImport, StoreError> {
        grants::import(&mut *self.conn.lock().await?, list, at).await
    }

    async fn settle_effect(
        &self,
        settlement: &crate::effects::Settlement,
    ) -> Result<crate::effects::Settled, StoreError> {
        let lease = self.lease.get();
        let mut client = self.conn.lock().await?;
        settle::settle(&mut client, lease.as_ref(), settlement).await
    }

    async fn audit_trail(&self, trace_id: &str) -> Result<Vec<AuditRecord>, StoreError> {
        read_trail(&*self.conn.lock().await?, trace_id).await
    }

    async fn acquire_lease(
        &self,
        host_id: &str,
        duration: Duration,
        at: &Timestamp,
    ) -> Result<Acquired, StoreError> {
        let acquired = lease::acquire(&mut *self.conn.lock().await?, host_id, duration, at).await?;
        self.lease.set(acquired.lease.clone());
        Ok(acquired)
    }

    async fn renew_lease(&self) -> Result<(), StoreError> {
        let held = self.lease.required()?;
        lease::renew(&*self.conn.lock().await?, &held).await
    }

    async fn take_over_expired(&self, at: &Timestamp) -> Result<Vec<RecoveredRun>, StoreError> {
        let held = self.lease.required()?;
        lease::take_over(&mut *self.conn.lock().await?, &held, at).await
    }

    async fn release_lease(&self) -> Result<(), StoreError> {
        let held = self.lease.required()?;
        lease::release(&*self.conn.lock().await?, &held).await
    }

    fn changes(&self) -> Option<broadcast::Receiver<String>> {
        Some(self.conn.changes().subscribe())
    }
}
