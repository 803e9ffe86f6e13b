//! ExecutionRecord assembly (envelope.md A.11): what grading and incident
//! review read. A record carries a turn's events and none of its result
//! metadata, except the facts lifted here under their rules.

use serde::Serialize;
use serde_json::Value;
use sharedos_protocol::{
    Address, Escalation, ExecutionEvent, ExecutionRequest, ExecutionResult, ExecutionStatus,
    Identifier, RuntimeManifest, Timestamp,
};

/// `{tool, reason}` as stated through `annotate("escalationAsked", …)`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EscalationAsked {
    pub tool: String,
    pub reason: String,
}

/// One tool call as the record sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationRecord {
    pub call_id: String,
    pub tool: String,
    /// `succeeded | denied | failed | interrupted` (a call with no
    /// `tool.completed` was stopped while with the kernel).
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SystemBlock {
    pub protocol_version: String,
    pub sharedos_version: String,
    pub runtime: RuntimeManifest,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_hash: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub catalog_hash: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_provider: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionBlock {
    pub execution_id: Identifier,
    pub trace_id: Identifier,
    pub agent: Address,
    pub status: ExecutionStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub terminal_reason_code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub escalation: Option<Escalation>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub escalation_asked: Option<EscalationAsked>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calls_after_escalation: Option<u64>,
    pub exposed_tools: Vec<String>,
    pub requested_tools: Vec<String>,
    pub operations: Vec<OperationRecord>,
    pub events: Vec<ExecutionEvent>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CostBlock {
    pub started_at: Timestamp,
    pub completed_at: Timestamp,
    pub elapsed_ms: i64,
    /// The number of `tool.requested` events.
    pub tool_calls: u64,
}

/// The record of one turn.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionRecord {
    pub version: &'static str,
    pub recorded_at: Timestamp,
    pub system: SystemBlock,
    pub execution: ExecutionBlock,
    pub cost: CostBlock,
}

/// True for a lowercase 64-hex content hash.
pub fn is_content_hash(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Assembles the record of a turn from its request and result.
pub fn assemble(
    request: &ExecutionRequest,
    result: &ExecutionResult,
    runtime: &RuntimeManifest,
) -> ExecutionRecord {
    let md = &result.metadata;
    let prompt_hash = md
        .get("promptHash")
        .and_then(Value::as_str)
        .filter(|h| is_content_hash(h))
        .map(str::to_owned);
    let escalation_asked = md.get("escalationAsked").and_then(|v| {
        let obj = v.as_object()?;
        if obj.len() != 2 {
            return None;
        }
        let tool = obj.get("tool")?.as_str()?.trim();
        let reason = obj.get("reason")?.as_str()?;
        let tool_ok = !tool.is_empty() && tool.chars().count() <= 256;
        (tool_ok && reason.chars().count() <= 512).then(|| EscalationAsked {
            tool: tool.to_owned(),
            reason: reason.to_owned(),
        })
    });
    let str_field = |k: &str| md.get(k).and_then(Value::as_str).map(str::to_owned);
    let exposed_tools = result
        .events
        .iter()
        .find(|e| e.kind == "turn.started")
        .and_then(|e| e.data.get("visibleTools"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let mut operations: Vec<OperationRecord> = Vec::new();
    for e in &result.events {
        let call_id = e
            .data
            .get("callId")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        match e.kind.as_str() {
            "tool.requested" => operations.push(OperationRecord {
                call_id,
                tool: e
                    .data
                    .get("tool")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                outcome: "interrupted".into(),
                code: None,
                step: e.data.get("step").and_then(Value::as_u64),
            }),
            "tool.completed" => {
                if let Some(op) = operations
                    .iter_mut()
                    .rev()
                    .find(|o| o.call_id == call_id && o.outcome == "interrupted")
                {
                    op.outcome = e
                        .data
                        .get("status")
                        .and_then(Value::as_str)
                        .unwrap_or("failed")
                        .to_owned();
                    op.code = e
                        .data
                        .get("code")
                        .and_then(Value::as_str)
                        .map(str::to_owned);
                }
            }
            _ => {}
        }
    }
    let terminal_reason_code = match result.status {
        ExecutionStatus::Escalated => Some("escalation_requested".to_owned()),
        _ => result.code().map(str::to_owned),
    };
    let elapsed_ms = ((result.completed_at.to_offset() - result.started_at.to_offset())
        .whole_milliseconds()) as i64;
    ExecutionRecord {
        version: "1",
        recorded_at: Timestamp::now(),
        system: SystemBlock {
            protocol_version: "1".into(),
            sharedos_version: env!("CARGO_PKG_VERSION").into(),
            runtime: runtime.clone(),
            prompt_hash,
            catalog_hash: str_field("catalogHash"),
            model: str_field("model"),
            model_provider: str_field("modelProvider"),
        },
        execution: ExecutionBlock {
            execution_id: result.execution_id.clone(),
            trace_id: result.trace_id.clone(),
            agent: request.agent.clone(),
            status: result.status,
            terminal_reason_code,
            output: result.output.clone(),
            escalation: result.escalation.clone(),
            escalation_asked,
            calls_after_escalation: md.get("callsAfterEscalation").and_then(Value::as_u64),
            exposed_tools,
            requested_tools: request.tools.iter().map(|t| t.name.to_string()).collect(),
            operations: operations.clone(),
            events: result.events.clone(),
        },
        cost: CostBlock {
            started_at: result.started_at.clone(),
            completed_at: result.completed_at.clone(),
            elapsed_ms,
            tool_calls: operations.len() as u64,
        },
    }
}
