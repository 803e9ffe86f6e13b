//! envelope.md G 18–29: mediation of `host.invoke_tool` (B.2).

mod support;

use std::sync::Arc;

use serde_json::json;
use sharedos_plugin_sdk::RuntimeHost;
use sharedos_protocol::{ErrorKind, ExecutionStatus, RuntimeTurnOutcome, ToolStatus};
use support::*;

#[tokio::test(start_paused = true)]
async fn g18_unlisted_tool_is_refused_before_the_kernel() {
    let kernel = TestKernel::new(vec![read_tool("files.read")]);
    let (plugin, log) = ScriptPlugin::new(vec![Step::call("c1", "files.delete")]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(request(&["files.read", "files.delete"])).await;
    assert_eq!(r.status, ExecutionStatus::Succeeded);
    let res = log.result("c1").unwrap();
    assert_eq!(res.status(), ToolStatus::Denied);
    assert_eq!(res.error().unwrap().code.as_str(), "tool_unavailable");
    assert_eq!(res.error().unwrap().retryable, Some(false));
    assert!(kernel.invoked().is_empty());
    assert_eq!(
        events_of(&r, "tool.requested"),
        [&json!({"callId": "c1", "tool": "files.delete"})]
    );
    assert_eq!(
        events_of(&r, "tool.completed"),
        [
            &json!({"callId": "c1", "tool": "files.delete", "status": "denied", "code": "tool_unavailable"})
        ]
    );
    let refused = kernel.refused();
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].call_id.as_str(), "c1");
    assert_eq!(refused[0].tool.as_str(), "files.delete");
    assert_eq!(refused[0].reason_code, "tool_unavailable");
    assert_eq!(refused[0].cause.as_deref(), Some("not_offered"));
}

#[tokio::test(start_paused = true)]
async fn g19_call_ceiling_refuses_the_second_call() {
    let kernel = TestKernel::new(vec![read_tool("files.read")])
        .handler("files.read", Handler::Succeed(json!(1)));
    let (plugin, log) = ScriptPlugin::new(vec![
        Step::call("c1", "files.read"),
        Step::call("c2", "files.read"),
    ]);
    let (mut opts, errs) = options(0);
    opts.default_max_tool_calls = Some(1);
    let h = executor_with(&kernel, plugin, opts, errs);
    let r = h.run(request(&["files.read"])).await;
    assert_eq!(r.status, ExecutionStatus::Succeeded);
    assert_eq!(log.result("c1").unwrap().status(), ToolStatus::Succeeded);
    assert_eq!(log.code("c2").as_deref(), Some("tool_call_limit_exceeded"));
    assert_eq!(kernel.invoked(), ["c1"]);
    assert_eq!(kernel.refused()[0].reason_code, "tool_call_limit_exceeded");
}

#[tokio::test(start_paused = true)]
async fn g20_step_ceiling_with_declared_steps() {
    let kernel = TestKernel::new(vec![read_tool("files.read")])
        .handler("files.read", Handler::Succeed(json!(1)));
    let (plugin, log) = ScriptPlugin::new(vec![
        Step::call_at("c1", "files.read", 0),
        Step::call_at("c2", "files.read", 1),
        Step::call_at("c3", "files.read", 0),
    ]);
    let h = executor(&kernel, plugin, 0);
    let r = h
        .run(request_with(&["files.read"], |v| {
            v["options"] = json!({"maxSteps": 1, "maxToolCalls": 8})
        }))
        .await;
    assert_eq!(r.status, ExecutionStatus::Succeeded);
    assert_eq!(log.result("c1").unwrap().status(), ToolStatus::Succeeded);
    assert_eq!(log.code("c2").as_deref(), Some("step_limit_exceeded"));
    assert_eq!(log.result("c3").unwrap().status(), ToolStatus::Succeeded);
    assert_eq!(kernel.invoked(), ["c1", "c3"]);
    assert_eq!(
        events_of(&r, "tool.completed")[1],
        &json!({"callId": "c2", "tool": "files.read", "step": 1, "status": "denied", "code": "step_limit_exceeded"})
    );
}

#[tokio::test(start_paused = true)]
async fn g21_undeclared_steps_are_bounded_by_the_call_ceiling_only() {
    let kernel = TestKernel::new(vec![read_tool("files.read")])
        .handler("files.read", Handler::Succeed(json!(1)));
    let (plugin, log) = ScriptPlugin::new(vec![
        Step::call("c1", "files.read"),
        Step::call("c2", "files.read"),
        Step::call("c3", "files.read"),
    ]);
    let h = executor(&kernel, plugin, 0);
    let r = h
        .run(request_with(&["files.read"], |v| {
            v["options"] = json!({"maxSteps": 1, "maxToolCalls": 2})
        }))
        .await;
    assert_eq!(r.status, ExecutionStatus::Succeeded);
    assert_eq!(log.result("c1").unwrap().status(), ToolStatus::Succeeded);
    assert_eq!(log.result("c2").unwrap().status(), ToolStatus::Succeeded);
    assert_eq!(log.code("c3").as_deref(), Some("tool_call_limit_exceeded"));
}

