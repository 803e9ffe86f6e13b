//! The sharedos wire contract.
//!
//! ```
//! use sharedos_protocol::{RuntimeEvent, methods};
//! let event: RuntimeEvent = serde_json::from_str(r#"{"type":"progress","data":{"pct":50}}"#).unwrap();
//! assert_eq!(event.kind.as_str(), "progress");
//! assert_eq!(methods::HOST_EMIT, "host/emit");
//! ```
//!
//! This crate holds data and the codec, nothing else: the types of every
//! message a host and a runtime plugin exchange (serde + schemars), the
//! envelope contracts they carry (`envelope.md` section A), method names,
//! protocol versions, JSON-RPC error codes and the bounded NDJSON codec.
//! No process, no policy.

#![forbid(unsafe_code)]

pub mod api_names;
pub mod codec;
pub mod contract;
pub mod errors;
mod event_kind;
pub mod execution;
pub mod harness;
pub mod json;
pub mod jsonrpc;
pub mod method;
pub mod per_call;
pub mod primitives;
mod rfc3339;
pub mod schema;
pub mod text;
pub mod tool_json;
pub mod wire;

pub use codec::{DEFAULT_MAX_MESSAGE_BYTES, FrameError, NdjsonCodec};
pub use contract::*;
pub use errors::{ErrorKind, RpcErrorCode};
pub use event_kind::EventKind;
pub use execution::*;
pub use primitives::*;
pub use wire::*;

/// The contract version carried in manifests and requests (`"1"`).
pub const CONTRACT_VERSION: &str = "1";

/// Wire protocol majors this build speaks, in preference order.
pub const PROTOCOL_VERSIONS: &[u32] = &[1];

/// Method names, from the declarations in [`method`].
pub mod methods {
    use crate::method::*;
    pub const INITIALIZE: &str = Initialize::NAME;
    pub const TURN_RUN: &str = TurnRun::NAME;
    pub const TURN_DRAINING: &str = TurnDraining::NAME;
    pub const TURN_ABORT: &str = TurnAbort::NAME;
    pub const HOST_INVOKE_TOOL: &str = InvokeTool::NAME;
    pub const HOST_EMIT: &str = Emit::NAME;
    pub const HOST_ANNOTATE: &str = Annotate::NAME;
}

/// The environment variable a host sets so an SDK knows it was started by a
/// host (a UX cookie, not a security measure).
pub const PLUGIN_COOKIE_ENV: &str = "SHAREDOS_PLUGIN";

/// The environment variable a host sets to its egress gateway's URL
/// (`http://host:port`) for a plugin whose traffic goes through it.
pub const EGRESS_URL_ENV: &str = "SHAREDOS_EGRESS_URL";

/// The environment variable a host sets to [`PLACEHOLDER_MODEL_KEY`] for a
/// model driver that insists on a key.
pub const MODEL_KEY_ENV: &str = "SHAREDOS_MODEL_KEY";

/// The placeholder a plugin is given where a program insists on a key;
/// the egress gateway drops it and adds the real one.
pub const PLACEHOLDER_MODEL_KEY: &str = "sharedos-placeholder";
