//! envelope.md G 30–39: the endings (B.9).

mod support;

use std::sync::Arc;

use serde_json::json;
use sharedos_host::executor::TurnError;
use sharedos_kernel::KernelError;
use sharedos_plugin_sdk::{RuntimeError, RuntimeHost};
use sharedos_protocol::{
    EscalationStatus, ExecutionStatus, ProtocolError, Reason, RuntimeTurnOutcome, Timestamp,
    ToolStatus,
};
use support::*;

fn md(v: serde_json::Value) -> Option<sharedos_protocol::JsonObject> {
    Some(v.as_object().unwrap().clone())
}

/// Nearest equivalent of G30: an in-process plugin cannot build
/// `complete` without an output, so the seat reports the outcome that did
/// not parse as `RuntimeError::InvalidOutcome` (what the process runtime
/// does for `{"type":"complete"}`).
#[tokio::test(start_paused = true)]
async fn g30_outcome_that_does_not_parse_is_invalid_runtime_outcome() {
    assert!(serde_json::from_value::<RuntimeTurnOutcome>(json!({"type": "complete"})).is_err());
    let kernel = TestKernel::new(vec![]);
    let plugin =
        FnPlugin(|_, _, _| async { Err(RuntimeError::InvalidOutcome("missing output".into())) });
    let h = executor(&kernel, Arc::new(plugin), 0);
    let r = h.run(request(&[])).await;
    assert_eq!(r.status, ExecutionStatus::Failed);
    assert_eq!(code(&r), "invalid_runtime_outcome");
    assert_eq!(r.retryable(), Some(false));
    assert_eq!(
        last_event(&r),
        (
            "turn.failed".into(),
            json!({"code": "invalid_runtime_outcome", "source": "envelope"})
        )
    );
    assert!(h.turn_errors().is_empty());
    assert_eq!(kernel.turn_ends()[0].ended_by.as_deref(), Some("envelope"));
}

