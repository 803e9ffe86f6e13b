//! The kernel's traits on PostgreSQL: the audit sink and the `maxUses`
//! counters, both fenced by this process's lease when it holds one.

use async_trait::async_trait;
use sharedos_kernel::{AuditError, AuditRecord, AuditSink, UsageStore};

use tokio_postgres::Client;

use super::conn::Connection;
use super::lease::{consume, insert_audit};
use super::{PostgresStore, pg};
use crate::StoreError;
use crate::group::{AuditQueue, Batch};

/// Group commit (`group.rs`): the append that finds the queue empty
/// starts a task that takes the connection and writes every record queued
/// by then in one transaction.
#[async_trait]
impl AuditSink for PostgresStore {
    async fn append(&self, record: &AuditRecord) -> Result<(), AuditError> {
        let (pending, first) = self.audit.push(record.clone(), self.lease.get());
        if first {
            let (client, queue) = (self.conn.clone(), self.audit.clone());
            tokio::spawn(async move { commit_audit(&client, &queue).await });
        }
        pending.done().await
    }
}

/// Writes every queued audit record, one transaction per lease, and
/// answers each append with its transaction's result.
async fn commit_audit(conn: &Connection, queue: &AuditQueue) {
    let mut client = match conn.lock().await {
        Ok(client) => client,
        Err(e) => {
            let e = e.to_string();
            for batch in queue.take() {
                batch.answer(Err(e.clone()));
            }
            return;
        }
    };
    for batch in queue.take() {
        let result = commit_batch(&mut client, &batch)
            .await
            .map_err(|e| e.to_string());
        batch.answer(result);
    }
}

async fn commit_batch(client: &mut Client, batch: &Batch) -> Result<(), StoreError> {
    let tx = client.transaction().await.map_err(pg)?;
    for r in batch.records() {
        insert_audit(&tx, r, batch.lease.as_ref()).await?;
    }
    tx.commit().await.map_err(pg)
}

#[async_trait]
impl UsageStore for PostgresStore {
    async fn try_consume(&self, grant_id: &str, max_uses: u64) -> Result<bool, String> {
        if max_uses == 0 {
            return Ok(false);
        }
        let max = i64::try_from(max_uses).unwrap_or(i64::MAX);
        let lease = self.lease.get();
        let client = self.conn.lock().await.map_err(|e| e.to_string())?;
        consume(&client, grant_id, max, lease.as_ref())
            .await
            .map_err(|e| e.to_string())
    }

    async fn remaining(&self, grant_id: &str, max_uses: u64) -> Result<u64, String> {
        let client = self.conn.lock().await.map_err(|e| e.to_string())?;
        let used: i64 = client
            .query_opt(
                "SELECT used FROM usage_counters WHERE grant_id = $1",
                &[&grant_id],
            )
            .await
            .map_err(|e| pg(e).to_string())?
            .map_or(0, |r| r.get(0));
        Ok(max_uses.saturating_sub(used as u64))
    }
}
