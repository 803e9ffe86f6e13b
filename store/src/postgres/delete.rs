//! Deleting an ended run and its journal (docs/STORE.md, "Deletion"); its
//! audit records are kept.

use tokio_postgres::Client;

use super::{pg, read_run};
use crate::{RunRecord, RunState, StoreError};

pub(super) async fn run(client: &mut Client, id: &str) -> Result<RunRecord, StoreError> {
    let tx = client.transaction().await.map_err(pg)?;
    // The row is locked first: a run cannot end, nor be deleted twice,
    // while this transaction decides.
    tx.execute("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE", &[&id])
        .await
        .map_err(pg)?;
    let run = read_run(&tx, id).await?;
    if run.state == RunState::InFlight {
        return Err(StoreError::RunInFlight(id.to_owned()));
    }
    tx.execute("DELETE FROM run_events WHERE run_id = $1", &[&id])
        .await
        .map_err(pg)?;
    tx.execute("DELETE FROM runs WHERE id = $1", &[&id])
        .await
        .map_err(pg)?;
    tx.commit().await.map_err(pg)?;
    Ok(run)
}