#[tokio::test(start_paused = true)]
async fn g31_plugin_fail_after_a_read_keeps_its_retryable() {
    let kernel = TestKernel::new(vec![read_tool("files.read")])
        .handler("files.read", Handler::Succeed(json!(1)));
    let (plugin, _) = ScriptPlugin::new(vec![
        Step::call("c1", "files.read"),
        Step::returns(RuntimeTurnOutcome::Fail {
            error: ProtocolError::new("harness_failed", "the harness failed", Some(true)),
            metadata: md(json!({"harness": "x"})),
        }),
    ]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(request(&["files.read"])).await;
    assert_eq!(r.status, ExecutionStatus::Failed);
    assert_eq!(code(&r), "harness_failed");
    assert_eq!(r.retryable(), Some(true));
    assert_eq!(
        last_event(&r),
        (
            "turn.failed".into(),
            json!({"code": "harness_failed", "source": "runtime"})
        )
    );
    assert_eq!(r.metadata.get("harness"), Some(&json!("x")));
    let end = &kernel.turn_ends()[0];
    assert_eq!(end.ended_by.as_deref(), Some("runtime"));
    assert_eq!(end.reason_code.as_deref(), Some("harness_failed"));
    assert!(h.turn_errors().is_empty());
}

#[tokio::test(start_paused = true)]
async fn g32_plugin_throw_is_runtime_failed_and_its_text_never_leaks() {
    let kernel = TestKernel::new(vec![]);
    let (plugin, _) = ScriptPlugin::new(vec![Step::throw("boom at /srv/x.ts:88")]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(request(&[])).await;
    assert_eq!(r.status, ExecutionStatus::Failed);
    assert_eq!(code(&r), "runtime_failed");
    assert_eq!(
        r.error.as_ref().unwrap().message.as_str(),
        "The runtime plugin failed."
    );
    assert!(!serde_json::to_string(&r).unwrap().contains("/srv/x.ts:88"));
    assert_eq!(
        last_event(&r),
        (
            "turn.failed".into(),
            json!({"code": "runtime_failed", "source": "envelope"})
        )
    );
    let errs = h.turn_errors();
    assert_eq!(errs.len(), 1);
    assert!(
        matches!(&errs[0].0, TurnError::Runtime(RuntimeError::Failed(m)) if m.contains("/srv/x.ts:88"))
    );
    assert_eq!(errs[0].1.execution_id, EXEC_ID);
    assert_eq!(errs[0].1.trace_id, TRACE);
    let end = &kernel.turn_ends()[0];
    assert_eq!(end.reason_code.as_deref(), Some("runtime_failed"));
    assert_eq!(end.ended_by.as_deref(), Some("envelope"));
    assert_eq!(r.retryable(), Some(true), "nothing was written");
}

#[tokio::test(start_paused = true)]
async fn g33_on_turn_error_that_panics_changes_nothing() {
    let kernel = TestKernel::new(vec![]);
    let (plugin, _) = ScriptPlugin::new(vec![Step::throw("boom")]);
    let (mut opts, errs) = options(0);
    opts.on_turn_error = Some(Arc::new(|_, _| panic!("hook bug")));
    let h = executor_with(&kernel, plugin, opts, errs);
    let r = h.run(request(&[])).await;
    assert_eq!(r.status, ExecutionStatus::Failed);
    assert_eq!(code(&r), "runtime_failed");
    assert_eq!(kernel.turn_ends().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn g34_plugin_never_resolves_is_cancelled_at_the_deadline() {
    let kernel = TestKernel::new(vec![]);
    let (plugin, log) = ScriptPlugin::new(vec![Step::Stall]);
    let h = executor(&kernel, plugin, 0);
    let (r, took) = timed(
        &h,
        request_with(&[], |v| v["options"] = json!({"timeoutMs": 5})),
    )
    .await;
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(code(&r), "turn_cancelled");
    assert_eq!(took, 5);
    assert!(
        lock(&log.abort).as_ref().unwrap().is_raised(),
        "the plugin's signal was aborted"
    );
    assert!(h.turn_errors().is_empty());
    assert_eq!(last_event(&r), ("turn.cancelled".into(), json!({})));
    let end = &kernel.turn_ends()[0];
    assert_eq!(end.status, ExecutionStatus::Cancelled);
    assert_eq!(end.reason_code.as_deref(), Some("turn_cancelled"));
}

#[tokio::test(start_paused = true)]
async fn g35_handler_honouring_abort_leaves_no_effect() {
    let kernel = TestKernel::new(vec![read_tool("files.read")]).handler(
        "files.read",
        Handler::Slow {
            work_ms: 50,
            honour_abort: true,
        },
    );
    let (plugin, _) = ScriptPlugin::new(vec![Step::call("c1", "files.read")]);
    let h = executor(&kernel, plugin, 0);
    let (r, took) = timed(
        &h,
        request_with(&["files.read"], |v| v["options"] = json!({"timeoutMs": 5})),
    )
    .await;
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(took, 5);
    settle().await;
    let invoked = kernel.tool_invoked("c1");
    assert_eq!(invoked.len(), 1);
    assert_eq!(invoked[0].outcome, "interrupted");
    assert_eq!(invoked[0].reason.as_deref(), Some("operation_aborted"));
    assert_eq!(
        types(&r),
        ["turn.started", "tool.requested", "turn.cancelled"],
        "no tool.completed for the aborted call"
    );
}

#[tokio::test(start_paused = true)]
async fn g36_offered_escalation_is_escalated() {
    let kernel = TestKernel::new(vec![escalate_tool()]);
    let (plugin, _) = ScriptPlugin::new(vec![Step::returns(RuntimeTurnOutcome::Escalate {
        reason: Reason::new("needs a human").unwrap(),
        metadata: md(json!({"harness": "h"})),
    })]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(request(&["sharedos.escalate"])).await;
    assert_eq!(r.status, ExecutionStatus::Escalated);
    let e = r.escalation.as_ref().unwrap();
    assert_eq!(e.reason.as_str(), "needs a human");
    assert_eq!(e.reviewer, owner());
    assert_eq!(e.requested_at, Timestamp::parse(BASE_TIME).unwrap());
    assert_eq!(e.status, EscalationStatus::Pending);
    assert_eq!(
        kernel.count(|c| matches!(c, KernelCall::Escalation { .. })),
        1
    );
    assert_eq!(
        last_event(&r),
        (
            "turn.escalated".into(),
            json!({"reason": "needs a human", "reviewer": {"kind": "human", "userId": "owner-1"}})
        )
    );
    assert_eq!(r.metadata.get("harness"), Some(&json!("h")));
    assert_eq!(r.metadata.get("runtime"), Some(&expected_runtime()));
    assert!(r.error.is_none());
    let end = &kernel.turn_ends()[0];
    assert_eq!(end.status, ExecutionStatus::Escalated);
    assert_eq!(end.reason_code, None);
}

/// Nearest equivalent of G37: `record_escalation` is a required port in
/// Rust, so "the kernel has no such port" becomes "the port fails for a
/// reason other than the audit": the envelope falls back to the stub.
#[tokio::test(start_paused = true)]
async fn g37_escalation_recorder_failure_falls_back_to_owner() {
    let kernel = TestKernel::new(vec![escalate_tool()]);
    *lock(&kernel.escalation_error) = Some(KernelError::Failed("no port".into()));
    let (plugin, _) = ScriptPlugin::new(vec![Step::returns(RuntimeTurnOutcome::Escalate {
        reason: Reason::new("r").unwrap(),
        metadata: None,
    })]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(request(&["sharedos.escalate"])).await;
    assert_eq!(r.status, ExecutionStatus::Escalated);
    let e = r.escalation.unwrap();
    assert_eq!(e.reviewer, owner());
    assert_eq!(e.status, EscalationStatus::Pending);
}

#[tokio::test(start_paused = true)]
async fn g38_escalation_not_offered_is_tool_unavailable() {
    let kernel = TestKernel::new(vec![read_tool("files.read")]);
    let (plugin, _) = ScriptPlugin::new(vec![Step::returns(RuntimeTurnOutcome::Escalate {
        reason: Reason::new("r").unwrap(),
        metadata: md(json!({"harness": "hostile"})),
    })]);
    let h = executor(&kernel, plugin, 0);
    // The caller even names the affordance; the kernel did not list it.
    let r = h.run(request(&["files.read", "sharedos.escalate"])).await;
    assert_eq!(r.status, ExecutionStatus::Failed);
    assert_eq!(code(&r), "tool_unavailable");
    assert_eq!(r.retryable(), Some(false));
    assert_eq!(
        last_event(&r),
        (
            "turn.failed".into(),
            json!({"code": "tool_unavailable", "source": "envelope"})
        )
    );
    assert!(events_of(&r, "turn.escalated").is_empty());
    assert_eq!(
        kernel.count(|c| matches!(c, KernelCall::Escalation { .. })),
        0
    );
    assert_eq!(r.metadata.get("harness"), Some(&json!("hostile")));
    assert_eq!(kernel.turn_ends()[0].ended_by.as_deref(), Some("envelope"));
}

/// G39 as a direct plugin: calling `sharedos.escalate` as a tool is an
/// ordinary mediated call (the kernel's handler answers); it ends nothing.
#[tokio::test(start_paused = true)]
async fn g39_escalate_as_a_tool_call_does_not_escalate() {
    let kernel = TestKernel::new(vec![escalate_tool()]).handler(
        "sharedos.escalate",
        Handler::Fail("escalation_not_terminated"),
    );
    let plugin = FnPlugin(|_, host: Arc<dyn RuntimeHost>, _| async move {
        let r = host
            .invoke_tool(call("c1", "sharedos.escalate"), Some(0))
            .await
            .unwrap();
        assert_eq!(r.status(), ToolStatus::Failed);
        Ok(RuntimeTurnOutcome::complete(json!(
            r.error().unwrap().code.as_str()
        )))
    });
    let h = executor(&kernel, Arc::new(plugin), 0);
    let r = h.run(request(&["sharedos.escalate"])).await;
    assert_eq!(r.status, ExecutionStatus::Succeeded);
    assert_eq!(r.output, Some(json!("escalation_not_terminated")));
    assert!(events_of(&r, "turn.escalated").is_empty());
    assert_eq!(
        kernel.count(|c| matches!(c, KernelCall::Escalation { .. })),
        0
    );
}

#[tokio::test(start_paused = true)]
async fn host_cancel_mid_turn_is_cancelled_at_once() {
    let kernel = TestKernel::new(vec![]);
    let (plugin, _) = ScriptPlugin::new(vec![Step::Stall]);
    let h = executor(&kernel, plugin, 5_000);
    let cancel = tokio_util::sync::CancellationToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(ms(1_000)).await;
        c2.cancel();
    });
    let start = tokio::time::Instant::now();
    let r = h
        .executor
        .execute(
            request(&[]),
            sharedos_host::executor::ExecuteOptions {
                cancel: Some(cancel),
                on_event: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(start.elapsed(), ms(1_000));
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(r.retryable(), Some(true));
    assert!(h.turn_errors().is_empty());
}

/// A panic is how an in-process Rust plugin throws: it ends the turn
/// `runtime_failed` like any other throw, with the ending recorded, rather
/// than unwinding through the host's `execute`.
#[tokio::test(start_paused = true)]
async fn plugin_panic_is_runtime_failed() {
    let kernel = TestKernel::new(vec![]);
    let plugin = FnPlugin(|_, host: Arc<dyn RuntimeHost>, _| async move {
        host.annotate("before", json!(true)).unwrap();
        if host.limits().max_steps > 0 {
            panic!("plugin bug at /srv/plugin.rs:12");
        }
        Ok(RuntimeTurnOutcome::complete(json!(null)))
    });
    let h = executor(&kernel, Arc::new(plugin), 0);
    let r = h.run(request(&[])).await;
    assert_eq!(r.status, ExecutionStatus::Failed);
    assert_eq!(code(&r), "runtime_failed");
    assert_eq!(r.metadata.get("before"), Some(&json!(true)));
    assert!(
        !serde_json::to_string(&r)
            .unwrap()
            .contains("/srv/plugin.rs")
    );
    assert_eq!(kernel.turn_ends().len(), 1);
    assert_eq!(kernel.live_leases(), 0);
    assert_eq!(h.turn_errors().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn limits_follow_the_request_then_the_defaults() {
    let kernel = TestKernel::new(vec![]);
    let plugin = FnPlugin(|_, host: Arc<dyn RuntimeHost>, _| async move {
        Ok(RuntimeTurnOutcome::complete(
            serde_json::to_value(host.limits()).unwrap(),
        ))
    });
    let h = executor(&kernel, Arc::new(plugin), 0);
    let r = h.run(request(&[])).await;
    assert_eq!(
        r.output,
        Some(json!({"maxSteps": 16, "maxToolCalls": 16, "timeoutMs": 120000}))
    );
    let r = h
        .run(request_with(&[], |v| {
            v["options"] = json!({"maxSteps": 3, "timeoutMs": 50})
        }))
        .await;
    assert_eq!(
        r.output,
        Some(json!({"maxSteps": 3, "maxToolCalls": 3, "timeoutMs": 50}))
    );
}
