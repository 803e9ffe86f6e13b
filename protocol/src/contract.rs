//! The envelope contracts a runtime sees (envelope.md A.3–A.7, A.9; the
//! turn request, A.2, is in `execution`).
//!
//! Every object here is strict: an unknown key fails to parse.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::primitives::*;

/// The escalation affordance's tool name (spec E.3): its presence in a
/// turn's catalogue is what offers escalation. Its one home: the kernel,
/// the envelope, the SDK and the harness all name it through this.
pub const ESCALATE_TOOL: &str = "sharedos.escalate";

/// The literal contract version `"1"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Version {
    #[default]
    #[serde(rename = "1")]
    V1,
}

/// Whether a tool reads or writes: the conservative classification the
/// retryable rule trusts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReadWrite {
    Read,
    Write,
}

/// `ResourceRef { namespace, path, owner? }`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourceRef {
    pub namespace: Identifier,
    /// At most 64 segments.
    pub path: Vec<PathSegment>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Address>,
}

/// What a tool needs: one action on one resource.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CapabilityRequirement {
    pub resource: ResourceRef,
    pub action: ShortName,
}

/// Behaviour hints of a tool.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ToolAnnotations {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
}

/// A tool definition (A.4). The kernel's definitions win over a caller's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ToolDefinition {
    pub name: Identifier,
    pub description: Description,
    pub namespace: Identifier,
    pub source: Identifier,
    pub read_write: ReadWrite,
    pub input_schema: JsonObject,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<JsonObject>,
    pub required_capability: CapabilityRequirement,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<ToolAnnotations>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<JsonObject>,
}

impl ToolDefinition {
    /// The refinements of A.4 beyond the shape.
    pub fn check(&self) -> Result<(), ContractError> {
        let ann = self.annotations.clone().unwrap_or_default();
        if self.read_write == ReadWrite::Read && ann.destructive == Some(true) {
            return Err(ContractError::new(format!(
                "tool {}: a read tool cannot be destructive",
                self.name
            )));
        }
        if self.read_write == ReadWrite::Write && ann.read_only == Some(true) {
            return Err(ContractError::new(format!(
                "tool {}: a write tool cannot be readOnly",
                self.name
            )));
        }
        if self.required_capability.resource.path.len() > 64 {
            return Err(ContractError::new(format!(
                "tool {}: requiredCapability.resource.path has more than 64 segments",
                self.name
            )));
        }
        Ok(())
    }

    /// Safe to repeat: a read, or a write declared idempotent (A.4).
    pub fn repeatable(&self) -> bool {
        self.read_write == ReadWrite::Read
            || self.annotations.as_ref().and_then(|a| a.idempotent) == Some(true)
    }
}

/// A tool call as the runtime asks for it (A.5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ToolCall {
    pub id: Identifier,
    pub tool: Identifier,
    pub arguments: JsonObject,
    pub trace_id: Identifier,
    pub requested_at: Timestamp,
}

/// A protocol-level error value carried in results (A.5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProtocolError {
    pub code: Identifier,
    pub message: ErrorMessage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<JsonObject>,
}

impl ProtocolError {
    /// An error with a code and a message written in code. Messages longer
    /// than the contract allows are cut; empty ones become the code.
    pub fn new(code: &str, message: &str, retryable: Option<bool>) -> Self {
        let code = Identifier::new(code).unwrap_or_else(|_| ident("error"));
        let mut msg: String = message.trim().chars().take(4096).collect();
        if msg.is_empty() {
            msg = code.as_str().to_owned();
        }
        let message = ErrorMessage::new(&msg).unwrap_or_else(|_| ident_message(code.as_str()));
        Self {
            code,
            message,
            retryable,
            details: None,
        }
    }
}

fn ident_message(code: &str) -> ErrorMessage {
    ErrorMessage::new(code)
        .unwrap_or_else(|_| ErrorMessage::new("error").unwrap_or_else(|_| unreachable!()))
}

/// The three statuses of a tool result. `interrupted` is an audit outcome
/// only, never a `ToolResult` status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ToolStatus {
    Succeeded,
    Denied,
    Failed,
}

impl ToolStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolStatus::Succeeded => "succeeded",
            ToolStatus::Denied => "denied",
            ToolStatus::Failed => "failed",
        }
    }
}

