//! Effects outside the tool catalogue (network egress): authorized against
//! the turn's grants like a call, and audited before and after.
//!
//! The gateway in the host asks the turn for each model request or
//! connection; grants decide, with `maxUses` and time windows, exactly as
//! for a tool.

use sharedos_protocol::{AccessContext, JsonObject};

use super::open::OpenTurn;
use super::records::resource_of;
use crate::audit::{AuditKind, AuditOutcome, AuditRecord, AuditSource};
use crate::grant::{Decision, DenyReason, Requirement, authorize};
use crate::port::{AuditEffect, EffectDecision, KernelError};

fn requirement(
    context: &AccessContext,
    namespace: &str,
    path: &[String],
    action: &str,
) -> Requirement {
    Requirement {
        namespace: namespace.to_owned(),
        path: path.to_vec(),
        owner: context.owner.clone(),
        action: action.to_owned(),
    }
}

pub(super) async fn authorize_effect(
    turn: &OpenTurn,
    context: &AccessContext,
    namespace: &str,
    path: &[String],
    action: &str,
) -> Result<EffectDecision, KernelError> {
    // The turn's opening records are durable before any of its effects.
    turn.opened().await?;
    let req = requirement(context, namespace, path, action);
    let decision = match &turn.grants {
        Ok(grants) => authorize(grants, turn.shared.usage.as_ref(), context, &req, true).await,
        // No authority loaded: refuse.
        Err(_) => Decision::Denied {
            reason: DenyReason::AuthorityUnavailable,
            grant_id: None,
        },
    };
    let (outcome, answer) = match &decision {
        Decision::Allowed { grant_id, .. } => (
            AuditOutcome::Allowed,
            EffectDecision::Allowed {
                grant_id: grant_id.to_string(),
            },
        ),
        Decision::Denied { reason, .. } => (
            AuditOutcome::Denied,
            EffectDecision::Denied {
                reason_code: reason.code().to_owned(),
            },
        ),
    };
    let mut record = AuditRecord::new(
        AuditKind::EffectAuthorized,
        outcome,
        context,
        AuditSource::Kernel,
    );
    record.resource = Some(resource_of(&req));
    record.action = Some(req.action.clone());
    record.authority_hash = turn.authority_hash.clone();
    match decision {
        Decision::Allowed { grant_id, consumed } => {
            record.grant_id = Some(grant_id.into_string());
            record.consumed = Some(consumed);
        }
        Decision::Denied { reason, grant_id } => {
            record.grant_id = grant_id.map(|id| id.into_string());
            record.reason = Some(reason.code().to_owned());
            if reason.fail_closed() {
                record.fail_closed = Some(true);
            }
        }
    }
    // Decision path: the record is written before any byte moves.
    turn.shared
        .recorder
        .decision(&record.entry(), AuditEffect::None)
        .await?;
    Ok(answer)
}

pub(super) async fn record_effect_outcome(
    turn: &OpenTurn,
    context: &AccessContext,
    namespace: &str,
    path: &[String],
    action: &str,
    succeeded: bool,
    metadata: JsonObject,
) {
    let req = requirement(context, namespace, path, action);
    let outcome = if succeeded {
        AuditOutcome::Succeeded
    } else {
        AuditOutcome::Failed
    };
    let mut record = AuditRecord::new(
        AuditKind::EffectCompleted,
        outcome,
        context,
        AuditSource::Kernel,
    );
    record.resource = Some(resource_of(&req));
    record.action = Some(req.action);
    record.metadata = Some(metadata);
    turn.shared.recorder.outcome(&record.entry()).await;
}
