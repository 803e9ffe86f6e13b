//! An audit sink that fails on demand.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use sharedos_kernel::{AuditError, AuditKind, AuditRecord, AuditSink};

/// Wraps `inner`: a record of a kind set to fail is refused with
/// `AuditError::Sink` (nothing reaches `inner`); a record of a kind set to
/// be slow (or any record, with [`FaultySink::slow_all`]) waits first.
/// Both can change while a turn runs: an outage on demand.
#[derive(Default)]
pub struct FaultySink<S> {
    inner: S,
    failing: Mutex<Vec<AuditKind>>,
    slow: Mutex<Vec<Slow>>,
}

/// Which records wait, and how long.
#[derive(Clone, Copy)]
struct Slow {
    /// `None`: every kind.
    kind: Option<AuditKind>,
    /// Only records of a tool call (`tool` set).
    calls_only: bool,
    delay: Duration,
}

impl Slow {
    fn applies(&self, record: &AuditRecord) -> bool {
        self.kind.is_none_or(|k| k == record.kind) && (!self.calls_only || record.tool.is_some())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<S: AuditSink> FaultySink<S> {
    /// A sink that passes everything to `inner`.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            failing: Mutex::new(Vec::new()),
            slow: Mutex::new(Vec::new()),
        }
    }

    /// A sink whose records of `kinds` fail from the start.
    pub fn failing(inner: S, kinds: &[AuditKind]) -> Self {
        let sink = Self::new(inner);
        for &kind in kinds {
            sink.fail_on(kind);
        }
        sink
    }

    /// Records of `kind` fail from now on.
    pub fn fail_on(&self, kind: AuditKind) {
        lock(&self.failing).push(kind);
    }

    /// Nothing fails any more.
    pub fn heal(&self) {
        lock(&self.failing).clear();
    }

    /// Records of `kind` wait `delay` before they are written.
    pub fn slow_on(&self, kind: AuditKind, delay: Duration) {
        self.slow_where(Some(kind), false, delay);
    }

    /// Records of `kind` about a tool call (`tool` set) wait `delay`; a
    /// zero delay removes the wait.
    pub fn slow_calls_on(&self, kind: AuditKind, delay: Duration) {
        self.slow_where(Some(kind), true, delay);
    }

    /// Every record waits `delay` (`None`: no record waits any more).
    pub fn slow_all(&self, delay: Option<Duration>) {
        let mut slow = lock(&self.slow);
        slow.clear();
        slow.extend(delay.map(|delay| Slow {
            kind: None,
            calls_only: false,
            delay,
        }));
    }

    fn slow_where(&self, kind: Option<AuditKind>, calls_only: bool, delay: Duration) {
        let mut slow = lock(&self.slow);
        slow.retain(|s| s.kind != kind || s.calls_only != calls_only);
        if !delay.is_zero() {
            slow.push(Slow {
                kind,
                calls_only,
                delay,
            });
        }
    }

    /// The wrapped sink.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

#[async_trait]
impl<S: AuditSink> AuditSink for FaultySink<S> {
    async fn append(&self, record: &AuditRecord) -> Result<(), AuditError> {
        let delay = lock(&self.slow)
            .iter()
            .find(|s| s.applies(record))
            .map(|s| s.delay);
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        if lock(&self.failing).contains(&record.kind) {
            return Err(AuditError::Sink(format!(
                "disk on fire (test fault on {})",
                record.kind
            )));
        }
        self.inner.append(record).await
    }
}
