//! Host leases on PostgreSQL: hosts on several machines sharing one
//! database.
//!
//! Expiry is read on the database server's clock, so the hosts' clocks
//! need not agree. A fenced write locks its host's lease row `FOR SHARE`
//! in its own transaction (one statement: a `WITH` in front of the write);
//! a takeover's `UPDATE` of that row conflicts with the share lock, so
//! either the write commits first and the takeover reads it, or the write
//! waits, sees the new epoch and writes nothing.

use std::time::Duration;

use sharedos_kernel::AuditRecord;
use sharedos_protocol::{ExecutionEvent, Timestamp};
use tokio_postgres::{Client, GenericClient, Transaction};

use super::{RUN_COLUMNS, corrupt, last_sequence, notify, pg, read_trail, run_of};
use crate::lease::duration_ms;
use crate::recovery::{HOST_RESTARTED, LEASE_EXPIRED, RecoveredRun, Takeover, reconcile};
use crate::{Acquired, Lease, StoreError};

/// Now, in milliseconds since the Unix epoch, on the server's clock.
const NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// Refuses the transaction's write when `lease`'s epoch moved on, and
/// holds the lease row (share lock) until the transaction ends.
pub(super) async fn check(c: &impl GenericClient, lease: Option<&Lease>) -> Result<(), StoreError> {
    let Some(lease) = lease else {
        return Ok(());
    };
    let epoch: Option<i64> = c
        .query_opt(
            "SELECT epoch FROM host_leases WHERE host_id = $1 FOR SHARE",
            &[&lease.host_id],
        )
        .await
        .map_err(pg)?
        .map(|r| r.get(0));
    if epoch == Some(lease.epoch) {
        Ok(())
    } else {
        Err(lease.fenced())
    }
}

/// `WITH fence AS (…)`: one row while `$a`/`$b`'s lease holds, locked.
fn fence_cte(host: usize, epoch: usize) -> String {
    format!(
        "WITH fence AS (SELECT 1 FROM host_leases WHERE host_id = ${host} AND epoch = ${epoch} FOR SHARE) "
    )
}

/// Stores one audit record; with a lease, only while it holds.
pub(super) async fn insert_audit(
    c: &impl GenericClient,
    r: &AuditRecord,
    lease: Option<&Lease>,
) -> Result<(), StoreError> {
    let text = serde_json::to_string(r).map_err(corrupt)?;
    let outcome = serde_json::to_value(r.outcome)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let kind = r.kind.as_str();
    let columns = "INSERT INTO audit_records (id, trace_id, kind, outcome, operation_id, record) ";
    let n = match lease {
        None => c
            .execute(
                &format!("{columns} VALUES ($1, $2, $3, $4, $5, $6)"),
                &[&r.id, &r.trace_id, &kind, &outcome, &r.operation_id, &text],
            )
            .await
            .map_err(pg)?,
        Some(l) => c
            .execute(
                &format!(
                    "{}{columns} SELECT $1::text, $2::text, $3::text, $4::text, $5::text, $6::text FROM fence",
                    fence_cte(7, 8)
                ),
                &[
                    &r.id,
                    &r.trace_id,
                    &kind,
                    &outcome,
                    &r.operation_id,
                    &text,
                    &l.host_id,
                    &l.epoch,
                ],
            )
            .await
            .map_err(pg)?,
    };
    match lease {
        Some(l) if n == 0 => Err(l.fenced()),
        _ => Ok(()),
    }
}

/// Stores one journal event; with a lease, only while it holds.
pub(super) async fn insert_event(
    c: &impl GenericClient,
    run_id: &str,
    event: &ExecutionEvent,
    lease: Option<&Lease>,
) -> Result<(), StoreError> {
    let text = serde_json::to_string(event).map_err(corrupt)?;
    let sequence = event.sequence as i64;
    let insert = "INSERT INTO run_events (run_id, sequence, event) ";
    let n = match lease {
        None => c
            .execute(
                &format!("{insert} VALUES ($1, $2, $3)"),
                &[&run_id, &sequence, &text],
            )
            .await
            .map_err(pg)?,
        Some(l) => c
            .execute(
                &format!(
                    "{}{insert} SELECT $1::text, $2::bigint, $3::text FROM fence",
                    fence_cte(4, 5)
                ),
                &[&run_id, &sequence, &text, &l.host_id, &l.epoch],
            )
            .await
            .map_err(pg)?,
    };
    match lease {
        Some(l) if n == 0 => Err(l.fenced()),
        _ => Ok(()),
    }
}

/// Takes `maxUses`' next use of `grant_id`; `Ok(false)` when none is
/// left, `Fenced` when the lease was lost.
pub(super) async fn consume(
    c: &Client,
    grant_id: &str,
    max: i64,
    lease: Option<&Lease>,
) -> Result<bool, StoreError> {
    let upsert = "INSERT INTO usage_counters (grant_id, used) ";
    let on_conflict = "ON CONFLICT (grant_id) DO UPDATE SET used = usage_counters.used + 1 \
                       WHERE usage_counters.used < $2 RETURNING used";
    let row = match lease {
        None => c
            .query_opt(
                &format!("{upsert} VALUES ($1, 1) {on_conflict}"),
                &[&grant_id, &max],
            )
            .await
            .map_err(pg)?,
        Some(l) => c
            .query_opt(
                &format!(
                    "{}{upsert} SELECT $1::text, 1 FROM fence {on_conflict}",
                    fence_cte(3, 4)
                ),
                &[&grant_id, &max, &l.host_id, &l.epoch],
            )
            .await
            .map_err(pg)?,
    };
    if row.is_some() {
        return Ok(true);
    }
    // No use taken: exhausted, or fenced (then say so, failing closed).
    check(c, lease).await?;
    Ok(false)
}

