//! Params and results of every wire method (DESIGN.md's method table,
//! protocol.md B.2). Params are always one by-name object.
//!
//! `initialize` params and result ignore unknown members (additive changes
//! do not bump the major); every other params object is strict.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::contract::{RuntimeEvent, RuntimeLimits, RuntimeManifest, ToolCall};
use crate::execution::RuntimeTurnRequest;
use crate::primitives::*;

/// A turn id chosen by the host: 1..128 bytes of `[A-Za-z0-9_.:-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, JsonSchema)]
#[serde(transparent)]
pub struct TurnId(#[schemars(regex(pattern = r"^[A-Za-z0-9_.:-]{1,128}$"))] String);

/// The bytes a turn id may hold, one lookup per byte.
const TURN_ID_BYTE: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b':' | b'-');
        b += 1;
    }
    table
};

impl TurnId {
    pub fn new(value: impl Into<String>) -> Result<Self, PrimitiveError> {
        let v = value.into();
        Self::check(&v)?;
        Ok(Self(v))
    }
    /// [`TurnId::new`] for borrowed text: checked before it is copied.
    pub(crate) fn from_borrowed(v: &str) -> Result<Self, PrimitiveError> {
        Self::check(v)?;
        Ok(Self(v.to_owned()))
    }
    fn check(v: &str) -> Result<(), PrimitiveError> {
        let ok = !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| TURN_ID_BYTE[usize::from(b)]);
        if ok {
            Ok(())
        } else {
            Err(PrimitiveError::Length {
                min: 1,
                max: 128,
                len: v.len(),
            })
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for TurnId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        crate::primitives::from_str_with(d, |s| {
            TurnId::from_borrowed(s).map_err(|_| "turnId must be 1..128 bytes of [A-Za-z0-9_.:-]")
        })
    }
}

impl std::fmt::Display for TurnId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The host's name and version, sent in `initialize`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostInfo {
    pub name: String,
    pub version: String,
}

/// Limits the host announces for the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionLimits {
    /// One line, either direction.
    pub max_message_bytes: u64,
    /// `host/invokeTool` requests in flight at once; more get `-32055`.
    pub max_inflight_tool_calls: u32,
    /// Turns per process; 1 in v1.
    pub max_concurrent_turns: u32,
}

/// `initialize` params (H→P request).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InitializeParams {
    /// Integer protocol majors the host speaks.
    pub protocol_versions: Vec<u32>,
    pub host: HostInfo,
    pub limits: ConnectionLimits,
    #[serde(default)]
    pub capabilities: JsonObject,
}

/// The capability key by which the host offers, and a plugin accepts,
/// several turns on one connection (docs/PROTOCOL.md section 4.6).
pub const CAPABILITY_TURNS: &str = "turns";
/// Its one value: after a turn's outcome, the host may send the next
/// `turn/run` on the same connection instead of closing stdin.
pub const TURNS_MANY: &str = "many";

/// Whether a `capabilities` object says `turns: "many"`.
pub fn offers_many_turns(capabilities: &JsonObject) -> bool {
    capabilities.get(CAPABILITY_TURNS).and_then(Value::as_str) == Some(TURNS_MANY)
}

/// `initialize` result (P→H response).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResult {
    /// The major the plugin chose from `protocolVersions`.
    pub protocol_version: u32,
    /// The plugin's manifest; the host checks it against its registry entry.
    pub manifest: RuntimeManifest,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sdk: Option<String>,
    #[serde(default)]
    pub capabilities: JsonObject,
}

/// `turn/run` params (H→P request). The response is the
/// `RuntimeTurnOutcome`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TurnRunParams {
    pub turn_id: TurnId,
    pub request: RuntimeTurnRequest,
    pub limits: RuntimeLimits,
}

/// `turn/draining` params (H→P notification). It carries no reason.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TurnDrainingParams {
    pub turn_id: TurnId,
}

/// `turn/abort` params (H→P notification).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TurnAbortParams {
    pub turn_id: TurnId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `host/invokeTool` params (P→H request). The result is always a
/// `ToolResult`, refusals included.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InvokeToolParams {
    pub turn_id: TurnId,
    pub call: ToolCall,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
}

/// `host/emit` params (P→H notification).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EmitParams {
    pub turn_id: TurnId,
    pub event: RuntimeEvent,
}

/// `host/annotate` params (P→H notification).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AnnotateParams {
    pub turn_id: TurnId,
    pub key: String,
    pub value: Value,
}

/// Why an annotation key is refused: empty, `runtime` or `__proto__`.
pub fn annotation_key_refused(key: &str) -> bool {
    key.is_empty() || key == "runtime" || key == "__proto__"
}

/// The message for a refused annotation key.
pub const ANNOTATION_KEY_MESSAGE: &str =
    "Runtime annotation key must be a non-empty string other than 'runtime' or '__proto__'";
