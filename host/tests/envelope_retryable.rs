//! envelope.md G 66–75: the retryable rule (B.7).

mod support;

use std::sync::Arc;

use serde_json::json;
use sharedos_protocol::{
    ExecutionRequest, ExecutionResult, ExecutionStatus, ProtocolError, RuntimeTurnOutcome,
    ToolDefinition,
};
use support::*;

fn kernel(tools: Vec<ToolDefinition>, handler: Handler) -> Arc<TestKernel> {
    let k = TestKernel::new(tools.clone());
    for t in &tools {
        k.handler(t.name.as_str(), handler.clone());
    }
    k
}

fn req(tools: &[&str]) -> ExecutionRequest {
    request_with(tools, |v| v["options"] = json!({"timeoutMs": 10_000}))
}

/// One call, then a stall to the deadline.
async fn call_then_stall(
    tool: ToolDefinition,
    handler: Handler,
) -> (ExecutionResult, Arc<TestKernel>) {
    let name = tool.name.to_string();
    let k = kernel(vec![tool], handler);
    let leaked: &'static str = Box::leak(name.clone().into_boxed_str());
    let (plugin, _) = ScriptPlugin::new(vec![Step::try_call("c1", leaked), Step::Stall]);
    let h = executor(&k, plugin, 0);
    let (r, took) = timed(&h, req(&[&name])).await;
    assert_eq!(took, 10_000);
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(code(&r), "turn_cancelled");
    (r, k)
}

#[tokio::test(start_paused = true)]
async fn g66_read_then_deadline_is_retryable() {
    let (r, _) = call_then_stall(read_tool("search"), Handler::Succeed(json!(1))).await;
    assert_eq!(r.retryable(), Some(true));
}

#[tokio::test(start_paused = true)]
async fn g66_read_that_outlives_the_deadline_is_still_retryable() {
    let (r, _) = call_then_stall(
        read_tool("search"),
        Handler::Slow {
            work_ms: 600_000,
            honour_abort: false,
        },
    )
    .await;
    assert_eq!(r.retryable(), Some(true));
}

#[tokio::test(start_paused = true)]
async fn g67_idempotent_write_then_deadline_is_retryable() {
    let (r, _) = call_then_stall(idempotent_write("set_flag"), Handler::Succeed(json!(1))).await;
    assert_eq!(r.retryable(), Some(true));
}

#[tokio::test(start_paused = true)]
async fn g68_succeeded_write_then_deadline_is_not_retryable() {
    let (r, _) = call_then_stall(write_tool("transfer_funds"), Handler::Succeed(json!(1))).await;
    assert_eq!(r.retryable(), Some(false));
}

#[tokio::test(start_paused = true)]
async fn g69_write_still_with_the_kernel_is_not_retryable() {
    let k = kernel(
        vec![write_tool("transfer_funds")],
        Handler::Slow {
            work_ms: 600_000,
            honour_abort: false,
        },
    );
    let (plugin, _) = ScriptPlugin::new(vec![Step::call("c1", "transfer_funds")]);
    let h = executor(&k, plugin, 0);
    let (r, took) = timed(&h, req(&["transfer_funds"])).await;
    assert_eq!(took, 10_000);
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(r.retryable(), Some(false));
}

#[tokio::test(start_paused = true)]
async fn g70_throw_after_a_write_or_a_read() {
    for (tool, expected) in [(write_tool("w"), false), (read_tool("w"), true)] {
        let k = kernel(vec![tool], Handler::Succeed(json!(1)));
        let (plugin, _) = ScriptPlugin::new(vec![Step::call("c1", "w"), Step::throw("boom")]);
        let r = executor(&k, plugin, 0).run(req(&["w"])).await;
        assert_eq!(code(&r), "runtime_failed");
        assert_eq!(r.retryable(), Some(expected));
    }
}

fn fail(retryable: Option<bool>) -> Step {
    Step::returns(RuntimeTurnOutcome::Fail {
        error: ProtocolError::new("harness_failed", "the harness failed", retryable),
        metadata: None,
    })
}