pub(super) async fn acquire(
    client: &mut Client,
    host_id: &str,
    duration: Duration,
    at: &Timestamp,
) -> Result<Acquired, StoreError> {
    let tx = client.transaction().await.map_err(pg)?;
    let was_live = tx
        .query_opt(
            &format!("SELECT expires_at > {NOW_MS} FROM host_leases WHERE host_id = $1 FOR UPDATE"),
            &[&host_id],
        )
        .await
        .map_err(pg)?
        .is_some_and(|r| r.get::<_, bool>(0));
    let epoch: i64 = tx
        .query_one(
            &format!(
                "INSERT INTO host_leases (host_id, epoch, expires_at) VALUES ($1, 1, {NOW_MS} + $2) \
                 ON CONFLICT (host_id) DO UPDATE SET epoch = host_leases.epoch + 1, \
                 expires_at = EXCLUDED.expires_at RETURNING epoch"
            ),
            &[&host_id, &duration_ms(duration)],
        )
        .await
        .map_err(pg)?
        .get(0);
    let takeover = Takeover {
        reason: HOST_RESTARTED,
        recovered_by: host_id,
        epoch,
    };
    let recovered = reconcile_host(&tx, host_id, &takeover, at).await?;
    tx.commit().await.map_err(pg)?;
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

pub(super) async fn renew(c: &Client, lease: &Lease) -> Result<(), StoreError> {
    let n = c
        .execute(
            &format!(
                "UPDATE host_leases SET expires_at = {NOW_MS} + $3 WHERE host_id = $1 AND epoch = $2"
            ),
            &[&lease.host_id, &lease.epoch, &lease.duration_ms()],
        )
        .await
        .map_err(pg)?;
    if n == 0 {
        return Err(lease.fenced());
    }
    Ok(())
}

pub(super) async fn release(c: &Client, lease: &Lease) -> Result<(), StoreError> {
    c.execute(
        "UPDATE host_leases SET expires_at = 0 WHERE host_id = $1 AND epoch = $2",
        &[&lease.host_id, &lease.epoch],
    )
    .await
    .map_err(pg)?;
    Ok(())
}

pub(super) async fn take_over(
    client: &mut Client,
    lease: &Lease,
    at: &Timestamp,
) -> Result<Vec<RecoveredRun>, StoreError> {
    check(&*client, Some(lease)).await?;
    let hosts: Vec<String> = client
        .query(
            &format!(
                "SELECT l.host_id FROM host_leases l WHERE l.expires_at <= {NOW_MS} AND l.host_id <> $1 \
                 AND EXISTS (SELECT 1 FROM runs r WHERE r.host_id = l.host_id AND r.state = 'in_flight') \
                 ORDER BY l.host_id"
            ),
            &[&lease.host_id],
        )
        .await
        .map_err(pg)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut recovered = Vec::new();
    for host in hosts {
        let tx = client.transaction().await.map_err(pg)?;
        check(&tx, Some(lease)).await?;
        // Re-checked under the row lock: a renewal that came first wins.
        let Some(row) = tx
            .query_opt(
                &format!(
                    "UPDATE host_leases SET epoch = epoch + 1 \
                     WHERE host_id = $1 AND expires_at <= {NOW_MS} RETURNING epoch"
                ),
                &[&host],
            )
            .await
            .map_err(pg)?
        else {
            continue;
        };
        let takeover = Takeover {
            reason: LEASE_EXPIRED,
            recovered_by: &lease.host_id,
            epoch: row.get(0),
        };
        recovered.extend(reconcile_host(&tx, &host, &takeover, at).await?);
        tx.commit().await.map_err(pg)?;
    }
    Ok(recovered)
}

/// Reconciles every run `host_id` has in flight, inside the transaction
/// that moved the host's epoch.
async fn reconcile_host(
    tx: &Transaction<'_>,
    host_id: &str,
    takeover: &Takeover<'_>,
    at: &Timestamp,
) -> Result<Vec<RecoveredRun>, StoreError> {
    let rows = tx
        .query(
            &format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE host_id = $1 AND state = 'in_flight' \
                 ORDER BY admitted_at, id FOR UPDATE"
            ),
            &[&host_id],
        )
        .await
        .map_err(pg)?;
    let mut report = Vec::new();
    for row in rows {
        let run = run_of(&row)?;
        let trail = read_trail(tx, &run.id).await?;
        let last = last_sequence(tx, &run.id)
            .await?
            .map(|l| l as u64)
            .or(run.dropped_through);
        let plan = reconcile(&run, &trail, last, takeover, at)?;
        for record in &plan.records {
            insert_audit(tx, record, None).await?;
        }
        insert_event(tx, &run.id, &plan.event, None).await?;
        tx.execute(
            "UPDATE runs SET state = 'interrupted', recovery = $2, ended_at = $3 WHERE id = $1",
            &[&run.id, &plan.account.to_string(), &at.as_str()],
        )
        .await
        .map_err(pg)?;
        notify(tx, &run.id).await?;
        report.push(plan.report);
    }
    Ok(report)
}
