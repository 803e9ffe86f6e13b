//! How a turn ends: the ending a runtime's outcome makes (B.1 step 16)
//! and the catch path (step 17).

use std::sync::Arc;

use serde_json::json;
use sharedos_kernel::KernelError;
use sharedos_plugin_sdk::Signal;
use sharedos_protocol::{Escalation, EscalationStatus, ExecutionStatus, RuntimeTurnOutcome};

use super::ending::*;
use super::events::TURN_MEMORY_EXCEEDED;
use super::turn::Turn;
use super::{Caught, ESCALATE_TOOL, Executor, RuntimeDiagnosis, TurnError};

impl Executor {
    /// Step 16 of B.1: the ending a runtime's outcome makes.
    pub(super) async fn ending_of(
        &self,
        turn: &Arc<Turn>,
        kernel_turn: &Arc<dyn sharedos_kernel::KernelTurn>,
        hard: &Signal,
        outcome: RuntimeTurnOutcome,
    ) -> Result<(Ending, Option<&'static str>), Caught> {
        let metadata = outcome_metadata(&outcome);
        match outcome {
            RuntimeTurnOutcome::Complete { output, .. } => {
                turn.events().push_envelope("turn.completed", json!({}));
                Ok((
                    Ending {
                        status: ExecutionStatus::Succeeded,
                        output: Some(output),
                        error: None,
                        escalation: None,
                        outcome_metadata: metadata,
                    },
                    None,
                ))
            }
            RuntimeTurnOutcome::Fail { error, .. } => {
                turn.events()
                    .push_envelope("turn.failed", failed_event(error.code.as_str(), "runtime"));
                let error = lower_retryable(error, turn.gate().safe_to_retry());
                Ok((
                    Ending {
                        status: ExecutionStatus::Failed,
                        output: None,
                        error: Some(error),
                        escalation: None,
                        outcome_metadata: metadata,
                    },
                    Some("runtime"),
                ))
            }
            RuntimeTurnOutcome::Escalate { reason, .. } => {
                self.escalation(turn, kernel_turn, hard, reason, metadata)
                    .await
            }
        }
    }

    /// An `escalate` outcome: honoured only when the catalogue offers
    /// escalation, and recorded with the kernel.
    async fn escalation(
        &self,
        turn: &Arc<Turn>,
        kernel_turn: &Arc<dyn sharedos_kernel::KernelTurn>,
        hard: &Signal,
        reason: sharedos_protocol::Text<1, 512>,
        metadata: Option<serde_json::Map<String, serde_json::Value>>,
    ) -> Result<(Ending, Option<&'static str>), Caught> {
        let offered = turn.gate().offers(ESCALATE_TOOL);
        if !offered {
            turn.events()
                .push_envelope("turn.failed", failed_event("tool_unavailable", "envelope"));
            let mut ending = Ending::failed("tool_unavailable", MSG_ESCALATE_NOT_OFFERED, false);
            ending.outcome_metadata = metadata;
            return Ok((ending, Some("envelope")));
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
        turn.events().push_envelope(
            "turn.escalated",
            json!({"reason": escalation.reason, "reviewer": escalation.reviewer}),
        );
        Ok((
            Ending {
                status: ExecutionStatus::Escalated,
                output: None,
                error: None,
                escalation: Some(escalation),
                outcome_metadata: metadata,
            },
            None,
        ))
    }

    /// The catch path of B.1 step 17.
    pub(super) async fn catch(
        &self,
        turn: &Arc<Turn>,
        caught: Caught,
        diagnosis: Option<&RuntimeDiagnosis>,
    ) -> (Ending, Option<&'static str>) {
        let signals = turn.signals();
        if signals.soft_raised() && !signals.hard_raised() && !turn.gate().idle() {
            let hard = signals.hard();
            tokio::select! {
                _ = turn.gate().wait_idle() => {}
                _ = hard.raised() => {}
            }
        }
        if let Some(KernelError::AuditUnavailable { cause, .. }) = turn.authority().outage() {
            turn.events()
                .push_envelope("turn.failed", failed_event(AUDIT_UNAVAILABLE, "envelope"));
            self.report_turn_error(turn, TurnError::AuditUnavailable { cause });
            return (
                Ending::failed(AUDIT_UNAVAILABLE, MSG_AUDIT, turn.gate().safe_to_retry()),
                Some("envelope"),
            );
        }
        // A violation stops the seat like an abort, but the turn failed: it
        // is the runtime's doing, not the deadline's or the host's.
        // Every envelope violation is the plugin's doing and repeats on a
        // retry: never retryable.
        if let Some(reason) = turn.violation() {
            let (code, message) = if reason == EGRESS_BUDGET_EXCEEDED {
                (EGRESS_BUDGET_EXCEEDED, MSG_EGRESS_BUDGET)
            } else {
                (RUNTIME_FAILED, MSG_RUNTIME_FAILED)
            };
            turn.events()
                .push_envelope("turn.failed", failed_event(code, "envelope"));
            self.report_turn_error(turn, TurnError::Violation { reason });
            let mut details = json!({"reason": reason});
            if reason == TURN_MEMORY_EXCEEDED {
                // What to fix: the limit the plugin's writes went past.
                details["limitBytes"] = json!(self.options.max_turn_bytes);
            }
            return (
                Ending::failed(code, message, false).with_details(details),
                Some("envelope"),
            );
        }
        if signals.soft_raised() {
            turn.events().push_envelope("turn.cancelled", json!({}));
            let cause = signals.cause().unwrap_or("drain");
            return (Ending::cancelled(turn.gate().safe_to_retry(), cause), None);
        }
        turn.events()
            .push_envelope("turn.failed", failed_event(RUNTIME_FAILED, "envelope"));
        let error = match caught {
            Caught::Runtime(e) => TurnError::Runtime(e),
            Caught::Kernel(e) => TurnError::Kernel(e.to_string()),
            Caught::Aborted => TurnError::Kernel("aborted".into()),
        };
        self.report_turn_error(turn, error);
        // A deterministic failure (a stream violation, a refused
        // handshake) would happen again: not retryable whatever the turn did.
        let ending = match diagnosis {
            Some(d) => Ending::failed(
                RUNTIME_FAILED,
                MSG_RUNTIME_FAILED,
                turn.gate().safe_to_retry() && !d.deterministic,
            )
            .with_details(json!({"reason": d.reason})),
            None => Ending::failed(
                RUNTIME_FAILED,
                MSG_RUNTIME_FAILED,
                turn.gate().safe_to_retry(),
            ),
        };
        (ending, Some("envelope"))
    }
}
