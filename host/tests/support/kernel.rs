//! The envelope tests' scripted kernel: `TestKernel` implements
//! `TurnKernel` and logs every port the envelope asks, with scripted tool
//! handlers, audit outages and hangs.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use async_trait::async_trait;
use serde_json::{Value, json};
use sharedos_kernel::{
    Admission, AuditEffect, KernelError, KernelTurn, RefusedCall, TurnEnd, TurnKernel,
};
use sharedos_protocol::{
    AccessContext, Address, Escalation, EscalationStatus, Identifier, ReachResult, Reason,
    ToolCall, ToolDefinition, ToolResult,
};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{lock, ms};

/// How a scripted tool handler behaves once its port is entered.
#[derive(Clone, Debug)]
pub enum Handler {
    Succeed(Value),
    Deny(&'static str),
    Fail(&'static str),
    /// `transfer_funds`: debit, work `work_ms`, then credit. When it honours
    /// the abort and is aborted mid-way, it stops: debit only.
    Transfer {
        work_ms: u64,
        honour_abort: bool,
    },
    /// Works `work_ms`, then succeeds with `{"ok": true}`.
    Slow {
        work_ms: u64,
        honour_abort: bool,
    },
    /// Answers with a result for another call id.
    WrongCallId,
    /// Waits for the abort and then rejects with an audit outage
    /// (effect "none"), as a stub kernel rejecting with `signal.reason`.
    OutageOnAbort,
}

/// One entry of the test kernel's audit trail.
#[derive(Clone, Debug, PartialEq)]
pub struct Audit {
    pub kind: &'static str,
    pub call_id: Option<String>,
    pub outcome: String,
    pub reason: Option<String>,
    pub source: &'static str,
    pub cause: Option<String>,
    pub at_ms: u64,
}

/// What the envelope asked the kernel, in order.
#[derive(Clone, Debug)]
pub enum KernelCall {
    Open,
    Admit,
    Reach,
    List,
    Invoke {
        call_id: String,
        tool: String,
        context: Box<AccessContext>,
        aborted_on_entry: bool,
    },
    Escalation {
        reason: String,
    },
    Refused(RefusedCall),
    TurnEnd(TurnEnd),
}

pub struct TestKernel {
    pub base: Instant,
    pub admission: Mutex<Admission>,
    pub open_error: Mutex<Option<KernelError>>,
    pub open_hangs: Mutex<bool>,
    pub reach: Mutex<ReachResult>,
    pub listing: Mutex<Vec<ToolDefinition>>,
    pub listing_error: Mutex<Option<KernelError>>,
    pub listing_hangs: Mutex<bool>,
    pub handlers: Mutex<HashMap<String, Handler>>,
    /// Call ids whose decision-path audit write fails.
    pub fail_decision: Mutex<HashSet<String>>,
    /// Call ids whose decision-path write is held until the gate is opened;
    /// then it fails. It does not honour the abort (the decision path is
    /// never time-bounded).
    pub hold_decision: Mutex<HashMap<String, Arc<Notify>>>,
    pub escalation_error: Mutex<Option<KernelError>>,
    pub turn_end_error: Mutex<bool>,
    pub refused_error: Mutex<bool>,
    pub log: Mutex<Vec<KernelCall>>,
    pub audit: Mutex<Vec<Audit>>,
    pub ledger: Mutex<Vec<String>>,
    pub leases: Mutex<Vec<Weak<TestTurn>>>,
    pub loads: AtomicUsize,
    me: Weak<TestKernel>,
}

impl TestKernel {
    pub fn new(listing: Vec<ToolDefinition>) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            me: me.clone(),
            base: Instant::now(),
            admission: Mutex::new(Admission::allowed()),
            open_error: Mutex::new(None),
            open_hangs: Mutex::new(false),
            reach: Mutex::new(ReachResult::Computed { reach: vec![] }),
            listing: Mutex::new(listing),
            listing_error: Mutex::new(None),
            listing_hangs: Mutex::new(false),
            handlers: Mutex::new(HashMap::new()),
            fail_decision: Mutex::new(HashSet::new()),
            hold_decision: Mutex::new(HashMap::new()),
            escalation_error: Mutex::new(None),
            turn_end_error: Mutex::new(false),
            refused_error: Mutex::new(false),
            log: Mutex::new(Vec::new()),
            audit: Mutex::new(Vec::new()),
            ledger: Mutex::new(Vec::new()),
            leases: Mutex::new(Vec::new()),
            loads: AtomicUsize::new(0),
        })
    }

    pub fn handler(self: &Arc<Self>, tool: &str, h: Handler) -> Arc<Self> {
        lock(&self.handlers).insert(tool.to_owned(), h);
        self.clone()
    }

    pub fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    fn audit_push(
        &self,
        kind: &'static str,
        call_id: Option<&str>,
        outcome: &str,
        reason: Option<&str>,
    ) {
        self.audit_full(kind, call_id, outcome, reason, "kernel", None);
    }

    fn audit_full(
        &self,
        kind: &'static str,
        call_id: Option<&str>,
        outcome: &str,
        reason: Option<&str>,
        source: &'static str,
        cause: Option<&str>,
    ) {
        let at_ms = self.now_ms();
        lock(&self.audit).push(Audit {
            kind,
            call_id: call_id.map(str::to_owned),
            outcome: outcome.to_owned(),
            reason: reason.map(str::to_owned),
            source,
            cause: cause.map(str::to_owned),
            at_ms,
        });
    }

    pub fn audit(&self) -> Vec<Audit> {
        lock(&self.audit).clone()
    }
    pub fn ledger(&self) -> Vec<String> {
        lock(&self.ledger).clone()
    }
    pub fn calls(&self) -> Vec<KernelCall> {
        lock(&self.log).clone()
    }
    pub fn invoked(&self) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                KernelCall::Invoke { call_id, .. } => Some(call_id),
                _ => None,
            })
            .collect()
    }
    pub fn count(&self, pred: impl Fn(&KernelCall) -> bool) -> usize {
        lock(&self.log).iter().filter(|c| pred(c)).count()
    }
    pub fn turn_ends(&self) -> Vec<TurnEnd> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                KernelCall::TurnEnd(e) => Some(e),
                _ => None,
            })
            .collect()
    }
    pub fn refused(&self) -> Vec<RefusedCall> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                KernelCall::Refused(r) => Some(r),
                _ => None,
            })
            .collect()
    }
    /// `tool.invoked` audit entries for a call id.
    pub fn tool_invoked(&self, call_id: &str) -> Vec<Audit> {
        self.audit()
            .into_iter()
            .filter(|a| a.kind == "tool.invoked" && a.call_id.as_deref() == Some(call_id))
            .collect()
    }
    /// Leases the kernel handed out that are still held by someone.
    pub fn live_leases(&self) -> usize {
        lock(&self.leases)
            .iter()
            .filter(|w| w.upgrade().is_some())
            .count()
    }

    fn outage(cause: &str) -> KernelError {
        KernelError::AuditUnavailable {
            effect: AuditEffect::None,
            cause: cause.to_owned(),
        }
    }

    async fn wait_or_abort(work_ms: u64, honour_abort: bool, abort: &CancellationToken) -> bool {
        if honour_abort {
            tokio::select! {
                _ = tokio::time::sleep(ms(work_ms)) => true,
                _ = abort.cancelled() => false,
            }
        } else {
            tokio::time::sleep(ms(work_ms)).await;
            true
        }
    }
}

