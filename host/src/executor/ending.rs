//! How a turn's result is built on each way out (envelope.md B.9).

use serde_json::{Value, json};
use sharedos_protocol::{
    Escalation, EventKind, ExecutionResult, ExecutionStatus, JsonObject, ProtocolError,
    RuntimeTurnOutcome, Timestamp, Version,
};

use super::turn::Turn;

pub(crate) const RUNTIME_FAILED: &str = "runtime_failed";
pub(crate) const TURN_CANCELLED: &str = "turn_cancelled";
pub(crate) const AUDIT_UNAVAILABLE: &str = "audit_unavailable";
pub(crate) const INVALID_RUNTIME_OUTCOME: &str = "invalid_runtime_outcome";
/// A per-turn egress budget (requests, bytes, tokens) ran out; a route's
/// model failed its `maxFailures` answers in a row.
pub(crate) use sharedos_egress::{EGRESS_BUDGET_EXCEEDED, MODEL_ACCESS_REFUSED, MODEL_UNAVAILABLE};

pub(crate) const MSG_RUNTIME_FAILED: &str = "The runtime plugin failed.";
pub(crate) const MSG_EGRESS_BUDGET: &str = "The turn used up its egress budget (model requests, bytes or tokens); raise runtimes.network.budget or ask for less.";
pub(crate) const MSG_MODEL_UNAVAILABLE: &str = "The model failed its route's maxFailures answers in a row (server errors, rate limits or no answer); the egress.model_failing event names the route and the last status.";
pub(crate) const MSG_MODEL_ACCESS_REFUSED: &str = "The model's provider refused the route's key (401 or 403) its maxFailures times in a row; check the route's secret and the account's access.";
pub(crate) const MSG_CANCELLED: &str = "The turn was cancelled before it completed.";
pub(crate) const MSG_DEADLINE: &str = "The turn reached its deadline before it completed.";
pub(crate) const MSG_AUDIT: &str =
    "The audit sink could not record a decision, so the turn was ended.";
pub(crate) const MSG_INVALID_OUTCOME: &str =
    "The runtime returned an outcome that does not match the SharedOS v1 contract.";
pub(crate) const MSG_ESCALATE_NOT_OFFERED: &str = "The runtime ended the turn by escalation, but this turn's catalogue does not offer the affordance.";
pub(crate) const MSG_ADMISSION: &str =
    "The access context does not grant permission to invoke this agent.";

/// Metadata in the one merge order: the outcome's own, then the
/// annotations, then `runtime`, which nothing a plugin says can replace.
pub(crate) fn merge_metadata(
    outcome: Option<&JsonObject>,
    annotations: &[(String, Value)],
    runtime: &Value,
) -> JsonObject {
    let mut m = JsonObject::new();
    if let Some(o) = outcome {
        for (k, v) in o {
            if k != "__proto__" {
                m.insert(k.clone(), v.clone());
            }
        }
    }
    for (k, v) in annotations {
        m.insert(k.clone(), v.clone());
    }
    m.insert("runtime".into(), runtime.clone());
    m
}

/// How a turn ends: what its result says, the terminal event that
/// announces it (the last of the log), and who ended it, for the kernel's
/// record (`runtime` for the plugin's own `fail`, `envelope` for a failure
/// the envelope decided).
pub(crate) struct Ending {
    pub status: ExecutionStatus,
    pub output: Option<Value>,
    pub error: Option<ProtocolError>,
    pub escalation: Option<Escalation>,
    pub outcome_metadata: Option<JsonObject>,
    pub event: Option<(EventKind, Value)>,
    pub ended_by: Option<&'static str>,
}

