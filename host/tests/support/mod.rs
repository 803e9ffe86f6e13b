//! Test doubles for the envelope: a scripted kernel implementing
//! `TurnKernel`; the plugin is the shared scriptable test plugin
//! (`sharedos_testplugin::ScriptPlugin`), or a closure where a script
//! cannot say it.
//!
//! Every test runs on tokio's paused clock; times below are virtual
//! milliseconds since the kernel was built (which is the turn's start in
//! every test).

#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use sharedos_host::executor::{
    ExecuteOptions, Executor, ExecutorOptions, Seat, TurnError, TurnIds,
};
use sharedos_kernel::{
    Admission, AuditEffect, KernelError, KernelTurn, RefusedCall, TurnEnd, TurnKernel,
};
use sharedos_plugin_sdk::{RuntimeError, RuntimeHost, RuntimePlugin, Signal};
use sharedos_protocol::{
    AccessContext, Address, Escalation, EscalationStatus, ExecutionRequest, ExecutionResult,
    Identifier, ReachResult, Reason, RuntimeManifest, RuntimeTurnOutcome, RuntimeTurnRequest,
    Timestamp, ToolCall, ToolDefinition, ToolResult,
};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------- fixtures

pub const EXEC_ID: &str = "exec-1";
pub const TRACE: &str = "trace-1";
pub const AGENT: &str = "agent-alice";
pub const BASE_TIME: &str = "2026-09-18T10:00:00Z";

pub fn tool_def(name: &str, namespace: &str, rw: &str, idempotent: Option<bool>) -> ToolDefinition {
    let mut v = json!({
        "name": name,
        "description": format!("kernel description of {name}"),
        "namespace": namespace,
        "source": "test-kernel",
        "readWrite": rw,
        "inputSchema": {"type": "object"},
        "requiredCapability": {"resource": {"namespace": namespace, "path": ["p"]}, "action": if rw == "read" { "read" } else { "write" }},
    });
    if let Some(i) = idempotent {
        v["annotations"] = json!({"idempotent": i});
    }
    serde_json::from_value(v).expect("tool definition")
}

pub fn read_tool(name: &str) -> ToolDefinition {
    tool_def(name, "files", "read", None)
}
pub fn write_tool(name: &str) -> ToolDefinition {
    tool_def(name, "bank", "write", None)
}
pub fn idempotent_write(name: &str) -> ToolDefinition {
    tool_def(name, "bank", "write", Some(true))
}
pub fn escalate_tool() -> ToolDefinition {
    tool_def("sharedos.escalate", "sharedos", "write", None)
}

/// A valid request as JSON; `tools` names the given tools with a caller's
/// own (different) description.
pub fn request_json(tools: &[&str]) -> Value {
    let tools: Vec<Value> = tools
        .iter()
        .map(|n| {
            let mut v = serde_json::to_value(read_tool(n)).unwrap();
            v["description"] = json!("caller-supplied description");
            v
        })
        .collect();
    json!({
        "version": "1",
        "executionId": EXEC_ID,
        "agent": {"kind": "agent", "agentId": AGENT},
        "context": {
            "namespaceId": "ns-1",
            "actor": {"kind": "agent", "agentId": AGENT},
            "authority": {"kind": "human", "userId": "issuer"},
            "owner": {"kind": "human", "userId": "owner-1"},
            "purpose": "help the owner",
            "traceId": TRACE,
            "enabledToolNamespaces": ["files", "bank", "sharedos"],
            "now": BASE_TIME
        },
        "message": {
            "version": "1",
            "id": "msg-1",
            "sender": {"kind": "human", "userId": "someone"},
            "receiver": {"kind": "agent", "agentId": AGENT},
            "purpose": "help the owner",
            "payload": {"text": "hello"},
            "traceId": TRACE,
            "createdAt": BASE_TIME
        },
        "tools": tools
    })
}

pub fn request(tools: &[&str]) -> ExecutionRequest {
    serde_json::from_value(request_json(tools)).expect("request")
}

pub fn request_with(tools: &[&str], f: impl FnOnce(&mut Value)) -> ExecutionRequest {
    let mut v = request_json(tools);
    f(&mut v);
    serde_json::from_value(v).expect("request")
}

pub fn owner() -> Address {
    Address::human("owner-1").unwrap()
}

pub fn call(id: &str, tool: &str) -> ToolCall {
    ToolCall {
        id: Identifier::new(id).unwrap(),
        tool: Identifier::new(tool).unwrap(),
        arguments: Default::default(),
        trace_id: Identifier::new(TRACE).unwrap(),
        requested_at: Timestamp::parse(BASE_TIME).unwrap(),
    }
}

pub fn manifest() -> RuntimeManifest {
    sharedos_testplugin::manifest()
}

