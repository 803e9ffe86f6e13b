//! Group commit for the stores' audit sinks: concurrent `append`s share
//! one transaction, as the JSONL sink's appends share one `fsync`.
//!
//! Every `append` queues its record with the lease it was made under and
//! waits for its answer. The append that finds the queue empty starts one
//! commit job (on the SQLite connection's thread, or a task of its own on
//! PostgreSQL); the job takes every record queued by the time it runs and
//! writes them in one transaction per lease (one in practice), then answers
//! each. Records queued while a commit runs wait for the next job, which
//! the first of them started. The invariant: while the queue is not empty,
//! a job that has not taken it yet is on its way, so every record is
//! written. Each caller still returns only once its own record is
//! committed (the kernel runs the effect right after a decision's `Ok`).
//! The job does not belong to the caller's future: a caller that stops
//! waiting (an outcome's timeout) leaves the others' commit running.

use std::sync::{Arc, Mutex};

use sharedos_kernel::{AuditError, AuditRecord};
use tokio::sync::oneshot;

use crate::lease::Lease;

/// One record waiting for its commit.
pub(crate) struct Queued {
    pub(crate) record: AuditRecord,
    /// The lease the record is fenced by.
    pub(crate) lease: Option<Lease>,
    reply: oneshot::Sender<Result<(), String>>,
}

/// The records waiting for a commit.
#[derive(Clone, Default)]
pub(crate) struct AuditQueue(Arc<Mutex<Vec<Queued>>>);

/// An append's wait for its commit.
pub(crate) struct Pending(oneshot::Receiver<Result<(), String>>);

impl Pending {
    pub(crate) async fn done(self) -> Result<(), AuditError> {
        self.0
            .await
            .map_err(|_| AuditError::Sink("the audit commit stopped before answering".into()))?
            .map_err(AuditError::Sink)
    }
}

impl AuditQueue {
    /// Queues `record`; with `true` the caller starts the commit job.
    pub(crate) fn push(&self, record: AuditRecord, lease: Option<Lease>) -> (Pending, bool) {
        let (reply, answer) = oneshot::channel();
        let mut waiting = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let first = waiting.is_empty();
        waiting.push(Queued {
            record,
            lease,
            reply,
        });
        (Pending(answer), first)
    }

    /// Every record queued so far, grouped by lease in their order.
    pub(crate) fn take(&self) -> Vec<Batch> {
        let waiting = std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()));
        let mut batches: Vec<Batch> = Vec::new();
        for q in waiting {
            match batches.last_mut() {
                Some(b) if b.lease == q.lease => b.records.push(q),
                _ => batches.push(Batch {
                    lease: q.lease.clone(),
                    records: vec![q],
                }),
            }
        }
        batches
    }

    /// Answers every queued record with `error` (the commit job could not
    /// be started).
    pub(crate) fn fail_all(&self, error: &str) {
        for batch in self.take() {
            batch.answer(Err(error.to_owned()));
        }
    }
}

/// Records of one lease, committed in one transaction.
pub(crate) struct Batch {
    pub(crate) lease: Option<Lease>,
    pub(crate) records: Vec<Queued>,
}

impl Batch {
    /// The records to write.
    pub(crate) fn records(&self) -> impl Iterator<Item = &AuditRecord> {
        self.records.iter().map(|q| &q.record)
    }

    /// Answers every append of the batch with the commit's result.
    pub(crate) fn answer(self, result: Result<(), String>) {
        for q in self.records {
            // The caller may have stopped waiting.
            let _ = q.reply.send(result.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(id: &str) -> AuditRecord {
        let service = json!({"kind": "service", "serviceId": "host"});
        serde_json::from_value(json!({
            "id": id, "type": "tool.invoked", "outcome": "succeeded",
            "at": "2026-12-05T04:00:00Z", "traceId": "run-1", "namespaceId": "ns",
            "actor": service, "authority": service, "owner": service, "purpose": "p",
            "source": "kernel",
        }))
        .unwrap()
    }

    fn lease(epoch: i64) -> Lease {
        Lease {
            host_id: "h".into(),
            epoch,
            duration: std::time::Duration::from_secs(1),
        }
    }

    #[test]
    fn only_the_first_append_of_a_batch_starts_a_commit() {
        let q = AuditQueue::default();
        let (_a, first) = q.push(record("a"), None);
        let (_b, second) = q.push(record("b"), None);
        assert!(first && !second);
        let batches = q.take();
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].records().count(), 2);
        // Taken: the next append starts the next commit.
        let (_c, third) = q.push(record("c"), None);
        assert!(third);
    }

    #[test]
    fn records_of_different_leases_are_committed_apart_in_order() {
        let q = AuditQueue::default();
        let _p: Vec<_> = [(1, "a"), (1, "b"), (2, "c"), (1, "d")]
            .into_iter()
            .map(|(e, id)| q.push(record(id), Some(lease(e))).0)
            .collect();
        let batches = q.take();
        let ids: Vec<Vec<&str>> = batches
            .iter()
            .map(|b| b.records().map(|r| r.id.as_str()).collect())
            .collect();
        assert_eq!(ids, vec![vec!["a", "b"], vec!["c"], vec!["d"]]);
    }

    #[tokio::test]
    async fn every_append_gets_its_batch_answer() {
        let q = AuditQueue::default();
        let (a, _) = q.push(record("a"), None);
        let (b, _) = q.push(record("b"), None);
        for batch in q.take() {
            batch.answer(Err("disk gone".into()));
        }
        assert!(matches!(a.done().await, Err(AuditError::Sink(m)) if m == "disk gone"));
        assert!(b.done().await.is_err());
        let (c, _) = q.push(record("c"), None);
        q.fail_all("no thread");
        assert!(c.done().await.is_err());
    }
}
