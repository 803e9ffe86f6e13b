//! The sharedos kernel: the one place that decides whether a tool call runs.
//!
//! A tool is usable in a turn only if it is registered, its namespace is
//! enabled, and a grant from the trusted grant source covers the exact
//! resource and action the call resolves to. Every decision is written to
//! the audit trail before any effect, every outcome after it.
//!
//! The envelope (in `sharedos-host`) reaches the kernel only through
//! [`TurnKernel`].

pub mod port;

pub use port::{Admission, AuditEffect, KernelError, RefusedCall, TurnEnd, TurnKernel, TurnLease};
