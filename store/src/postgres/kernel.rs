//! The kernel's traits on PostgreSQL: the audit sink and the `maxUses`
//! counters, both fenced by this process's lease when it holds one.

use async_trait::async_trait;
use sharedos_kernel::{AuditError, AuditRecord, AuditSink, UsageStore};

use super::lease::{consume, insert_audit};
use super::{PostgresStore, pg};

#[async_trait]
impl AuditSink for PostgresStore {
    async fn append(&self, record: &AuditRecord) -> Result<(), AuditError> {
        let lease = self.lease.get();
        let client = self.client.lock().await;
        insert_audit(&*client, record, lease.as_ref())
            .await
            .map_err(|e| AuditError::Sink(e.to_string()))
    }
}

#[async_trait]
impl UsageStore for PostgresStore {
    async fn try_consume(&self, grant_id: &str, max_uses: u64) -> Result<bool, String> {
        if max_uses == 0 {
            return Ok(false);
        }
        let max = i64::try_from(max_uses).unwrap_or(i64::MAX);
        let lease = self.lease.get();
        let client = self.client.lock().await;
        consume(&client, grant_id, max, lease.as_ref())
            .await
            .map_err(|e| e.to_string())
    }

    async fn remaining(&self, grant_id: &str, max_uses: u64) -> Result<u64, String> {
        let client = self.client.lock().await;
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
