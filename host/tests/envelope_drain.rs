//! envelope.md G 53–65: the drain grace and its two signals (B.5, B.6).
//!
//! Grace 5000 ms, timeout 120000 ms, and one write tool `transfer_funds`
//! that debits, works `work_ms` (honouring the abort), then credits.
//! G 56–59 drive the standard loop in the catalogue; here they are direct
//! plugins that do what the loop does (check `draining` before a decision
//! and after a result), since what is tested is the envelope's answer.

mod support;

use std::sync::Arc;

use futures_util::future::{Either, select, try_join};
use serde_json::json;
use sharedos_plugin_sdk::{RuntimeError, RuntimeHost};
use sharedos_protocol::{ExecutionStatus, RuntimeTurnOutcome, ToolStatus};
use support::*;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

const GRACE: u64 = 5_000;
const LIMIT: u64 = 120_000;

fn bank(work_ms: u64) -> Arc<TestKernel> {
    TestKernel::new(vec![write_tool("transfer_funds")]).handler(
        "transfer_funds",
        Handler::Transfer {
            work_ms,
            honour_abort: true,
        },
    )
}

fn req() -> sharedos_protocol::ExecutionRequest {
    request(&["transfer_funds"])
}

fn position(audit: &[Audit], pred: impl Fn(&Audit) -> bool) -> usize {
    audit.iter().position(pred).expect("audit entry")
}

#[tokio::test(start_paused = true)]
async fn g53_call_running_when_draining_starts_answers_and_the_turn_ends_early() {
    let kernel = bank(3_000);
    let (plugin, log) = ScriptPlugin::new(vec![
        Step::sleep(114_000),
        Step::call("c1", "transfer_funds"),
        Step::ThrowIfDraining,
    ]);
    let h = executor(&kernel, plugin, GRACE);
    let (r, took) = timed(&h, req()).await;
    assert_eq!(
        took, 117_000,
        "settles when the call answers, before the limit"
    );
    assert_eq!(kernel.ledger(), ["debit:c1", "credit:c1"]);
    assert_eq!(
        log.result("c1").unwrap().status(),
        ToolStatus::Succeeded,
        "the handler was never signalled"
    );
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(code(&r), "turn_cancelled");
    assert_eq!(r.retryable(), Some(false));
    assert_eq!(
        events_of(&r, "tool.completed"),
        [&json!({"callId": "c1", "tool": "transfer_funds", "status": "succeeded"})]
    );
    assert_eq!(last_event(&r).0, "turn.cancelled");
    let audit = kernel.audit();
    let invoked = position(&audit, |a| {
        a.kind == "tool.invoked" && a.outcome == "succeeded"
    });
    let ended = position(&audit, |a| a.kind == "turn.ended");
    assert!(invoked < ended);
    assert_eq!(audit[ended].reason.as_deref(), Some("turn_cancelled"));
    assert!(h.turn_errors().is_empty());
}

/// G53 with a seat that stops waiting: it gives up on its call the moment
/// draining fires and throws. The call is still with the kernel; the
/// envelope waits for it, and its late result is not lost: it is in the
/// turn's events as `tool.completed` (B.6).
#[tokio::test(start_paused = true)]
async fn g53_late_result_of_an_abandoned_call_is_in_the_events() {
    let kernel = bank(3_000);
    let plugin = FnPlugin(|_, host: Arc<dyn RuntimeHost>, _| async move {
        tokio::time::sleep(ms(114_000)).await;
        let draining = host.draining();
        let call = host.invoke_tool(call("c1", "transfer_funds"), Some(0));
        match select(Box::pin(call), Box::pin(draining.raised())).await {
            Either::Left(_) => Ok(RuntimeTurnOutcome::complete(json!("answered first"))),
            Either::Right(_) => Err(RuntimeError::Failed("draining".into())),
        }
    });
    let h = executor(&kernel, Arc::new(plugin), GRACE);
    let (r, took) = timed(&h, req()).await;
    assert_eq!(took, 117_000);
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(r.retryable(), Some(false));
    assert_eq!(kernel.ledger(), ["debit:c1", "credit:c1"]);
    assert_eq!(
        types(&r),
        [
            "turn.started",
            "tool.requested",
            "tool.completed",
            "turn.cancelled"
        ],
        "the late call's ending is recorded before the turn's"
    );
    assert_eq!(
        events_of(&r, "tool.completed"),
        [&json!({"callId": "c1", "tool": "transfer_funds", "step": 0, "status": "succeeded"})]
    );
}

