//! The standard loop through the real executor (envelope.md D, G 39, 51,
//! 52, 56–59): a scripted driver seated with `create_standard_runtime`,
//! against the scripted test kernel, on tokio's paused clock.

mod support;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::{Value, json};
use sharedos_host::executor::Seat;
use sharedos_plugin_sdk::{
    AgentTurnDecision, AgentTurnDriver, AgentTurnInput, AgentTurnSession, DriverError,
    SessionOutcome, Signal, StandardRuntimeOptions, create_standard_runtime,
};
use sharedos_protocol::{
    ExecutionStatus, ProtocolError, Reason, RuntimeManifest, RuntimeTurnRequest, ToolStatus,
};
use support::*;

const HASH: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// One answer of the scripted session's `next`.
enum Next {
    Decide(AgentTurnDecision),
    /// Waits until this virtual time (ms since the turn began), then decides.
    At(u64, AgentTurnDecision),
    Error(DriverError),
    /// Never answers.
    Hang,
}

#[derive(Default)]
struct DriverLog {
    inputs: Mutex<Vec<AgentTurnInput>>,
    closed: Mutex<Vec<SessionOutcome>>,
}

impl DriverLog {
    fn inputs(&self) -> Vec<AgentTurnInput> {
        lock(&self.inputs).clone()
    }
    fn closed(&self) -> Vec<SessionOutcome> {
        lock(&self.closed).clone()
    }
    fn input_kinds(&self) -> Vec<String> {
        self.inputs()
            .iter()
            .map(|i| match i {
                AgentTurnInput::Start => "start".to_owned(),
                AgentTurnInput::ToolResult(r) => r.status().as_str().to_owned(),
            })
            .collect()
    }
}

struct ScriptDriver {
    manifest: Option<RuntimeManifest>,
    /// `open` answers at this virtual time; `u64::MAX` never.
    open_at: u64,
    close_hangs: bool,
    script: Mutex<Option<VecDeque<Next>>>,
    log: Arc<DriverLog>,
    base: tokio::time::Instant,
}

impl ScriptDriver {
    fn new(script: Vec<Next>) -> Self {
        Self {
            manifest: None,
            open_at: 0,
            close_hangs: false,
            script: Mutex::new(Some(script.into())),
            log: Arc::new(DriverLog::default()),
            base: tokio::time::Instant::now(),
        }
    }
}

struct ScriptSession {
    script: VecDeque<Next>,
    close_hangs: bool,
    log: Arc<DriverLog>,
    base: tokio::time::Instant,
}

