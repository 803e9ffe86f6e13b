//! Deleting an ended run and its journal (docs/STORE.md, "Deletion"); its
//! audit records are kept.

use rusqlite::{Connection, TransactionBehavior};

use super::runs::read_run;
use super::unavailable;
use crate::{RunRecord, RunState, StoreError};

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