/// The provenance the envelope must write under `metadata.runtime`.
pub fn expected_runtime() -> Value {
    json!({"id": "sharedos-testplugin", "version": "0.1.0", "protocolVersion": "1", "metadata": {"package": "sharedos-testplugin"}})
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A clock that reads tokio's (paused) virtual time.
pub fn virtual_clock() -> sharedos_host::executor::Clock {
    let base = Instant::now();
    let t0 = Timestamp::parse(BASE_TIME).unwrap().to_offset();
    Arc::new(move || Timestamp::from_offset(t0 + base.elapsed()))
}

// ---------------------------------------------------------------- kernel

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

// ---------------------------------------------------------------- plugins

// The scripted plugin is the shared test plugin (plugins/testplugin): the
// same steps run from its binary over the protocol.
#[allow(unused_imports)] // each test file uses its part
pub use sharedos_testplugin::{PluginLog, ScriptPlugin, Step};

/// A plugin written as a closure, for shapes a script does not cover and
/// that only exist in process: concurrent calls from one turn, a call
/// future dropped half way, a host kept and used from another task, a
/// forged `ToolCall` (wrong trace, ids the script's constructors refuse).
pub struct FnPlugin<F>(pub F);

#[async_trait]
impl<F, Fut> RuntimePlugin for FnPlugin<F>
where
    F: Fn(RuntimeTurnRequest, Arc<dyn RuntimeHost>, Signal) -> Fut + Send + Sync,
    Fut: Future<Output = Result<RuntimeTurnOutcome, RuntimeError>> + Send + 'static,
{
    fn manifest(&self) -> RuntimeManifest {
        manifest()
    }
    async fn run(
        &self,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
    ) -> Result<RuntimeTurnOutcome, RuntimeError> {
        (self.0)(request, host, abort).await
    }
}

// ---------------------------------------------------------------- harness

/// What `on_turn_error` heard.
pub type TurnErrors = Arc<Mutex<Vec<(TurnError, TurnIds)>>>;

pub struct Harness {
    pub executor: Executor,
    pub turn_errors: TurnErrors,
}

pub fn options(grace_ms: u64) -> (ExecutorOptions, TurnErrors) {
    let errors: TurnErrors = Arc::new(Mutex::new(Vec::new()));
    let sink = errors.clone();
    let opts = ExecutorOptions {
        clock: virtual_clock(),
        drain_grace_ms: grace_ms,
        on_turn_error: Some(Arc::new(move |e: &TurnError, ids: &TurnIds| {
            lock(&sink).push((e.clone(), ids.clone()))
        })),
        ..ExecutorOptions::default()
    };
    (opts, errors)
}

pub fn executor(
    kernel: &Arc<TestKernel>,
    plugin: Arc<dyn RuntimePlugin>,
    grace_ms: u64,
) -> Harness {
    let (opts, turn_errors) = options(grace_ms);
    executor_with(kernel, plugin, opts, turn_errors)
}

pub fn executor_with(
    kernel: &Arc<TestKernel>,
    plugin: Arc<dyn RuntimePlugin>,
    opts: ExecutorOptions,
    turn_errors: TurnErrors,
) -> Harness {
    let executor = Executor::new(kernel.clone(), Seat::in_process(plugin), opts).expect("executor");
    Harness {
        executor,
        turn_errors,
    }
}

impl Harness {
    pub async fn run(&self, request: ExecutionRequest) -> ExecutionResult {
        self.executor
            .execute(request, ExecuteOptions::default())
            .await
            .expect("a result")
    }
    pub fn turn_errors(&self) -> Vec<(TurnError, TurnIds)> {
        lock(&self.turn_errors).clone()
    }
}

/// Runs a turn and returns the result with the virtual time it took.
pub async fn timed(h: &Harness, request: ExecutionRequest) -> (ExecutionResult, u64) {
    let start = Instant::now();
    let r = h.run(request).await;
    (r, start.elapsed().as_millis() as u64)
}

pub fn types(r: &ExecutionResult) -> Vec<String> {
    r.events.iter().map(|e| e.kind.to_string()).collect()
}

pub fn last_event(r: &ExecutionResult) -> (String, Value) {
    let e = r.events.last().expect("an event");
    (e.kind.to_string(), e.data.clone())
}

pub fn events_of<'a>(r: &'a ExecutionResult, kind: &str) -> Vec<&'a Value> {
    r.events
        .iter()
        .filter(|e| e.kind == kind)
        .map(|e| &e.data)
        .collect()
}

pub fn code(r: &ExecutionResult) -> &str {
    r.code().unwrap_or("")
}

/// Lets every spawned task that can run, run (no virtual time passes).
pub async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// The number of tasks still alive on the runtime (timers are tasks here).
pub fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}
