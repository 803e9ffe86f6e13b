//! Host leases on SQLite: processes sharing one file, on one machine.
//!
//! Every lease operation and every fenced write runs in a `BEGIN
//! IMMEDIATE` transaction, which holds the database's write lock from its
//! start: the epoch a write checks cannot move before it commits, and a
//! takeover sees every write the fenced process committed. Expiry is read
//! on this machine's clock (all processes sharing the file share it).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};
use sharedos_protocol::Timestamp;

use super::fence::{check, fenced};
use super::runs::{RUN_COLUMNS, raw_run, run_of};
use super::{insert_audit, insert_event, read_trail, unavailable};
use crate::lease::duration_ms;
use crate::recovery::{HOST_RESTARTED, LEASE_EXPIRED, RecoveredRun, Takeover, reconcile};
use crate::{Acquired, Lease, RunRecord, StoreError};

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, duration_ms)
}

pub(crate) fn acquire(
    conn: &mut Connection,
    host_id: &str,
    duration: Duration,
    at: &Timestamp,
) -> Result<Acquired, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(unavailable)?;
    let now = now_ms();
    let was_live = tx
        .query_row(
            "SELECT expires_at FROM host_leases WHERE host_id = ?1",
            [host_id],
            |r| r.get::<_, i64>(0),
        )
        .optional()
        .map_err(unavailable)?
        .is_some_and(|expires| expires > now);
    let epoch: i64 = tx
        .query_row(
            "INSERT INTO host_leases (host_id, epoch, expires_at) VALUES (?1, 1, ?2) \
             ON CONFLICT (host_id) DO UPDATE SET epoch = epoch + 1, expires_at = excluded.expires_at \
             RETURNING epoch",
            params![host_id, now.saturating_add(duration_ms(duration))],
            |r| r.get(0),
        )
        .map_err(unavailable)?;
    let takeover = Takeover {
        reason: HOST_RESTARTED,
        recovered_by: host_id,
        epoch,
    };
    let recovered = reconcile_host(&tx, host_id, &takeover, at)?;
    tx.commit().map_err(unavailable)?;
    Ok(Acquired {
        lease: Lease {
            host_id: host_id.to_owned(),
            epoch,
            duration,
        },
        was_live,
        recovered,
    })
}

pub(crate) fn renew(conn: &Connection, lease: &Lease) -> Result<(), StoreError> {
    let expires = now_ms().saturating_add(lease.duration_ms());
    let n = conn
        .execute(
            "UPDATE host_leases SET expires_at = ?3 WHERE host_id = ?1 AND epoch = ?2",
            params![lease.host_id, lease.epoch, expires],
        )
        .map_err(unavailable)?;
    if n == 0 {
        return Err(lease.fenced());
    }
    Ok(())
}

pub(crate) fn release(conn: &Connection, lease: &Lease) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE host_leases SET expires_at = 0 WHERE host_id = ?1 AND epoch = ?2",
        params![lease.host_id, lease.epoch],
    )
    .map_err(unavailable)?;
    Ok(())
}

/// Host ids other than `me` whose lease expired with runs in flight.
fn expired_hosts(conn: &Connection, me: &str, now: i64) -> Result<Vec<String>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT l.host_id FROM host_leases l WHERE l.expires_at <= ?1 AND l.host_id <> ?2 \
             AND EXISTS (SELECT 1 FROM runs r WHERE r.host_id = l.host_id AND r.state = 'in_flight') \
             ORDER BY l.host_id",
        )
        .map_err(unavailable)?;
    let rows = stmt
        .query_map(params![now, me], |r| r.get::<_, String>(0))
        .map_err(unavailable)?;
    rows.map(|r| r.map_err(unavailable)).collect()
}

pub(crate) fn take_over(
    conn: &mut Connection,
    lease: &Lease,
    at: &Timestamp,
) -> Result<Vec<RecoveredRun>, StoreError> {
    // Reads first: the write lock only when there is something to take.
    check(conn, Some(lease))?;
    if expired_hosts(conn, &lease.host_id, now_ms())?.is_empty() {
        return Ok(Vec::new());
    }
    fenced(conn, Some(lease), |tx| {
        let mut recovered = Vec::new();
        for host in expired_hosts(tx, &lease.host_id, now_ms())? {
            let epoch: i64 = tx
                .query_row(
                    "UPDATE host_leases SET epoch = epoch + 1 WHERE host_id = ?1 RETURNING epoch",
                    [&host],
                    |r| r.get(0),
                )
                .map_err(unavailable)?;
            let takeover = Takeover {
                reason: LEASE_EXPIRED,
                recovered_by: &lease.host_id,
                epoch,
            };
            recovered.extend(reconcile_host(tx, &host, &takeover, at)?);
        }
        Ok(recovered)
    })
}

/// Reconciles every run `host_id` has in flight, inside the caller's
/// transaction (the one that moved the host's epoch).
fn reconcile_host(
    tx: &Transaction<'_>,
    host_id: &str,
    takeover: &Takeover<'_>,
    at: &Timestamp,
) -> Result<Vec<RecoveredRun>, StoreError> {
    let runs: Vec<RunRecord> = {
        let mut stmt = tx
            .prepare(&format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE host_id = ?1 AND state = 'in_flight' \
                 ORDER BY admitted_at, id"
            ))
            .map_err(unavailable)?;
        let rows = stmt.query_map([host_id], raw_run).map_err(unavailable)?;
        rows.map(|r| run_of(r.map_err(unavailable)?))
            .collect::<Result<_, _>>()?
    };
    let mut report = Vec::new();
    for run in runs {
        let trail = read_trail(tx, &run.id)?;
        let last: Option<i64> = tx
            .query_row(
                "SELECT MAX(sequence) FROM run_events WHERE run_id = ?1",
                [&run.id],
                |r| r.get(0),
            )
            .map_err(unavailable)?;
        let last = last.map(|l| l as u64).or(run.dropped_through);
        let plan = reconcile(&run, &trail, last, takeover, at)?;
        for record in &plan.records {
            insert_audit(tx, record)?;
        }
        insert_event(tx, &run.id, &plan.event)?;
        tx.execute(
            "UPDATE runs SET state = 'interrupted', recovery = ?2, ended_at = ?3 WHERE id = ?1",
            params![run.id, plan.account.to_string(), at.as_str()],
        )
        .map_err(unavailable)?;
        report.push(plan.report);
    }
    Ok(report)
}
