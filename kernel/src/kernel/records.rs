//! The audit records the kernel writes, and the [`Recorder`] that writes
//! them on the decision path (before the effect, refusing on failure) or
//! the outcome path (after it, failures to the hook).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sharedos_protocol::{
    AccessContext, Identifier, JsonObject, PathSegment, ResourceRef, ToolCall, ToolResult,
    ToolStatus, ident,
};

use super::ErrorHook;
use crate::audit::{AuditError, AuditKind, AuditOutcome, AuditRecord, AuditSink, AuditSource};
use crate::grant::{Decision, Requirement};
use crate::port::{AuditEffect, KernelError};

/// Writes audit records on both paths.
pub(super) struct Recorder {
    pub(super) audit: Arc<dyn AuditSink>,
    pub(super) hook: Arc<dyn ErrorHook>,
    pub(super) timeout: Option<Duration>,
}

impl Recorder {
    /// Decision path: before the effect, never time-bounded; a failure
    /// refuses the operation.
    pub(super) async fn decision(
        &self,
        record: &AuditRecord,
        effect: AuditEffect,
    ) -> Result<(), KernelError> {
        self.audit
            .append(record)
            .await
            .map_err(|e| KernelError::AuditUnavailable {
                effect,
                cause: e.to_string(),
            })
    }

    /// Outcome path: after the effect; a failure or a timeout goes to the
    /// hook and never changes the result.
    pub(super) async fn outcome(&self, record: &AuditRecord) {
        let result = match self.timeout {
            None => self.audit.append(record).await,
            Some(t) => match tokio::time::timeout(t, self.audit.append(record)).await {
                Ok(r) => r,
                Err(_) => Err(AuditError::Timeout {
                    timeout_ms: t.as_millis() as u64,
                }),
            },
        };
        if let Err(e) = result {
            self.hook.audit_error(&e, record);
        }
    }
}

pub(super) fn outcome_of(status: ToolStatus) -> AuditOutcome {
    match status {
        ToolStatus::Succeeded => AuditOutcome::Succeeded,
        ToolStatus::Denied => AuditOutcome::Denied,
        ToolStatus::Failed => AuditOutcome::Failed,
    }
}

/// The codes recorded `failClosed`: refusals because infrastructure was down.
pub(super) fn infrastructure_code(code: &str) -> bool {
    matches!(
        code,
        "audit_unavailable"
            | "authority_unavailable"
            | "usage_store_unavailable"
            | "delegation_chain_unverified"
    )
}

/// What the kernel knows about a call as it goes through the checks, for
/// its `tool.invoked` record.
#[derive(Default)]
pub(super) struct CallFacts {
    pub(super) resource: Option<ResourceRef>,
    pub(super) action: Option<String>,
    pub(super) grant_id: Option<String>,
    pub(super) cause: Option<String>,
    /// The step-12 decision record once written: the outcome record is
    /// made from it (its identity fields, resource, action, grant and call
    /// are already there), so the second record of a call costs a new id
    /// and a few fields, not a second copy of the context.
    /// Boxed: the call's futures move these facts a few times, and the
    /// record is the largest thing in them.
    pub(super) decided: Option<Box<AuditRecord>>,
}

/// `tool.invoked` for a call: `outcome` with `reason` (and `failClosed`
/// for an infrastructure code), after the effect.
pub(super) fn invoked_record(
    context: &AccessContext,
    call: &ToolCall,
    outcome: AuditOutcome,
    reason: Option<&str>,
    facts: CallFacts,
    metadata: Option<JsonObject>,
) -> Box<AuditRecord> {
    let mut r = match facts.decided {
        Some(mut decided) => {
            decided.id = crate::audit::record_id();
            decided.kind = AuditKind::ToolInvoked;
            decided.outcome = outcome;
            decided.consumed = None;
            decided.fail_closed = None;
            decided
        }
        None => {
            let mut r = Box::new(AuditRecord::new(
                AuditKind::ToolInvoked,
                outcome,
                context,
                AuditSource::Kernel,
            ));
            r.operation_id = Some(call.id.to_string());
            r.tool = Some(call.tool.to_string());
            r.resource = facts.resource;
            r.action = facts.action;
            r.grant_id = facts.grant_id;
            r
        }
    };
    r.cause = facts.cause;
    r.reason = reason.map(str::to_owned);
    if reason.is_some_and(infrastructure_code) {
        r.fail_closed = Some(true);
    }
    r.metadata = metadata;
    r
}

/// The `tool.invoked` outcome of a result.
pub(super) fn result_outcome(result: &ToolResult) -> (AuditOutcome, Option<&str>) {
    (
        outcome_of(result.status()),
        result.error().map(|e| e.code.as_str()),
    )
}

pub(super) fn catalog_metadata(hash: Option<String>) -> Option<JsonObject> {
    hash.map(|h| {
        let mut m = JsonObject::new();
        m.insert("catalogHash".into(), Value::String(h));
        m
    })
}

pub(super) fn resource_of(req: &Requirement) -> ResourceRef {
    ResourceRef {
        namespace: Identifier::new(&req.namespace).unwrap_or_else(|_| ident("invalid")),
        path: req
            .path
            .iter()
            .filter_map(|s| PathSegment::new(s).ok())
            .collect(),
        owner: Some(req.owner.clone()),
    }
}

/// `authorization.checked` for a decision on a requirement's resource and
/// action (made once per call by the caller, and moved in).
pub(super) fn checked_record(
    context: &AccessContext,
    (resource, action): (ResourceRef, String),
    decision: &Decision,
    operation_id: Option<&str>,
    tool: Option<&str>,
) -> AuditRecord {
    let outcome = if matches!(decision, Decision::Allowed { .. }) {
        AuditOutcome::Allowed
    } else {
        AuditOutcome::Denied
    };
    let mut r = AuditRecord::new(
        AuditKind::AuthorizationChecked,
        outcome,
        context,
        AuditSource::Kernel,
    );
    r.resource = Some(resource);
    r.action = Some(action);
    r.operation_id = operation_id.map(str::to_owned);
    r.tool = tool.map(str::to_owned);
    match decision {
        Decision::Allowed { grant_id, consumed } => {
            r.grant_id = Some(grant_id.clone());
            r.consumed = Some(*consumed);
        }
        Decision::Denied { reason, grant_id } => {
            r.grant_id = grant_id.clone();
            r.reason = Some(reason.code().to_owned());
            r.consumed = Some(false);
            if reason.fail_closed() {
                r.fail_closed = Some(true);
            }
        }
    }
    r
}
