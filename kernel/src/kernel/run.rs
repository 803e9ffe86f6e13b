//! Step 13 of an allowed call: the handler, guarded, and what its answer
//! means. The caller (the check pipeline in `invoke.rs`) writes the one
//! `tool.invoked` for it.

use std::panic::AssertUnwindSafe;
use std::task::Poll;

use sharedos_protocol::{AccessContext, ToolCall, ToolResult};
use tokio_util::sync::CancellationToken;

use super::refusal::Refusal;
use super::{EXECUTION_FAILED_MESSAGE, ErrorHook};
use crate::port::{AuditEffect, KernelError};
use crate::registry::{HandlerAnswer, RegisteredTool, ToolError};

/// Runs `parsed` (the call as the handler's `parse_arguments` left it);
/// `call` is the call as asked, which the result must name.
pub(super) async fn handler(
    tool: &RegisteredTool,
    context: &AccessContext,
    parsed: &ToolCall,
    call: &ToolCall,
    hook: &dyn ErrorHook,
    abort: CancellationToken,
) -> Result<ToolResult, Refusal> {
    // A panic in the handler is a failure of the tool, not of the kernel:
    // every poll of its future is guarded.
    let joined = {
        let mut invoked = tool.handler.invoke(context, parsed, abort.clone());
        std::future::poll_fn(|cx| {
            match std::panic::catch_unwind(AssertUnwindSafe(|| invoked.as_mut().poll(cx))) {
                Ok(Poll::Ready(answer)) => Poll::Ready(Ok(answer)),
                Ok(Poll::Pending) => Poll::Pending,
                Err(_) => Poll::Ready(Err(())),
            }
        })
        .await
    };
    let failed = |code: &str, message: &str| {
        Ok(ToolResult::failed(call, code, message, context.now.clone()))
    };
    let text = match joined {
        Ok(Ok(answer)) => return checked_answer(tool, call, answer, context),
        Ok(Err(ToolError::Kernel(KernelError::AuditUnavailable { cause, .. }))) => {
            return Err(Refusal::Interrupted {
                reason: "audit_unavailable",
                error: KernelError::AuditUnavailable {
                    effect: AuditEffect::Unknown,
                    cause,
                },
            });
        }
        Ok(Err(_)) if abort.is_cancelled() => {
            return Err(Refusal::Interrupted {
                reason: "operation_aborted",
                error: KernelError::Interrupted,
            });
        }
        Ok(Err(ToolError::Failed(text))) => text,
        Ok(Err(ToolError::Aborted)) => {
            "the handler reported an abort that was not signalled".into()
        }
        Ok(Err(ToolError::Kernel(k))) => k.to_string(),
        Err(()) => "the handler panicked".into(),
    };
    hook.tool_error(call.tool.as_str(), call.id.as_str(), &text);
    failed("tool_execution_failed", EXECUTION_FAILED_MESSAGE)
}

/// A handler's answer is its result only when it names this call and tool
/// and its output fits the declared `outputSchema`.
fn checked_answer(
    tool: &RegisteredTool,
    call: &ToolCall,
    answer: HandlerAnswer,
    context: &AccessContext,
) -> Result<ToolResult, Refusal> {
    let parsed = match answer {
        HandlerAnswer::Result(r) => Some(r),
        HandlerAnswer::Raw(v) => serde_json::from_value::<ToolResult>(v).ok(),
    };
    Ok(match parsed {
        Some(r)
            if r.call_id() == &call.id
                && r.tool() == &call.tool
                && r.output().is_none_or(|o| tool.output_fits(o)) =>
        {
            r
        }
        _ => ToolResult::failed(
            call,
            "invalid_tool_result",
            "The tool answered with an invalid result.",
            context.now.clone(),
        ),
    })
}