/// The answer to a tool call (A.5): `succeeded | denied | failed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToolResult {
    Succeeded {
        #[serde(rename = "callId")]
        call_id: Identifier,
        tool: Identifier,
        #[serde(rename = "completedAt")]
        completed_at: Timestamp,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metadata: Option<JsonObject>,
        output: Value,
    },
    Denied {
        #[serde(rename = "callId")]
        call_id: Identifier,
        tool: Identifier,
        #[serde(rename = "completedAt")]
        completed_at: Timestamp,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metadata: Option<JsonObject>,
        error: ProtocolError,
    },
    Failed {
        #[serde(rename = "callId")]
        call_id: Identifier,
        tool: Identifier,
        #[serde(rename = "completedAt")]
        completed_at: Timestamp,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metadata: Option<JsonObject>,
        error: ProtocolError,
    },
}

impl ToolResult {
    pub fn succeeded(call: &ToolCall, output: Value, at: Timestamp) -> Self {
        ToolResult::Succeeded {
            call_id: call.id.clone(),
            tool: call.tool.clone(),
            completed_at: at,
            metadata: None,
            output,
        }
    }
    /// A refusal made before anything ran. Envelope and kernel refusals are
    /// never retryable.
    pub fn denied(call: &ToolCall, code: &str, message: &str, at: Timestamp) -> Self {
        ToolResult::Denied {
            call_id: call.id.clone(),
            tool: call.tool.clone(),
            completed_at: at,
            metadata: None,
            error: ProtocolError::new(code, message, Some(false)),
        }
    }
    pub fn failed(call: &ToolCall, code: &str, message: &str, at: Timestamp) -> Self {
        ToolResult::Failed {
            call_id: call.id.clone(),
            tool: call.tool.clone(),
            completed_at: at,
            metadata: None,
            error: ProtocolError::new(code, message, Some(false)),
        }
    }
    pub fn status(&self) -> ToolStatus {
        match self {
            ToolResult::Succeeded { .. } => ToolStatus::Succeeded,
            ToolResult::Denied { .. } => ToolStatus::Denied,
            ToolResult::Failed { .. } => ToolStatus::Failed,
        }
    }
    pub fn call_id(&self) -> &Identifier {
        match self {
            ToolResult::Succeeded { call_id, .. }
            | ToolResult::Denied { call_id, .. }
            | ToolResult::Failed { call_id, .. } => call_id,
        }
    }
    pub fn tool(&self) -> &Identifier {
        match self {
            ToolResult::Succeeded { tool, .. }
            | ToolResult::Denied { tool, .. }
            | ToolResult::Failed { tool, .. } => tool,
        }
    }
    pub fn error(&self) -> Option<&ProtocolError> {
        match self {
            ToolResult::Succeeded { .. } => None,
            ToolResult::Denied { error, .. } | ToolResult::Failed { error, .. } => Some(error),
        }
    }
    pub fn output(&self) -> Option<&Value> {
        match self {
            ToolResult::Succeeded { output, .. } => Some(output),
            _ => None,
        }
    }
}

/// Something that happened at a moment, as a plugin states it (`emit`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RuntimeEvent {
    #[serde(rename = "type")]
    pub kind: Identifier,
    pub data: Value,
}

/// What `run` resolves to (A.7), discriminated by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum RuntimeTurnOutcome {
    Complete {
        output: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metadata: Option<JsonObject>,
    },
    Fail {
        error: ProtocolError,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metadata: Option<JsonObject>,
    },
    Escalate {
        reason: Reason,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metadata: Option<JsonObject>,
    },
}

impl RuntimeTurnOutcome {
    pub fn complete(output: Value) -> Self {
        RuntimeTurnOutcome::Complete {
            output,
            metadata: None,
        }
    }
    pub fn metadata(&self) -> Option<&JsonObject> {
        match self {
            RuntimeTurnOutcome::Complete { metadata, .. }
            | RuntimeTurnOutcome::Fail { metadata, .. }
            | RuntimeTurnOutcome::Escalate { metadata, .. } => metadata.as_ref(),
        }
    }
}

/// A runtime's JSON-safe identity (A.9).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RuntimeManifest {
    pub id: Identifier,
    pub version: Identifier,
    pub protocol_version: Version,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<JsonObject>,
}

impl RuntimeManifest {
    pub fn new(id: &str, version: &str) -> Result<Self, PrimitiveError> {
        Ok(Self {
            id: Identifier::new(id)?,
            version: Identifier::new(version)?,
            protocol_version: Version::V1,
            metadata: None,
        })
    }
}

