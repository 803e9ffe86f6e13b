//! [`Kernel`]: the embedded [`TurnKernel`].
//!
//! The check order of `invoke_tool` is envelope.md C.1; each step's code is
//! named where it is decided.

use std::sync::{Arc, Mutex, RwLock};

use async_trait::async_trait;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sharedos_protocol::{
    AccessContext, Address, CapabilityRequirement, Escalation, EscalationStatus, ExecutionStatus,
    Identifier, JsonObject, ReachEntry, ReachResult, ReachScope, Reason, ToolCall, ToolDefinition,
    ToolResult, canonical_json, ident,
};
use tokio_util::sync::CancellationToken;

use crate::audit::{AuditError, AuditOutcome, AuditRecord, AuditSink, AuditSource};
use crate::config::{ConfigError, HostPolicy, KernelConfig};
use crate::grant::{
    ConfigGrantSource, Decision, DenyReason, Grant, GrantSource, MemoryUsageStore, Requirement,
    Scope, UsageStore, authorize, discover,
};
use crate::port::{
    Admission, AuditEffect, KernelError, RefusedCall, TurnEnd, TurnKernel, TurnLease,
};
use crate::registry::{RegistrationError, ToolHandler, ToolRegistry};
use crate::tools::{EXECUTION_NAMESPACE, escalate, files};

/// The message of every `tool_unavailable` the kernel answers: the caller
/// cannot tell unregistered, disabled and undiscoverable apart.
pub const TOOL_UNAVAILABLE_MESSAGE: &str =
    "The tool is not available in this permission-filtered turn.";
/// The message of a grant refusal.
pub const NOT_GRANTED_MESSAGE: &str = "The access context does not grant this tool capability.";
/// The message of `tool_execution_failed`; the handler's own text goes to
/// the error hook.
pub const EXECUTION_FAILED_MESSAGE: &str = "The tool failed while running.";

/// Where errors that must not change a result go: outcome-path audit
/// failures and handler error text. Implementations must not block.
pub trait ErrorHook: Send + Sync {
    fn audit_error(&self, error: &AuditError, record: &AuditRecord) {
        tracing::warn!(record_type = %record.kind, record_id = %record.id, %error, "audit outcome write failed");
    }
    fn tool_error(&self, tool: &str, call_id: &str, error: &str) {
        tracing::warn!(%tool, %call_id, %error, "tool handler failed");
    }
}

/// The default hook: `tracing` warnings.
#[derive(Debug, Default, Clone, Copy)]
pub struct TracingHook;

impl ErrorHook for TracingHook {}

/// Why a kernel could not be built.
#[derive(Debug, thiserror::Error)]
pub enum KernelSetupError {
    #[error("kernel configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Registration(#[from] RegistrationError),
    #[error("usage store {path}: {message}")]
    UsageStore { path: String, message: String },
    #[error("files root {path}: {message}")]
    FilesRoot { path: String, message: String },
}

/// What a turn holds: its authority, its registry, its catalogue hash.
struct TurnAuthority {
    grants: Result<Arc<Vec<Grant>>, &'static str>,
    authority_hash: Option<String>,
    registry: Arc<ToolRegistry>,
    catalog_hash: Mutex<Option<String>>,
}

impl TurnAuthority {
    fn catalog_hash(&self) -> Option<String> {
        self.catalog_hash.lock().ok().and_then(|h| h.clone())
    }
}

mod build;
mod effect;
mod records;
mod run;

pub use build::KernelBuilder;

use records::{
    CallFacts, Recorder, catalog_metadata, checked_record, infrastructure_code, invoked_record,
    resource_of,
};
use run::Run;

/// The embedded kernel.
pub struct Kernel {
    registry: RwLock<Arc<ToolRegistry>>,
    policy: RwLock<Arc<HostPolicy>>,
    grants: Arc<dyn GrantSource>,
    config_grants: Option<Arc<ConfigGrantSource>>,
    usage: Arc<dyn UsageStore>,
    recorder: Arc<Recorder>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel").finish_non_exhaustive()
    }
}

/// Runs a handler's synchronous hook; a panic in it is `None`, so a broken
/// tool fails its call instead of the turn.
fn guarded<T>(f: impl FnOnce() -> T) -> Option<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok()
}

