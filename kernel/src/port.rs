//! The kernel surface the envelope uses (envelope.md B.0): a [`TurnKernel`]
//! opens one [`KernelTurn`] per turn, and every operation of the turn goes
//! through that object.
//!
//! The turn object is typed: a kernel keeps whatever it loaded for the turn
//! (authority, registry snapshot, catalogue hash) in its own type behind
//! `dyn KernelTurn`, so a second kernel is one `impl TurnKernel` and one
//! `impl KernelTurn`, with nothing to downcast. Every port is required
//! (ADR 0023): the envelope records its own refusals, the escalation and the
//! end of every turn through the kernel.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use sharedos_protocol::{
    AccessContext, Address, Escalation, ExecutionStatus, Identifier, ReachResult, Reason, ToolCall,
    ToolDefinition, ToolResult,
};
use tokio_util::sync::CancellationToken;

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

impl std::fmt::Debug for dyn KernelTurn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KernelTurn(..)")
    }
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

/// A call with the kernel that owns all it needs (see
/// [`KernelTurn::invoke_tool_owned`]).
pub type OwnedInvoke =
    Pin<Box<dyn Future<Output = Result<ToolResult, KernelError>> + Send + 'static>>;

/// The kernel: opens turns, and records how they ended.
#[async_trait]
pub trait TurnKernel: Send + Sync {
    /// Loads authority once from the trusted grant source and holds it in
    /// the returned turn. Revocation in the store takes effect at the next
    /// turn. Refuses only when the decision record cannot be written.
    async fn open_turn(&self, context: &AccessContext) -> Result<Arc<dyn KernelTurn>, KernelError>;

    /// Records the end of a turn (`turn.ended`), on the outcome path. On the
    /// kernel rather than the turn: a turn whose authority could not be
    /// opened still ends, and that end is recorded.
    async fn record_turn_end(
        &self,
        context: &AccessContext,
        end: TurnEnd,
    ) -> Result<(), KernelError>;

    /// A turn's opening in one call: [`TurnKernel::open_turn`], then
    /// [`KernelTurn::admit`] and, when admitted, [`KernelTurn::reach`] and
    /// [`KernelTurn::list_tools`]. The default makes those calls in turn,
    /// each record durable before the next call; [`Opening::durable`] is
    /// then already settled.
    ///
    /// A kernel may instead hand the opening's records (`authority.resolved`,
    /// the admission's `authorization.checked`, `tool.catalog.listed`) to its
    /// sink together and answer before they are durable: the caller can
    /// start what is not an effect (the plugin's process) meanwhile, and
    /// awaits [`Opening::durable`] before it treats the turn as admitted.
    /// Every operation of the returned turn waits for those records first,
    /// so no effect runs before its turn's decisions are durable; and a
    /// failure to write them refuses each one (`AuditUnavailable`).
    async fn open_admitted(
        &self,
        context: &AccessContext,
        agent: &Address,
    ) -> Result<Opening, KernelError> {
        let turn = self.open_turn(context).await?;
        let admission = turn.admit(context, agent).await?;
        let admitted = if admission.allowed {
            Some(Admitted {
                reach: turn.reach(context).await?,
                tools: turn.list_tools(context).await?,
            })
        } else {
            None
        };
        Ok(Opening {
            turn,
            admission,
            admitted,
            durable: Box::pin(std::future::ready(Ok(()))),
        })
    }
}

/// The durability of a turn's opening records (see
/// [`TurnKernel::open_admitted`]).
pub type OpeningDurable = Pin<Box<dyn Future<Output = Result<(), KernelError>> + Send + 'static>>;

/// What [`TurnKernel::open_admitted`] answers.
pub struct Opening {
    pub turn: Arc<dyn KernelTurn>,
    pub admission: Admission,
    /// The reach and the catalogue; `None` when the turn was not admitted.
    pub admitted: Option<Admitted>,
    /// Settles once the opening's records are durable, with
    /// `AuditUnavailable` when they could not be written.
    pub durable: OpeningDurable,
}

impl std::fmt::Debug for Opening {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opening")
            .field("admission", &self.admission)
            .field("admitted", &self.admitted)
            .finish_non_exhaustive()
    }
}

