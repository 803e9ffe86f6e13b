//! Recovery without replay: what becomes of the runs a host left in
//! flight, when the same host id starts again (`host_restarted`) or when
//! another host takes over an expired lease (`host_lease_expired`).
//!
//! Nothing is re-executed. For each such run the audit trail (whose
//! decisions were committed before their effects) says which tool calls
//! were allowed and which of those reported an outcome. A call allowed
//! without an outcome may or may not have had its effect: it gets a
//! `tool.invoked` record `interrupted` (with the reason), the run is
//! marked `interrupted` with the whole account, and its journal gets a
//! last `run.interrupted` event so observers stop waiting.
//!
//! [`reconcile`] decides what to write; each backend writes it in the
//! transaction that took the lease (its epoch bump fences the host that
//! left the runs), so a reconciliation is whole or not at all.
//!
//! A run's trace id is its run id (the session layer builds each turn's
//! context that way), which is how its audit records are found.

use serde::Serialize;
use serde_json::{Value, json};
use sharedos_kernel::{AuditKind, AuditOutcome, AuditRecord, AuditSource};
use sharedos_protocol::{ExecutionEvent, Identifier, ShortName, Timestamp, Version};

use crate::{RunRecord, StoreError};

/// The reason of a run reconciled by a new process under its host id.
pub const HOST_RESTARTED: &str = "host_restarted";
/// The reason of a run taken over from a host whose lease expired.
pub const LEASE_EXPIRED: &str = "host_lease_expired";

/// A tool call the audit trail knows about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KnownCall {
    pub operation_id: String,
    pub tool: Option<String>,
    /// `succeeded`, `failed`, `interrupted`, or `unknown` when the host
    /// stopped between the decision and the outcome.
    pub outcome: String,
}

/// What recovery found and recorded for one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoveredRun {
    pub run_id: String,
    /// [`HOST_RESTARTED`] or [`LEASE_EXPIRED`].
    pub reason: &'static str,
    /// The host id the run was admitted under.
    pub host_id: String,
    /// The host id that reconciled it.
    pub recovered_by: String,
    /// The epoch of `host_id`'s lease the reconciliation took.
    pub epoch: i64,
    /// Authorization decisions recorded by the kernel (kept as they are).
    pub decisions: usize,
    /// Allowed tool calls, with what is known of each.
    pub calls: Vec<KnownCall>,
    /// Calls allowed without an outcome: their effect is unknown.
    pub interrupted: Vec<String>,
    /// The last journaled sequence before the host stopped.
    pub last_sequence: Option<u64>,
}

/// Who reconciles, and why.
#[derive(Debug, Clone, Copy)]
pub struct Takeover<'a> {
    pub reason: &'static str,
    pub recovered_by: &'a str,
    /// The epoch the reconciling transaction gave the run's host id.
    pub epoch: i64,
}

/// What to write for one run: the `interrupted` outcome records, the last
/// journal event, and the account stored as the run's `recovery`.
#[derive(Debug, Clone)]
pub struct Reconciliation {
    pub records: Vec<AuditRecord>,
    pub event: ExecutionEvent,
    pub account: Value,
    pub report: RecoveredRun,
}

fn outcome_name(outcome: AuditOutcome) -> String {
    serde_json::to_value(outcome)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "unknown".into())
}

/// Reconciles `run` from its audit `trail` and the last sequence of its
/// journal; writes nothing.
pub fn reconcile(
    run: &RunRecord,
    trail: &[AuditRecord],
    last_sequence: Option<u64>,
    takeover: &Takeover<'_>,
    at: &Timestamp,
) -> Result<Reconciliation, StoreError> {
    let decisions = trail
        .iter()
        .filter(|r| r.kind == "authorization.checked")
        .count();
    let mut calls = Vec::new();
    let mut interrupted = Vec::new();
    let mut records = Vec::new();
    for decision in trail.iter().filter(|r| {
        r.kind == "authorization.checked"
            && r.outcome == AuditOutcome::Allowed
            && r.tool.is_some()
            && r.operation_id.is_some()
    }) {
        let op = decision.operation_id.clone().unwrap_or_default();
        let outcome = trail
            .iter()
            .rev()
            .find(|r| r.kind == "tool.invoked" && r.operation_id.as_deref() == Some(&op))
            .map(|r| outcome_name(r.outcome));
        if outcome.is_none() {
            records.push(interrupted_record(decision, takeover.reason, at));
            interrupted.push(op.clone());
        }
        calls.push(KnownCall {
            operation_id: op,
            tool: decision.tool.clone(),
            outcome: outcome.unwrap_or_else(|| "unknown".into()),
        });
    }
    let report = RecoveredRun {
        run_id: run.id.clone(),
        reason: takeover.reason,
        host_id: run.host_id.clone(),
        recovered_by: takeover.recovered_by.to_owned(),
        epoch: takeover.epoch,
        decisions,
        calls,
        interrupted,
        last_sequence,
    };
    let account = serde_json::to_value(&report).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let next = last_sequence.map_or(0, |s| s + 1);
    let event = interrupted_event(run, next, takeover.reason, &account, at)?;
    Ok(Reconciliation {
        records,
        event,
        account,
        report,
    })
}

/// The outcome record of a call whose outcome never came.
fn interrupted_record(decision: &AuditRecord, reason: &str, at: &Timestamp) -> AuditRecord {
    let mut r = decision.clone();
    r.id = uuid_like(&decision.id);
    r.kind = AuditKind::ToolInvoked;
    r.outcome = AuditOutcome::Interrupted;
    r.at = at.clone();
    r.source = AuditSource::Envelope;
    r.reason = Some(reason.into());
    r.consumed = None;
    r.fail_closed = None;
    r
}

/// A record id derived from the decision's: the store refuses a duplicate
/// instead of recording the interruption twice.
fn uuid_like(decision_id: &str) -> String {
    format!("{decision_id}.recovered")
}

fn interrupted_event(
    run: &RunRecord,
    sequence: u64,
    reason: &str,
    account: &Value,
    at: &Timestamp,
) -> Result<ExecutionEvent, StoreError> {
    let bad = |e: sharedos_protocol::PrimitiveError| StoreError::Corrupt(e.to_string());
    let id = Identifier::new(&run.id).map_err(bad)?;
    Ok(ExecutionEvent {
        version: Version::V1,
        event_id: Identifier::new(format!("{}.interrupted", run.id)).map_err(bad)?,
        execution_id: id.clone(),
        trace_id: id,
        sequence,
        kind: ShortName::new("run.interrupted").map_err(bad)?,
        data: json!({ "reason": reason, "recovery": account }).into(),
        occurred_at: at.clone(),
    })
}