#[tokio::test(start_paused = true)]
async fn g54_without_grace_the_deadline_interrupts_the_transfer() {
    let kernel = bank(3_000);
    let (plugin, _) = ScriptPlugin::new(vec![
        Step::sleep(118_000),
        Step::call("c1", "transfer_funds"),
    ]);
    let h = executor(&kernel, plugin, 0);
    let (r, took) = timed(&h, req()).await;
    assert_eq!(took, LIMIT);
    settle().await;
    assert_eq!(kernel.ledger(), ["debit:c1"]);
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(r.retryable(), Some(false));
    let invoked = kernel.tool_invoked("c1");
    assert_eq!(invoked.len(), 1);
    assert_eq!(
        (invoked[0].outcome.as_str(), invoked[0].reason.as_deref()),
        ("interrupted", Some("operation_aborted"))
    );
    assert!(events_of(&r, "tool.completed").is_empty());
}

#[tokio::test(start_paused = true)]
async fn g55_long_call_is_interrupted_at_the_limit_not_before() {
    let kernel = bank(60_000);
    let (plugin, _) = ScriptPlugin::new(vec![
        Step::sleep(100_000),
        Step::call("c1", "transfer_funds"),
    ]);
    let h = executor(&kernel, plugin, GRACE);
    let (r, took) = timed(&h, req()).await;
    assert_eq!(
        took, LIMIT,
        "the grace is inside the limit; the turn ends at it"
    );
    settle().await;
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(r.retryable(), Some(false));
    assert_eq!(kernel.ledger(), ["debit:c1"]);
    let invoked = kernel.tool_invoked("c1");
    assert_eq!(invoked.len(), 1);
    assert_eq!(invoked[0].outcome, "interrupted");
    assert!(
        invoked[0].at_ms >= LIMIT,
        "no tool.invoked before 120 s (at {})",
        invoked[0].at_ms
    );
}

#[tokio::test(start_paused = true)]
async fn g56_call_asked_for_while_draining_is_refused() {
    let kernel = bank(3_000);
    let (plugin, log) = ScriptPlugin::new(vec![
        Step::sleep(116_000),
        Step::try_call("c1", "transfer_funds"),
        Step::ThrowIfDraining,
    ]);
    let h = executor(&kernel, plugin, GRACE);
    let (r, took) = timed(&h, req()).await;
    assert_eq!(took, 116_000);
    assert_eq!(log.code("c1").as_deref(), Some("turn_draining"));
    assert!(kernel.invoked().is_empty(), "no handler ran");
    assert!(kernel.ledger().is_empty());
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(r.retryable(), Some(true));
    let invoked = kernel.tool_invoked("c1");
    assert_eq!(invoked.len(), 1);
    assert_eq!(
        (
            invoked[0].outcome.as_str(),
            invoked[0].reason.as_deref(),
            invoked[0].source
        ),
        ("denied", Some("turn_draining"), "envelope")
    );
}

#[tokio::test(start_paused = true)]
async fn g57_result_landing_in_the_drain_on_the_last_step_is_cancelled() {
    let kernel = bank(3_000);
    let (plugin, _) = ScriptPlugin::new(vec![
        Step::sleep(114_000),
        Step::call_at("c1", "transfer_funds", 0),
        Step::ThrowIfDraining,
    ]);
    let h = executor(&kernel, plugin, GRACE);
    let r = h
        .run(request_with(&["transfer_funds"], |v| {
            v["options"] = json!({"maxSteps": 1})
        }))
        .await;
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(code(&r), "turn_cancelled");
    assert_eq!(r.retryable(), Some(false));
}

#[tokio::test(start_paused = true)]
async fn g58_seat_ready_only_after_draining_asks_nothing() {
    let kernel = bank(3_000);
    let (plugin, log) = ScriptPlugin::new(vec![
        Step::sleep(116_000),
        Step::ThrowIfDraining,
        Step::call("c1", "transfer_funds"),
    ]);
    let h = executor(&kernel, plugin, GRACE);
    let (r, took) = timed(&h, req()).await;
    assert_eq!(took, 116_000);
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(r.retryable(), Some(true));
    assert!(lock(&log.results).is_empty());
}