/// A turn of the test kernel: each port is the kernel's, logged there.
pub struct TestTurn(Arc<TestKernel>);

#[async_trait]
impl KernelTurn for TestTurn {
    async fn admit(&self, _: &AccessContext, _: &Address) -> Result<Admission, KernelError> {
        self.0.admit().await
    }
    async fn reach(&self, _: &AccessContext) -> Result<ReachResult, KernelError> {
        self.0.reach().await
    }
    async fn list_tools(&self, _: &AccessContext) -> Result<Vec<ToolDefinition>, KernelError> {
        self.0.list_tools().await
    }
    async fn invoke_tool(
        &self,
        context: &AccessContext,
        call: &ToolCall,
        abort: CancellationToken,
    ) -> Result<ToolResult, KernelError> {
        self.0.invoke_tool(context, call, abort).await
    }
    async fn record_escalation(
        &self,
        context: &AccessContext,
        execution_id: &Identifier,
        reason: &Reason,
    ) -> Result<Escalation, KernelError> {
        self.0
            .record_escalation(context, execution_id, reason)
            .await
    }
    async fn record_refused_call(
        &self,
        _: &AccessContext,
        refused: RefusedCall,
    ) -> Result<(), KernelError> {
        self.0.record_refused_call(refused).await
    }
}