fn sha256_hex(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// `catalogHash`: sha256 of the canonical JSON of a listed catalogue.
pub fn catalog_hash(tools: &[ToolDefinition]) -> String {
    let value = serde_json::to_value(tools).unwrap_or(Value::Null);
    sha256_hex(&canonical_json(&value))
}

fn requirement_of(cap: &CapabilityRequirement, context: &AccessContext) -> Requirement {
    Requirement {
        namespace: cap.resource.namespace.to_string(),
        path: cap
            .resource
            .path
            .iter()
            .map(|s| s.as_str().to_owned())
            .collect(),
        owner: cap
            .resource
            .owner
            .clone()
            .unwrap_or_else(|| context.owner.clone()),
        action: cap.action.to_string(),
    }
}

impl Kernel {
    /// The configuration's grant source, when built by `from_config`
    /// (revoke or replace grants; effective at the next turn).
    pub fn config_grants(&self) -> Option<&Arc<ConfigGrantSource>> {
        self.config_grants.as_ref()
    }

    /// Registers a tool for turns that open authority from now on; turns
    /// already running keep the registry they started with.
    pub fn register(
        &self,
        definition: ToolDefinition,
        handler: Arc<dyn ToolHandler>,
    ) -> Result<(), RegistrationError> {
        let mut guard = self.registry.write().map_err(|_| {
            RegistrationError::InvalidDefinition("the tool registry lock is poisoned".into())
        })?;
        let mut next = guard.snapshot();
        next.register(definition, handler)?;
        *guard = Arc::new(next);
        Ok(())
    }

    /// Replaces the host policy; effective at the next operation, also in
    /// running turns (a ceiling can only narrow what grants allow).
    pub fn set_host_policy(&self, policy: HostPolicy) {
        match self.policy.write() {
            Ok(mut p) => *p = Arc::new(policy),
            Err(p) => *p.into_inner() = Arc::new(policy),
        }
    }

    fn current_policy(&self) -> Arc<HostPolicy> {
        match self.policy.read() {
            Ok(p) => Arc::clone(&p),
            Err(p) => Arc::clone(&p.into_inner()),
        }
    }

    fn current_registry(&self) -> Arc<ToolRegistry> {
        match self.registry.read() {
            Ok(r) => Arc::clone(&r),
            Err(p) => Arc::clone(&p.into_inner()),
        }
    }

    fn turn<'a>(&self, lease: &'a TurnLease) -> Result<&'a TurnAuthority, KernelError> {
        lease
            .get::<TurnAuthority>()
            .ok_or_else(|| KernelError::Failed("the lease was not opened by this kernel".into()))
    }

    /// Records `tool.invoked` for an answer the kernel gave itself.
    async fn answer(
        &self,
        turn: &TurnAuthority,
        context: &AccessContext,
        call: &ToolCall,
        result: ToolResult,
        facts: CallFacts,
    ) -> ToolResult {
        let record = invoked_record(context, call, &result, facts, turn.catalog_hash());
        self.recorder.outcome(record).await;
        result
    }
}

#[async_trait]
impl TurnKernel for Kernel {
    async fn open_turn_authority(&self, context: &AccessContext) -> Result<TurnLease, KernelError> {
        let loaded = self.grants.load(context).await;
        // Every loaded grant is kept, ancestors and revoked ones included:
        // each operation filters by identity and liveness, and a delegation
        // chain needs its ancestors to be checked.
        let grants: Result<Vec<Grant>, &'static str> = loaded.map_err(|_| "grant_source_failed");
        let authority_hash = grants.as_ref().ok().map(|g| {
            sha256_hex(&canonical_json(
                &serde_json::to_value(g).unwrap_or(Value::Null),
            ))
        });
        let mut record = AuditRecord::new(
            "authority.resolved",
            if grants.is_ok() {
                AuditOutcome::Allowed
            } else {
                AuditOutcome::Denied
            },
            context,
            AuditSource::Kernel,
        );
        record.authority_hash = authority_hash.clone();
        if let Err(cause) = &grants {
            record.reason = Some("authority_unavailable".into());
            record.cause = Some((*cause).into());
            record.fail_closed = Some(true);
        }
        self.recorder.decision(record, AuditEffect::None).await?;
        Ok(TurnLease::new(TurnAuthority {
            grants: grants.map(Arc::new),
            authority_hash,
            registry: self.current_registry(),
            catalog_hash: Mutex::new(None),
        }))
    }