#[tokio::test(start_paused = true)]
async fn g59_decision_landing_in_the_drain_that_ends_the_turn_is_honoured() {
    let kernel = bank(3_000);
    let (plugin, _) = ScriptPlugin::new(vec![
        Step::sleep(116_000),
        Step::returns(RuntimeTurnOutcome::complete(json!({"answer": 42}))),
    ]);
    let h = executor(&kernel, plugin, GRACE);
    let r = h.run(req()).await;
    assert_eq!(r.status, ExecutionStatus::Succeeded);
    assert_eq!(r.output, Some(json!({"answer": 42})));
}

#[tokio::test(start_paused = true)]
async fn g60_host_cancel_does_not_drain() {
    let kernel = bank(10_000);
    let (plugin, _) = ScriptPlugin::new(vec![Step::call("c1", "transfer_funds")]);
    let h = executor(&kernel, plugin, GRACE);
    let cancel = CancellationToken::new();
    let run = h.executor.execute(
        req(),
        sharedos_host::executor::ExecuteOptions {
            cancel: Some(cancel.clone()),
            on_event: None,
        },
    );
    let started = tokio::time::Instant::now();
    let stop = async {
        tokio::time::sleep(ms(2_000)).await;
        cancel.cancel();
    };
    let (r, ()) = tokio::join!(run, stop);
    let r = r.unwrap();
    assert_eq!(
        started.elapsed(),
        ms(2_000),
        "settles with no clock advance after the cancel"
    );
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(r.retryable(), Some(false));
    settle().await;
    assert_eq!(kernel.ledger(), ["debit:c1"]);
    assert_eq!(kernel.tool_invoked("c1")[0].outcome, "interrupted");
}

#[tokio::test(start_paused = true)]
async fn g61_outage_on_one_call_lets_the_running_call_finish() {
    let kernel = bank(3_000);
    lock(&kernel.fail_decision).insert("c2".into());
    // The seat runs both calls and stops at the first rejection, dropping
    // its wait on call-1.
    let plugin = FnPlugin(|_, host: Arc<dyn RuntimeHost>, _| async move {
        let c1 = host.invoke_tool(call("c1", "transfer_funds"), None);
        let c2 = async {
            tokio::time::sleep(ms(1_000)).await;
            host.invoke_tool(call("c2", "transfer_funds"), None).await
        };
        try_join(c1, c2)
            .await
            .map_err(|e| RuntimeError::Failed(e.to_string()))?;
        Ok(RuntimeTurnOutcome::complete(json!("unreachable")))
    });
    let h = executor(&kernel, Arc::new(plugin), GRACE);
    let (r, took) = timed(&h, req()).await;
    assert_eq!(took, 3_000);
    assert_eq!(kernel.ledger(), ["debit:c1", "credit:c1"]);
    assert_eq!(r.status, ExecutionStatus::Failed);
    assert_eq!(code(&r), "audit_unavailable");
    assert_eq!(r.retryable(), Some(false));
    assert_eq!(
        events_of(&r, "tool.completed"),
        [&json!({"callId": "c1", "tool": "transfer_funds", "status": "succeeded"})],
        "exactly one tool.completed, for call-1"
    );
    assert_eq!(
        last_event(&r),
        (
            "turn.failed".into(),
            json!({"code": "audit_unavailable", "source": "envelope"})
        )
    );
}

/// G61 with a seat that awaits both calls and reports the rejection.
#[tokio::test(start_paused = true)]
async fn g61_outage_with_a_seat_that_awaits_both_calls() {
    let kernel = bank(3_000);
    lock(&kernel.fail_decision).insert("c2".into());
    let plugin = FnPlugin(|_, host: Arc<dyn RuntimeHost>, _| async move {
        let c1 = host.invoke_tool(call("c1", "transfer_funds"), None);
        let c2 = host.invoke_tool(call("c2", "transfer_funds"), None);
        let (r1, r2) = futures_util::future::join(c1, c2).await;
        assert!(r1.is_ok());
        assert_eq!(
            r2.unwrap_err().kind,
            sharedos_protocol::ErrorKind::AuditUnavailable
        );
        Ok(RuntimeTurnOutcome::complete(json!("swallowed")))
    });
    let h = executor(&kernel, Arc::new(plugin), GRACE);
    let r = h.run(req()).await;
    assert_eq!(code(&r), "audit_unavailable");
    assert_eq!(r.retryable(), Some(false));
    assert_eq!(events_of(&r, "tool.completed").len(), 1);
    assert_eq!(kernel.ledger(), ["debit:c1", "credit:c1"]);
}

