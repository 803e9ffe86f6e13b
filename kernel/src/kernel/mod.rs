//! [`Kernel`]: the embedded [`TurnKernel`]. It opens an [`OpenTurn`]
//! (`open.rs`; the port's operations on it in `turn.rs`) per turn; a tool
//! call goes through the check pipeline of `invoke.rs` (envelope.md C.1,
//! one function per step) and the handler run of `run.rs`.

use std::borrow::Cow;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use serde_json::Value;
use sha2::{Digest, Sha256};
use sharedos_protocol::{
    AccessContext, Address, CapabilityRequirement, ExecutionStatus, ToolDefinition, canonical_json,
};

use crate::audit::{
    AuditEntry, AuditError, AuditKind, AuditOutcome, AuditRecord, AuditSink, AuditSource, RecordId,
    RecordIdentity,
};
use crate::config::{ConfigError, HostPolicy, KernelConfig};
use crate::grant::{
    ConfigGrantSource, Grant, GrantSource, MemoryUsageStore, Requirement, UsageStore,
};
use crate::port::{Admitted, AuditEffect, KernelError, KernelTurn, Opening, TurnEnd, TurnKernel};
use crate::registry::{RegisteredTool, RegistrationError, ToolHandler, ToolRegistry};
use crate::tools::{escalate, files};

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

mod build;
mod effect;
mod invoke;
mod open;
mod records;
mod refusal;
mod run;
mod turn;

pub use build::KernelBuilder;

use open::OpenTurn;
use records::{Recorder, infrastructure_code};

/// The embedded kernel.
pub struct Kernel {
    registry: RwLock<Arc<ToolRegistry>>,
    grants: Arc<dyn GrantSource>,
    config_grants: Option<Arc<ConfigGrantSource>>,
    shared: Arc<Shared>,
}

/// What every open turn of a kernel shares with it: the host policy (a
/// change reaches running turns at their next operation), the usage store
/// and the audit recorder.
pub(super) struct Shared {
    policy: RwLock<Arc<HostPolicy>>,
    usage: Arc<dyn UsageStore>,
    recorder: Recorder,
}

impl Shared {
    fn current_policy(&self) -> Arc<HostPolicy> {
        match self.policy.read() {
            Ok(p) => Arc::clone(&p),
            Err(p) => Arc::clone(&p.into_inner()),
        }
    }
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

/// The requirement `tool` declares, for `context`'s owner when it names
/// none: borrowed from the one the tool keeps when that was made for the
/// same owner (every call of a turn, and of turns of the same owner), made
/// anew otherwise. Equal to `requirement_of` on the declaration either way.
fn declared_requirement<'t>(
    tool: &'t RegisteredTool,
    context: &AccessContext,
) -> Cow<'t, Requirement> {
    let cap = &tool.definition.required_capability;
    let owner = cap.resource.owner.as_ref().unwrap_or(&context.owner);
    let kept = tool
        .declared_requirement()
        .get_or_init(|| requirement_of(cap, context));
    if &kept.owner == owner {
        Cow::Borrowed(kept)
    } else {
        Cow::Owned(requirement_of(cap, context))
    }
}

fn requirement_of(cap: &CapabilityRequirement, context: &AccessContext) -> Requirement {
    Requirement {
        namespace: cap.resource.namespace.as_str().to_owned(),
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
        action: cap.action.as_str().to_owned(),
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
        match self.shared.policy.write() {
            Ok(mut p) => *p = Arc::new(policy),
            Err(p) => *p.into_inner() = Arc::new(policy),
        }
    }

    fn current_registry(&self) -> Arc<ToolRegistry> {
        match self.registry.read() {
            Ok(r) => Arc::clone(&r),
            Err(p) => Arc::clone(&p.into_inner()),
        }
    }
}

