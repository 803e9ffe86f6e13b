//! The tool calls of a run as its audit trail tells them, and the
//! settlement of one whose outcome a crash left unknown (docs/STORE.md,
//! "Unresolved effects").
//!
//! Recovery ([`crate::recovery`]) gives a call allowed without an outcome
//! a `tool.invoked` record `interrupted`, with the id of its decision and
//! `.recovered`. An operator who looked at the source settles it: one
//! `effect.settled` record, `succeeded` or `failed`, whose id is the
//! decision's and `.settled`, so the audit table's unique id makes the
//! settlement happen once whatever the hosts racing for it. Nothing else
//! is written to the audit trail: a reader tells a call's state from its
//! records alone.

use serde::Serialize;
use sharedos_kernel::{AuditKind, AuditOutcome, AuditRecord, AuditSource};
use sharedos_protocol::{ExecutionEvent, Identifier, ShortName, Timestamp, Version};

use crate::StoreError;

/// Where a tool call allowed by the kernel stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EffectState {
    /// Its outcome was recorded when it ran: `succeeded`.
    Succeeded,
    /// Its outcome was recorded when it ran: `failed`.
    Failed,
    /// Allowed, its outcome not recorded yet: its run is in flight.
    InProgress,
    /// Its host stopped between the decision and the outcome (recovery
    /// recorded it `interrupted`); nobody has settled it yet.
    Unresolved,
    /// An operator settled it with the outcome observed at its source.
    Settled,
}

impl EffectState {
    pub fn as_str(self) -> &'static str {
        match self {
            EffectState::Succeeded => "succeeded",
            EffectState::Failed => "failed",
            EffectState::InProgress => "in_progress",
            EffectState::Unresolved => "unresolved",
            EffectState::Settled => "settled",
        }
    }
}

/// One allowed tool call of a run, as its audit records hold it: what was
/// authorized (the resource, the action and the grant; the audit never
/// holds a call's arguments), when, and what became of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Effect {
    pub run_id: String,
    pub operation_id: String,
    pub tool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<sharedos_protocol::ResourceRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grant_id: Option<String>,
    /// The time of the `authorization.checked` record that allowed it.
    pub authorized_at: Timestamp,
    pub state: EffectState,
    /// Why its outcome is unknown (`host_restarted`,
    /// `host_lease_expired`), and since when; for an unresolved or a
    /// settled call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unresolved_because: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interrupted_at: Option<Timestamp>,
    /// The settlement's record, once settled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settlement: Option<AuditRecord>,
    /// The decision's record id (the settlement's id derives from it).
    #[serde(skip)]
    pub decision_id: String,
}

/// The id of the settlement of the call `decision_id` allowed.
pub fn settlement_id(decision_id: &str) -> String {
    format!("{decision_id}.settled")
}

/// Every allowed tool call of `run_id` in the order of its decisions.
pub fn effects_of(run_id: &str, trail: &[AuditRecord]) -> Vec<Effect> {
    let allowed = trail.iter().filter(|r| {
        r.kind == AuditKind::AuthorizationChecked
            && r.outcome == AuditOutcome::Allowed
            && r.tool.is_some()
            && r.operation_id.is_some()
    });
    allowed
        .map(|decision| {
            let op = decision.operation_id.as_deref();
            let of_call = |kind: AuditKind| {
                trail
                    .iter()
                    .rev()
                    .find(|r| r.kind == kind && r.operation_id.as_deref() == op)
            };
            let outcome = of_call(AuditKind::ToolInvoked);
            let settlement = of_call(AuditKind::EffectSettled).cloned();
            let interrupted = outcome.filter(|r| r.outcome == AuditOutcome::Interrupted);
            let state = match (outcome.map(|r| r.outcome), &settlement) {
                (_, Some(_)) => EffectState::Settled,
                (Some(AuditOutcome::Succeeded), None) => EffectState::Succeeded,
                (Some(AuditOutcome::Interrupted), None) => EffectState::Unresolved,
                (None, None) => EffectState::InProgress,
                (Some(_), None) => EffectState::Failed,
            };
            Effect {
                run_id: run_id.to_owned(),
                operation_id: op.unwrap_or_default().to_owned(),
                tool: decision.tool.clone(),
                resource: decision.resource.clone(),
                action: decision.action.clone(),
                grant_id: decision.grant_id.clone(),
                authorized_at: decision.at.clone(),
                state,
                unresolved_because: interrupted.and_then(|r| r.reason.clone()),
                interrupted_at: interrupted.map(|r| r.at.clone()),
                settlement,
                decision_id: decision.id.clone(),
            }
        })
        .collect()
}