#[async_trait]
impl TurnKernel for TestKernel {
    async fn open_turn(&self, _: &AccessContext) -> Result<Arc<dyn KernelTurn>, KernelError> {
        self.open().await?;
        let kernel = self
            .me
            .upgrade()
            .ok_or_else(|| KernelError::Failed("the test kernel is gone".into()))?;
        let turn = Arc::new(TestTurn(kernel));
        lock(&self.leases).push(Arc::downgrade(&turn));
        Ok(turn)
    }

    async fn record_turn_end(&self, _: &AccessContext, end: TurnEnd) -> Result<(), KernelError> {
        self.end_turn(end).await
    }
}

impl TestKernel {
    async fn open(&self) -> Result<(), KernelError> {
        lock(&self.log).push(KernelCall::Open);
        self.loads.fetch_add(1, Ordering::SeqCst);
        if *lock(&self.open_hangs) {
            std::future::pending::<()>().await;
        }
        if let Some(e) = lock(&self.open_error).clone() {
            return Err(e);
        }
        Ok(())
    }

    async fn admit(&self) -> Result<Admission, KernelError> {
        lock(&self.log).push(KernelCall::Admit);
        Ok(lock(&self.admission).clone())
    }

    async fn reach(&self) -> Result<ReachResult, KernelError> {
        lock(&self.log).push(KernelCall::Reach);
        Ok(lock(&self.reach).clone())
    }

    async fn list_tools(&self) -> Result<Vec<ToolDefinition>, KernelError> {
        lock(&self.log).push(KernelCall::List);
        if *lock(&self.listing_hangs) {
            std::future::pending::<()>().await;
        }
        if let Some(e) = lock(&self.listing_error).clone() {
            self.audit_push(
                "tool.catalog.listed",
                None,
                "failed",
                Some("audit_unavailable"),
            );
            return Err(e);
        }
        Ok(lock(&self.listing).clone())
    }

