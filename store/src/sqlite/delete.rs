//! Deleting an ended run and its journal, or a closed session with its
//! runs and their journals (docs/STORE.md, "Deletion"); audit records are
//! kept.

use rusqlite::{Connection, TransactionBehavior};

use rusqlite::OptionalExtension;

use super::runs::{read_run, read_session};
use super::unavailable;
use crate::{RunRecord, RunState, SessionRecord, StoreError};

pub(crate) fn run(conn: &mut Connection, id: &str) -> Result<RunRecord, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(unavailable)?;
    let run = read_run(&tx, id)?;
    if run.state == RunState::InFlight {
        return Err(StoreError::RunInFlight(id.to_owned()));
    }
    tx.execute("DELETE FROM run_events WHERE run_id = ?1", [id])
        .map_err(unavailable)?;
    tx.execute("DELETE FROM runs WHERE id = ?1", [id])
        .map_err(unavailable)?;
    tx.commit().map_err(unavailable)?;
    Ok(run)
}

pub(crate) fn session(conn: &mut Connection, id: &str) -> Result<SessionRecord, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(unavailable)?;
    let session = read_session(&tx, id)?;
    if session.open {
        return Err(StoreError::SessionOpen(id.to_owned()));
    }
    let flying: Option<String> = tx
        .query_row(
            "SELECT id FROM runs WHERE session_id = ?1 AND state = 'in_flight' LIMIT 1",
            [id],
            |r| r.get(0),
        )
        .optional()
        .map_err(unavailable)?;
    if let Some(run) = flying {
        return Err(StoreError::RunInFlight(run));
    }
    tx.execute(
        "DELETE FROM run_events WHERE run_id IN (SELECT id FROM runs WHERE session_id = ?1)",
        [id],
    )
    .map_err(unavailable)?;
    tx.execute("DELETE FROM runs WHERE session_id = ?1", [id])
        .map_err(unavailable)?;
    tx.execute("DELETE FROM sessions WHERE id = ?1", [id])
        .map_err(unavailable)?;
    tx.commit().map_err(unavailable)?;
    Ok(session)
}