#[tokio::test(start_paused = true)]
async fn g71_plugin_true_is_lowered_after_a_write() {
    for (tool, expected) in [(write_tool("w"), false), (read_tool("w"), true)] {
        let k = kernel(vec![tool], Handler::Succeed(json!(1)));
        let (plugin, _) = ScriptPlugin::new(vec![Step::call("c1", "w"), fail(Some(true))]);
        let r = executor(&k, plugin, 0).run(req(&["w"])).await;
        assert_eq!(code(&r), "harness_failed");
        assert_eq!(r.retryable(), Some(expected));
    }
}

#[tokio::test(start_paused = true)]
async fn g72_plugin_false_or_absent_is_never_raised() {
    let k = kernel(vec![], Handler::Succeed(json!(1)));
    let (plugin, _) = ScriptPlugin::new(vec![fail(Some(false))]);
    let r = executor(&k, plugin, 0).run(req(&[])).await;
    assert_eq!(r.retryable(), Some(false));
    let (plugin, _) = ScriptPlugin::new(vec![fail(None)]);
    let r = executor(&k, plugin, 0).run(req(&[])).await;
    assert_eq!(r.retryable(), None);
}

#[tokio::test(start_paused = true)]
async fn g73_write_denied_by_the_kernel_does_not_count() {
    let (r, k) = call_then_stall(
        write_tool("transfer_funds"),
        Handler::Deny("no_matching_grant"),
    )
    .await;
    assert_eq!(k.invoked(), ["c1"]);
    assert_eq!(r.retryable(), Some(true));
}

#[tokio::test(start_paused = true)]
async fn g74_write_that_failed_counts() {
    let (r, _) = call_then_stall(
        write_tool("transfer_funds"),
        Handler::Fail("invalid_tool_arguments"),
    )
    .await;
    assert_eq!(r.retryable(), Some(false));
}

#[tokio::test(start_paused = true)]
async fn g75_envelope_refused_write_does_not_count() {
    // Unlisted: the caller names it and declares it a write; the kernel
    // did not list it but would run it (a handler is registered), so an
    // envelope that forwarded or counted it would make the turn
    // non-retryable.
    let k = TestKernel::new(vec![]).handler(
        "transfer_funds",
        Handler::Transfer {
            work_ms: 0,
            honour_abort: true,
        },
    );
    let (plugin, log) =
        ScriptPlugin::new(vec![Step::try_call("c1", "transfer_funds"), Step::Stall]);
    let declared_write = request_with(&["transfer_funds"], |v| {
        v["options"] = json!({"timeoutMs": 10_000});
        v["tools"][0]["readWrite"] = json!("write");
        v["tools"][0]["namespace"] = json!("bank");
    });
    let r = executor(&k, plugin, 0).run(declared_write).await;
    assert_eq!(log.code("c1").as_deref(), Some("tool_unavailable"));
    assert!(k.invoked().is_empty(), "the envelope never forwards it");
    assert!(k.ledger().is_empty());
    assert_eq!(r.retryable(), Some(true));

    // Over budget: the first (read) call uses the budget, the write is refused.
    let k = kernel(
        vec![read_tool("search"), write_tool("transfer_funds")],
        Handler::Succeed(json!(1)),
    );
    let (plugin, log) = ScriptPlugin::new(vec![
        Step::try_call("c1", "search"),
        Step::try_call("c2", "transfer_funds"),
        Step::Stall,
    ]);
    let r = executor(&k, plugin, 0)
        .run(request_with(&["search", "transfer_funds"], |v| {
            v["options"] = json!({"timeoutMs": 10_000, "maxToolCalls": 1})
        }))
        .await;
    assert_eq!(log.code("c2").as_deref(), Some("tool_call_limit_exceeded"));
    assert_eq!(r.retryable(), Some(true));
}

/// The classification comes from the kernel's listing, never from the
/// request: a caller that declares the write a read changes nothing.
#[tokio::test(start_paused = true)]
async fn classification_is_the_kernels_not_the_callers() {
    // request() declares every named tool as a read.
    let (r, _) = call_then_stall(write_tool("transfer_funds"), Handler::Succeed(json!(1))).await;
    assert_eq!(r.retryable(), Some(false));
}
