//! The runtime-facing contract of sharedos.
//!
//! A runtime plugin implements [`RuntimePlugin`]. It is handed a sanitized
//! [`RuntimeTurnRequest`], an abort [`Signal`] and a [`RuntimeHost`] with
//! exactly five members: `limits`, `invoke_tool`, `emit`, `annotate` and
//! `draining`. Nothing else: no grants, no files of the host, no network.
//!
//! The same plugin code runs in-process (trusted: the host calls it
//! directly) or out-of-process (untrusted: `serve` turns a binary into a
//! plugin over its stdin/stdout).

#![forbid(unsafe_code)]

mod host;
mod remote;
mod serve;
mod signal;
pub mod standard;

pub use host::{HostCallError, RuntimeError, RuntimeHost, RuntimePlugin, check_annotation};
pub use remote::RemoteHost;
pub use serve::{SDK_NAME, ServeError, serve, serve_io};
pub use signal::{Signal, SignalSource};
pub use standard::{
    AgentTurnDecision, AgentTurnDriver, AgentTurnInput, AgentTurnSession, DriverError,
    SessionOutcome, StandardRuntimeOptions, create_standard_runtime, standard_runtime_manifest,
};

pub use sharedos_protocol as protocol;
pub use sharedos_protocol::{
    JsonObject, RuntimeEvent, RuntimeLimits, RuntimeManifest, RuntimeTurnOutcome,
    RuntimeTurnRequest, ToolCall, ToolResult,
};
