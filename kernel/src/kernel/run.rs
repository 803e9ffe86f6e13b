//! Steps 13–14 of an allowed call: the handler, then its `tool.invoked`.
//! They run in a task of their own so the outcome is recorded even when the
//! caller stops waiting.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::Poll;

use sharedos_protocol::{AccessContext, ToolCall, ToolResult};
use tokio_util::sync::CancellationToken;

use super::EXECUTION_FAILED_MESSAGE;
use super::records::{CallFacts, Recorder, catalog_metadata, invoked_record};
use crate::audit::{AuditOutcome, AuditRecord, AuditSource};
use crate::port::{AuditEffect, KernelError};
use crate::registry::{HandlerAnswer, RegisteredTool, ToolError};

/// Steps 13–14 of one allowed call.
pub(super) struct Run {
    pub(super) tool: Arc<RegisteredTool>,
    pub(super) recorder: Arc<Recorder>,
    pub(super) context: AccessContext,
    pub(super) call: ToolCall,
    pub(super) original: ToolCall,
    pub(super) facts: CallFacts,
    pub(super) catalog_hash: Option<String>,
}

impl Run {
    pub(super) async fn go(self, abort: CancellationToken) -> Result<ToolResult, KernelError> {
        // A panic in the handler is a failure of the tool, not of the
        // kernel: every poll of its future is guarded. (No task of its
        // own: this `Run` is already one, so the handler borrows the
        // call and the context instead of taking copies.)
        let joined = {
            let mut invoked = self
                .tool
                .handler
                .invoke(&self.context, &self.call, abort.clone());
            std::future::poll_fn(|cx| {
                match std::panic::catch_unwind(AssertUnwindSafe(|| invoked.as_mut().poll(cx))) {
                    Ok(Poll::Ready(answer)) => Poll::Ready(Ok(answer)),
                    Ok(Poll::Pending) => Poll::Pending,
                    Err(_) => Poll::Ready(Err(())),
                }
            })
            .await
        };
        let call = &self.original;
        let now = self.context.now.clone();
        let failed =
            |code: &str, message: &str| ToolResult::failed(call, code, message, now.clone());
        let result = match joined {
            Ok(Ok(answer)) => {
                let parsed = match answer {
                    HandlerAnswer::Result(r) => Some(r),
                    HandlerAnswer::Raw(v) => serde_json::from_value::<ToolResult>(v).ok(),
                };
                match parsed {
                    Some(r)
                        if r.call_id() == &call.id
                            && r.tool() == &call.tool
                            && r.output().is_none_or(|o| self.tool.output_fits(o)) =>
                    {
                        r
                    }
                    _ => failed(
                        "invalid_tool_result",
                        "The tool answered with an invalid result.",
                    ),
                }
            }
            Ok(Err(ToolError::Kernel(KernelError::AuditUnavailable { cause, .. }))) => {
                self.interrupted("audit_unavailable").await;
                return Err(KernelError::AuditUnavailable {
                    effect: AuditEffect::Unknown,
                    cause,
                });
            }
            Ok(Err(_)) if abort.is_cancelled() => {
                self.interrupted("operation_aborted").await;
                return Err(KernelError::Interrupted);
            }
            Ok(Err(e)) => {
                let text = match e {
                    ToolError::Failed(t) => t,
                    ToolError::Aborted => {
                        "the handler reported an abort that was not signalled".into()
                    }
                    ToolError::Kernel(k) => k.to_string(),
                };
                self.recorder
                    .hook
                    .tool_error(call.tool.as_str(), call.id.as_str(), &text);
                failed("tool_execution_failed", EXECUTION_FAILED_MESSAGE)
            }
            Err(()) => {
                self.recorder.hook.tool_error(
                    call.tool.as_str(),
                    call.id.as_str(),
                    "the handler panicked",
                );
                failed("tool_execution_failed", EXECUTION_FAILED_MESSAGE)
            }
        };
        let record = invoked_record(
            &self.context,
            call,
            &result,
            self.facts.clone(),
            self.catalog_hash.clone(),
        );
        self.recorder.outcome(record).await;
        Ok(result)
    }

    async fn interrupted(&self, reason: &str) {
        let mut r = AuditRecord::new(
            "tool.invoked",
            AuditOutcome::Interrupted,
            &self.context,
            AuditSource::Kernel,
        );
        r.operation_id = Some(self.original.id.to_string());
        r.tool = Some(self.original.tool.to_string());
        r.resource = self.facts.resource.clone();
        r.action = self.facts.action.clone();
        r.grant_id = self.facts.grant_id.clone();
        r.reason = Some(reason.to_owned());
        if reason == "audit_unavailable" {
            r.fail_closed = Some(true);
        }
        r.metadata = catalog_metadata(self.catalog_hash.clone());
        self.recorder.outcome(r).await;
    }
}
