//! ExecutionRecord assembly (envelope.md A.11): what grading and incident
//! review read. A record carries a turn's events and none of its result
//! metadata, except the facts lifted here under their rules.

use serde::Serialize;
use serde_json::Value;
use sharedos_protocol::{
    Address, Escalation, EventKind, ExecutionEvent, ExecutionRequest, ExecutionResult,
    ExecutionStatus, Identifier, RuntimeManifest, Timestamp,
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

/// The plugin's `escalationAsked` annotation when it is well formed
/// (exactly `tool` and `reason`, within their bounds).
fn escalation_asked(v: &Value) -> Option<EscalationAsked> {
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
}

/// The tools the turn exposed (its `turn.started` event's `visibleTools`).
fn exposed_tools(result: &ExecutionResult) -> Vec<String> {
    result
        .events
        .iter()
        .find(|e| e.kind == EventKind::TurnStarted)
        .and_then(|e| e.data.get("visibleTools"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// One record per `tool.requested`, completed by its `tool.completed`
/// (`interrupted` when none came).
fn operations(result: &ExecutionResult) -> Vec<OperationRecord> {
    let mut operations: Vec<OperationRecord> = Vec::new();
    for e in &result.events {
        let call_id = e
            .data
            .get("callId")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        match EventKind::from_name(e.kind.as_str()) {
            Some(EventKind::ToolRequested) => operations.push(OperationRecord {
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
            Some(EventKind::ToolCompleted) => {
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
    operations
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
    let escalation_asked = md.get("escalationAsked").and_then(escalation_asked);
    let str_field = |k: &str| md.get(k).and_then(Value::as_str).map(str::to_owned);
    let exposed_tools = exposed_tools(result);
    let operations = operations(result);
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

#[cfg(test)]
mod tests {
    use serde_json::json;
    use sharedos_protocol::{ExecutionRequest, ExecutionResult, RuntimeManifest};

    use super::*;

    fn request() -> ExecutionRequest {
        serde_json::from_str(include_str!("../../demo/turn.json")).unwrap()
    }

    fn result(
        metadata: serde_json::Value,
        status: &str,
        error: Option<serde_json::Value>,
    ) -> ExecutionResult {
        let mut v = json!({
            "version": "1", "executionId": "demo-turn-1", "traceId": "trace-demo-1", "status": status,
            "events": [
                {"version":"1","eventId":"e0","executionId":"demo-turn-1","traceId":"trace-demo-1","sequence":0,
                 "type":"turn.started","data":{"visibleTools":["files.read","files.write"]},"occurredAt":"2026-11-30T12:00:00Z"},
                {"version":"1","eventId":"e1","executionId":"demo-turn-1","traceId":"trace-demo-1","sequence":1,
                 "type":"tool.requested","data":{"callId":"c1","tool":"files.read","step":0},"occurredAt":"2026-11-30T12:00:00Z"},
                {"version":"1","eventId":"e2","executionId":"demo-turn-1","traceId":"trace-demo-1","sequence":2,
                 "type":"tool.completed","data":{"callId":"c1","tool":"files.read","status":"denied","code":"no_matching_grant","step":0},
                 "occurredAt":"2026-11-30T12:00:00Z"},
                {"version":"1","eventId":"e3","executionId":"demo-turn-1","traceId":"trace-demo-1","sequence":3,
                 "type":"tool.requested","data":{"callId":"c2","tool":"files.write"},"occurredAt":"2026-11-30T12:00:01Z"}
            ],
            "startedAt": "2026-11-30T12:00:00Z", "completedAt": "2026-11-30T12:00:02.500Z", "metadata": metadata
        });
        if status == "succeeded" {
            v["output"] = json!(null);
        }
        if let Some(e) = error {
            v["error"] = e;
        }
        serde_json::from_value(v).unwrap()
    }

    fn manifest() -> RuntimeManifest {
        RuntimeManifest::new("sharedos.standard", "0.1.0").unwrap()
    }

    #[test]
    fn prompt_hash_is_lifted_only_when_it_is_a_content_hash() {
        let h = "a".repeat(64);
        let r = assemble(
            &request(),
            &result(json!({"promptHash": h, "runtime": {}}), "succeeded", None),
            &manifest(),
        );
        assert_eq!(r.system.prompt_hash.as_deref(), Some(h.as_str()));
        for bad in [
            json!("A".repeat(64)),
            json!("a".repeat(63)),
            json!(42),
            json!("g".repeat(64)),
        ] {
            let r = assemble(
                &request(),
                &result(json!({"promptHash": bad, "runtime": {}}), "succeeded", None),
                &manifest(),
            );
            assert_eq!(r.system.prompt_hash, None, "{bad}");
        }
    }

    #[test]
    fn escalation_asked_is_shape_validated() {
        let ok = json!({"escalationAsked": {"tool": "sharedos.escalate", "reason": "need a human"}, "runtime": {}});
        let r = assemble(&request(), &result(ok, "succeeded", None), &manifest());
        assert_eq!(r.execution.escalation_asked.unwrap().reason, "need a human");
        for bad in [
            json!({"tool": "sharedos.escalate"}),
            json!({"tool": "sharedos.escalate", "reason": "x", "extra": 1}),
            json!({"tool": "", "reason": "x"}),
            json!({"tool": "t", "reason": "r".repeat(513)}),
            json!("sharedos.escalate"),
        ] {
            let md = json!({"escalationAsked": bad, "runtime": {}});
            let r = assemble(&request(), &result(md, "succeeded", None), &manifest());
            assert!(r.execution.escalation_asked.is_none(), "{bad}");
        }
    }

    #[test]
    fn operations_tools_and_reason_code_come_from_events_and_result() {
        let err = json!({"code": "turn_cancelled", "message": "cancelled", "retryable": false});
        let r = assemble(
            &request(),
            &result(
                json!({"runtime": {}, "secret": "x"}),
                "cancelled",
                Some(err),
            ),
            &manifest(),
        );
        assert_eq!(
            r.execution.terminal_reason_code.as_deref(),
            Some("turn_cancelled")
        );
        assert_eq!(r.execution.exposed_tools, vec!["files.read", "files.write"]);
        assert_eq!(r.execution.requested_tools.len(), 4);
        assert_eq!(r.execution.operations.len(), 2);
        assert_eq!(r.execution.operations[0].outcome, "denied");
        assert_eq!(
            r.execution.operations[0].code.as_deref(),
            Some("no_matching_grant")
        );
        // A call with no completion was stopped while with the kernel.
        assert_eq!(r.execution.operations[1].outcome, "interrupted");
        assert_eq!(r.cost.tool_calls, 2);
        assert_eq!(r.cost.elapsed_ms, 2500);
        // Metadata that is not lifted stays out of the record.
        assert!(!serde_json::to_string(&r).unwrap().contains("secret"));
    }
}
