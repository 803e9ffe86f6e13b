//! The fencing of a leased store's writes on SQLite: the epoch check every
//! write of a host holding a lease makes in its own transaction. Apart
//! from the lease's own operations (`lease.rs`) so the run writes
//! (`runs.rs`) and the leases both use it without importing each other.

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior};

use super::unavailable;
use crate::{Lease, StoreError};

/// Refuses the write when `lease`'s epoch moved on; no lease, no check.
pub(crate) fn check(conn: &Connection, lease: Option<&Lease>) -> Result<(), StoreError> {
    let Some(lease) = lease else {
        return Ok(());
    };
    let epoch: Option<i64> = conn
        .prepare_cached("SELECT epoch FROM host_leases WHERE host_id = ?1")
        .and_then(|mut s| s.query_row([&lease.host_id], |r| r.get(0)).optional())
        .map_err(unavailable)?;
    if epoch == Some(lease.epoch) {
        Ok(())
    } else {
        Err(lease.fenced())
    }
}

/// Runs `write` in one `BEGIN IMMEDIATE` transaction, after the lease
/// check.
pub(crate) fn fenced<T>(
    conn: &mut Connection,
    lease: Option<&Lease>,
    write: impl FnOnce(&Transaction<'_>) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(unavailable)?;
    check(&tx, lease)?;
    let out = write(&tx)?;
    tx.commit().map_err(unavailable)?;
    Ok(out)
}
