//! The embedded kernel's [`KernelTurn`]: the port's operations on an
//! [`OpenTurn`] (`open.rs`), the two pipelines handed to `invoke.rs` and
//! `effect.rs`.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};
use sharedos_protocol::{
    AccessContext, Address, Escalation, EscalationStatus, Identifier, JsonObject, ReachEntry,
    ReachResult, ReachScope, Reason, ToolCall, ToolDefinition, ToolResult, ident,
};
use tokio_util::sync::CancellationToken;

use super::open::OpenTurn;
use super::records::{Checked, catalog_metadata, checked_entry, infrastructure_code, resource_of};
use super::{catalog_hash, requirement_of};
use crate::audit::{AuditEntry, AuditKind, AuditOutcome, AuditRecord, AuditSource, RecordId};
use crate::grant::{Decision, DenyReason, Requirement, Scope, authorize, discover};
use crate::port::{
    Admission, AuditEffect, EffectDecision, KernelError, KernelTurn, OwnedInvoke, RefusedCall,
};
use crate::tools::EXECUTION_NAMESPACE;

impl OpenTurn {
    /// `tool.catalog.listed` and the catalogue's hash.
    fn listing_record(
        &self,
        context: &AccessContext,
        enabled: &[&str],
        listed: &[ToolDefinition],
        withheld: usize,
    ) -> (AuditRecord, String) {
        let hash = catalog_hash(listed);
        let outcome = if self.grants.is_ok() {
            AuditOutcome::Allowed
        } else {
            AuditOutcome::Denied
        };
        let mut record = AuditRecord::new(
            AuditKind::ToolCatalogListed,
            outcome,
            context,
            AuditSource::Kernel,
        );
        record.authority_hash = self.authority_hash.clone();
        if self.grants.is_err() {
            record.reason = Some("authority_unavailable".into());
            record.fail_closed = Some(true);
        }
        let mut metadata = catalog_metadata(Some(hash.clone())).unwrap_or_default();
        metadata.insert("enabledNamespaces".into(), json!(enabled));
        metadata.insert("withheldCount".into(), json!(withheld));
        metadata.insert("listedCount".into(), json!(listed.len()));
        record.metadata = Some(metadata);
        (record, hash)
    }

    /// The admission's decision and its `authorization.checked`, not yet
    /// written.
    pub(super) async fn admission(
        &self,
        context: &AccessContext,
        agent: &Address,
    ) -> (Admission, AuditRecord) {
        let [kind, id] = agent.path();
        let req = Requirement {
            namespace: EXECUTION_NAMESPACE.into(),
            path: vec![kind, id],
            owner: context.owner.clone(),
            action: "invoke".into(),
        };
        let decision = match &self.grants {
            Ok(grants) => authorize(grants, self.shared.usage.as_ref(), context, &req, true).await,
            Err(_) => Decision::Denied {
                reason: DenyReason::AuthorityUnavailable,
                grant_id: None,
            },
        };
        let resource = resource_of(&req);
        let (id, identity) = (RecordId::new(), self.identity(context));
        let checked = Checked {
            resource: &resource,
            action: &req.action,
            decision: &decision,
            operation_id: None,
            tool: None,
        };
        let mut entry = checked_entry(&id, context, identity.view(), checked);
        if let Err(cause) = &self.grants {
            entry.cause = Some(cause);
        }
        let record = entry.to_record();
        let admission = match decision {
            Decision::Allowed { .. } => Admission::allowed(),
            Decision::Denied { reason, .. } => Admission::refused(reason.code()),
        };
        (admission, record)
    }

    /// The catalogue (tools in enabled namespaces that pass discovery) and
    /// its `tool.catalog.listed`, not yet written; the turn keeps its hash.
    pub(super) async fn listing(
        &self,
        context: &AccessContext,
    ) -> (Vec<ToolDefinition>, AuditRecord) {
        let enabled: Vec<&str> = context
            .enabled_tool_namespaces
            .iter()
            .map(|n| n.as_str())
            .collect();
        let mut listed = Vec::new();
        let mut withheld = 0usize;
        let policy = self.shared.current_policy();
        if let Ok(grants) = &self.grants {
            for tool in self.registry.iter() {
                let def = &tool.definition;
                let ceiling = requirement_of(&def.required_capability, context);
                let frozen = policy.refuses(&ceiling.namespace, &ceiling.path, def.read_write);
                if enabled.contains(&def.namespace.as_str())
                    && !frozen
                    && discover(grants, self.shared.usage.as_ref(), context, &ceiling)
                        .await
                        .is_ok()
                {
                    listed.push(def.clone());
                } else {
                    withheld += 1;
                }
            }
        }
        let (record, hash) = self.listing_record(context, &enabled, &listed, withheld);
        self.set_catalog_hash(hash);
        (listed, record)
    }
}

