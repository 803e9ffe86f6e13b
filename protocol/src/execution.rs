//! The caller-facing contracts: `ExecutionRequest` in, `ExecutionResult`
//! out (envelope.md A.1, A.6, A.8), and the sanitized `RuntimeTurnRequest`
//! the runtime sees in their place (A.2): it carries the request's message
//! and options, so it lives next to them.

use std::borrow::Cow;
use std::ops::Deref;
use std::sync::OnceLock;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::contract::{
    ContractError, ProtocolError, ReachResult, ToolDefinition, ToolStatus, Version,
};
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
    pub data: EventData,
    pub occurred_at: Timestamp,
}

/// An event's `data`: any JSON value on the wire and in the schema.
///
/// Every tool call writes two events (`tool.requested`, `tool.completed`),
/// so a busy turn holds two per call; building each one's `data` as a
/// `serde_json` map (a node and a string per key and per value) was a
/// large share of the host's work per call. A call's events therefore keep
/// their parts, the call's shared ids (a clone is a reference count), and
/// are written from them: the same bytes, keys in the sorted order a map
/// writes them. Everything else, and every event read back, is a `Value`.
/// Readers that want a `Value` get one through `Deref` (built once, on
/// first use, for a call's event); equality is equality of the JSON.
#[derive(Debug, Clone)]
pub enum EventData {
    Value(Value),
    Call(CallEventData),
}

impl EventData {
    /// The JSON value, owned.
    pub fn into_value(self) -> Value {
        match self {
            EventData::Value(v) => v,
            EventData::Call(c) => match c.value.into_inner() {
                Some(v) => *v,
                None => c.parts.to_value(),
            },
        }
    }
}

impl Deref for EventData {
    type Target = Value;
    fn deref(&self) -> &Value {
        match self {
            EventData::Value(v) => v,
            EventData::Call(c) => c.value.get_or_init(|| Box::new(c.parts.to_value())),
        }
    }
}

impl From<Value> for EventData {
    fn from(v: Value) -> Self {
        EventData::Value(v)
    }
}

impl From<EventData> for Value {
    fn from(d: EventData) -> Self {
        d.into_value()
    }
}

impl PartialEq for EventData {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (EventData::Call(a), EventData::Call(b)) => a.parts == b.parts,
            _ => **self == **other,
        }
    }
}

impl PartialEq<Value> for EventData {
    fn eq(&self, other: &Value) -> bool {
        **self == *other
    }
}

impl Serialize for EventData {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            EventData::Value(v) => v.serialize(s),
            EventData::Call(c) => c.parts.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for EventData {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(EventData::Value)
    }
}

/// The schema is `Value`'s: the type changes nothing on the wire.
impl JsonSchema for EventData {
    fn schema_name() -> Cow<'static, str> {
        Value::schema_name()
    }
    fn schema_id() -> Cow<'static, str> {
        Value::schema_id()
    }
    fn inline_schema() -> bool {
        Value::inline_schema()
    }
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        Value::json_schema(generator)
    }
}

/// The `data` of a call's event: `tool.requested` is `{callId, step?,
/// tool}`, `tool.completed` adds `status` and `code` (when the result has
/// one).
#[derive(Debug, Clone)]
pub struct CallEventData {
    parts: CallParts,
    /// The JSON value, when a reader asked for it. Boxed: few events are
    /// read so, and every event of a turn is as large as this.
    value: OnceLock<Box<Value>>,
}

#[derive(Debug, Clone, PartialEq)]
struct CallParts {
    call_id: Identifier,
    tool: Identifier,
    step: Option<u64>,
    ending: Option<(ToolStatus, Option<Identifier>)>,
}

impl CallEventData {
    /// `tool.requested`'s `data`.
    pub fn requested(call_id: Identifier, tool: Identifier, step: Option<u64>) -> Self {
        Self::new(CallParts {
            call_id,
            tool,
            step,
            ending: None,
        })
    }

    /// `tool.completed`'s `data`.
    pub fn completed(
        call_id: Identifier,
        tool: Identifier,
        step: Option<u64>,
        status: ToolStatus,
        code: Option<Identifier>,
    ) -> Self {
        Self::new(CallParts {
            call_id,
            tool,
            step,
            ending: Some((status, code)),
        })
    }

    fn new(parts: CallParts) -> Self {
        Self {
            parts,
            value: OnceLock::new(),
        }
    }

    pub fn call_id(&self) -> &Identifier {
        &self.parts.call_id
    }
    pub fn tool(&self) -> &Identifier {
        &self.parts.tool
    }
    pub fn step(&self) -> Option<u64> {
        self.parts.step
    }
    /// `tool.completed`'s `status`; `None` for `tool.requested`.
    pub fn status(&self) -> Option<ToolStatus> {
        self.parts.ending.as_ref().map(|(status, _)| *status)
    }
    pub fn code(&self) -> Option<&Identifier> {
        self.parts
            .ending
            .as_ref()
            .and_then(|(_, code)| code.as_ref())
    }
}

impl CallParts {
    fn to_value(&self) -> Value {
        let text = |s: &str| Value::String(s.to_owned());
        let mut m = serde_json::Map::new();
        m.insert("callId".to_owned(), text(self.call_id.as_str()));
        if let Some((status, code)) = &self.ending {
            if let Some(code) = code {
                m.insert("code".to_owned(), text(code.as_str()));
            }
            m.insert("status".to_owned(), text(status.as_str()));
        }
        if let Some(step) = self.step {
            m.insert("step".to_owned(), Value::Number(step.into()));
        }
        m.insert("tool".to_owned(), text(self.tool.as_str()));
        Value::Object(m)
    }
}

/// Written as the map of [`CallParts::to_value`] is: the same members, in
/// the same (sorted) order, through the same serializer calls.
impl Serialize for CallParts {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let code = self.ending.as_ref().and_then(|(_, code)| code.as_ref());
        let len = 2
            + usize::from(code.is_some())
            + usize::from(self.ending.is_some())
            + usize::from(self.step.is_some());
        let mut m = s.serialize_map(Some(len))?;
        m.serialize_entry("callId", self.call_id.as_str())?;
        if let Some(code) = code {
            m.serialize_entry("code", code.as_str())?;
        }
        if let Some((status, _)) = &self.ending {
            m.serialize_entry("status", status.as_str())?;
        }
        if let Some(step) = self.step {
            m.serialize_entry("step", &step)?;
        }
        m.serialize_entry("tool", self.tool.as_str())?;
        m.end()
    }
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
