//! The sharedos kernel: the one place that decides whether a tool call runs.
//!
//! A tool is usable in a turn only if it is registered, its namespace is
//! enabled, and a grant from the trusted grant source covers the exact
//! resource and action the call resolves to. Every decision is written to
//! the audit trail before any effect, every outcome after it.
//!
//! The envelope (in `sharedos-host`) reaches the kernel only through
//! [`TurnKernel`] and the [`KernelTurn`] it opens per turn. A host builds the embedded default with
//! [`Kernel::from_config`]:
//!
//! ```no_run
//! use std::sync::Arc;
//! use sharedos_kernel::{JsonlAuditSink, Kernel, KernelConfig};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config: KernelConfig = toml::from_str(r#"
//!     [[grants]]
//!     id = "alice-admission"
//!     subject = { kind = "agent", agentId = "alice" }
//!     issuer = { kind = "service", serviceId = "host" }
//!     namespaceId = "tenant-1"
//!     capabilities = [{ namespace = "sharedos.execution", path = ["agent", "alice"], scope = "exact", actions = ["invoke"] }]
//! "#)?;
//! let audit = Arc::new(JsonlAuditSink::open("/var/lib/sharedos/audit.jsonl")?);
//! let kernel = Kernel::from_config(&config, "/var/lib/sharedos/files".as_ref(), audit)?;
//! # let _ = kernel; Ok(()) }
//! ```

#![forbid(unsafe_code)]

pub mod audit;
pub mod config;
pub mod grant;
pub mod kernel;
pub mod port;
pub mod registry;
pub mod tools;
pub mod usage;

pub use audit::{
    AuditEntry, AuditError, AuditKind, AuditOutcome, AuditRecord, AuditSink, AuditSource, EntryId,
    IdentityRef, JsonlAuditSink, MemoryAuditSink, MetadataRef, RecordId, RecordIdentity,
    RecordMetadata,
};
pub use config::{
    ConfigError, EscalationConfig, FilesConfig, FrozenSubtree, HostPolicy, KernelConfig,
};
pub use grant::{
    Capability, ConfigGrantSource, Grant, GrantConstraints, GrantSource, MAX_DELEGATION_DEPTH,
    MemoryUsageStore, Scope, UsageStore,
};
pub use kernel::{ErrorHook, Kernel, KernelBuilder, KernelSetupError, TracingHook, catalog_hash};
pub use port::{
    Admission, Admitted, AuditEffect, EffectDecision, KernelError, KernelTurn, Opening,
    OpeningDurable, OwnedInvoke, RefusedCall, TurnEnd, TurnKernel,
};
pub use registry::{HandlerAnswer, RegistrationError, ToolError, ToolHandler, ToolRegistry};
pub use usage::JsonlUsageStore;
