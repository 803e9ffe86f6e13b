//! How a turn ends: the ending a runtime's outcome makes (B.1 step 16)
//! and the catch path (step 17).

use std::sync::Arc;

use serde_json::json;
use sharedos_kernel::KernelError;
use sharedos_plugin_sdk::Signal;
use sharedos_protocol::{Escalation, EscalationStatus, RuntimeTurnOutcome};

use super::ending::*;
use super::events::TURN_MEMORY_EXCEEDED;
use super::turn::Turn;
use sharedos_protocol::ESCALATE_TOOL;

use super::{Caught, Executor, RuntimeDiagnosis, TurnError};

impl Executor {
    /// Step 16 of B.1: the ending a runtime's outcome makes.
    pub(super) async fn ending_of(
        &self,
        turn: &Arc<Turn>,
        kernel_turn: &Arc<dyn sharedos_kernel::KernelTurn>,
        hard: &Signal,
        outcome: RuntimeTurnOutcome,
    ) -> Result<Ending, Caught> {
        let metadata = outcome_metadata(&outcome);
        let ending = match outcome {
            RuntimeTurnOutcome::Complete { output, .. } => Ending::completed(output),
            RuntimeTurnOutcome::Fail { error, .. } => {
                let error = lower_retryable(error, turn.gate().safe_to_retry());
                Ending::failed_by_runtime(error)
            }
            RuntimeTurnOutcome::Escalate { reason, .. } => {
                self.escalation(turn, kernel_turn, hard, reason).await?
            }
        };
        Ok(ending.with_metadata(metadata))
    }

    /// An `escalate` outcome: honoured only when the catalogue offers
    /// escalation, and recorded with the kernel.
    async fn escalation(
        &self,
        turn: &Arc<Turn>,
        kernel_turn: &Arc<dyn sharedos_kernel::KernelTurn>,
        hard: &Signal,
        reason: sharedos_protocol::Text<1, 512>,
    ) -> Result<Ending, Caught> {
        if !turn.gate().offers(ESCALATE_TOOL) {
            return Ok(Ending::failed(
                "tool_unavailable",
                MSG_ESCALATE_NOT_OFFERED,
                false,
            ));
        }
        let context = turn.context_now();
        let recorded = tokio::select! {
            biased;
            _ = hard.raised() => return Err(Caught::Aborted),
            r = kernel_turn.record_escalation(&context, turn.execution_id(), &reason) => r,
        };
        let escalation = match recorded {
            Ok(e) => e,
            Err(e @ KernelError::AuditUnavailable { .. }) => {
                turn.note_audit_outage(&e);
                return Err(Caught::Kernel(e));
            }
            Err(e) => {
                tracing::warn!(execution_id = %turn.execution_id(), error = %e, "recording the escalation failed");
                Escalation {
                    reason: reason.clone(),
                    reviewer: turn.authority().context().owner.clone(),
                    requested_at: turn.now(),
                    requested_authority: None,
                    status: EscalationStatus::Pending,
                }
            }
        };
        Ok(Ending::escalated(escalation))
    }

    /// The catch path of B.1 step 17: a drain waits for the calls in
    /// flight, then the ending names the first cause (an audit outage, a
    /// violation, a stop, the runtime's failure).
    pub(super) async fn catch(
        &self,
        turn: &Arc<Turn>,
        caught: Caught,
        diagnosis: Option<&RuntimeDiagnosis>,
    ) -> Ending {
        let signals = turn.signals();
        if signals.soft_raised() && !signals.hard_raised() && !turn.gate().idle() {
            let hard = signals.hard();
            tokio::select! {
                _ = turn.gate().wait_idle() => {}
                _ = hard.raised() => {}
            }
        }
        if let Some(KernelError::AuditUnavailable { cause, .. }) = turn.authority().outage() {
            self.report_turn_error(turn, TurnError::AuditUnavailable { cause });
            return Ending::failed(AUDIT_UNAVAILABLE, MSG_AUDIT, turn.gate().safe_to_retry());
        }
        // A violation stops the seat like an abort, but the turn failed: it
        // is the runtime's doing, not the deadline's or the host's.
        if let Some(reason) = turn.violation() {
            return self.violation_ending(turn, reason);
        }
        if signals.soft_raised() {
            let cause = signals.cause().unwrap_or("drain");
            return Ending::cancelled(turn.gate().safe_to_retry(), cause);
        }
        let error = match caught {
            Caught::Runtime(e) => TurnError::Runtime(e),
            Caught::Kernel(e) => TurnError::Kernel(e.to_string()),
            Caught::Aborted => TurnError::Kernel("aborted".into()),
        };
        self.report_turn_error(turn, error);
        // A deterministic failure (a stream violation, a refused
        // handshake) would happen again: not retryable whatever the turn did.
        let safe = turn.gate().safe_to_retry();
        match diagnosis {
            Some(d) => Ending::failed(RUNTIME_FAILED, MSG_RUNTIME_FAILED, safe && !d.deterministic)
                .with_details(json!({"reason": d.reason})),
            None => Ending::failed(RUNTIME_FAILED, MSG_RUNTIME_FAILED, safe),
        }
    }

    /// An envelope violation is the plugin's doing and repeats on a retry:
    /// never retryable. A model that kept failing may come back: retryable,
    /// unless its provider refused the key.
    fn violation_ending(&self, turn: &Turn, reason: &'static str) -> Ending {
        let (code, message, retryable) = match reason {
            EGRESS_BUDGET_EXCEEDED => (EGRESS_BUDGET_EXCEEDED, MSG_EGRESS_BUDGET, false),
            MODEL_UNAVAILABLE => (MODEL_UNAVAILABLE, MSG_MODEL_UNAVAILABLE, true),
            MODEL_ACCESS_REFUSED => (MODEL_ACCESS_REFUSED, MSG_MODEL_ACCESS_REFUSED, false),
            _ => (RUNTIME_FAILED, MSG_RUNTIME_FAILED, false),
        };
        self.report_turn_error(turn, TurnError::Violation { reason });
        let mut details = json!({"reason": reason});
        if reason == TURN_MEMORY_EXCEEDED {
            // What to fix: the limit the plugin's writes went past.
            details["limitBytes"] = json!(self.options.max_turn_bytes);
        }
        Ending::failed(code, message, retryable).with_details(details)
    }
}