#[async_trait]
impl KernelTurn for OpenTurn {
    async fn admit(
        &self,
        context: &AccessContext,
        agent: &Address,
    ) -> Result<Admission, KernelError> {
        let (admission, record) = self.admission(context, agent).await;
        self.shared
            .recorder
            .decision(&record.entry(), AuditEffect::None)
            .await?;
        Ok(admission)
    }

    async fn reach(&self, context: &AccessContext) -> Result<ReachResult, KernelError> {
        let Ok(grants) = &self.grants else {
            return Ok(ReachResult::Unavailable {
                reason_code: ident("authority_unavailable"),
            });
        };
        let mut reach: Vec<ReachEntry> = Vec::new();
        let usable = grants
            .iter()
            .filter(|g| g.applies(context) && g.check_chain(grants, context).is_ok());
        for g in usable {
            for c in &g.capabilities {
                let entry = ReachEntry {
                    namespace: c.namespace.clone(),
                    path: c.path.clone(),
                    actions: c.actions.clone(),
                    scope: match c.scope {
                        Scope::Exact => ReachScope::Exact,
                        Scope::Descendants => ReachScope::Descendants,
                    },
                };
                if !reach.contains(&entry) {
                    reach.push(entry);
                }
            }
        }
        Ok(ReachResult::Computed { reach })
    }

    async fn list_tools(
        &self,
        context: &AccessContext,
    ) -> Result<Vec<ToolDefinition>, KernelError> {
        let (listed, record) = self.listing(context).await;
        self.shared
            .recorder
            .decision(&record.entry(), AuditEffect::None)
            .await?;
        Ok(listed)
    }

    async fn opened(&self) -> Result<(), KernelError> {
        OpenTurn::opened(self).await
    }

    async fn invoke_tool(
        &self,
        context: &AccessContext,
        call: &ToolCall,
        abort: CancellationToken,
    ) -> Result<ToolResult, KernelError> {
        super::invoke::invoke_tool(self, context, call, abort).await
    }

    /// The call's whole future in one box (the default would box
    /// `invoke_tool`'s inside its own).
    fn invoke_tool_owned(
        self: Arc<Self>,
        context: Arc<AccessContext>,
        call: ToolCall,
        abort: CancellationToken,
    ) -> OwnedInvoke {
        Box::pin(async move { super::invoke::invoke_tool(&self, &context, &call, abort).await })
    }

    async fn record_escalation(
        &self,
        context: &AccessContext,
        execution_id: &Identifier,
        reason: &Reason,
    ) -> Result<Escalation, KernelError> {
        self.opened().await?;
        let mut r = AuditRecord::new(
            AuditKind::EscalationRequested,
            AuditOutcome::Escalated,
            context,
            AuditSource::Kernel,
        );
        r.operation_id = Some(execution_id.to_string());
        r.reason = Some("escalation_requested".into());
        let mut m = JsonObject::new();
        m.insert("detail".into(), json!(reason.as_str()));
        m.insert(
            "reviewer".into(),
            serde_json::to_value(&context.owner).unwrap_or(Value::Null),
        );
        m.insert("reviewerAssumed".into(), json!(true));
        m.insert("resolution".into(), json!("pending"));
        r.metadata = Some(m);
        self.shared.recorder.outcome(&r.entry()).await;
        Ok(Escalation {
            reason: reason.clone(),
            reviewer: context.owner.clone(),
            requested_at: context.now.clone(),
            requested_authority: None,
            status: EscalationStatus::Pending,
        })
    }

    async fn record_refused_call(
        &self,
        context: &AccessContext,
        refused: RefusedCall,
    ) -> Result<(), KernelError> {
        self.opened().await?;
        let (id, identity) = (RecordId::new(), self.identity(context));
        let kinds = (
            AuditKind::ToolInvoked,
            AuditOutcome::Denied,
            AuditSource::Envelope,
        );
        let mut r = AuditEntry::new(&id, kinds, &context.now, identity.view());
        r.operation_id = Some(refused.call_id.as_str());
        r.tool = Some(refused.tool.as_str());
        if infrastructure_code(&refused.reason_code) {
            r.fail_closed = Some(true);
        }
        r.reason = Some(&refused.reason_code);
        r.cause = refused.cause.as_deref();
        let metadata = self.catalog_metadata();
        r.metadata = metadata.as_deref().map(|m| m.view());
        self.shared.recorder.outcome(&r).await;
        Ok(())
    }

    async fn authorize_effect(
        &self,
        context: &AccessContext,
        namespace: &str,
        path: &[String],
        action: &str,
    ) -> Result<EffectDecision, KernelError> {
        super::effect::authorize_effect(self, context, namespace, path, action).await
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
        super::effect::record_effect_outcome(
            self, context, namespace, path, action, succeeded, metadata,
        )
        .await
    }
}