fn held(kernel: &Arc<TestKernel>, id: &str) -> Arc<Notify> {
    let gate = Arc::new(Notify::new());
    lock(&kernel.hold_decision).insert(id.into(), gate.clone());
    gate
}

#[tokio::test(start_paused = true)]
async fn g62_late_outage_after_a_completed_turn_changes_nothing() {
    let kernel = bank(3_000);
    let gate = held(&kernel, "c1");
    let plugin = FnPlugin(|_, host: Arc<dyn RuntimeHost>, _| async move {
        let c1 = host.invoke_tool(call("c1", "transfer_funds"), None);
        let _ = select(Box::pin(c1), Box::pin(tokio::time::sleep(ms(10)))).await;
        Ok(RuntimeTurnOutcome::complete(json!("done")))
    });
    let h = executor(&kernel, Arc::new(plugin), GRACE);
    let r = h.run(req()).await;
    assert_eq!(r.status, ExecutionStatus::Succeeded);
    gate.notify_one();
    settle().await;
    assert_eq!(kernel.turn_ends().len(), 1);
    assert_eq!(kernel.turn_ends()[0].status, ExecutionStatus::Succeeded);
    assert!(kernel.ledger().is_empty());
    assert_eq!(alive_tasks(), 0, "no timer was armed by the late outage");
}

#[tokio::test(start_paused = true)]
async fn g63_call_held_at_the_deadline_makes_the_turn_not_retryable() {
    let kernel = bank(3_000);
    let gate = held(&kernel, "c1");
    let (plugin, _) = ScriptPlugin::new(vec![Step::call("c1", "transfer_funds")]);
    let h = executor(&kernel, plugin, GRACE);
    let (r, took) = timed(&h, req()).await;
    assert_eq!(took, LIMIT);
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(
        r.retryable(),
        Some(false),
        "the call was still with the kernel"
    );
    gate.notify_one();
    settle().await;
    assert_eq!(kernel.turn_ends().len(), 1);
    assert_eq!(alive_tasks(), 0);
}

#[tokio::test(start_paused = true)]
async fn g64_no_timer_outlives_a_turn() {
    // A complete inside the limit.
    let kernel = bank(0);
    let (plugin, _) = ScriptPlugin::new(vec![Step::sleep(10)]);
    let h = executor(&kernel, plugin, GRACE);
    h.run(req()).await;
    settle().await;
    assert_eq!(alive_tasks(), 0);

    // An audit-outage ending with a grace (the outage arms a hard timer).
    let kernel = bank(0);
    lock(&kernel.fail_decision).insert("c1".into());
    let (plugin, _) = ScriptPlugin::new(vec![Step::call("c1", "transfer_funds")]);
    let h = executor(&kernel, plugin, GRACE);
    let r = h.run(req()).await;
    assert_eq!(code(&r), "audit_unavailable");
    settle().await;
    assert_eq!(alive_tasks(), 0);

    // A cancelled ending.
    let kernel = bank(0);
    let (plugin, _) = ScriptPlugin::new(vec![Step::Stall]);
    let h = executor(&kernel, plugin, GRACE);
    h.run(req()).await;
    settle().await;
    assert_eq!(alive_tasks(), 0);
}

