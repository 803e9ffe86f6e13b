//! The audit records the kernel writes, and the [`Recorder`] that writes
//! them on the decision path (before the effect, refusing on failure) or
//! the outcome path (after it, failures to the hook).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use sharedos_protocol::{
    AccessContext, Identifier, JsonObject, PathSegment, ResourceRef, ToolCall, ToolResult,
    ToolStatus, ident,
};

use super::ErrorHook;
use crate::audit::{
    AuditEntry, AuditError, AuditKind, AuditOutcome, AuditSink, AuditSource, IdentityRef,
    MetadataRef, RecordId,
};
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
        entry: &AuditEntry<'_>,
        effect: AuditEffect,
    ) -> Result<(), KernelError> {
        self.audit
            .append_entry(entry)
            .await
            .map_err(|e| KernelError::AuditUnavailable {
                effect,
                cause: e.to_string(),
            })
    }

    /// Outcome path: after the effect; a failure or a timeout goes to the
    /// hook and never changes the result.
    pub(super) async fn outcome(&self, entry: &AuditEntry<'_>) {
        let result = match self.timeout {
            None => self.audit.append_entry(entry).await,
            Some(t) => match tokio::time::timeout(t, self.audit.append_entry(entry)).await {
                Ok(r) => r,
                Err(_) => Err(AuditError::Timeout {
                    timeout_ms: t.as_millis() as u64,
                }),
            },
        };
        if let Err(e) = result {
            self.hook.audit_error(&e, &entry.to_record());
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
/// its records: its `authorization.checked` (step 12) and its one
/// `tool.invoked` borrow these.
#[derive(Default)]
pub(super) struct CallFacts<'a> {
    pub(super) resource: Option<ResourceRef>,
    /// Borrowed from the tool's declared capability when the call needs
    /// exactly that.
    pub(super) action: Option<Cow<'a, str>>,
    pub(super) grant_id: Option<Identifier>,
    pub(super) cause: Option<&'static str>,
}

/// `tool.invoked` for a call: `outcome` with `reason` (and `failClosed`
/// for an infrastructure code), after the effect.
pub(super) fn invoked_entry<'e>(
    (id, context, identity): (&'e RecordId, &'e AccessContext, IdentityRef<'e>),
    call: &'e ToolCall,
    (outcome, reason): (AuditOutcome, Option<&'e str>),
    facts: &'e CallFacts<'_>,
    metadata: Option<MetadataRef<'e>>,
) -> AuditEntry<'e> {
    let kinds = (AuditKind::ToolInvoked, outcome, AuditSource::Kernel);
    let mut r = AuditEntry::new(id, kinds, &context.now, identity);
    r.operation_id = Some(call.id.as_str());
    r.tool = Some(call.tool.as_str());
    r.resource = facts.resource.as_ref();
    r.action = facts.action.as_deref();
    r.grant_id = facts.grant_id.as_ref().map(Identifier::as_str);
    r.cause = facts.cause;
    r.reason = reason;
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
        m.insert("catalogHash".into(), serde_json::Value::String(h));
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

/// What an `authorization.checked` decided about.
pub(super) struct Checked<'e> {
    pub(super) resource: &'e ResourceRef,
    pub(super) action: &'e str,
    pub(super) decision: &'e Decision,
    pub(super) operation_id: Option<&'e str>,
    pub(super) tool: Option<&'e str>,
}

/// `authorization.checked` for a decision on a requirement's resource and
/// action.
pub(super) fn checked_entry<'e>(
    id: &'e RecordId,
    context: &'e AccessContext,
    identity: IdentityRef<'e>,
    checked: Checked<'e>,
) -> AuditEntry<'e> {
    let outcome = if matches!(checked.decision, Decision::Allowed { .. }) {
        AuditOutcome::Allowed
    } else {
        AuditOutcome::Denied
    };
    let kinds = (
        AuditKind::AuthorizationChecked,
        outcome,
        AuditSource::Kernel,
    );
    let mut r = AuditEntry::new(id, kinds, &context.now, identity);
    r.resource = Some(checked.resource);
    r.action = Some(checked.action);
    r.operation_id = checked.operation_id;
    r.tool = checked.tool;
    match checked.decision {
        Decision::Allowed { grant_id, consumed } => {
            r.grant_id = Some(grant_id.as_str());
            r.consumed = Some(*consumed);
        }
        Decision::Denied { reason, grant_id } => {
            r.grant_id = grant_id.as_ref().map(Identifier::as_str);
            r.reason = Some(reason.code());
            r.consumed = Some(false);
            if reason.fail_closed() {
                r.fail_closed = Some(true);
            }
        }
    }
    r
}