impl Ending {
    fn new(status: ExecutionStatus, event: EventKind, data: Value) -> Self {
        Self {
            status,
            output: None,
            error: None,
            escalation: None,
            outcome_metadata: None,
            event: Some((event, data)),
            ended_by: None,
        }
    }
    /// `succeeded`, with the plugin's output.
    pub fn completed(output: Value) -> Self {
        let mut ending = Self::new(
            ExecutionStatus::Succeeded,
            EventKind::TurnCompleted,
            json!({}),
        );
        ending.output = Some(output);
        ending
    }
    /// `failed` with the plugin's own error (`source: runtime`).
    pub fn failed_by_runtime(error: ProtocolError) -> Self {
        let data = failed_event(error.code.as_str(), "runtime");
        let mut ending = Self::new(ExecutionStatus::Failed, EventKind::TurnFailed, data);
        ending.error = Some(error);
        ending.ended_by = Some("runtime");
        ending
    }
    /// `escalated`, as the kernel recorded it.
    pub fn escalated(escalation: Escalation) -> Self {
        let data = json!({"reason": escalation.reason, "reviewer": escalation.reviewer});
        let mut ending = Self::new(ExecutionStatus::Escalated, EventKind::TurnEscalated, data);
        ending.escalation = Some(escalation);
        ending
    }
    /// `failed` for a reason the envelope decided (`source: envelope`).
    pub fn failed(code: &str, message: &str, retryable: bool) -> Self {
        let mut ending = Self::new(
            ExecutionStatus::Failed,
            EventKind::TurnFailed,
            failed_event(code, "envelope"),
        );
        ending.error = Some(ProtocolError::new(code, message, Some(retryable)));
        ending.ended_by = Some("envelope");
        ending
    }
    /// `cancelled turn_cancelled` (ADR 0007's one code for every stop),
    /// with `error.details.cause` saying which stop: `deadline` (the
    /// turn's `timeoutMs`), `caller` (the host's own cancellation) or
    /// `drain` (the runtime ended while the turn drained).
    pub fn cancelled(retryable: bool, cause: &'static str) -> Self {
        let message = if cause == "deadline" {
            MSG_DEADLINE
        } else {
            MSG_CANCELLED
        };
        let mut ending = Self::new(
            ExecutionStatus::Cancelled,
            EventKind::TurnCancelled,
            json!({}),
        );
        ending.error = Some(ProtocolError::new(TURN_CANCELLED, message, Some(retryable)));
        ending.with_details(json!({"cause": cause}))
    }
    pub fn denied(code: &str, message: &str) -> Self {
        let mut ending = Self::new(
            ExecutionStatus::Denied,
            EventKind::TurnDenied,
            json!({"code": code}),
        );
        ending.error = Some(ProtocolError::new(code, message, Some(false)));
        ending
    }
    /// Adds `error.details` (fixed tokens of the host's, never a plugin's
    /// text).
    pub fn with_details(mut self, details: Value) -> Self {
        if let (Some(error), Value::Object(d)) = (self.error.as_mut(), details) {
            error.details = Some(d);
        }
        self
    }
    /// The outcome's own metadata, merged first into the result's.
    pub fn with_metadata(mut self, metadata: Option<JsonObject>) -> Self {
        self.outcome_metadata = metadata;
        self
    }
    /// Without a terminal event: a turn the caller had cancelled before
    /// anything ran.
    pub fn unannounced(mut self) -> Self {
        self.event = None;
        self
    }
}

/// Builds the result of a turn that got as far as having a `Turn`.
pub(crate) fn build(
    turn: &Turn,
    ending: Ending,
    started_at: Timestamp,
    runtime: &Value,
    with_annotations: bool,
) -> ExecutionResult {
    let annotations = if with_annotations {
        turn.annotations()
    } else {
        Vec::new()
    };
    ExecutionResult {
        version: Version::V1,
        execution_id: turn.execution_id().clone(),
        trace_id: turn.trace_id().clone(),
        status: ending.status,
        output: ending.output,
        error: ending.error,
        escalation: ending.escalation,
        // Moved in by the executor once the observer has seen them all.
        events: Vec::new(),
        started_at,
        completed_at: turn.now(),
        metadata: merge_metadata(ending.outcome_metadata.as_ref(), &annotations, runtime),
    }
}

/// The plugin's `fail` error with the retryable rule applied: a `true` is
/// lowered when a retry is not safe; `false` and absent stay as they are.
pub(crate) fn lower_retryable(mut error: ProtocolError, safe: bool) -> ProtocolError {
    if error.retryable == Some(true) && !safe {
        error.retryable = Some(false);
    }
    error
}

/// `turn.failed{code, source}`.
pub(crate) fn failed_event(code: &str, source: &str) -> Value {
    json!({"code": code, "source": source})
}

pub(crate) fn outcome_metadata(outcome: &RuntimeTurnOutcome) -> Option<JsonObject> {
    outcome.metadata().cloned()
}
