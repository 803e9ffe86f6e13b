//! The `RuntimeHost` the envelope hands the seat: mediation of every tool
//! call in the exact order of envelope.md B.2, `emit` (B.3), `annotate`
//! (B.4) and the draining signal.

use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use async_trait::async_trait;
use futures_util::FutureExt;
use serde_json::{Value, json};
use sharedos_kernel::{AuditEffect, KernelError, RefusedCall};
use sharedos_plugin_sdk::{HostCallError, RuntimeHost, Signal, check_annotation};
use sharedos_protocol::{
    CallEventData, ErrorKind, EventData, EventKind, Identifier, RuntimeEvent, RuntimeLimits,
    ToolCall, ToolResult, ToolStatus,
};

use super::detach::{Panicked, RunToEnd};
use super::events::{CALL_COMPLETED, CALL_REQUESTED};
use super::gate::{Admitted, CALL_LIMIT, Offered, STEP_LIMIT};
use super::turn::Turn;
use crate::limits::COMPLETION_EXTRA_BYTES;

pub(crate) const TURN_DRAINING: &str = "turn_draining";
pub(crate) const TOOL_UNAVAILABLE: &str = "tool_unavailable";

/// The in-process host of one turn. Holds the turn weakly in spirit: once
/// the turn closes, every member answers as a closed host does.
pub struct EnvelopeHost {
    pub(crate) turn: Arc<Turn>,
}

impl EnvelopeHost {
    fn refusal_message(code: &str) -> &'static str {
        match code {
            TURN_DRAINING => "The turn is ending and takes no new tool calls.",
            STEP_LIMIT => "The runtime reached its maximum number of steps.",
            CALL_LIMIT => "The runtime reached its maximum number of tool calls.",
            _ => "The tool is not available in this permission-filtered turn.",
        }
    }

    /// An envelope refusal: a `denied` result, its `tool.completed`, and the
    /// refusal recorded through the kernel (awaited, failure swallowed).
    async fn refuse(
        &self,
        call: &ToolCall,
        step: Option<u64>,
        code: &str,
        cause: Option<&str>,
    ) -> ToolResult {
        let turn = &self.turn;
        let result = ToolResult::denied(call, code, Self::refusal_message(code), turn.now());
        let code_id = result.error().map(|err| err.code.clone());
        let data = completed(call, step, ToolStatus::Denied, code_id);
        turn.events().push_prepaid(CALL_COMPLETED, data);
        if let Some(kernel_turn) = turn.authority().kernel_turn() {
            let refused = RefusedCall {
                call_id: call.id.clone(),
                tool: call.tool.clone(),
                reason_code: code.to_owned(),
                cause: cause.map(str::to_owned),
            };
            if let Err(e) = kernel_turn
                .record_refused_call(&turn.context_now(), refused)
                .await
            {
                tracing::warn!(execution_id = %turn.execution_id(), error = %e, "recording an envelope refusal failed");
            }
        }
        result
    }

    fn closed(&self) -> bool {
        !self.turn.is_open() || self.turn.signals().hard_raised()
    }
}

/// `tool.completed`'s `data` for `call`.
fn completed(
    call: &ToolCall,
    step: Option<u64>,
    status: ToolStatus,
    code: Option<sharedos_protocol::Identifier>,
) -> CallEventData {
    CallEventData::completed(call.id.clone(), call.tool.clone(), step, status, code)
}

