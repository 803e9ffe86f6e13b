//! The kernel surface the envelope uses (envelope.md B.0): `TurnKernel`.
//!
//! All eight ports are required (ADR 0023): the envelope records its own
//! refusals, the escalation and the end of every turn through the kernel.

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use sharedos_protocol::{
    AccessContext, Address, Escalation, ExecutionStatus, Identifier, ReachResult, Reason, ToolCall,
    ToolDefinition, ToolResult,
};
use tokio_util::sync::CancellationToken;

/// The authority a kernel loaded for one turn, held until the turn ends.
/// Opaque to the envelope; each kernel stores what it needs in it.
#[derive(Clone)]
pub struct TurnLease(pub Arc<dyn Any + Send + Sync>);

impl std::fmt::Debug for TurnLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TurnLease(..)")
    }
}

impl TurnLease {
    pub fn new<T: Any + Send + Sync>(value: T) -> Self {
        Self(Arc::new(value))
    }
    pub fn get<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.0.downcast_ref::<T>()
    }
}

/// The decision on admitting a turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    pub allowed: bool,
    /// Set when refused: `no_matching_grant`, `authority_unavailable`, ...
    pub reason_code: Option<String>,
}

impl Admission {
    pub fn allowed() -> Self {
        Self {
            allowed: true,
            reason_code: None,
        }
    }
    pub fn refused(code: &str) -> Self {
        Self {
            allowed: false,
            reason_code: Some(code.to_owned()),
        }
    }
}

/// A call the envelope refused before it reached the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedCall {
    pub call_id: Identifier,
    pub tool: Identifier,
    pub reason_code: String,
    /// `not_offered` for a tool outside the turn's catalogue.
    pub cause: Option<String>,
}

/// How a turn ended, for the audit's `turn.ended`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnEnd {
    pub execution_id: Identifier,
    pub status: ExecutionStatus,
    pub reason_code: Option<String>,
    /// `envelope` or `runtime`: the source of the last `turn.failed`.
    pub ended_by: Option<String>,
}

/// Whether an effect may have happened when a decision could not be
/// recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditEffect {
    /// Nothing ran.
    None,
    /// A port that was already entered asked for a decision of its own.
    Unknown,
}

/// Why a kernel port rejected (the cases with no `ToolResult`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// A decision-path audit write failed (`AuditUnavailableError`).
    #[error("the audit sink could not record a decision: {cause}")]
    AuditUnavailable { effect: AuditEffect, cause: String },
    /// The operation was stopped by the turn's hard signal after its port
    /// was entered; the kernel recorded it `interrupted`.
    #[error("the operation was interrupted")]
    Interrupted,
    /// The operation was stopped before its port was entered.
    #[error("the operation was aborted")]
    Aborted,
    /// Anything else; the message is for logs, never for a result.
    #[error("kernel failure: {0}")]
    Failed(String),
}

/// The kernel surface the envelope uses for one turn.
#[async_trait]
pub trait TurnKernel: Send + Sync {
    /// Loads authority once from the trusted grant source and holds it for
    /// the turn. Revocation in the store takes effect at the next turn.
    async fn open_turn_authority(&self, context: &AccessContext) -> Result<TurnLease, KernelError>;

    /// Admission: consumes a use of `sharedos.execution` / the agent's
    /// address path / `invoke`, owner = `context.owner`.
    async fn admit_turn(
        &self,
        lease: &TurnLease,
        context: &AccessContext,
        agent: &Address,
    ) -> Result<Admission, KernelError>;

    /// The descriptive reach of the turn's authority (grants nothing).
    async fn reach(
        &self,
        lease: &TurnLease,
        context: &AccessContext,
    ) -> Result<ReachResult, KernelError>;

    /// Tools in enabled namespaces that pass non-consuming discovery, in
    /// the kernel's order, with the kernel's definitions.
    async fn list_tools(
        &self,
        lease: &TurnLease,
        context: &AccessContext,
    ) -> Result<Vec<ToolDefinition>, KernelError>;

    /// Finds the handler, validates arguments, re-authorizes the exact
    /// resource and action, audits, runs. `abort` is the turn's hard
    /// signal, the only one a handler is given.
    async fn invoke_tool(
        &self,
        lease: &TurnLease,
        context: &AccessContext,
        call: &ToolCall,
        abort: CancellationToken,
    ) -> Result<ToolResult, KernelError>;

    /// Records an escalation (`escalation.requested`); grants nothing.
    async fn record_escalation(
        &self,
        lease: &TurnLease,
        context: &AccessContext,
        execution_id: &Identifier,
        reason: &Reason,
    ) -> Result<Escalation, KernelError>;

    /// Records a call the envelope refused (`tool.invoked`, source
    /// `envelope`).
    async fn record_refused_call(
        &self,
        lease: &TurnLease,
        context: &AccessContext,
        refused: RefusedCall,
    ) -> Result<(), KernelError>;

    /// Records the end of a turn (`turn.ended`), on the outcome path.
    async fn record_turn_end(
        &self,
        context: &AccessContext,
        end: TurnEnd,
    ) -> Result<(), KernelError>;
}

/// The kernel's answer on an effect outside the tool catalogue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EffectDecision {
    Allowed {
        grant_id: String,
    },
    /// `no_matching_grant`, `grant_exhausted`, `authority_unavailable`, ...
    Denied {
        reason_code: String,
    },
}

/// Effects that are not tool calls (the egress gateway's requests and
/// connections): authorized against the turn's grants, each decision
/// audited before the effect (`effect.authorized`) and each outcome after
/// it (`effect.completed`).
#[async_trait]
pub trait EffectPort: Send + Sync {
    /// Consumes a use of a bounded grant when allowed.
    async fn authorize_effect(
        &self,
        lease: &TurnLease,
        context: &AccessContext,
        namespace: &str,
        path: &[String],
        action: &str,
    ) -> Result<EffectDecision, KernelError>;

    /// Records what happened (`metadata` holds no payload and no secret).
    async fn record_effect_outcome(
        &self,
        context: &AccessContext,
        namespace: &str,
        path: &[String],
        action: &str,
        succeeded: bool,
        metadata: sharedos_protocol::JsonObject,
    );
}
