//! The deadline machinery of B.5, and which stop ended a cancelled turn.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::turn::Turn;

/// Who raised the hard signal first: `deadline` or `caller`. A cancelled
/// turn says it in `error.details.cause`, and the host logs it, so an
/// operator can tell a deadline from a cancellation.
#[derive(Debug, Default)]
pub(crate) struct StopCause(OnceLock<&'static str>);

impl StopCause {
    /// Notes `cause` unless another stop came first.
    pub fn set(&self, cause: &'static str) {
        let _ = self.0.set(cause);
    }
    pub fn get(&self) -> Option<&'static str> {
        self.0.get().copied()
    }
}

/// The two timers of B.5: `draining` at `timeout − grace` (when grace > 0)
/// and the hard stop at `timeout`.
pub(crate) fn spawn_deadlines(
    turn: &Arc<Turn>,
    timeout_ms: u64,
    grace_ms: u64,
    stop: Arc<StopCause>,
) -> tokio::task::JoinHandle<()> {
    // The clock starts now, not when the timer task is first polled.
    let start = tokio::time::Instant::now();
    // A grace no smaller than the limit leaves no time in which a call is
    // taken: the turn is draining from its first instant, before the seat
    // can make a call (ADR 0007).
    if grace_ms > 0 && grace_ms >= timeout_ms {
        turn.signals.raise_soft();
    }
    let weak = Arc::downgrade(turn);
    tokio::spawn(async move {
        let deadline = start + Duration::from_millis(timeout_ms);
        if grace_ms > 0 && grace_ms < timeout_ms {
            tokio::time::sleep_until(
                start + Duration::from_millis(timeout_ms.saturating_sub(grace_ms)),
            )
            .await;
            match weak.upgrade() {
                Some(t) => t.signals.raise_soft(),
                None => return,
            }
        }
        tokio::time::sleep_until(deadline).await;
        if let Some(t) = weak.upgrade() {
            stop.set("deadline");
            if !t.signals.hard_raised() {
                tracing::warn!(execution_id = %t.execution_id, timeout_ms, "the turn reached its deadline; stopping the runtime");
            }
            t.signals.raise_hard();
        }
    })
}
