//! Effects outside the tool catalogue (network egress): authorized against
//! the turn's grants like a call, and audited before and after.
//!
//! The gateway in the host asks here for each model request or connection;
//! grants decide, with `maxUses` and time windows, exactly as for a tool.

use async_trait::async_trait;
use sharedos_protocol::{AccessContext, JsonObject};

use super::records::resource_of;
use super::{Kernel, TurnAuthority};
use crate::audit::{AuditOutcome, AuditRecord, AuditSource};
use crate::grant::{Decision, Requirement, authorize};
use crate::port::{AuditEffect, EffectDecision, EffectPort, KernelError, TurnLease};

#[async_trait]
impl EffectPort for Kernel {
    async fn authorize_effect(
        &self,
        lease: &TurnLease,
        context: &AccessContext,
        namespace: &str,
        path: &[String],
        action: &str,
    ) -> Result<EffectDecision, KernelError> {
        let req = Requirement {
            namespace: namespace.to_owned(),
            path: path.to_vec(),
            owner: context.owner.clone(),
            action: action.to_owned(),
        };
        let authority = lease.get::<TurnAuthority>();
        let decision = match authority.map(|a| a.grants.as_ref()) {
            Some(Ok(grants)) => authorize(grants, self.usage.as_ref(), context, &req, true).await,
            // No authority loaded (or a lease of another kernel): refuse.
            _ => Decision::Denied {
                reason: crate::grant::DenyReason::AuthorityUnavailable,
                grant_id: None,
            },
        };
        let (outcome, answer) = match &decision {
            Decision::Allowed { grant_id, .. } => (
                AuditOutcome::Allowed,
                EffectDecision::Allowed {
                    grant_id: grant_id.clone(),
                },
            ),
            Decision::Denied { reason, .. } => (
                AuditOutcome::Denied,
                EffectDecision::Denied {
                    reason_code: reason.code().to_owned(),
                },
            ),
        };
        let mut record =
            AuditRecord::new("effect.authorized", outcome, context, AuditSource::Kernel);
        record.resource = Some(resource_of(&req));
        record.action = Some(req.action.clone());
        record.authority_hash = authority.and_then(|a| a.authority_hash.clone());
        match decision {
            Decision::Allowed { grant_id, consumed } => {
                record.grant_id = Some(grant_id);
                record.consumed = Some(consumed);
            }
            Decision::Denied { reason, grant_id } => {
                record.grant_id = grant_id;
                record.reason = Some(reason.code().to_owned());
                if reason.fail_closed() {
                    record.fail_closed = Some(true);
                }
            }
        }
        // Decision path: the record is written before any byte moves.
        self.recorder.decision(record, AuditEffect::None).await?;
        Ok(answer)
    }

    async fn record_effect_outcome(
        &self,
        context: &AccessContext,
        namespace: &str,
        path: &[String],
        action: &str,
        succeeded: bool,
        metadata: JsonObject,
    ) {
        let req = Requirement {
            namespace: namespace.to_owned(),
            path: path.to_vec(),
            owner: context.owner.clone(),
            action: action.to_owned(),
        };
        let outcome = if succeeded {
            AuditOutcome::Succeeded
        } else {
            AuditOutcome::Failed
        };
        let mut record =
            AuditRecord::new("effect.completed", outcome, context, AuditSource::Kernel);
        record.resource = Some(resource_of(&req));
        record.action = Some(req.action);
        record.metadata = Some(metadata);
        self.recorder.outcome(record).await;
    }
}
