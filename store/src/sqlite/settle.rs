//! A settlement on SQLite (docs/STORE.md, "Unresolved effects"): its audit
//! record, once per id, and its journal event, in one `BEGIN IMMEDIATE`
//! transaction under this process's lease.

use rusqlite::{Connection, OptionalExtension, params};

use super::{fence, insert_event, unavailable};
use crate::effects::{Settled, Settlement};
use crate::{Lease, StoreError};

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

pub(super) fn settle(
    conn: &mut Connection,
    lease: Option<&Lease>,
    s: &Settlement,
) -> Result<Settled, StoreError> {
    fence::fenced(conn, lease, |tx| {
        let exists: Option<i64> = tx
            .query_row("SELECT 1 FROM runs WHERE id = ?1", [&s.run_id], |r| {
                r.get(0)
            })
            .optional()
            .map_err(unavailable)?;
        if exists.is_none() {
            return Err(StoreError::NotFound {
                what: "run",
                id: s.run_id.clone(),
            });
        }
        if let Some(first) = existing(tx, &s.record.id)? {
            return Ok(Settled::Before(Box::new(first)));
        }
        let r = &s.record;
        let text = serde_json::to_string(r).map_err(corrupt)?;
        tx.execute(
            "INSERT INTO audit_records (id, trace_id, kind, outcome, operation_id, record) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                r.id,
                r.trace_id,
                r.kind.as_str(),
                r.outcome.as_str(),
                r.operation_id,
                text
            ],
        )
        .map_err(unavailable)?;
        let last: Option<i64> = tx
            .query_row(
                "SELECT MAX(sequence) FROM run_events WHERE run_id = ?1",
                [&s.run_id],
                |r| r.get(0),
            )
            .map_err(unavailable)?;
        let next = last.map_or(0, |l| l as u64 + 1);
        insert_event(tx, &s.run_id, &s.event(next)?)?;
        Ok(Settled::Now)
    })
}

fn existing(
    conn: &Connection,
    id: &str,
) -> Result<Option<sharedos_kernel::AuditRecord>, StoreError> {
    let text: Option<String> = conn
        .query_row(
            "SELECT record FROM audit_records WHERE id = ?1",
            [id],
            |r| r.get(0),
        )
        .optional()
        .map_err(unavailable)?;
    text.map(|t| serde_json::from_str(&t).map_err(corrupt))
        .transpose()
}