#[tokio::test(start_paused = true)]
async fn g22_a_guessed_name_uses_budget() {
    let kernel = TestKernel::new(vec![read_tool("files.read")])
        .handler("files.read", Handler::Succeed(json!(1)));
    let (plugin, log) = ScriptPlugin::new(vec![
        Step::call("c1", "files.guess"),
        Step::call("c2", "files.read"),
    ]);
    let h = executor(&kernel, plugin, 0);
    h.run(request_with(&["files.read"], |v| {
        v["options"] = json!({"maxToolCalls": 1})
    }))
    .await;
    assert_eq!(log.code("c1").as_deref(), Some("tool_unavailable"));
    assert_eq!(log.code("c2").as_deref(), Some("tool_call_limit_exceeded"));
    assert!(kernel.invoked().is_empty());
}

#[tokio::test(start_paused = true)]
async fn g23_kernel_denial_reaches_the_plugin_with_the_turn_context() {
    let kernel = TestKernel::new(vec![read_tool("files.read")])
        .handler("files.read", Handler::Deny("no_matching_grant"));
    let (plugin, log) = ScriptPlugin::new(vec![Step::call("c1", "files.read")]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(request(&["files.read"])).await;
    assert_eq!(r.status, ExecutionStatus::Succeeded);
    assert_eq!(log.code("c1").as_deref(), Some("no_matching_grant"));
    assert_eq!(log.result("c1").unwrap().status(), ToolStatus::Denied);
    let invoke = kernel
        .calls()
        .into_iter()
        .find_map(|c| match c {
            KernelCall::Invoke {
                context,
                aborted_on_entry,
                ..
            } => Some((context, aborted_on_entry)),
            _ => None,
        })
        .unwrap();
    let (ctx, aborted) = invoke;
    // The kernel gets the full context (actor, authority, namespace), which
    // carries no grants by type, and a live abort token.
    assert_eq!(ctx.actor, sharedos_protocol::Address::agent(AGENT).unwrap());
    assert_eq!(
        ctx.authority,
        sharedos_protocol::Address::human("issuer").unwrap()
    );
    assert_eq!(ctx.namespace_id.as_str(), "ns-1");
    assert!(!aborted);
    assert_eq!(
        events_of(&r, "tool.completed"),
        [
            &json!({"callId": "c1", "tool": "files.read", "status": "denied", "code": "no_matching_grant"})
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn g24_captured_host_is_closed_after_the_turn() {
    let kernel = TestKernel::new(vec![read_tool("files.read")])
        .handler("files.read", Handler::Succeed(json!(1)));
    let (plugin, log) = ScriptPlugin::new(vec![Step::CaptureHost]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(request(&["files.read"])).await;
    let host = log.host();
    let err = host
        .invoke_tool(call("late", "files.read"), None)
        .await
        .unwrap_err();
    assert_eq!(err.message, "Runtime host is closed");
    assert_eq!(err.kind, ErrorKind::TurnNotActive);
    let err = host
        .emit(sharedos_protocol::RuntimeEvent {
            kind: sharedos_protocol::ident("late"),
            data: json!(null),
        })
        .unwrap_err();
    assert_eq!(err.message, "Runtime host is closed");
    assert!(kernel.invoked().is_empty());
    assert!(kernel.refused().is_empty());
    assert_eq!(types(&r), ["turn.started", "turn.completed"]);
}

/// G25: a call missing `traceId` cannot be built as the typed `ToolCall`
/// the host takes (the type requires it). G26 (a step of -1 or 1.5) and
/// G25 on the wire: `g25_g26_malformed_call_and_step_are_invalid_params`
/// in host/src/process/driver/tests.rs, where the host answers -32602 and never
/// mediates.
#[test]
fn g25_a_call_without_trace_id_does_not_decode() {
    let mut v = serde_json::to_value(call("c1", "files.read")).unwrap();
    assert!(serde_json::from_value::<sharedos_protocol::ToolCall>(v.clone()).is_ok());
    v.as_object_mut().unwrap().remove("traceId");
    assert!(serde_json::from_value::<sharedos_protocol::ToolCall>(v).is_err());
}

/// Nearest equivalent of G27 ("stub kernel returns {}"): the typed port
/// cannot return `{}`, so the kernel answers a result for another call.
#[tokio::test(start_paused = true)]
async fn g27_kernel_result_for_another_call_is_invalid() {
    let kernel =
        TestKernel::new(vec![read_tool("files.read")]).handler("files.read", Handler::WrongCallId);
    let (plugin, log) = ScriptPlugin::new(vec![
        Step::try_call("c1", "files.read"),
        Step::call("c2", "files.read"),
    ]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(request(&["files.read"])).await;
    let err = log.result("c1").unwrap_err();
    assert_eq!(err.message, "Kernel returned an invalid tool result");
    // Uncaught, it ends the turn runtime_failed.
    assert_eq!(r.status, ExecutionStatus::Failed);
    assert_eq!(code(&r), "runtime_failed");
    assert!(events_of(&r, "tool.completed").is_empty());
}

#[tokio::test(start_paused = true)]
async fn g28_turn_end_is_recorded_once_and_a_failing_recorder_changes_nothing() {
    for failing in [false, true] {
        let kernel = TestKernel::new(vec![]);
        *lock(&kernel.turn_end_error) = failing;
        let (plugin, _) = ScriptPlugin::new(vec![]);
        let h = executor(&kernel, plugin, 0);
        let r = h.run(request(&[])).await;
        assert_eq!(r.status, ExecutionStatus::Succeeded);
        let ends = kernel.turn_ends();
        assert_eq!(ends.len(), 1);
        assert_eq!(ends[0].execution_id.as_str(), EXEC_ID);
        assert_eq!(ends[0].status, ExecutionStatus::Succeeded);
        assert_eq!(ends[0].reason_code, None);
        assert_eq!(ends[0].ended_by, None);
    }
}

#[tokio::test(start_paused = true)]
async fn g28_failing_refusal_recorder_changes_nothing() {
    let kernel = TestKernel::new(vec![]);
    *lock(&kernel.refused_error) = true;
    let (plugin, log) = ScriptPlugin::new(vec![Step::call("c1", "nope")]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(request(&[])).await;
    assert_eq!(r.status, ExecutionStatus::Succeeded);
    assert_eq!(log.code("c1").as_deref(), Some("tool_unavailable"));
}

#[tokio::test(start_paused = true)]
async fn g29_grace_not_below_timeout_refuses_every_call() {
    let kernel = TestKernel::new(vec![read_tool("files.read")])
        .handler("files.read", Handler::Succeed(json!(1)));
    let (plugin, log) = ScriptPlugin::new(vec![
        Step::try_call("c1", "files.read"),
        Step::try_call("c2", "files.read"),
    ]);
    let (mut opts, errs) = options(5_000);
    opts.default_timeout_ms = 5_000;
    let h = executor_with(&kernel, plugin, opts, errs);
    let (r, took) = timed(&h, request(&["files.read"])).await;
    assert_eq!(log.code("c1").as_deref(), Some("turn_draining"));
    assert_eq!(log.code("c2").as_deref(), Some("turn_draining"));
    assert!(kernel.invoked().is_empty());
    assert_eq!(
        r.status,
        ExecutionStatus::Succeeded,
        "an outcome the seat returns while draining is honoured"
    );
    assert_eq!(took, 0);
    // Not clamped (ADR 0007), but said.
    let warnings = &r.metadata["runtime"]["warnings"];
    assert!(
        warnings[0]
            .as_str()
            .is_some_and(|w| w.contains("is not above drainGraceMs 5000")),
        "{warnings}"
    );
    let refused = kernel.refused();
    assert_eq!(refused.len(), 2);
    assert!(
        refused
            .iter()
            .all(|c| c.reason_code == "turn_draining" && c.cause.is_none())
    );
}

/// The draining refusal is not counted against the budget.
#[tokio::test(start_paused = true)]
async fn draining_refusal_is_not_counted() {
    let kernel = TestKernel::new(vec![read_tool("files.read")])
        .handler("files.read", Handler::Succeed(json!(1)));
    let plugin = FnPlugin(|_req, host: Arc<dyn RuntimeHost>, _abort| async move {
        let r = host
            .invoke_tool(call("c1", "files.read"), None)
            .await
            .unwrap();
        assert_eq!(r.error().unwrap().code.as_str(), "turn_draining");
        Ok(RuntimeTurnOutcome::complete(json!(
            host.draining().is_raised()
        )))
    });
    let (mut opts, errs) = options(600_000);
    opts.default_max_tool_calls = Some(1);
    let h = executor_with(&kernel, Arc::new(plugin), opts, errs);
    let r = h.run(request(&["files.read"])).await;
    assert_eq!(r.output, Some(json!(true)));
}