    async fn invoke_tool(
        &self,
        context: &AccessContext,
        call: &ToolCall,
        abort: CancellationToken,
    ) -> Result<ToolResult, KernelError> {
        let id = call.id.to_string();
        lock(&self.log).push(KernelCall::Invoke {
            call_id: id.clone(),
            tool: call.tool.to_string(),
            context: Box::new(context.clone()),
            aborted_on_entry: abort.is_cancelled(),
        });
        if abort.is_cancelled() {
            return Err(KernelError::Aborted);
        }
        // The decision path: authorization.checked is written before anything runs.
        let gate = lock(&self.hold_decision).get(&id).cloned();
        if let Some(gate) = gate {
            gate.notified().await;
            return Err(Self::outage("sink down while holding the decision"));
        }
        if lock(&self.fail_decision).contains(&id) {
            return Err(Self::outage("audit sink is down"));
        }
        let Some(handler) = lock(&self.handlers).get(call.tool.as_str()).cloned() else {
            self.audit_push(
                "tool.invoked",
                Some(&id),
                "denied",
                Some("tool_unavailable"),
            );
            return Ok(ToolResult::denied(
                call,
                "tool_unavailable",
                "not registered",
                context.now.clone(),
            ));
        };
        self.audit_push("authorization.checked", Some(&id), "allowed", None);
        let at = context.now.clone();
        let result = match handler {
            Handler::Succeed(v) => ToolResult::succeeded(call, v, at),
            Handler::Deny(code) => ToolResult::denied(
                call,
                code,
                "The access context does not grant this tool capability",
                at,
            ),
            Handler::Fail(code) => ToolResult::failed(call, code, "the tool failed", at),
            Handler::WrongCallId => {
                let mut other = call.clone();
                other.id = Identifier::new("someone-else").unwrap();
                ToolResult::succeeded(&other, json!(1), at)
            }
            Handler::Transfer {
                work_ms,
                honour_abort,
            } => {
                lock(&self.ledger).push(format!("debit:{id}"));
                if !Self::wait_or_abort(work_ms, honour_abort, &abort).await {
                    self.audit_push(
                        "tool.invoked",
                        Some(&id),
                        "interrupted",
                        Some("operation_aborted"),
                    );
                    return Err(KernelError::Interrupted);
                }
                lock(&self.ledger).push(format!("credit:{id}"));
                ToolResult::succeeded(call, json!({"transferred": true}), at)
            }
            Handler::Slow {
                work_ms,
                honour_abort,
            } => {
                if !Self::wait_or_abort(work_ms, honour_abort, &abort).await {
                    self.audit_push(
                        "tool.invoked",
                        Some(&id),
                        "interrupted",
                        Some("operation_aborted"),
                    );
                    return Err(KernelError::Interrupted);
                }
                ToolResult::succeeded(call, json!({"ok": true}), at)
            }
            Handler::OutageOnAbort => {
                abort.cancelled().await;
                return Err(Self::outage("the turn's abort reason"));
            }
        };
        let reason = result.error().map(|e| e.code.to_string());
        self.audit_push(
            "tool.invoked",
            Some(&id),
            result.status().as_str(),
            reason.as_deref(),
        );
        Ok(result)
    }

    async fn record_escalation(
        &self,
        context: &AccessContext,
        _: &Identifier,
        reason: &Reason,
    ) -> Result<Escalation, KernelError> {
        lock(&self.log).push(KernelCall::Escalation {
            reason: reason.to_string(),
        });
        if let Some(e) = lock(&self.escalation_error).clone() {
            return Err(e);
        }
        self.audit_push(
            "escalation.requested",
            None,
            "escalated",
            Some("escalation_requested"),
        );
        Ok(Escalation {
            reason: reason.clone(),
            reviewer: context.owner.clone(),
            requested_at: context.now.clone(),
            requested_authority: None,
            status: EscalationStatus::Pending,
        })
    }

    async fn record_refused_call(&self, refused: RefusedCall) -> Result<(), KernelError> {
        lock(&self.log).push(KernelCall::Refused(refused.clone()));
        self.audit_full(
            "tool.invoked",
            Some(refused.call_id.as_str()),
            "denied",
            Some(&refused.reason_code),
            "envelope",
            refused.cause.as_deref(),
        );
        if *lock(&self.refused_error) {
            return Err(KernelError::Failed("refusal recorder down".into()));
        }
        Ok(())
    }

    async fn end_turn(&self, end: TurnEnd) -> Result<(), KernelError> {
        lock(&self.log).push(KernelCall::TurnEnd(end.clone()));
        let outcome = match end.status.as_str() {
            "cancelled" => "failed",
            s => s,
        };
        self.audit_push("turn.ended", None, outcome, end.reason_code.as_deref());
        if *lock(&self.turn_end_error) {
            return Err(KernelError::Failed("turn-end recorder down".into()));
        }
        Ok(())
    }
}