/// Nearest equivalent of G65: −1, 1.5 and NaN are not `u64`s; the bound
/// that is left is the upper one.
#[tokio::test(start_paused = true)]
async fn g65_drain_grace_out_of_range_is_refused() {
    let kernel = TestKernel::new(vec![]);
    let (plugin, _) = ScriptPlugin::new(vec![]);
    let (mut opts, _) = options(0);
    opts.drain_grace_ms = 600_001;
    let err = sharedos_host::executor::Executor::new(
        kernel.clone(),
        sharedos_host::executor::Seat::in_process(plugin.clone()),
        opts,
    )
    .err()
    .expect("refused");
    assert!(
        err.0.starts_with("drainGraceMs must be between 0 and"),
        "{}",
        err.0
    );
    let (mut opts, _) = options(0);
    opts.drain_grace_ms = 600_000;
    assert!(
        sharedos_host::executor::Executor::new(
            kernel,
            sharedos_host::executor::Seat::in_process(plugin),
            opts
        )
        .is_ok()
    );
}

/// A seat that ignores `draining` is refused the same calls and stopped at
/// the same deadline.
#[tokio::test(start_paused = true)]
async fn seat_ignoring_draining_is_stopped_at_the_deadline() {
    let kernel = bank(0);
    let (plugin, log) = ScriptPlugin::new(vec![
        Step::sleep(116_000),
        Step::try_call("c1", "transfer_funds"),
        Step::Stall,
    ]);
    let h = executor(&kernel, plugin, GRACE);
    let (r, took) = timed(&h, req()).await;
    assert_eq!(took, LIMIT);
    assert_eq!(log.code("c1").as_deref(), Some("turn_draining"));
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(r.retryable(), Some(true));
    assert!(lock(&log.abort).as_ref().unwrap().is_raised());
}

/// While draining, `emit` and `annotate` still work; after the hard abort
/// `emit` is refused and `annotate` is still kept while the turn is open.
#[tokio::test(start_paused = true)]
async fn emit_works_while_draining_and_not_after_the_abort() {
    let kernel = bank(0);
    let plugin = FnPlugin(
        |_, host: Arc<dyn RuntimeHost>, abort: sharedos_plugin_sdk::Signal| async move {
            host.draining().raised().await;
            host.emit(sharedos_protocol::RuntimeEvent {
                kind: sharedos_protocol::ident("draining.seen"),
                data: json!(1),
            })
            .unwrap();
            host.annotate("drained", json!(true)).unwrap();
            abort.raised().await;
            let refused = host
                .emit(sharedos_protocol::RuntimeEvent {
                    kind: sharedos_protocol::ident("late"),
                    data: json!(2),
                })
                .unwrap_err();
            host.annotate("emitAfterAbort", json!(refused.message))
                .unwrap();
            Err(RuntimeError::Failed("stopped".into()))
        },
    );
    let h = executor(&kernel, Arc::new(plugin), GRACE);
    let (r, took) = timed(&h, req()).await;
    assert_eq!(took, LIMIT);
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(
        types(&r),
        ["turn.started", "runtime.event", "turn.cancelled"]
    );
    assert_eq!(
        r.events[1].occurred_at.to_offset() - r.events[0].occurred_at.to_offset(),
        time::Duration::milliseconds(115_000)
    );
    assert_eq!(r.metadata.get("drained"), Some(&json!(true)));
    assert_eq!(
        r.metadata.get("emitAfterAbort"),
        Some(&json!("Runtime host is closed"))
    );
}

/// `limits` carry the drain point: the grace and when the drain starts, so
/// a plugin can plan its work instead of finding out by refusals; a turn
/// without a grace says nothing of a drain.
#[tokio::test(start_paused = true)]
async fn the_limits_carry_the_drain_point() {
    for (grace, expected) in [
        (
            GRACE,
            json!({"drainGraceMs": GRACE, "drainAtMs": LIMIT - GRACE}),
        ),
        (0, json!({})),
    ] {
        let kernel = bank(0);
        let plugin = FnPlugin(|_req, host: Arc<dyn RuntimeHost>, _abort| async move {
            Ok(RuntimeTurnOutcome::complete(
                serde_json::to_value(host.limits()).unwrap(),
            ))
        });
        let (opts, errs) = options(grace);
        let h = executor_with(&kernel, Arc::new(plugin), opts, errs);
        let r = h.run(req()).await;
        let limits = r.output.clone().unwrap();
        assert_eq!(limits["timeoutMs"], json!(LIMIT), "{limits}");
        for key in ["drainGraceMs", "drainAtMs"] {
            assert_eq!(
                limits.get(key),
                expected.get(key),
                "grace {grace}: {limits}"
            );
        }
    }
}