/// The bookkeeping of a mediated call once the kernel answered (steps
/// 11–13): the call gate's retry book, an audit outage, and the call's
/// `tool.completed`. These belong to the mediated call, not to the seat's
/// wait on it: a result that lands after the seat stopped waiting (it
/// threw, or gave up on the call when the turn began draining) is still
/// recorded as `tool.completed` (B.6), and before the in-flight guard lets
/// the catch path write the turn's ending. Returns whether the result
/// names this call and tool.
fn settle_call(
    turn: &Turn,
    (call_id, tool): (Identifier, Identifier),
    step: Option<u64>,
    admitted: &Admitted,
    outcome: &Result<ToolResult, KernelError>,
) -> bool {
    let effect_possible = match outcome {
        Ok(result) => result.status() != ToolStatus::Denied,
        Err(err) => {
            let refused_for_outage = matches!(
                err,
                KernelError::AuditUnavailable {
                    effect: AuditEffect::None,
                    ..
                }
            ) && !turn.signals().hard_raised();
            !refused_for_outage
        }
    };
    turn.gate().settle(admitted.repeatable, effect_possible);
    let result = match outcome {
        Ok(result) => result,
        Err(err) => {
            turn.note_audit_outage(err);
            if matches!(err, KernelError::AuditUnavailable { .. }) {
                turn.drain_for_outage();
            }
            return false;
        }
    };
    let matches = result.call_id() == &call_id && result.tool() == &tool;
    if matches && turn.is_open() && !turn.signals().hard_raised() {
        let code = result.error().map(|err| err.code.clone());
        let data = CallEventData::completed(call_id, tool, step, result.status(), code);
        turn.events().push_prepaid(CALL_COMPLETED, data);
    }
    matches
}

/// The seat's answer once the kernel answered: a kernel failure as the
/// error the plugin sees, a result that does not name the call refused.
fn answer(
    turn: &Turn,
    outcome: Result<ToolResult, KernelError>,
    matches: bool,
) -> Result<ToolResult, HostCallError> {
    // The result is moved once, straight into the answer.
    match outcome {
        Ok(result) if matches => Ok(result),
        Ok(_) => Err(HostCallError::new(
            ErrorKind::Internal,
            "Kernel returned an invalid tool result",
        )),
        Err(err) => Err(kernel_failure(turn, err)),
    }
}

/// A kernel failure as the error the plugin sees.
fn kernel_failure(turn: &Turn, err: KernelError) -> HostCallError {
    match err {
        KernelError::AuditUnavailable { .. } => HostCallError::new(
            ErrorKind::AuditUnavailable,
            "The audit sink could not record this call's decision; the turn is ending.",
        ),
        KernelError::Interrupted | KernelError::Aborted => HostCallError::new(
            ErrorKind::Cancelled,
            "The call was interrupted by the turn's abort.",
        ),
        KernelError::Failed(msg) => {
            tracing::warn!(execution_id = %turn.execution_id(), error = %msg, "kernel port failed");
            HostCallError::new(
                ErrorKind::Internal,
                "The kernel could not answer this call.",
            )
        }
    }
}

impl EnvelopeHost {
    /// Steps 10–11: the call with the kernel. The bookkeeping is tied to
    /// the kernel's own work, so a call the seat stopped waiting for still
    /// counts as outstanding: the work runs in this task while it is
    /// awaited; if the hard signal wins it goes on as a task of its own
    /// (`RunToEnd`), still counted as in flight.
    async fn with_kernel(
        &self,
        call: ToolCall,
        step: Option<u64>,
        offered: Offered,
    ) -> Result<ToolResult, HostCallError> {
        let turn = self.turn.clone();
        let Some(kernel_turn) = turn.authority().kernel_turn() else {
            return Err(HostCallError::closed());
        };
        let admitted = turn.gate().admit_offered(offered);
        let abort = turn.signals().kernel_abort();
        let context = turn.context_now();
        // The call moves into the kernel's work; the bookkeeping keeps its
        // id and tool (to check the result and name `tool.completed`), and
        // what the seat's answer needs of it (whether the result names this
        // call) comes back with the outcome. The kernel's future is the
        // work's one box; the bookkeeping runs in its last poll.
        let named = (call.id.clone(), call.tool.clone());
        let settle = move |outcome: Result<ToolResult, KernelError>| {
            let matches = settle_call(&turn, named, step, &admitted, &outcome);
            drop(admitted);
            (outcome, matches)
        };
        let kernel = kernel_turn.invoke_tool_owned(context, call, abort);
        let mut work = RunToEnd::new(kernel.map(settle));
        // The work raced with the hard signal, the work polled first. The
        // signal's wait is made only once the work did not answer at a
        // poll: a call answered in its first poll never makes it.
        let signals = self.turn.signals();
        let mut aborted = std::pin::pin!(None);
        let raced = std::future::poll_fn(|cx| {
            if let Poll::Ready(joined) = Pin::new(&mut work).poll(cx) {
                return Poll::Ready(Some(joined));
            }
            if aborted.is_none() {
                aborted.set(Some(signals.aborted()));
            }
            match aborted.as_mut().as_pin_mut() {
                Some(wait) => wait.poll(cx).map(|()| None),
                None => Poll::Pending,
            }
        });
        let Some(joined) = raced.await else {
            return Err(HostCallError::new(
                ErrorKind::Cancelled,
                "The turn was aborted while the call was with the kernel.",
            ));
        };
        let (outcome, matches) = match joined {
            Ok(done) => done,
            Err(Panicked) => (
                Err(KernelError::Failed("the kernel task panicked".into())),
                false,
            ),
        };
        answer(&self.turn, outcome, matches)
    }
}