    async fn admit_turn(
        &self,
        lease: &TurnLease,
        context: &AccessContext,
        agent: &Address,
    ) -> Result<Admission, KernelError> {
        let turn = self.turn(lease)?;
        let [kind, id] = agent.path();
        let req = Requirement {
            namespace: EXECUTION_NAMESPACE.into(),
            path: vec![kind, id],
            owner: context.owner.clone(),
            action: "invoke".into(),
        };
        let decision = match &turn.grants {
            Ok(grants) => authorize(grants, self.usage.as_ref(), context, &req, true).await,
            Err(_) => Decision::Denied {
                reason: DenyReason::AuthorityUnavailable,
                grant_id: None,
            },
        };
        let mut record = checked_record(context, &req, &decision, None, None);
        if turn.grants.is_err() {
            record.cause = turn.grants.as_ref().err().map(|c| (*c).to_owned());
        }
        self.recorder.decision(record, AuditEffect::None).await?;
        Ok(match decision {
            Decision::Allowed { .. } => Admission::allowed(),
            Decision::Denied { reason, .. } => Admission::refused(reason.code()),
        })
    }

    async fn reach(
        &self,
        lease: &TurnLease,
        context: &AccessContext,
    ) -> Result<ReachResult, KernelError> {
        let turn = self.turn(lease)?;
        let Ok(grants) = &turn.grants else {
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
        lease: &TurnLease,
        context: &AccessContext,
    ) -> Result<Vec<ToolDefinition>, KernelError> {
        let turn = self.turn(lease)?;
        let enabled: Vec<&str> = context
            .enabled_tool_namespaces
            .iter()
            .map(|n| n.as_str())
            .collect();
        let mut listed = Vec::new();
        let mut withheld = 0usize;
        let policy = self.current_policy();
        if let Ok(grants) = &turn.grants {
            for tool in turn.registry.iter() {
                let def = &tool.definition;
                let ceiling = requirement_of(&def.required_capability, context);
                let frozen = policy.refuses(&ceiling.namespace, &ceiling.path, def.read_write);
                if enabled.contains(&def.namespace.as_str())
                    && !frozen
                    && discover(grants, self.usage.as_ref(), context, &ceiling)
                        .await
                        .is_ok()
                {
                    listed.push(def.clone());
                } else {
                    withheld += 1;
                }
            }
        }
        let hash = catalog_hash(&listed);
        let mut record = AuditRecord::new(
            "tool.catalog.listed",
            if turn.grants.is_ok() {
                AuditOutcome::Allowed
            } else {
                AuditOutcome::Denied
            },
            context,
            AuditSource::Kernel,
        );
        record.authority_hash = turn.authority_hash.clone();
        if turn.grants.is_err() {
            record.reason = Some("authority_unavailable".into());
            record.fail_closed = Some(true);
        }
        let mut metadata = catalog_metadata(Some(hash.clone())).unwrap_or_default();
        metadata.insert("enabledNamespaces".into(), json!(enabled));
        metadata.insert("withheldCount".into(), json!(withheld));
        metadata.insert("listedCount".into(), json!(listed.len()));
        record.metadata = Some(metadata);
        self.recorder.decision(record, AuditEffect::None).await?;
        if let Ok(mut h) = turn.catalog_hash.lock() {
            *h = Some(hash);
        }
        Ok(listed)
    }

    async fn invoke_tool(
        &self,
        lease: &TurnLease,
        context: &AccessContext,
        call: &ToolCall,
        abort: CancellationToken,
    ) -> Result<ToolResult, KernelError> {
        // 1. Stopped before the port was entered: nothing written.
        if abort.is_cancelled() {
            return Err(KernelError::Aborted);
        }
        let turn = self.turn(lease)?;
        let now = context.now.clone();
        let mut facts = CallFacts::default();
        // 2. The call belongs to this trace.
        if call.trace_id != context.trace_id {
            let r = ToolResult::denied(
                call,
                "trace_mismatch",
                "The tool call belongs to another trace.",
                now,
            );
            return Ok(self.answer(turn, context, call, r, facts).await);
        }
        // 3. The turn's authority.
        let grants = match &turn.grants {
            Ok(g) => Arc::clone(g),
            Err(cause) => {
                facts.cause = Some((*cause).to_owned());
                let r = ToolResult::denied(call, "authority_unavailable", NOT_GRANTED_MESSAGE, now);
                return Ok(self.answer(turn, context, call, r, facts).await);
            }
        };
        // 4–6. Registered, and in an enabled namespace.
        let unavailable = |cause: &str, facts: &mut CallFacts| {
            facts.cause = Some(cause.to_owned());
            ToolResult::denied(
                call,
                "tool_unavailable",
                TOOL_UNAVAILABLE_MESSAGE,
                context.now.clone(),
            )
        };
        let Some(tool) = turn.registry.get(call.tool.as_str()).map(Arc::clone) else {
            let r = unavailable("not_registered", &mut facts);
            return Ok(self.answer(turn, context, call, r, facts).await);
        };
        let def = &tool.definition;
        if !context
            .enabled_tool_namespaces
            .iter()
            .any(|n| n == &def.namespace)
        {
            let r = unavailable("namespace_disabled", &mut facts);
            return Ok(self.answer(turn, context, call, r, facts).await);
        }
        // 7. Discovery, non-consuming.
        let ceiling = requirement_of(&def.required_capability, context);
        if let Err(reason) = discover(&grants, self.usage.as_ref(), context, &ceiling).await {
            let decision = Decision::Denied {
                reason,
                grant_id: None,
            };
            let record = checked_record(
                context,
                &ceiling,
                &decision,
                Some(call.id.as_str()),
                Some(call.tool.as_str()),
            );
            self.recorder.decision(record, AuditEffect::None).await?;
            let r = unavailable(reason.code(), &mut facts);
            return Ok(self.answer(turn, context, call, r, facts).await);
        }
        // 8. Arguments: the schema, then the handler's own parse.
        let parsed = tool.check_arguments(&call.arguments).and_then(|()| {
            guarded(|| tool.handler.parse_arguments(&call.arguments))
                .unwrap_or_else(|| Err("the tool could not parse its arguments".into()))
        });
        let parsed = match parsed {
            Ok(p) => p,
            Err(message) => {
                let message = format!("Invalid tool arguments: {message}");
                let r = ToolResult::failed(call, "invalid_tool_arguments", &message, now);
                return Ok(self.answer(turn, context, call, r, facts).await);
            }
        };
        let parsed_call = ToolCall {
            arguments: parsed,
            ..call.clone()
        };
        // 9. The exact requirement.
        let resolved = guarded(|| tool.handler.resolve_requirement(context, &parsed_call))
            .unwrap_or_else(|| Err("resolve_requirement panicked".into()));
        let resolved = match resolved {
            Ok(r) => r.unwrap_or_else(|| def.required_capability.clone()),
            Err(text) => {
                self.recorder
                    .hook
                    .tool_error(call.tool.as_str(), call.id.as_str(), &text);
                let r = ToolResult::failed(
                    call,
                    "tool_requirement_resolution_failed",
                    "The tool could not resolve what this call needs.",
                    now,
                );
                return Ok(self.answer(turn, context, call, r, facts).await);
            }
        };
        let req = requirement_of(&resolved, context);
        facts.resource = Some(resource_of(&req));
        facts.action = Some(req.action.clone());
        // 10. World boundary: the owner is the context's.
        if req.owner != context.owner {
            let decision = Decision::Denied {
                reason: DenyReason::InvalidRequest,
                grant_id: None,
            };
            let record = checked_record(
                context,
                &req,
                &decision,
                Some(call.id.as_str()),
                Some(call.tool.as_str()),
            );
            self.recorder.decision(record, AuditEffect::None).await?;
            let r = ToolResult::denied(call, "invalid_request", NOT_GRANTED_MESSAGE, now);
            return Ok(self.answer(turn, context, call, r, facts).await);
        }
        // 11. Ceiling: same namespace, action and owner; the declared path
        // is a segment prefix of the requested one.
        let within = req.namespace == ceiling.namespace
            && req.action == ceiling.action
            && req.owner == ceiling.owner
            && ceiling.path.len() <= req.path.len()
            && ceiling.path.iter().zip(&req.path).all(|(a, b)| a == b);
        if !within {
            let r = ToolResult::failed(
                call,
                "invalid_tool_requirement",
                "The tool asked for more than its declared capability.",
                now,
            );
            return Ok(self.answer(turn, context, call, r, facts).await);
        }
        // 12. Exact re-authorization, consuming; recorded before any effect.
        // The host's ceiling narrows first and consumes nothing.
        let decision = if self
            .current_policy()
            .refuses(&req.namespace, &req.path, def.read_write)
        {
            Decision::Denied {
                reason: DenyReason::HostPolicyDenied,
                grant_id: None,
            }
        } else {
            authorize(&grants, self.usage.as_ref(), context, &req, true).await
        };
        let record = checked_record(
            context,
            &req,
            &decision,
            Some(call.id.as_str()),
            Some(call.tool.as_str()),
        );
        self.recorder.decision(record, AuditEffect::None).await?;
        match decision {
            Decision::Denied { reason, grant_id } => {
                facts.grant_id = grant_id;
                let r = ToolResult::denied(call, reason.code(), NOT_GRANTED_MESSAGE, now);
                Ok(self.answer(turn, context, call, r, facts).await)
            }
            Decision::Allowed { grant_id, .. } => {
                facts.grant_id = Some(grant_id);
                if abort.is_cancelled() {
                    return Err(KernelError::Aborted);
                }
                // 13–14 run in their own task so the outcome is recorded
                // even when the caller stops waiting.
                let run = Run {
                    tool,
                    recorder: Arc::clone(&self.recorder),
                    context: context.clone(),
                    call: parsed_call,
                    original: call.clone(),
                    facts,
                    catalog_hash: turn.catalog_hash(),
                };
                tokio::spawn(run.go(abort))
                    .await
                    .map_err(|e| KernelError::Failed(format!("tool task: {e}")))?
            }
        }
    }

    async fn record_escalation(
        &self,
        _lease: &TurnLease,
        context: &AccessContext,
        execution_id: &Identifier,
        reason: &Reason,
    ) -> Result<Escalation, KernelError> {
        let mut r = AuditRecord::new(
            "escalation.requested",
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
        self.recorder.outcome(r).await;
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
        lease: &TurnLease,
        context: &AccessContext,
        refused: RefusedCall,
    ) -> Result<(), KernelError> {
        let hash = self.turn(lease).ok().and_then(TurnAuthority::catalog_hash);
        let mut r = AuditRecord::new(
            "tool.invoked",
            AuditOutcome::Denied,
            context,
            AuditSource::Envelope,
        );
        r.operation_id = Some(refused.call_id.to_string());
        r.tool = Some(refused.tool.to_string());
        if infrastructure_code(&refused.reason_code) {
            r.fail_closed = Some(true);
        }
        r.reason = Some(refused.reason_code);
        r.cause = refused.cause;
        r.metadata = catalog_metadata(hash);
        self.recorder.outcome(r).await;
        Ok(())
    }

    async fn record_turn_end(
        &self,
        context: &AccessContext,
        end: TurnEnd,
    ) -> Result<(), KernelError> {
        let (outcome, reason) = match end.status {
            ExecutionStatus::Succeeded => (AuditOutcome::Succeeded, end.reason_code),
            ExecutionStatus::Denied => (AuditOutcome::Denied, end.reason_code),
            ExecutionStatus::Failed => (AuditOutcome::Failed, end.reason_code),
            ExecutionStatus::Escalated => (AuditOutcome::Escalated, end.reason_code),
            ExecutionStatus::Cancelled => (
                AuditOutcome::Failed,
                Some(end.reason_code.unwrap_or_else(|| "turn_cancelled".into())),
            ),
        };
        let mut r = AuditRecord::new("turn.ended", outcome, context, AuditSource::Envelope);
        r.operation_id = Some(end.execution_id.to_string());
        r.ended_by = end.ended_by;
        if reason.as_deref().is_some_and(infrastructure_code) {
            r.fail_closed = Some(true);
        }
        r.reason = reason;
        self.recorder.outcome(r).await;
        Ok(())
    }
}
