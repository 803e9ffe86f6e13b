//! The audit record's line behind one face: [`fast`] (the hand writer a
//! sink uses, `audit/line.rs`) and [`reference`] (serde's derive) offer
//! the same function and give the same bytes, so a caller that compares
//! them (the bench) picks one by path; and [`LineSink`], a sink that
//! hands each record's line to a function, so a sink outside the kernel
//! gets the lines the JSONL sink writes without naming the shared record
//! parts ([`super::AuditEntry`] and its pieces never leave the kernel).

use async_trait::async_trait;

use super::{AuditEntry, AuditError, AuditRecord, AuditSink};

/// The hand-written line: the keys as literal bytes, the turn's shared
/// parts written once.
pub mod fast {
    use super::{AuditError, AuditRecord};

    /// `record` as one JSON line, newline included.
    pub fn record_line(record: &AuditRecord) -> Result<Vec<u8>, AuditError> {
        record.to_json_line()
    }
}

/// The reference: the serde derive through `serde_json`.
pub mod reference {
    use super::{AuditError, AuditRecord};

    /// `record` as one JSON line, newline included.
    pub fn record_line(record: &AuditRecord) -> Result<Vec<u8>, AuditError> {
        let mut line = serde_json::to_vec(record).map_err(|e| AuditError::Sink(e.to_string()))?;
        line.push(b'\n');
        Ok(line)
    }
}

/// A sink that writes each record as its JSON line (the bytes the JSONL
/// sink writes, made the same way, in the caller's task) and hands the
/// line to `deliver`; what `deliver` does with it (drop it, count it,
/// send it on) is the caller's.
pub struct LineSink<F> {
    deliver: F,
}

impl<F> LineSink<F>
where
    F: Fn(Vec<u8>) -> Result<(), AuditError> + Send + Sync,
{
    pub fn new(deliver: F) -> Self {
        Self { deliver }
    }
}

#[async_trait]
impl<F> AuditSink for LineSink<F>
where
    F: Fn(Vec<u8>) -> Result<(), AuditError> + Send + Sync,
{
    async fn append(&self, record: &AuditRecord) -> Result<(), AuditError> {
        (self.deliver)(record.to_json_line()?)
    }
    async fn append_entry(&self, entry: &AuditEntry<'_>) -> Result<(), AuditError> {
        (self.deliver)(entry.to_json_line()?)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::{AuditSink, LineSink, fast, reference};
    use crate::audit::AuditRecord;

    fn record() -> AuditRecord {
        let text = r#"{"id":"0190c3e2-0000-7000-8000-000000000001","type":"tool.invoked","outcome":"succeeded","at":"2026-12-05T21:14:39.123Z","traceId":"trace-7f3a","namespaceId":"acme","actor":{"kind":"agent","agentId":"agent-1"},"authority":{"kind":"service","serviceId":"svc"},"owner":{"kind":"human","userId":"user-1"},"purpose":"summarise \"the\" notes\n","source":"kernel","resource":{"namespace":"acme","path":["notes","2026"]},"action":"read","grantId":"g-12","operationId":"op-9","tool":"files.read"}"#;
        serde_json::from_str(text).unwrap_or_else(|e| panic!("the record reads: {e}"))
    }

    #[test]
    fn both_faces_write_the_same_line() {
        let r = record();
        let line = fast::record_line(&r).ok();
        assert!(line.as_ref().is_some_and(|l| l.ends_with(b"}\n")));
        assert_eq!(line, reference::record_line(&r).ok());
    }

    #[tokio::test]
    async fn the_line_sink_hands_on_what_the_reference_writes() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let into = Arc::clone(&seen);
        let sink = LineSink::new(move |line| {
            into.lock()
                .map_err(|_| crate::AuditError::Sink("poisoned".into()))?
                .push(line);
            Ok(())
        });
        let r = record();
        assert!(sink.append(&r).await.is_ok());
        assert!(sink.append_entry(&r.entry()).await.is_ok());
        let want = reference::record_line(&r).ok();
        let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
        assert_eq!(seen.len(), 2);
        for line in seen {
            assert_eq!(Some(line), want);
        }
    }
}
