//! The caller-facing contracts: `ExecutionRequest` in, `ExecutionResult`
//! out (envelope.md A.1, A.6, A.8), and the sanitized `RuntimeTurnRequest`
//! the runtime sees in their place (A.2): it carries the request's message
//! and options, so it lives next to them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::contract::{ContractError, ProtocolError, ReachResult, ToolDefinition, Version};
use crate::primitives::*;

/// Upper bound of `options.timeoutMs`.
pub const MAX_EXECUTION_TIMEOUT_MS: u64 = 600_000;
/// Upper bound of `options.maxToolCalls`.
pub const MAX_EXECUTION_TOOL_CALLS: u32 = 10_000;
/// Upper bound of `options.maxSteps`.
pub const MAX_EXECUTION_STEPS: u32 = 1_000;
/// At most this many tools may be requested.
pub const MAX_REQUESTED_TOOLS: usize = 512;

/// Per-request limits (strict).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExecutionOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_steps: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_tool_calls: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_EXECUTION_TIMEOUT_MS))]
    pub timeout_ms: Option<u64>,
}

/// Who the turn is for, and under whose authority (strict; carries no
/// grants).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AccessContext {
    pub namespace_id: Identifier,
    pub actor: Address,
    pub authority: Address,
    pub owner: Address,
    pub purpose: Purpose,
    pub trace_id: Identifier,
    /// Unique, at most 256.
    pub enabled_tool_namespaces: Vec<Identifier>,
    pub now: Timestamp,
}

/// Where a message came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MessageProvenance {
    pub source: Identifier,
    /// At most 64.
    pub parent_ids: Vec<Identifier>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<JsonObject>,
}

/// The message that starts a turn (strict).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MessageEnvelope {
    pub version: Version,
    pub id: Identifier,
    pub sender: Address,
    pub receiver: Address,
    pub purpose: Purpose,
    pub payload: Value,
    pub trace_id: Identifier,
    pub created_at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<Identifier>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<MessageProvenance>,
}

/// One turn to run (A.1). Runtime selection is not a field: the host picks
/// the runtime from trusted configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExecutionRequest {
    pub version: Version,
    pub execution_id: Identifier,
    pub agent: Address,
    pub context: AccessContext,
    pub message: MessageEnvelope,
    /// Names requested; the kernel's definitions win. At most 512.
    pub tools: Vec<ToolDefinition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<JsonObject>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<ExecutionOptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<JsonObject>,
}