#[async_trait]
impl AgentTurnSession for ScriptSession {
    fn prompt_hash(&self) -> Option<String> {
        Some(HASH.to_owned())
    }
    async fn next(
        &mut self,
        input: AgentTurnInput,
        _signal: Signal,
    ) -> Result<AgentTurnDecision, DriverError> {
        lock(&self.log.inputs).push(input);
        match self.script.pop_front() {
            Some(Next::Decide(d)) => Ok(d),
            Some(Next::At(t, d)) => {
                tokio::time::sleep_until(self.base + ms(t)).await;
                Ok(d)
            }
            Some(Next::Error(e)) => Err(e),
            Some(Next::Hang) | None => std::future::pending().await,
        }
    }
    async fn close(&mut self, outcome: SessionOutcome) {
        lock(&self.log.closed).push(outcome);
        if self.close_hangs {
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait]
impl AgentTurnDriver for ScriptDriver {
    fn manifest(&self) -> Option<RuntimeManifest> {
        self.manifest.clone()
    }
    async fn open(
        &self,
        _request: &RuntimeTurnRequest,
        _signal: Signal,
    ) -> Result<Box<dyn AgentTurnSession>, DriverError> {
        if self.open_at == u64::MAX {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep_until(self.base + ms(self.open_at)).await;
        Ok(Box::new(ScriptSession {
            script: lock(&self.script).take().unwrap_or_default(),
            close_hangs: self.close_hangs,
            log: self.log.clone(),
            base: self.base,
        }))
    }
}

type LoopErrors = Arc<Mutex<Vec<String>>>;

/// Seats the driver in the standard loop behind the executor.
fn seat(
    kernel: &Arc<TestKernel>,
    driver: ScriptDriver,
    grace_ms: u64,
) -> (Harness, Arc<DriverLog>, LoopErrors) {
    let log = driver.log.clone();
    let errors: LoopErrors = Arc::default();
    let sink = errors.clone();
    let mut o = StandardRuntimeOptions::new(Arc::new(driver));
    o.on_turn_error = Some(Arc::new(move |e: &DriverError, _: &str, _: &str| {
        lock(&sink).push(e.to_string())
    }));
    let plugin = create_standard_runtime(o);
    let (opts, turn_errors) = options(grace_ms);
    let executor =
        sharedos_host::executor::Executor::new(kernel.clone(), Seat::in_process(plugin), opts)
            .expect("executor");
    (
        Harness {
            executor,
            turn_errors,
        },
        log,
        errors,
    )
}

fn tool_call(id: &'static str, tool: &'static str, step: Option<u64>) -> AgentTurnDecision {
    AgentTurnDecision::ToolCall {
        call: call(id, tool),
        step,
    }
}

fn complete(v: Value) -> AgentTurnDecision {
    AgentTurnDecision::Complete {
        output: v,
        metadata: None,
    }
}

fn retryable(r: &sharedos_protocol::ExecutionResult) -> Option<bool> {
    r.error.as_ref().and_then(|e| e.retryable)
}

fn with_options(tools: &[&str], o: Value) -> sharedos_protocol::ExecutionRequest {
    request_with(tools, |v| v["options"] = o)
}

// ----------------------------------------------------------------- tests

#[tokio::test(start_paused = true)]
async fn the_result_names_the_seated_driver_or_sharedos_standard() {
    let kernel = TestKernel::new(vec![]);
    let mut driver = ScriptDriver::new(vec![Next::Decide(complete(json!(1)))]);
    driver.manifest = Some(RuntimeManifest::new("acme.driver", "2.1.0").unwrap());
    let (h, _, _) = seat(&kernel, driver, 0);
    let r = h.run(request(&[])).await;
    assert_eq!(r.status, ExecutionStatus::Succeeded);
    assert_eq!(
        r.metadata["runtime"],
        json!({"id": "acme.driver", "version": "2.1.0", "protocolVersion": "1"})
    );
    assert_eq!(
        events_of(&r, "turn.started")[0]["runtime"]["id"],
        "acme.driver"
    );

    let kernel = TestKernel::new(vec![]);
    let (h, _, _) = seat(
        &kernel,
        ScriptDriver::new(vec![Next::Decide(complete(json!(1)))]),
        0,
    );
    let r = h.run(request(&[])).await;
    assert_eq!(r.metadata["runtime"]["id"], "sharedos.standard");
    assert_eq!(
        r.metadata["runtime"]["metadata"]["executionModel"],
        "bounded-driver-loop"
    );
    assert_eq!(r.metadata["promptHash"], HASH);
}

#[tokio::test(start_paused = true)]
async fn g51_prompt_hash_is_on_the_cancelled_result_when_next_never_answers() {
    let kernel = TestKernel::new(vec![]);
    let (h, log, errors) = seat(&kernel, ScriptDriver::new(vec![Next::Hang]), 0);
    let (r, took) = timed(&h, with_options(&[], json!({"timeoutMs": 5}))).await;
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(code(&r), "turn_cancelled");
    assert_eq!(retryable(&r), Some(true));
    assert_eq!(took, 5);
    assert_eq!(r.metadata["promptHash"], HASH);
    assert_eq!(last_event(&r).0, "turn.cancelled");
    assert_eq!(log.closed(), vec![SessionOutcome::Cancelled]);
    assert!(lock(&errors).is_empty());
    assert!(
        h.turn_errors().is_empty(),
        "a cancellation is never reported"
    );
}

#[tokio::test(start_paused = true)]
async fn g51_no_prompt_hash_when_cancelled_inside_open() {
    let kernel = TestKernel::new(vec![]);
    let mut driver = ScriptDriver::new(vec![Next::Decide(complete(json!(1)))]);
    driver.open_at = u64::MAX;
    let (h, log, _) = seat(&kernel, driver, 0);
    let r = h.run(with_options(&[], json!({"timeoutMs": 5}))).await;
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert!(r.metadata.get("promptHash").is_none(), "{:?}", r.metadata);
    assert!(log.inputs().is_empty());
    assert!(log.closed().is_empty());
}

#[tokio::test(start_paused = true)]
async fn g52_escalate_on_a_granted_turn_states_escalation_asked() {
    let kernel = TestKernel::new(vec![escalate_tool()]);
    let driver = ScriptDriver::new(vec![Next::Decide(AgentTurnDecision::Escalate {
        reason: Reason::new("R: needs a human").unwrap(),
        metadata: None,
    })]);
    let (h, log, _) = seat(&kernel, driver, 0);
    let r = h.run(request(&["sharedos.escalate"])).await;
    assert_eq!(r.status, ExecutionStatus::Escalated);
    assert_eq!(
        r.metadata["escalationAsked"],
        json!({"tool": "sharedos.escalate", "reason": "R: needs a human"})
    );
    assert_eq!(r.escalation.as_ref().unwrap().reviewer, owner());
    assert_eq!(events_of(&r, "turn.escalated").len(), 1);
    assert_eq!(log.closed(), vec![SessionOutcome::Escalated]);
}

#[tokio::test(start_paused = true)]
async fn a_denied_result_is_handed_back_and_the_turn_continues() {
    let kernel = TestKernel::new(vec![read_tool("files.read")])
        .handler("files.read", Handler::Deny("no_matching_grant"));
    let driver = ScriptDriver::new(vec![
        Next::Decide(tool_call("c1", "files.read", None)),
        Next::Decide(tool_call("c2", "files.missing", None)),
        Next::Decide(complete(json!("carried on"))),
    ]);
    let (h, log, _) = seat(&kernel, driver, 0);
    let r = h.run(request(&["files.read"])).await;
    assert_eq!(r.status, ExecutionStatus::Succeeded);
    assert_eq!(r.output, Some(json!("carried on")));
    assert_eq!(log.input_kinds(), vec!["start", "denied", "denied"]);
    let codes: Vec<String> = log
        .inputs()
        .iter()
        .filter_map(|i| match i {
            AgentTurnInput::ToolResult(r) => r.error().map(|e| e.code.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(codes, vec!["no_matching_grant", "tool_unavailable"]);
    let steps: Vec<&Value> = events_of(&r, "tool.requested")
        .iter()
        .map(|d| &d["step"])
        .collect();
    assert_eq!(
        steps,
        vec![&json!(0), &json!(1)],
        "the loop declares its step"
    );
    assert_eq!(log.closed(), vec![SessionOutcome::Succeeded]);
}

#[tokio::test(start_paused = true)]
async fn the_loops_step_ceiling_ends_the_turn_failed_not_retryable() {
    let kernel = TestKernel::new(vec![read_tool("files.read")])
        .handler("files.read", Handler::Succeed(json!(1)));
    let driver = ScriptDriver::new(vec![
        Next::Decide(tool_call("c1", "files.read", None)),
        Next::Decide(tool_call("c2", "files.read", None)),
        Next::Decide(tool_call("c3", "files.read", None)),
    ]);
    let (h, log, _) = seat(&kernel, driver, 0);
    let r = h
        .run(with_options(
            &["files.read"],
            json!({"maxSteps": 2, "maxToolCalls": 8}),
        ))
        .await;
    assert_eq!(r.status, ExecutionStatus::Failed);
    assert_eq!(code(&r), "step_limit_exceeded");
    assert_eq!(retryable(&r), Some(false));
    assert_eq!(
        last_event(&r),
        (
            "turn.failed".to_owned(),
            json!({"code": "step_limit_exceeded", "source": "runtime"})
        )
    );
    assert_eq!(kernel.invoked(), vec!["c1", "c2"]);
    assert_eq!(log.closed(), vec![SessionOutcome::Failed]);
}

#[tokio::test(start_paused = true)]
async fn a_declared_step_behind_the_loop_is_invalid_driver_decision() {
    let kernel = TestKernel::new(vec![read_tool("files.read")])
        .handler("files.read", Handler::Succeed(json!(1)));
    let driver = ScriptDriver::new(vec![
        Next::Decide(tool_call("c1", "files.read", Some(0))),
        Next::Decide(tool_call("c2", "files.read", Some(0))),
    ]);
    let (h, _, _) = seat(&kernel, driver, 0);
    let r = h.run(request(&["files.read"])).await;
    assert_eq!(r.status, ExecutionStatus::Failed);
    assert_eq!(code(&r), "invalid_driver_decision");
    assert_eq!(retryable(&r), Some(false));
    assert_eq!(kernel.invoked(), vec!["c1"]);
}

#[tokio::test(start_paused = true)]
async fn an_invalid_decision_is_invalid_driver_decision() {
    let kernel = TestKernel::new(vec![]);
    let driver = ScriptDriver::new(vec![Next::Error(DriverError::InvalidDecision(
        "not a decision".into(),
    ))]);
    let (h, _, errors) = seat(&kernel, driver, 0);
    let r = h.run(request(&[])).await;
    assert_eq!(r.status, ExecutionStatus::Failed);
    assert_eq!(code(&r), "invalid_driver_decision");
    assert_eq!(retryable(&r), Some(false));
    assert!(lock(&errors).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_driver_error_is_driver_failed_retryable_then_lowered_after_a_write() {
    // After a read: retryable stays true.
    let kernel = TestKernel::new(vec![read_tool("files.read")])
        .handler("files.read", Handler::Succeed(json!(1)));
    let driver = ScriptDriver::new(vec![
        Next::Decide(tool_call("c1", "files.read", None)),
        Next::Error(DriverError::Failed("provider down".into())),
    ]);
    let (h, log, errors) = seat(&kernel, driver, 0);
    let r = h.run(request(&["files.read"])).await;
    assert_eq!(r.status, ExecutionStatus::Failed);
    assert_eq!(code(&r), "driver_failed");
    assert_eq!(retryable(&r), Some(true));
    assert_eq!(
        last_event(&r).1,
        json!({"code": "driver_failed", "source": "runtime"})
    );
    assert_eq!(*lock(&errors), vec!["provider down".to_owned()]);
    assert!(
        h.turn_errors().is_empty(),
        "the loop reports to its own hook"
    );
    assert_eq!(log.closed(), vec![SessionOutcome::Failed]);
    assert!(!serde_json::to_string(&r).unwrap().contains("provider down"));

    // After a write that succeeded: the envelope lowers it.
    let kernel = TestKernel::new(vec![write_tool("transfer_funds")]).handler(
        "transfer_funds",
        Handler::Transfer {
            work_ms: 0,
            honour_abort: true,
        },
    );
    let driver = ScriptDriver::new(vec![
        Next::Decide(tool_call("c1", "transfer_funds", None)),
        Next::Error(DriverError::Failed("provider down".into())),
    ]);
    let (h, _, _) = seat(&kernel, driver, 0);
    let r = h.run(request(&["transfer_funds"])).await;
    assert_eq!(code(&r), "driver_failed");
    assert_eq!(retryable(&r), Some(false));
}

#[tokio::test(start_paused = true)]
async fn a_fail_decision_is_the_runtimes_ending() {
    let kernel = TestKernel::new(vec![]);
    let driver = ScriptDriver::new(vec![Next::Decide(AgentTurnDecision::Fail {
        error: ProtocolError::new("model_refused", "The model refused.", Some(true)),
        metadata: Some(json!({"model": "m"}).as_object().unwrap().clone()),
    })]);
    let (h, log, _) = seat(&kernel, driver, 0);
    let r = h.run(request(&[])).await;
    assert_eq!(code(&r), "model_refused");
    assert_eq!(retryable(&r), Some(true));
    assert_eq!(r.metadata["model"], "m");
    assert_eq!(log.closed(), vec![SessionOutcome::Failed]);
}

// Drain (grace 5000, timeout 120000: draining from 115 s).

fn transfer_kernel(work_ms: u64) -> Arc<TestKernel> {
    TestKernel::new(vec![write_tool("transfer_funds")]).handler(
        "transfer_funds",
        Handler::Transfer {
            work_ms,
            honour_abort: true,
        },
    )
}

#[tokio::test(start_paused = true)]
async fn g58_a_session_opening_during_the_drain_is_never_asked() {
    let kernel = transfer_kernel(0);
    let mut driver = ScriptDriver::new(vec![Next::Decide(tool_call("c1", "transfer_funds", None))]);
    driver.open_at = 116_000;
    let (h, log, _) = seat(&kernel, driver, 5_000);
    let (r, took) = timed(&h, request(&["transfer_funds"])).await;
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(code(&r), "turn_cancelled");
    assert_eq!(retryable(&r), Some(true));
    assert_eq!(took, 116_000, "ends once nothing is in flight");
    assert!(log.inputs().is_empty(), "next is never called");
    assert_eq!(types(&r), vec!["turn.started", "turn.cancelled"]);
    assert_eq!(r.metadata["promptHash"], HASH);
    assert_eq!(log.closed(), vec![SessionOutcome::Cancelled]);
}

#[tokio::test(start_paused = true)]
async fn g59_a_complete_decided_during_the_drain_is_honoured() {
    let kernel = transfer_kernel(0);
    let driver = ScriptDriver::new(vec![Next::At(116_000, complete(json!({"answer": 42})))]);
    let (h, log, _) = seat(&kernel, driver, 5_000);
    let r = h.run(request(&["transfer_funds"])).await;
    assert_eq!(r.status, ExecutionStatus::Succeeded);
    assert_eq!(r.output, Some(json!({"answer": 42})));
    assert_eq!(log.closed(), vec![SessionOutcome::Succeeded]);
}

#[tokio::test(start_paused = true)]
async fn g56_a_tool_call_decided_during_the_drain_is_refused_and_the_turn_cancelled() {
    let kernel = transfer_kernel(0);
    let driver = ScriptDriver::new(vec![
        Next::At(116_000, tool_call("c1", "transfer_funds", None)),
        Next::Decide(complete(json!("never"))),
    ]);
    let (h, log, _) = seat(&kernel, driver, 5_000);
    let r = h.run(request(&["transfer_funds"])).await;
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(retryable(&r), Some(true));
    assert!(kernel.ledger().is_empty(), "no handler ran");
    assert!(kernel.invoked().is_empty());
    assert_eq!(log.input_kinds(), vec!["start"], "next called once");
    assert_eq!(
        events_of(&r, "tool.completed"),
        vec![
            &json!({"callId": "c1", "tool": "transfer_funds", "step": 0, "status": "denied", "code": "turn_draining"})
        ]
    );
    let refused = kernel.tool_invoked("c1");
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].outcome, "denied");
    assert_eq!(refused[0].reason.as_deref(), Some("turn_draining"));
    assert_eq!(refused[0].source, "envelope");
    assert_eq!(log.closed(), vec![SessionOutcome::Cancelled]);
}

#[tokio::test(start_paused = true)]
async fn g57_a_result_landing_during_the_drain_ends_the_loop_unseen() {
    // The call starts at 114 s and works 3 s: it lands at 117 s, during
    // the drain. maxSteps 1: cancelled, not step_limit_exceeded.
    let kernel = transfer_kernel(3_000);
    let driver = ScriptDriver::new(vec![
        Next::At(114_000, tool_call("c1", "transfer_funds", None)),
        Next::Decide(complete(json!("never"))),
    ]);
    let (h, log, _) = seat(&kernel, driver, 5_000);
    let (r, took) = timed(
        &h,
        with_options(&["transfer_funds"], json!({"maxSteps": 1})),
    )
    .await;
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(code(&r), "turn_cancelled");
    assert_eq!(retryable(&r), Some(false), "the write went through");
    assert_eq!(took, 117_000);
    assert_eq!(log.input_kinds(), vec!["start"], "the seat never sees it");
    assert_eq!(kernel.ledger(), vec!["debit:c1", "credit:c1"]);
    assert_eq!(
        events_of(&r, "tool.completed")[0]["status"],
        json!(ToolStatus::Succeeded.as_str())
    );
    assert_eq!(log.closed(), vec![SessionOutcome::Cancelled]);
}

#[tokio::test(start_paused = true)]
async fn g39_escalate_forwarded_as_a_tool_call_does_not_escalate() {
    let kernel = TestKernel::new(vec![escalate_tool()]).handler(
        "sharedos.escalate",
        Handler::Fail("escalation_not_terminated"),
    );
    let driver = ScriptDriver::new(vec![
        Next::Decide(tool_call("c1", "sharedos.escalate", None)),
        Next::Decide(complete(json!("done"))),
    ]);
    let (h, log, _) = seat(&kernel, driver, 0);
    let r = h.run(request(&["sharedos.escalate"])).await;
    assert_eq!(r.status, ExecutionStatus::Succeeded);
    assert_eq!(log.input_kinds(), vec!["start", "failed"]);
    match &log.inputs()[1] {
        AgentTurnInput::ToolResult(res) => {
            assert_eq!(
                res.error().unwrap().code.as_str(),
                "escalation_not_terminated"
            )
        }
        _ => unreachable!(),
    }
    assert!(events_of(&r, "turn.escalated").is_empty());
    assert_eq!(
        kernel.count(|c| matches!(c, KernelCall::Escalation { .. })),
        0
    );
    assert!(r.metadata.get("escalationAsked").is_none());
}

#[tokio::test(start_paused = true)]
async fn a_hanging_close_is_bounded_and_does_not_hang_the_turn() {
    // Completed: the turn waits at most the close timeout (1 s).
    let kernel = TestKernel::new(vec![]);
    let mut driver = ScriptDriver::new(vec![Next::Decide(complete(json!("done")))]);
    driver.close_hangs = true;
    let (h, log, _) = seat(&kernel, driver, 0);
    let (r, took) = timed(&h, request(&[])).await;
    assert_eq!(r.status, ExecutionStatus::Succeeded);
    assert_eq!(took, 1_000);
    assert_eq!(log.closed(), vec![SessionOutcome::Succeeded]);

    // Cancelled at the deadline: the turn ends at the deadline, whatever
    // close does.
    let kernel = TestKernel::new(vec![]);
    let mut driver = ScriptDriver::new(vec![Next::Hang]);
    driver.close_hangs = true;
    let (h, log, _) = seat(&kernel, driver, 0);
    let (r, took) = timed(&h, with_options(&[], json!({"timeoutMs": 50}))).await;
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(took, 50);
    assert_eq!(log.closed(), vec![SessionOutcome::Cancelled]);
}
