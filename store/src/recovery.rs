//! Recovery without replay: what a host does at start for the runs it
//! left in flight when it stopped.
//!
//! Nothing is re-executed. For each such run the audit trail (whose
//! decisions were committed before their effects) says which tool calls
//! were allowed and which of those reported an outcome. A call allowed
//! without an outcome may or may not have had its effect: it gets a
//! `tool.invoked` record `interrupted` (reason `host_restarted`), the run
//! is marked `interrupted` with the whole account, and its journal gets a
//! last `run.interrupted` event so observers stop waiting.
//!
//! A run's trace id is its run id (the session layer builds each turn's
//! context that way), which is how its audit records are found.

use serde::Serialize;
use serde_json::{Value, json};
use sharedos_kernel::{AuditKind, AuditOutcome, AuditRecord, AuditSource};
use sharedos_protocol::{ExecutionEvent, Identifier, ShortName, Timestamp, Version};

use crate::{RunRecord, Store, StoreError};

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
    pub reason: &'static str,
    /// Authorization decisions recorded by the kernel (kept as they are).
    pub decisions: usize,
    /// Allowed tool calls, with what is known of each.
    pub calls: Vec<KnownCall>,
    /// Calls allowed without an outcome: their effect is unknown.
    pub interrupted: Vec<String>,
    /// The last journaled sequence before the host stopped.
    pub last_sequence: Option<u64>,
}

/// Marks every run `host_id` left in flight as interrupted; returns what
/// was found, one entry per run.
pub async fn recover(
    store: &dyn Store,
    host_id: &str,
    at: &Timestamp,
) -> Result<Vec<RecoveredRun>, StoreError> {
    let mut report = Vec::new();
    for run in store.in_flight_runs(host_id).await? {
        report.push(recover_run(store, &run, at).await?);
    }
    Ok(report)
}

fn outcome_name(outcome: AuditOutcome) -> String {
    serde_json::to_value(outcome)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "unknown".into())
}

async fn recover_run(
    store: &dyn Store,
    run: &RunRecord,
    at: &Timestamp,
) -> Result<RecoveredRun, StoreError> {
    let trail = store.audit_trail(&run.id).await?;
    let decisions = trail
        .iter()
        .filter(|r| r.kind == "authorization.checked")
        .count();
    let mut calls = Vec::new();
    let mut interrupted = Vec::new();
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
            store
                .append(&interrupted_record(decision, at))
                .await
                .map_err(|e| StoreError::Unavailable(e.to_string()))?;
            interrupted.push(op.clone());
        }
        calls.push(KnownCall {
            operation_id: op,
            tool: decision.tool.clone(),
            outcome: outcome.unwrap_or_else(|| "unknown".into()),
        });
    }
    let last_sequence = last_sequence(store, run).await?;
    let recovered = RecoveredRun {
        run_id: run.id.clone(),
        reason: "host_restarted",
        decisions,
        calls,
        interrupted,
        last_sequence,
    };
    let account =
        serde_json::to_value(&recovered).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let next = last_sequence.map_or(0, |s| s + 1);
    store
        .append_event(&run.id, &interrupted_event(run, next, &account, at)?)
        .await?;
    store.interrupt_run(&run.id, &account, at.as_str()).await?;
    Ok(recovered)
}

async fn last_sequence(store: &dyn Store, run: &RunRecord) -> Result<Option<u64>, StoreError> {
    let mut last = run.dropped_through;
    loop {
        let batch = store.events_after(&run.id, last, 1000).await;
        match batch {
            Ok(b) if b.is_empty() => return Ok(last),
            Ok(b) => last = b.last().map(|e| e.sequence),
            Err(StoreError::BeyondEnd { .. }) => return Ok(last),
            Err(e) => return Err(e),
        }
    }
}

/// The outcome record of a call whose outcome never came.
fn interrupted_record(decision: &AuditRecord, at: &Timestamp) -> AuditRecord {
    let mut r = decision.clone();
    r.id = uuid_like(&decision.id);
    r.kind = AuditKind::ToolInvoked;
    r.outcome = AuditOutcome::Interrupted;
    r.at = at.clone();
    r.source = AuditSource::Envelope;
    r.reason = Some("host_restarted".into());
    r.consumed = None;
    r.fail_closed = None;
    r
}

/// A record id derived from the decision's, so a recovery that itself
/// stops halfway and runs again writes the same id (the store refuses the
/// duplicate instead of recording the interruption twice).
fn uuid_like(decision_id: &str) -> String {
    format!("{decision_id}.recovered")
}

fn interrupted_event(
    run: &RunRecord,
    sequence: u64,
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
        data: json!({ "reason": "host_restarted", "recovery": account }),
        occurred_at: at.clone(),
    })
}