impl ExecutionRequest {
    /// The refinements of A.1 beyond the shape: bounds, uniqueness, the
    /// agent address kind. A request that fails here gets no result.
    pub fn check(&self) -> Result<(), ContractError> {
        if !matches!(self.agent, Address::Agent { .. }) {
            return Err(ContractError::new(
                "agent: must be an agent address ({\"kind\":\"agent\",\"agentId\":…})",
            ));
        }
        if self.tools.len() > MAX_REQUESTED_TOOLS {
            return Err(ContractError::new(format!(
                "tools: at most {MAX_REQUESTED_TOOLS} tools may be requested"
            )));
        }
        for (i, t) in self.tools.iter().enumerate() {
            t.check()
                .map_err(|e| ContractError::new(format!("tools[{i}]: {e}")))?;
        }
        let ns = &self.context.enabled_tool_namespaces;
        if ns.len() > 256 {
            return Err(ContractError::new(
                "context.enabledToolNamespaces: at most 256 entries",
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for n in ns {
            if !seen.insert(n.as_str()) {
                return Err(ContractError::new(format!(
                    "context.enabledToolNamespaces: {n} appears twice"
                )));
            }
        }
        if let Some(p) = &self.message.provenance
            && p.parent_ids.len() > 64
        {
            return Err(ContractError::new(
                "message.provenance.parentIds: at most 64 entries",
            ));
        }
        if let Some(o) = &self.options {
            if let Some(v) = o.max_steps
                && !(1..=MAX_EXECUTION_STEPS).contains(&v)
            {
                return Err(ContractError::new(format!(
                    "options.maxSteps: must be 1..={MAX_EXECUTION_STEPS}, got {v}"
                )));
            }
            if let Some(v) = o.max_tool_calls
                && !(1..=MAX_EXECUTION_TOOL_CALLS).contains(&v)
            {
                return Err(ContractError::new(format!(
                    "options.maxToolCalls: must be 1..={MAX_EXECUTION_TOOL_CALLS}, got {v}"
                )));
            }
            if let Some(v) = o.timeout_ms
                && !(1..=MAX_EXECUTION_TIMEOUT_MS).contains(&v)
            {
                return Err(ContractError::new(format!(
                    "options.timeoutMs: must be 1..={MAX_EXECUTION_TIMEOUT_MS}, got {v}"
                )));
            }
        }
        Ok(())
    }
}

/// One event of a turn, written only by the envelope (A.6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExecutionEvent {
    pub version: Version,
    pub event_id: Identifier,
    pub execution_id: Identifier,
    pub trace_id: Identifier,
    pub sequence: u64,
    #[serde(rename = "type")]
    pub kind: ShortName,
    pub data: Value,
    pub occurred_at: Timestamp,
}

/// How a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionStatus {
    Succeeded,
    Denied,
    Failed,
    Cancelled,
    Escalated,
}

impl ExecutionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionStatus::Succeeded => "succeeded",
            ExecutionStatus::Denied => "denied",
            ExecutionStatus::Failed => "failed",
            ExecutionStatus::Cancelled => "cancelled",
            ExecutionStatus::Escalated => "escalated",
        }
    }
}

/// A request for a human (A.8). Nothing is granted by it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Escalation {
    pub reason: Reason,
    pub reviewer: Address,
    pub requested_at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_authority: Option<Value>,
    pub status: EscalationStatus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EscalationStatus {
    Pending,
}

/// The result of one turn (A.8). `metadata` is always present and always
/// holds `runtime`, the envelope's provenance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExecutionResult {
    pub version: Version,
    pub execution_id: Identifier,
    pub trace_id: Identifier,
    pub status: ExecutionStatus,
    /// Present exactly when `status` is `succeeded` (it may be `null`).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub output: Option<Value>,
    /// Present for `denied`, `failed` and (always, from the envelope)
    /// `cancelled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ProtocolError>,
    /// Present exactly when `status` is `escalated`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalation: Option<Escalation>,
    pub events: Vec<ExecutionEvent>,
    pub started_at: Timestamp,
    pub completed_at: Timestamp,
    pub metadata: JsonObject,
}

impl ExecutionResult {
    /// `error.retryable`, where the ending offers one.
    pub fn retryable(&self) -> Option<bool> {
        self.error.as_ref().and_then(|e| e.retryable)
    }
    pub fn code(&self) -> Option<&str> {
        self.error.as_ref().map(|e| e.code.as_str())
    }
    pub fn event_types(&self) -> Vec<&str> {
        self.events.iter().map(|e| e.kind.as_str()).collect()
    }
}

/// The context a runtime may see: no authority, no enabled namespaces, no
/// grants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RuntimeVisibleContext {
    pub actor: Address,
    pub owner: Address,
    pub namespace_id: Identifier,
    pub purpose: Purpose,
    pub trace_id: Identifier,
    pub now: Timestamp,
    pub reach: ReachResult,
}

/// The sanitized request a runtime receives (A.2). `tools` is the effective
/// catalogue, with the kernel's definitions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RuntimeTurnRequest {
    pub version: Version,
    pub execution_id: Identifier,
    pub agent: Address,
    pub context: RuntimeVisibleContext,
    pub message: MessageEnvelope,
    pub tools: Vec<ToolDefinition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<JsonObject>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<ExecutionOptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<JsonObject>,
}
