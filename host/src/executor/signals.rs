//! The turn's two signals (envelope.md B.5) in one vocabulary: the SDK's
//! observe-only [`Signal`], raised through its [`SignalSource`]. `soft` is
//! `draining`; `hard` aborts the seat and the handlers. Raising hard always
//! raises soft first, so no one ever sees hard raised while soft is not.
//! The kernel takes its abort as a `CancellationToken`; that adaptation is
//! made here, once, and nowhere else.

use std::sync::OnceLock;

use sharedos_plugin_sdk::{Signal, SignalSource};
use tokio_util::sync::CancellationToken;

#[derive(Default)]
pub(crate) struct TurnSignals {
    soft: SignalSource,
    hard: SignalSource,
    /// The hard signal in the form the kernel's ports take.
    kernel_abort: CancellationToken,
    /// Who raised the hard signal first, when it was a stop (`deadline` or
    /// `caller`): a cancelled turn says it in `error.details.cause`, and
    /// the host logs it, so an operator can tell a deadline from a
    /// cancellation.
    cause: OnceLock<&'static str>,
}

impl TurnSignals {
    pub fn raise_soft(&self) {
        self.soft.raise();
    }
    pub fn raise_hard(&self) {
        self.soft.raise();
        self.hard.raise();
        self.kernel_abort.cancel();
    }
    /// Notes `cause` as the stop unless another came first.
    pub fn note_cause(&self, cause: &'static str) {
        let _ = self.cause.set(cause);
    }
    pub fn cause(&self) -> Option<&'static str> {
        self.cause.get().copied()
    }
    pub fn soft_raised(&self) -> bool {
        self.soft.is_raised()
    }
    pub fn hard_raised(&self) -> bool {
        self.hard.is_raised()
    }
    /// The abort, as the seat and the envelope's own waits observe it.
    pub fn hard(&self) -> Signal {
        self.hard.signal()
    }
    /// Resolves once the hard signal is raised. Lazy: nothing is
    /// subscribed to until it is first polled.
    pub async fn aborted(&self) {
        self.hard.signal().raised().await;
    }
    /// `draining`, as the plugin observes it.
    pub fn draining(&self) -> Signal {
        self.soft.signal()
    }
    /// The abort as the kernel's `invoke_tool` takes it.
    pub fn kernel_abort(&self) -> CancellationToken {
        self.kernel_abort.clone()
    }
}
