//! Why a call did not reach a result of its handler: what each step of
//! `invoke_tool` (invoke.rs) and the guarded handler (run.rs) answer
//! instead of going on.

use sharedos_protocol::ToolResult;

use crate::port::KernelError;

/// Why a call did not reach a result of its handler.
pub(crate) enum Refusal {
    /// The kernel answers the call itself (recorded `tool.invoked` with the
    /// result's status and code). Boxed: the common path is `Ok`, and a
    /// small `Err` keeps every step's return cheap.
    Answer(Box<ToolResult>),
    /// The handler was entered and then stopped: recorded `interrupted`
    /// with `reason`, and the call rejects with `error` (envelope.md C.4).
    Interrupted {
        reason: &'static str,
        error: KernelError,
    },
    /// The call rejects with nothing more recorded: stopped before its port
    /// was entered, or its decision could not be written.
    Reject(KernelError),
}

impl From<KernelError> for Refusal {
    fn from(e: KernelError) -> Self {
        Refusal::Reject(e)
    }
}
