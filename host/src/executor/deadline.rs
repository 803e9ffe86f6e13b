//! The deadline machinery of B.5: the one timer of a turn. It raises
//! `draining` at `timeout − grace` (when grace > 0) and the hard stop at
//! `timeout`, or earlier, at `grace` after an audit outage drained the turn
//! (B.10). Nothing else arms a timer on the turn's signals.

use std::sync::{Arc, Weak};
use std::time::Duration;

use sharedos_protocol::Identifier;
use tokio::sync::watch;
use tokio::time::Instant;

use super::signals::TurnSignals;

/// The armed timer; disarmed when the turn closes (or this is dropped).
pub(crate) struct Deadline {
    task: tokio::task::JoinHandle<()>,
    /// When an outage's drain wants the hard stop.
    outage_stop: watch::Sender<Option<Instant>>,
    grace: Duration,
}

impl Deadline {
    /// Arms the timer. The clock starts now, not when the timer task is
    /// first polled. A grace no smaller than the limit leaves no time in
    /// which a call is taken: the turn is draining from its first instant,
    /// before the seat can make a call (ADR 0007).
    pub fn arm(
        signals: &Arc<TurnSignals>,
        execution_id: Identifier,
        timeout_ms: u64,
        grace_ms: u64,
    ) -> Self {
        let start = Instant::now();
        if grace_ms > 0 && grace_ms >= timeout_ms {
            signals.raise_soft();
        }
        let (outage_stop, outage) = watch::channel(None);
        let timer = Timer {
            signals: Arc::downgrade(signals),
            execution_id,
            timeout_ms,
            deadline: start + Duration::from_millis(timeout_ms),
            drain_at: (grace_ms > 0 && grace_ms < timeout_ms)
                .then(|| start + Duration::from_millis(timeout_ms - grace_ms)),
            outage,
        };
        Self {
            task: tokio::spawn(timer.run()),
            outage_stop,
            grace: Duration::from_millis(grace_ms),
        }
    }

    /// An outage's drain: the hard stop at `grace` from now, unless the
    /// deadline comes first (the stop comes at min(grace, time left)).
    pub fn stop_after_grace(&self) {
        let at = Instant::now() + self.grace;
        self.outage_stop.send_if_modified(|slot| {
            let first = slot.is_none();
            slot.get_or_insert(at);
            first
        });
    }

    pub fn disarm(&self) {
        self.task.abort();
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Timer {
    signals: Weak<TurnSignals>,
    execution_id: Identifier,
    timeout_ms: u64,
    deadline: Instant,
    drain_at: Option<Instant>,
    outage: watch::Receiver<Option<Instant>>,
}

impl Timer {
    async fn run(mut self) {
        let mut stop_at = self.deadline;
        loop {
            let drain = self.drain_at.filter(|d| *d < stop_at);
            tokio::select! {
                biased;
                _ = tokio::time::sleep_until(drain.unwrap_or(stop_at)) => {
                    if drain.is_none() {
                        break;
                    }
                    self.drain_at = None;
                    match self.signals.upgrade() {
                        Some(s) => s.raise_soft(),
                        None => return,
                    }
                }
                Ok(()) = self.outage.changed() => {
                    if let Some(at) = *self.outage.borrow_and_update() {
                        stop_at = stop_at.min(at);
                    }
                }
            }
        }
        let Some(signals) = self.signals.upgrade() else {
            return;
        };
        if stop_at >= self.deadline {
            signals.note_cause("deadline");
            if !signals.hard_raised() {
                tracing::warn!(execution_id = %self.execution_id, timeout_ms = self.timeout_ms, "the turn reached its deadline; stopping the runtime");
            }
        }
        signals.raise_hard();
    }
}
