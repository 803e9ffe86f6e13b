//! Every ending of the envelope (envelope.md B.9) across the process
//! boundary: the real executor, a real kernel with the JSONL audit sink,
//! and `sharedos-testplugin` seated through `ProcessRuntime`, launched
//! directly and through the sandbox (default policy: level strong, or isolated without a memory controller) where
//! the kill matters. Each ending's result is checked exactly (status,
//! code, `retryable`, final event, annotations, `metadata.runtime` with
//! the sandbox report), the audit `turn.ended` record, and that no process
//! of the turn survives it.
//!
//! Deadlines are measured with a generous margin (`timeoutMs` + 3 s): the
//! machine is shared.

use std::time::Duration;

use serde_json::{Value, json};
use sharedos_host::executor::TurnError;
use sharedos_protocol::ExecutionStatus;
use sharedos_tests::turns::{Launch, TurnRun, TurnSpec, kill_marked, run_turn, wait_gone};

/// Both launchers for one scenario: `name::direct` and `name::sandbox`.
macro_rules! both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn direct() {
                super::$name(Launch::Direct).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sandbox() {
                super::$name(Launch::Sandbox).await;
            }
        }
    )*};
}

/// The generous margin past a deadline within which the turn must end.
const MARGIN: Duration = Duration::from_secs(3);

fn outcome_str(r: &sharedos_kernel::AuditRecord) -> String {
    serde_json::to_value(r.outcome)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The audit `turn.ended`: outcome, reason, endedBy.
fn assert_turn_ended(run: &TurnRun, outcome: &str, reason: Option<&str>, ended_by: Option<&str>) {
    let r = run.turn_ended();
    assert_eq!(outcome_str(r), outcome, "turn.ended: {r:?}");
    assert_eq!(r.reason.as_deref(), reason, "turn.ended reason: {r:?}");
    assert_eq!(r.ended_by.as_deref(), ended_by, "turn.ended endedBy: {r:?}");
    assert_eq!(r.operation_id.as_deref(), Some("exec-1"));
}

fn assert_failed_by_envelope(run: &TurnRun, code: &str) {
    assert_eq!(
        run.result.status,
        ExecutionStatus::Failed,
        "{:?}",
        run.result
    );
    assert_eq!(run.code(), Some(code));
    assert_eq!(
        run.last_event(),
        (
            "turn.failed".into(),
            json!({"code": code, "source": "envelope"})
        )
    );
    assert_turn_ended(run, "failed", Some(code), Some("envelope"));
}

fn assert_cancelled(run: &TurnRun, retryable: bool) {
    assert_eq!(
        run.result.status,
        ExecutionStatus::Cancelled,
        "{:?}",
        run.result
    );
    assert_eq!(run.code(), Some("turn_cancelled"));
    assert_eq!(run.retryable(), Some(retryable));
    assert_eq!(run.last_event(), ("turn.cancelled".into(), json!({})));
    assert!(
        run.turn_errors.is_empty(),
        "a cancelled turn is never reported to on_turn_error: {:?}",
        run.turn_errors
    );
    assert_turn_ended(run, "failed", Some("turn_cancelled"), None);
}

fn assert_runtime_error_reported(run: &TurnRun) {
    assert!(
        matches!(run.turn_errors.as_slice(), [TurnError::Runtime(_)]),
        "on_turn_error: {:?}",
        run.turn_errors
    );
}

/// The deadline held: the turn ended no earlier than (just under) its
/// limit and well within the margin.
/// `error.details`, as JSON.
fn details(run: &TurnRun) -> Value {
    json!(run.result.error.as_ref().and_then(|e| e.details.clone()))
}

fn assert_ended_by_deadline(run: &TurnRun, timeout_ms: u64) {
    assert_eq!(
        details(run),
        json!({"cause": "deadline"}),
        "a deadline says so, unlike a cancellation"
    );
    let limit = Duration::from_millis(timeout_ms);
    eprintln!("deadline {timeout_ms} ms: the turn took {:?}", run.elapsed);
    assert!(
        run.elapsed + Duration::from_millis(100) >= limit,
        "ended before the deadline: {:?}",
        run.elapsed
    );
    assert!(
        run.elapsed < limit + MARGIN,
        "the deadline of {timeout_ms} ms did not end the turn in time: {:?}",
        run.elapsed
    );
}

fn annotate(key: &str, value: Value) -> Value {
    json!({"op": "annotate", "key": key, "value": value})
}

fn write_call(path: &str) -> Value {
    json!({"op": "call", "tool": "files.write", "arguments": {"path": path, "content": "x"}})
}

fn ledger_call() -> Value {
    json!({"op": "call", "tool": "ledger.append", "arguments": {"entry": 1}})
}

async fn deadline_stops(launch: Launch, script: Value) -> TurnRun {
    let run = run_turn(TurnSpec::new(launch, script).timeout(1500)).await;
    assert_cancelled(&run, true);
    assert_ended_by_deadline(&run, 1500);
    run.assert_provenance(launch);
    run
}

mod audit_outage;
mod broken;
mod cancel;
mod deadline;
mod exits;
mod hostile;
mod observers;
mod outcomes;