/// Each grant's tenant, subject and issuer that equal the context's are
/// made the context's own shared text. A call's context is the turn's
/// (its ids are shared, only its time differs), and `Grant::applies`
/// compares these three for every grant on every call: equal text at the
/// same place compares without reading it (`Grant::applies` looks at the
/// place first). Every comparison answers as
/// before.
fn share_identity(mut grants: Vec<Grant>, context: &AccessContext) -> Vec<Grant> {
    for g in &mut grants {
        if g.namespace_id == context.namespace_id {
            g.namespace_id = context.namespace_id.clone();
        }
        if g.subject == context.actor {
            g.subject = context.actor.clone();
        }
        if g.issuer == context.authority {
            g.issuer = context.authority.clone();
        }
    }
    grants
}

impl Kernel {
    /// A turn's authority loaded, and its `authority.resolved`, not yet
    /// written.
    async fn open(&self, context: &AccessContext) -> (OpenTurn, AuditRecord) {
        let loaded = self.grants.load(context).await;
        // Every loaded grant is kept, ancestors and revoked ones included:
        // each operation filters by identity and liveness, and a delegation
        // chain needs its ancestors to be checked.
        let grants: Result<Vec<Grant>, &'static str> = loaded
            .map(|grants| share_identity(grants, context))
            .map_err(|_| "grant_source_failed");
        let authority_hash = grants.as_ref().ok().map(|g| {
            sha256_hex(&canonical_json(
                &serde_json::to_value(g).unwrap_or(Value::Null),
            ))
        });
        let outcome = if grants.is_ok() {
            AuditOutcome::Allowed
        } else {
            AuditOutcome::Denied
        };
        // The turn's records share this identity (and its JSON).
        let identity = RecordIdentity::of(context);
        let id = RecordId::new();
        let kinds = (AuditKind::AuthorityResolved, outcome, AuditSource::Kernel);
        let mut entry = AuditEntry::new(&id, kinds, &context.now, identity.view());
        entry.authority_hash = authority_hash.as_deref();
        if let Err(cause) = &grants {
            entry.reason = Some("authority_unavailable");
            entry.cause = Some(cause);
            entry.fail_closed = Some(true);
        }
        let record = entry.to_record();
        let turn = OpenTurn::new(
            Arc::clone(&self.shared),
            grants.map(Arc::new),
            authority_hash,
            self.current_registry(),
            identity,
        );
        (turn, record)
    }
}

#[async_trait]
impl TurnKernel for Kernel {
    async fn open_turn(&self, context: &AccessContext) -> Result<Arc<dyn KernelTurn>, KernelError> {
        let (turn, record) = self.open(context).await;
        self.shared
            .recorder
            .decision(&record.entry(), AuditEffect::None)
            .await?;
        Ok(Arc::new(turn))
    }

    /// The opening's records (`authority.resolved`, the admission's
    /// `authorization.checked`, `tool.catalog.listed`) go to the sink as
    /// one group (one `fsync` for the JSONL sink) and this answers before
    /// they are durable; the turn's every operation waits for them.
    async fn open_admitted(
        &self,
        context: &AccessContext,
        agent: &Address,
    ) -> Result<Opening, KernelError> {
        let (turn, resolved) = self.open(context).await;
        let (admission, checked) = turn.admission(context, agent).await;
        let mut records = vec![resolved, checked];
        let admitted = if admission.allowed {
            let reach = KernelTurn::reach(&turn, context).await?;
            let (tools, listed) = turn.listing(context).await;
            records.push(listed);
            Some(Admitted { reach, tools })
        } else {
            None
        };
        let durable = turn.hold_opening(records);
        Ok(Opening {
            turn: Arc::new(turn),
            admission,
            admitted,
            durable,
        })
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
        let mut r = AuditRecord::new(
            AuditKind::TurnEnded,
            outcome,
            context,
            AuditSource::Envelope,
        );
        r.operation_id = Some(end.execution_id.to_string());
        r.ended_by = end.ended_by;
        if reason.as_deref().is_some_and(infrastructure_code) {
            r.fail_closed = Some(true);
        }
        r.reason = reason;
        self.shared.recorder.outcome(&r.entry()).await;
        Ok(())
    }
}
