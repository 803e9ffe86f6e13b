//! The one way out of a turn (envelope.md B.9): whatever ended it, the
//! host closes, the ending's event is written as the last of the log, the
//! result is built with the seat's provenance, the end is recorded with
//! the kernel, and the sealed log moves into the result once the observer
//! has seen it.

use serde_json::{Value, json};
use sharedos_kernel::TurnEnd;
use sharedos_protocol::{ExecutionResult, ExecutionStatus, Timestamp};

use super::ending::{Ending, TURN_CANCELLED, build};
use super::turn::Turn;
use super::{Executor, TurnReport};

/// How long the result of a stopped turn waits, at most, for its process
/// to be gone (the deferred kill waits up to 250 ms for a `turn/abort` to
/// reach the plugin, then kills and reaps the tree).
const STOPPED_PROCESS_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Executor {
    /// Ends the turn. `report`: the seat's report, `None` when the turn
    /// ended before the deadline machinery started (a context mismatch,
    /// a caller that cancelled first), whose result names the runtime only.
    /// The event log moves into the result rather than being copied: the
    /// log of a busy turn holds two events a tool call, and a copy of it was
    /// a tenth of the host's work per call.
    pub(super) async fn finish(
        &self,
        turn: &Turn,
        mut ending: Ending,
        started_at: Timestamp,
        report: Option<&TurnReport>,
    ) -> ExecutionResult {
        // Held past the close: `turn.ended` follows the opening's records.
        let kernel_turn = turn.authority().kernel_turn();
        turn.close();
        if let Some((kind, data)) = ending.event.take() {
            // The ending seals the log: nothing is written after it.
            turn.events().push_envelope(kind, data);
        }
        let mut runtime = match report {
            Some(report) => self.turn_provenance(turn, report),
            None => self.runtime_provenance(None),
        };
        if ending.status == ExecutionStatus::Cancelled
            && let Some(report) = report
            && report.diagnosis().is_none()
        {
            // A stopped turn says how its process ended too: by itself on
            // the `turn/abort`, or by the host's kill, waited for (bounded).
            if let Some(process) = report.process_end_within(STOPPED_PROCESS_WAIT).await {
                tracing::info!(
                    execution_id = %turn.execution_id(),
                    process = %process,
                    "the stopped turn's plugin process ended"
                );
                runtime["process"] = process;
            }
        }
        let with_annotations = ending.status != ExecutionStatus::Denied;
        let ended_by = ending.ended_by;
        let mut result = build(turn, ending, started_at, &runtime, with_annotations);
        if let Some(kernel_turn) = kernel_turn {
            // A turn stopped while they were being committed: the end is
            // recorded after them (their failure is already the turn's).
            let _ = kernel_turn.opened().await;
        }
        self.record_end(turn, &result, ended_by).await;
        turn.events().flush_delivery().await;
        result.events = turn.events().take();
        result
    }

    /// `metadata.runtime`: the manifest's id, version, protocol version and
    /// metadata, and the sandbox report when there is one.
    fn runtime_provenance(&self, sandbox: Option<Value>) -> Value {
        let mut v = self.runtime_ref();
        if let Some(md) = &self.seat.manifest.metadata {
            v["metadata"] = Value::Object(md.clone());
        }
        if let Some(r) = sandbox {
            v["sandbox"] = r;
        }
        v
    }

    /// `metadata.runtime` of a turn that ran: the seat's report (the
    /// sandbox, the affinity, the process's diagnosis, the protocol
    /// violations its peer counted) and the warnings.
    fn turn_provenance(&self, turn: &Turn, report: &TurnReport) -> Value {
        let mut runtime = self.runtime_provenance(report.sandbox());
        if let Some(a) = report.affinity() {
            runtime["affinity"] = a;
        }
        if let Some(p) = report.program() {
            runtime["programSha256"] = json!(p.sha256.hex());
            runtime["programPinned"] = json!(true);
        }
        if let Some(cli) = report.cli() {
            runtime["harnessCliSha256"] = json!(cli.hex());
        }
        if let Some(d) = report.diagnosis() {
            runtime["process"] = d.process;
        }
        if let Some(v) = report.protocol_violations() {
            tracing::warn!(
                execution_id = %turn.execution_id(),
                protocol_violations = %v,
                "the turn ended with messages of the runtime's dropped and counted"
            );
            runtime["protocolViolations"] = v;
        }
        if let Some(w) = self.no_working_time(turn.limits().timeout_ms) {
            runtime["warnings"] = json!([w]);
        }
        if let Some(egress) = turn.egress() {
            runtime["egress"] = egress.clone();
        }
        runtime
    }

    async fn record_end(
        &self,
        turn: &Turn,
        result: &ExecutionResult,
        ended_by: Option<&'static str>,
    ) {
        let reason_code = match result.status {
            ExecutionStatus::Succeeded | ExecutionStatus::Escalated => None,
            ExecutionStatus::Cancelled => Some(
                result
                    .code()
                    .map(str::to_owned)
                    .unwrap_or_else(|| TURN_CANCELLED.to_owned()),
            ),
            _ => result.code().map(str::to_owned),
        };
        let mut context = turn.authority().context().clone();
        context.now = result.completed_at.clone();
        let end = TurnEnd {
            execution_id: turn.execution_id().clone(),
            status: result.status,
            reason_code,
            ended_by: ended_by.map(str::to_owned),
        };
        if let Err(e) = self.kernel.record_turn_end(&context, end).await {
            tracing::warn!(execution_id = %turn.execution_id(), error = %e, "recording the end of the turn failed");
        }
    }
}