/// A settlement to record: the `effect.settled` audit record and the
/// journal event that says it (its sequence chosen by the store, after
/// the journal's last).
#[derive(Debug, Clone, PartialEq)]
pub struct Settlement {
    pub run_id: String,
    pub record: AuditRecord,
}

impl Settlement {
    /// The settlement of `effect` by whoever `metadata` names, recorded
    /// under the decision's identity (scope, actor) with `outcome`.
    pub fn new(
        effect: &Effect,
        decision: &AuditRecord,
        outcome: AuditOutcome,
        metadata: sharedos_protocol::JsonObject,
        at: &Timestamp,
    ) -> Self {
        let mut record = decision.clone();
        record.id = settlement_id(&effect.decision_id);
        record.kind = AuditKind::EffectSettled;
        record.outcome = outcome;
        record.at = at.clone();
        record.source = AuditSource::Envelope;
        record.reason = Some("settled_by_operator".into());
        record.consumed = None;
        record.fail_closed = None;
        record.cause = None;
        record.metadata = Some(metadata);
        Self {
            run_id: effect.run_id.clone(),
            record,
        }
    }

    /// The journal event of this settlement at `sequence`.
    pub fn event(&self, sequence: u64) -> Result<ExecutionEvent, StoreError> {
        let bad = |e: sharedos_protocol::PrimitiveError| StoreError::Corrupt(e.to_string());
        let id = Identifier::new(&self.run_id).map_err(bad)?;
        let data =
            serde_json::to_value(&self.record).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        Ok(ExecutionEvent {
            version: Version::V1,
            event_id: Identifier::new(format!("{}.settled.{sequence}", self.run_id))
                .map_err(bad)?,
            execution_id: id.clone(),
            trace_id: id,
            sequence,
            kind: ShortName::new("effect.settled").map_err(bad)?,
            data: serde_json::json!({ "settlement": data }).into(),
            occurred_at: self.record.at.clone(),
        })
    }
}

/// What [`crate::Store::settle_effect`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Settled {
    /// Recorded now, with its journal event.
    Now,
    /// Settled before (by any host): the first settlement's record.
    Before(Box<AuditRecord>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(id: &str, kind: &str, outcome: &str, op: &str) -> AuditRecord {
        let agent = json!({"kind": "agent", "agentId": "alice"});
        let service = json!({"kind": "service", "serviceId": "host"});
        serde_json::from_value(json!({
            "id": id, "type": kind, "outcome": outcome, "at": "2026-12-05T04:00:00Z",
            "traceId": "run-1", "namespaceId": "ns", "actor": agent, "authority": service,
            "owner": service, "purpose": "p", "source": "kernel", "operationId": op,
            "tool": "files.write", "reason": "host_restarted",
        }))
        .unwrap()
    }

    #[test]
    fn each_allowed_call_gets_the_state_its_records_say() {
        let trail = vec![
            record("d1", "authorization.checked", "allowed", "c1"),
            record("o1", "tool.invoked", "succeeded", "c1"),
            record("d2", "authorization.checked", "allowed", "c2"),
            record("o2", "tool.invoked", "failed", "c2"),
            record("d3", "authorization.checked", "allowed", "c3"),
            record("d3.recovered", "tool.invoked", "interrupted", "c3"),
            record("d4", "authorization.checked", "allowed", "c4"),
            record("d4.recovered", "tool.invoked", "interrupted", "c4"),
            record("d4.settled", "effect.settled", "failed", "c4"),
            record("d5", "authorization.checked", "allowed", "c5"),
            record("d6", "authorization.checked", "denied", "c6"),
        ];
        let states: Vec<(String, EffectState)> = effects_of("run-1", &trail)
            .into_iter()
            .map(|e| (e.operation_id, e.state))
            .collect();
        let expected = [
            ("c1", EffectState::Succeeded),
            ("c2", EffectState::Failed),
            ("c3", EffectState::Unresolved),
            ("c4", EffectState::Settled),
            ("c5", EffectState::InProgress),
        ];
        let expected: Vec<(String, EffectState)> = expected
            .iter()
            .map(|(o, s)| ((*o).to_owned(), *s))
            .collect();
        assert_eq!(states, expected);
        let settled = &effects_of("run-1", &trail)[3];
        assert_eq!(
            settled.settlement.as_ref().map(|r| r.id.as_str()),
            Some("d4.settled")
        );
        assert_eq!(
            settled.unresolved_because.as_deref(),
            Some("host_restarted")
        );
        assert_eq!(settlement_id("d3"), "d3.settled");
    }
}