#[async_trait]
impl RuntimeHost for EnvelopeHost {
    fn limits(&self) -> RuntimeLimits {
        self.turn.limits()
    }

    async fn invoke_tool(
        &self,
        call: ToolCall,
        step: Option<u64>,
    ) -> Result<ToolResult, HostCallError> {
        let turn = &self.turn;
        // 1. A call after close or after the hard abort.
        if self.closed() {
            return Err(HostCallError::closed());
        }
        // 2–3. The call and step shapes are checked by their types (a
        // malformed call never reaches here: the wire answers -32602).
        // 4. The call pays for its `tool.completed` now, so its answer is
        // never refused for the budget. Over the budget the turn is stopped
        // (`rate_limit_exceeded`, or `turn_memory_exceeded` for the byte
        // ledger) and the call rejected as after an abort.
        let requested = CallEventData::requested(call.id.clone(), call.tool.clone(), step);
        if !turn.push_plugin_event(
            CALL_REQUESTED,
            EventData::Call(requested),
            1,
            COMPLETION_EXTRA_BYTES,
        ) {
            return Err(HostCallError::closed());
        }
        // 5. Draining.
        if turn.signals().soft_raised() {
            return Ok(self.refuse(&call, step, TURN_DRAINING, None).await);
        }
        // 6–8. The step and call ceilings.
        if let Err(code) = turn.gate().count(step, &turn.limits()) {
            return Ok(self.refuse(&call, step, code, None).await);
        }
        // 9. Catalogue.
        let Some(offered) = turn.gate().offered(call.tool.as_str()) else {
            return Ok(self
                .refuse(&call, step, TOOL_UNAVAILABLE, Some("not_offered"))
                .await);
        };
        // 10–11. The kernel, raced with the hard signal.
        let result = self.with_kernel(call, step, offered).await?;
        // 12. Check the host again. (13, `tool.completed`, was written by
        // the mediated call.)
        if self.closed() {
            return Err(HostCallError::closed());
        }
        Ok(result)
    }

    fn emit(&self, event: RuntimeEvent) -> Result<(), HostCallError> {
        if self.closed() {
            return Err(HostCallError::closed());
        }
        let turn = &self.turn;
        let data =
            json!({"runtime": turn.runtime_ref(), "type": event.kind.as_str(), "data": event.data});
        // Over the turn's event budget the seat is stopped; the emit is
        // answered as one after the abort.
        if !turn.push_plugin_event(EventKind::RuntimeEvent, data.into(), 0, 0) {
            return Err(HostCallError::closed());
        }
        Ok(())
    }

    fn annotate(&self, key: &str, value: Value) -> Result<(), HostCallError> {
        check_annotation(key)?;
        self.turn.annotate(key, value);
        Ok(())
    }

    fn draining(&self) -> Signal {
        self.turn.signals().draining()
    }
}