/// An admitted turn's reach and catalogue ([`KernelTurn::reach`],
/// [`KernelTurn::list_tools`]).
#[derive(Debug, Clone)]
pub struct Admitted {
    pub reach: ReachResult,
    pub tools: Vec<ToolDefinition>,
}

/// One turn's view of the kernel. Every operation gets the context with the
/// operation's `now` (expiry is checked against it); its identity fields are
/// the ones the turn was opened with.
///
/// A port future must be driven to its end for its outcome to be recorded:
/// the envelope's mediation runs each call in a task of its own, the one
/// place that guarantees "finish and record even when nobody waits".
#[async_trait]
pub trait KernelTurn: Send + Sync + 'static {
    /// Admission: consumes a use of `sharedos.execution` / the agent's
    /// address path / `invoke`, owner = `context.owner`.
    async fn admit(
        &self,
        context: &AccessContext,
        agent: &Address,
    ) -> Result<Admission, KernelError>;

    /// The descriptive reach of the turn's authority (grants nothing).
    async fn reach(&self, context: &AccessContext) -> Result<ReachResult, KernelError>;

    /// Tools in enabled namespaces that pass non-consuming discovery, in
    /// the kernel's order, with the kernel's definitions.
    async fn list_tools(&self, context: &AccessContext)
    -> Result<Vec<ToolDefinition>, KernelError>;

    /// Finds the handler, validates arguments, re-authorizes the exact
    /// resource and action, audits, runs. `abort` is the turn's hard
    /// signal, the only one a handler is given.
    async fn invoke_tool(
        &self,
        context: &AccessContext,
        call: &ToolCall,
        abort: CancellationToken,
    ) -> Result<ToolResult, KernelError>;

    /// [`KernelTurn::invoke_tool`] as a future that owns the turn, the
    /// context and the call, so the caller can hand it to a task of its own
    /// if it stops waiting. The default wraps `invoke_tool` (its future in
    /// a second box); a kernel overrides it to make the whole call one
    /// allocation.
    fn invoke_tool_owned(
        self: Arc<Self>,
        context: Arc<AccessContext>,
        call: ToolCall,
        abort: CancellationToken,
    ) -> OwnedInvoke {
        Box::pin(async move { self.invoke_tool(&context, &call, abort).await })
    }

    /// Waits until the records of the turn's opening are durable (see
    /// [`TurnKernel::open_admitted`]): `Ok` at once for a kernel that
    /// writes each as it goes (the default).
    async fn opened(&self) -> Result<(), KernelError> {
        Ok(())
    }

    /// Records an escalation (`escalation.requested`); grants nothing.
    async fn record_escalation(
        &self,
        context: &AccessContext,
        execution_id: &Identifier,
        reason: &Reason,
    ) -> Result<Escalation, KernelError>;

    /// Records a call the envelope refused (`tool.invoked`, source
    /// `envelope`).
    async fn record_refused_call(
        &self,
        context: &AccessContext,
        refused: RefusedCall,
    ) -> Result<(), KernelError>;

    /// An effect outside the tool catalogue (the egress gateway's requests
    /// and connections), authorized against the turn's grants and audited
    /// before the effect (`effect.authorized`); consumes a use of a bounded
    /// grant when allowed. A kernel without effects keeps this default,
    /// which refuses (fail closed).
    async fn authorize_effect(
        &self,
        context: &AccessContext,
        namespace: &str,
        path: &[String],
        action: &str,
    ) -> Result<EffectDecision, KernelError> {
        let _ = (context, namespace, path, action);
        Ok(EffectDecision::Denied {
            reason_code: "effects_unsupported".into(),
        })
    }

    /// Records what an effect did (`effect.completed`; `metadata` holds no
    /// payload and no secret).
    async fn record_effect_outcome(
        &self,
        context: &AccessContext,
        namespace: &str,
        path: &[String],
        action: &str,
        succeeded: bool,
        metadata: sharedos_protocol::JsonObject,
    ) {
        let _ = (context, namespace, path, action, succeeded, metadata);
    }
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
