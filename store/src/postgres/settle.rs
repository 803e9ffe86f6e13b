//! A settlement on PostgreSQL (docs/STORE.md, "Unresolved effects"): the
//! run's row locked first, so two hosts settling calls of one run
//! serialize; then its audit record, once per id, and its journal event,
//! in one transaction under this process's lease.

use tokio_postgres::Client;

use super::lease::{insert_audit, insert_event};
use super::{corrupt, last_sequence, notify, pg};
use crate::StoreError;
use crate::effects::{Settled, Settlement};

pub(super) async fn settle(
    client: &mut Client,
    lease: Option<&crate::Lease>,
    s: &Settlement,
) -> Result<Settled, StoreError> {
    let tx = client.transaction().await.map_err(pg)?;
    let locked = tx
        .execute("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE", &[&s.run_id])
        .await
        .map_err(pg)?;
    if locked == 0 {
        return Err(StoreError::NotFound {
            what: "run",
            id: s.run_id.clone(),
        });
    }
    let first = tx
        .query_opt(
            "SELECT record FROM audit_records WHERE id = $1",
            &[&s.record.id],
        )
        .await
        .map_err(pg)?;
    if let Some(row) = first {
        let record = serde_json::from_str(row.get::<_, &str>(0)).map_err(corrupt)?;
        return Ok(Settled::Before(Box::new(record)));
    }
    insert_audit(&tx, &s.record, lease).await?;
    let next = last_sequence(&tx, &s.run_id)
        .await?
        .map_or(0, |l| l as u64 + 1);
    insert_event(&tx, &s.run_id, &s.event(next)?, lease).await?;
    notify(&tx, &s.run_id).await?;
    tx.commit().await.map_err(pg)?;
    Ok(Settled::Now)
}