/// The turn's bounded step, tool-call and deadline limits (A.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RuntimeLimits {
    pub max_steps: u32,
    pub max_tool_calls: u32,
    /// The deadline, in milliseconds from the start of the turn.
    pub timeout_ms: u64,
    /// The host's drain grace: `turn/draining` comes this long before the
    /// deadline. Absent when the host drains only on an audit outage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_grace_ms: Option<u64>,
    /// When the drain starts, in milliseconds from the start of the turn
    /// (`timeoutMs - drainGraceMs`, 0 when the grace is not below the
    /// limit: the turn drains from its first instant). Absent with no grace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_at_ms: Option<u64>,
}

/// One descriptive reach entry. It grants nothing and carries no grant id,
/// issuer, expiry or budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReachEntry {
    pub namespace: Identifier,
    pub path: Vec<PathSegment>,
    pub actions: Vec<ShortName>,
    pub scope: ReachScope,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReachScope {
    Exact,
    Descendants,
}

/// What the runtime is told about its reach (A.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
pub enum ReachResult {
    Computed {
        reach: Vec<ReachEntry>,
    },
    Unavailable {
        #[serde(rename = "reasonCode")]
        reason_code: Identifier,
    },
}

/// A contract refinement that the shape alone does not catch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ContractError(pub String);

impl ContractError {
    pub fn new(msg: impl Into<String>) -> Self {
        Self(msg.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tool_result_is_strict_and_tagged() {
        let ok: ToolResult = serde_json::from_value(json!({
            "status":"succeeded","callId":"c1","tool":"t","completedAt":"2026-01-01T00:00:00Z","output":null
        }))
        .unwrap();
        assert_eq!(ok.status(), ToolStatus::Succeeded);
        assert_eq!(ok.output(), Some(&Value::Null));
        // missing output
        assert!(
            serde_json::from_value::<ToolResult>(json!({
                "status":"succeeded","callId":"c1","tool":"t","completedAt":"2026-01-01T00:00:00Z"
            }))
            .is_err()
        );
        // unknown key
        assert!(serde_json::from_value::<ToolResult>(json!({
            "status":"succeeded","callId":"c1","tool":"t","completedAt":"2026-01-01T00:00:00Z","output":1,"x":1
        }))
        .is_err());
        // interrupted is not a status
        assert!(
            serde_json::from_value::<ToolResult>(json!({
                "status":"interrupted","callId":"c1","tool":"t","completedAt":"2026-01-01T00:00:00Z"
            }))
            .is_err()
        );
    }

    #[test]
    fn outcome_strict() {
        assert!(serde_json::from_value::<RuntimeTurnOutcome>(json!({"type":"complete"})).is_err());
        assert!(
            serde_json::from_value::<RuntimeTurnOutcome>(
                json!({"type":"complete","output":1,"extra":1})
            )
            .is_err()
        );
        assert!(
            serde_json::from_value::<RuntimeTurnOutcome>(json!({"type":"escalate","reason":"  "}))
                .is_err()
        );
        assert!(serde_json::from_value::<RuntimeTurnOutcome>(json!({"type":"other"})).is_err());
        let o: RuntimeTurnOutcome =
            serde_json::from_value(json!({"type":"complete","output":null})).unwrap();
        assert_eq!(o, RuntimeTurnOutcome::complete(Value::Null));
    }

    #[test]
    fn tool_call_strict() {
        let base = json!({"id":"c","tool":"t","arguments":{},"traceId":"tr","requestedAt":"2026-01-01T00:00:00Z"});
        assert!(serde_json::from_value::<ToolCall>(base.clone()).is_ok());
        let mut extra = base.clone();
        extra["grant"] = json!({});
        assert!(serde_json::from_value::<ToolCall>(extra).is_err());
        let mut missing = base;
        missing.as_object_mut().unwrap().remove("traceId");
        assert!(serde_json::from_value::<ToolCall>(missing).is_err());
    }

    #[test]
    fn manifest_version_literal() {
        assert!(
            serde_json::from_value::<RuntimeManifest>(
                json!({"id":"a","version":"1","protocolVersion":"2"})
            )
            .is_err()
        );
        assert!(
            serde_json::from_value::<RuntimeManifest>(
                json!({"id":"a","version":"1","protocolVersion":"1"})
            )
            .is_ok()
        );
    }
}
