//! Every ending of the envelope (envelope.md B.9) across the process
//! boundary: the real executor, a real kernel with the JSONL audit sink,
//! and `sharedos-testplugin` seated through `ProcessRuntime`, launched
//! directly and through the sandbox (default policy, level strong) where
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

// ---------------------------------------------------------------- completed

async fn completed(launch: Launch) {
    let run = run_turn(TurnSpec::new(
        launch,
        json!([
            {"op": "emit_pid"},
            {"op": "emit", "type": "progress", "data": {"n": 1}},
            annotate("note", json!("kept")),
            write_call("notes/a.txt"),
        ]),
    ))
    .await;
    assert_eq!(
        run.result.status,
        ExecutionStatus::Succeeded,
        "{:?}",
        run.result
    );
    assert_eq!(run.result.error, None);
    let output = run.result.output.clone().expect("output");
    assert_eq!(
        output["results"][0]["result"]["status"], "succeeded",
        "{output}"
    );
    assert_eq!(run.last_event(), ("turn.completed".into(), json!({})));
    assert_eq!(run.runtime_events("progress"), vec![json!({"n": 1})]);
    assert_eq!(run.result.metadata.get("note"), Some(&json!("kept")));
    run.assert_provenance(launch);
    assert!(run.turn_errors.is_empty(), "{:?}", run.turn_errors);
    assert_turn_ended(&run, "succeeded", None, None);
    // The write happened, under the agent's directory.
    let written = run.files_root.join("endings/alice/notes/a.txt");
    assert_eq!(std::fs::read_to_string(&written).unwrap(), "x");
    // The streamed events are the result's events.
    assert_eq!(run.streamed, run.result.events);
    run.assert_no_survivor();
}

// --------------------------------------------------------------- plugin fail

fn fail_outcome() -> Value {
    json!({"op": "outcome", "value": {"type": "fail",
        "error": {"code": "harness_failed", "message": "the harness failed", "retryable": true},
        "metadata": {"harness": "x"}}})
}

/// A non-idempotent write reached the kernel: the plugin's `retryable:
/// true` is lowered to `false`.
async fn plugin_fail_after_write_is_lowered(launch: Launch) {
    let run = run_turn(TurnSpec::new(
        launch,
        json!([ledger_call(), annotate("note", json!(1)), fail_outcome()]),
    ))
    .await;
    assert_eq!(
        run.result.status,
        ExecutionStatus::Failed,
        "{:?}",
        run.result
    );
    assert_eq!(run.code(), Some("harness_failed"));
    assert_eq!(run.retryable(), Some(false));
    assert_eq!(
        run.last_event(),
        (
            "turn.failed".into(),
            json!({"code": "harness_failed", "source": "runtime"})
        )
    );
    assert_eq!(run.result.metadata.get("harness"), Some(&json!("x")));
    assert_eq!(run.result.metadata.get("note"), Some(&json!(1)));
    run.assert_provenance(launch);
    assert!(run.turn_errors.is_empty(), "{:?}", run.turn_errors);
    assert_turn_ended(&run, "failed", Some("harness_failed"), Some("runtime"));
    run.assert_no_survivor();
}

/// Only an idempotent write (`files.write`) and a read: the plugin's
/// `retryable: true` stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_fail_after_idempotent_write_keeps_retryable() {
    let run = run_turn(TurnSpec::new(
        Launch::Direct,
        json!([
            write_call("a.txt"),
            {"op": "call", "tool": "files.read", "arguments": {"path": "a.txt"}},
            fail_outcome()
        ]),
    ))
    .await;
    assert_eq!(run.code(), Some("harness_failed"));
    assert_eq!(run.retryable(), Some(true));
    run.assert_no_survivor();
}

/// The lowering only ever lowers: `false` and an absent `retryable` stay as
/// the plugin said, even with no effect behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_fail_retryable_false_or_absent_is_kept() {
    for (error, expected) in [
        (
            json!({"code": "harness_failed", "message": "m", "retryable": false}),
            Some(false),
        ),
        (json!({"code": "harness_failed", "message": "m"}), None),
    ] {
        let run = run_turn(TurnSpec::new(
            Launch::Direct,
            json!([{"op": "outcome", "value": {"type": "fail", "error": error}}]),
        ))
        .await;
        assert_eq!(run.code(), Some("harness_failed"));
        assert_eq!(run.retryable(), expected, "{error}");
        run.assert_no_survivor();
    }
}

// ---------------------------------------------------------------- escalation

async fn escalated_when_offered(launch: Launch) {
    let run = run_turn(
        TurnSpec::new(
            launch,
            json!([
                annotate("note", json!("kept")),
                {"op": "outcome", "value": {"type": "escalate", "reason": "needs delete rights", "metadata": {"m": 1}}}
            ]),
        )
        .tools(&["files.read", "sharedos.escalate"]),
    )
    .await;
    assert_eq!(
        run.result.status,
        ExecutionStatus::Escalated,
        "{:?}",
        run.result
    );
    assert_eq!(run.result.error, None);
    let esc = serde_json::to_value(run.result.escalation.as_ref().expect("escalation")).unwrap();
    assert_eq!(esc["reason"], "needs delete rights");
    assert_eq!(
        esc["reviewer"],
        json!({"kind": "human", "userId": "operator"})
    );
    assert_eq!(esc["status"], "pending");
    assert_eq!(
        run.last_event(),
        (
            "turn.escalated".into(),
            json!({"reason": "needs delete rights", "reviewer": {"kind": "human", "userId": "operator"}})
        )
    );
    assert_eq!(run.result.metadata.get("m"), Some(&json!(1)));
    assert_eq!(run.result.metadata.get("note"), Some(&json!("kept")));
    run.assert_provenance(launch);
    let rec = run
        .audit
        .iter()
        .find(|r| r.kind == "escalation.requested")
        .expect("an escalation.requested record");
    assert_eq!(outcome_str(rec), "escalated");
    assert_eq!(rec.reason.as_deref(), Some("escalation_requested"));
    let md = serde_json::to_value(rec.metadata.as_ref().unwrap()).unwrap();
    assert_eq!(md["detail"], "needs delete rights", "{md}");
    assert_eq!(
        md["reviewer"],
        json!({"kind": "human", "userId": "operator"})
    );
    assert_eq!(md["reviewerAssumed"], true);
    assert_eq!(md["resolution"], "pending");
    assert_turn_ended(&run, "escalated", None, None);
    run.assert_no_survivor();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalate_not_offered_is_tool_unavailable() {
    let run = run_turn(TurnSpec::new(
        Launch::Direct,
        json!([
            annotate("note", json!("kept")),
            {"op": "outcome", "value": {"type": "escalate", "reason": "needs delete rights", "metadata": {"m": 1}}}
        ]),
    ))
    .await;
    assert_failed_by_envelope(&run, "tool_unavailable");
    assert_eq!(run.retryable(), Some(false));
    assert_eq!(run.result.escalation, None);
    assert_eq!(run.result.metadata.get("m"), Some(&json!(1)));
    assert_eq!(run.result.metadata.get("note"), Some(&json!("kept")));
    assert!(!run.event_types().contains(&"turn.escalated"));
    assert!(!run.audit.iter().any(|r| r.kind == "escalation.requested"));
    assert!(run.turn_errors.is_empty());
    run.assert_provenance(Launch::Direct);
    run.assert_no_survivor();
}

// --------------------------------------------------------------- host cancel

/// The host cancels once the plugin has made a non-idempotent write and is
/// stalled: cancelled, not retryable, annotations kept, tree killed.
async fn host_cancel_after_write(launch: Launch) {
    let mut spec = TurnSpec::new(
        launch,
        json!([annotate("note", json!("kept")), ledger_call(), {"op": "emit_pid"}, {"op": "stall"}]),
    );
    spec.cancel_on_event = Some("pid");
    let run = run_turn(spec).await;
    assert_cancelled(&run, false);
    assert_eq!(details(&run), json!({"cause": "caller"}));
    assert_eq!(run.result.metadata.get("note"), Some(&json!("kept")));
    run.assert_provenance(launch);
    assert!(run.elapsed < Duration::from_secs(10), "{:?}", run.elapsed);
    run.assert_no_survivor();
}

/// A cancel with only reads behind it stays retryable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_cancel_after_reads_only_is_retryable() {
    let mut spec = TurnSpec::new(
        Launch::Direct,
        json!([{"op": "call", "tool": "files.list", "arguments": {}}, {"op": "emit_pid"}, {"op": "stall"}]),
    );
    spec.cancel_on_event = Some("pid");
    let run = run_turn(spec).await;
    assert_cancelled(&run, true);
    run.assert_no_survivor();
}

/// The host's signal was already cancelled: `cancelled`, retryable, no
/// event, no kernel call but the `turn.ended` record, and no process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precancelled_turn_starts_nothing() {
    let mut spec = TurnSpec::new(Launch::Direct, json!([{"op": "emit_pid"}]));
    spec.precancel = true;
    let run = run_turn(spec).await;
    assert_eq!(run.result.status, ExecutionStatus::Cancelled);
    assert_eq!(run.code(), Some("turn_cancelled"));
    assert_eq!(run.retryable(), Some(true));
    assert!(run.result.events.is_empty(), "{:?}", run.result.events);
    assert!(run.turn_errors.is_empty());
    let kinds: Vec<&str> = run.audit.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(kinds, ["turn.ended"]);
    assert_turn_ended(&run, "failed", Some("turn_cancelled"), None);
    assert!(run.seen_pids.is_empty());
    run.assert_no_survivor();
}

/// A plugin that never answers `initialize`: the turn's deadline (smaller
/// than the 10 s handshake timeout) ends it, cancelled.
async fn deadline_during_handshake(launch: Launch) {
    let run = run_turn(
        TurnSpec::new(launch, json!([]))
            .mode("silent")
            .timeout(1500),
    )
    .await;
    assert_cancelled(&run, true);
    assert_ended_by_deadline(&run, 1500);
    run.assert_provenance(launch);
    run.assert_no_survivor();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_cancel_during_handshake() {
    let mut spec = TurnSpec::new(Launch::Direct, json!([])).mode("silent");
    spec.cancel_after = Some(Duration::from_millis(500));
    let run = run_turn(spec).await;
    assert_cancelled(&run, true);
    assert!(run.elapsed < Duration::from_secs(5), "{:?}", run.elapsed);
    run.assert_no_survivor();
}

/// The deadline fires while a non-idempotent handler runs: the handler is
/// stopped and recorded `interrupted`, the turn is cancelled and not
/// retryable (a write was with the kernel).
async fn deadline_interrupts_a_running_handler(launch: Launch) {
    let mut run = run_turn(
        TurnSpec::new(
            launch,
            json!([{"op": "emit_pid"}, {"op": "call", "tool": "ledger.slow", "arguments": {"ms": 60000}}]),
        )
        .timeout(1500),
    )
    .await;
    assert_cancelled(&run, false);
    assert_ended_by_deadline(&run, 1500);
    let interrupted = run.wait_audit(Duration::from_secs(5), |r| {
        r.kind == "tool.invoked" && r.tool.as_deref() == Some("ledger.slow")
    });
    assert!(interrupted, "no tool.invoked for the interrupted call");
    let rec = run
        .audit
        .iter()
        .find(|r| r.kind == "tool.invoked" && r.tool.as_deref() == Some("ledger.slow"))
        .unwrap();
    assert_eq!(outcome_str(rec), "interrupted", "{rec:?}");
    assert_eq!(rec.reason.as_deref(), Some("operation_aborted"));
    let auth = run
        .audit
        .iter()
        .position(|r| r.kind == "authorization.checked" && r.operation_id == rec.operation_id)
        .expect("the call was authorized");
    let inv = run.audit.iter().position(|r| r.id == rec.id).unwrap();
    assert!(auth < inv);
    run.assert_provenance(launch);
    run.assert_no_survivor();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_cancel_interrupts_a_running_handler() {
    let mut spec = TurnSpec::new(
        Launch::Direct,
        json!([{"op": "emit_pid"}, {"op": "call", "tool": "ledger.slow", "arguments": {"ms": 60000}}]),
    );
    spec.cancel_after = Some(Duration::from_millis(800));
    let mut run = run_turn(spec).await;
    assert_cancelled(&run, false);
    assert!(run.elapsed < Duration::from_secs(5), "{:?}", run.elapsed);
    assert!(run.wait_audit(Duration::from_secs(5), |r| {
        r.kind == "tool.invoked"
            && r.tool.as_deref() == Some("ledger.slow")
            && outcome_str(r) == "interrupted"
    }));
    run.assert_no_survivor();
}

/// `turn/draining` leaves a call already running alone: it gives its real
/// result and the plugin's outcome during the drain is honoured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_leaves_a_running_call_alone() {
    let run = run_turn(
        TurnSpec::new(
            Launch::Direct,
            json!([{"op": "call", "tool": "ledger.slow", "arguments": {"ms": 1500}}]),
        )
        .timeout(4000)
        .grace(3000),
    )
    .await;
    assert_eq!(
        run.result.status,
        ExecutionStatus::Succeeded,
        "{:?}",
        run.result
    );
    let output = run.result.output.clone().unwrap();
    assert_eq!(
        output["results"][0]["result"]["status"], "succeeded",
        "{output}"
    );
    assert_eq!(output["draining"], true, "{output}");
    run.assert_no_survivor();
}

// ------------------------------------------------------------------ deadline

/// No grace: one signal at the limit, `turn/abort`, the tree killed.
async fn deadline_without_grace(launch: Launch) {
    let run = run_turn(
        TurnSpec::new(
            launch,
            json!([annotate("note", json!("kept")), {"op": "emit_pid"}, {"op": "stall"}]),
        )
        .timeout(1500),
    )
    .await;
    assert_cancelled(&run, true);
    assert_ended_by_deadline(&run, 1500);
    assert_eq!(run.result.metadata.get("note"), Some(&json!("kept")));
    run.assert_provenance(launch);
    run.assert_no_survivor();
}

/// With a grace: `turn/draining` at `timeout − grace` refuses the next call
/// `turn_draining`; the plugin stalls and the hard deadline cancels it.
async fn deadline_with_grace(launch: Launch) {
    let run = run_turn(
        TurnSpec::new(
            launch,
            json!([
                annotate("note", json!("kept")),
                {"op": "emit_pid"},
                {"op": "sleep", "ms": 1400},
                {"op": "call", "tool": "files.read", "arguments": {"path": "a.txt"}},
                {"op": "emit", "type": "after_drain_call", "data": null},
                {"op": "stall"}
            ]),
        )
        .timeout(3000)
        .grace(2000),
    )
    .await;
    assert_cancelled(&run, true);
    assert_ended_by_deadline(&run, 3000);
    let refused = run
        .result
        .events
        .iter()
        .find(|e| e.kind.as_str() == "tool.completed")
        .expect("the call during the drain was answered");
    assert_eq!(refused.data["status"], "denied", "{}", refused.data);
    assert_eq!(refused.data["code"], "turn_draining", "{}", refused.data);
    // emit still works while draining.
    assert_eq!(run.runtime_events("after_drain_call").len(), 1);
    assert_eq!(run.result.metadata.get("note"), Some(&json!("kept")));
    // The refused call never reached the kernel's authorization.
    assert!(
        !run.audit
            .iter()
            .any(|r| r.kind == "authorization.checked" && r.tool.as_deref() == Some("files.read")),
        "a drained call was authorized"
    );
    run.assert_provenance(launch);
    run.assert_no_survivor();
}

/// A grace not below the limit: the turn drains from its first instant,
/// no call is ever taken (ADR 0007), the plugin is told at once, and its
/// outcome is honoured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grace_not_below_the_limit_takes_no_call() {
    let run = run_turn(
        TurnSpec::new(
            Launch::Direct,
            json!([
                {"op": "call", "tool": "files.list", "arguments": {}},
                ledger_call()
            ]),
        )
        .timeout(3000)
        .grace(3000),
    )
    .await;
    assert_eq!(
        run.result.status,
        ExecutionStatus::Succeeded,
        "{:?}",
        run.result
    );
    let output = run.result.output.clone().unwrap();
    assert_eq!(output["draining"], true, "{output}");
    for r in output["results"].as_array().unwrap() {
        assert_eq!(r["result"]["status"], "denied", "{r}");
        assert_eq!(r["result"]["error"]["code"], "turn_draining", "{r}");
    }
    assert!(
        !run.audit
            .iter()
            .any(|r| r.kind == "authorization.checked" && r.tool.is_some()),
        "a call was authorized during the drain"
    );
    run.assert_no_survivor();
}

/// A limit shorter than the launch itself: the turn is cancelled by its
/// deadline wherever the launch is, and nothing is left running.
async fn tiny_deadline_during_launch(launch: Launch) {
    for ms in [1u64, 5, 20, 60] {
        let run = run_turn(
            TurnSpec::new(launch, json!([{"op": "emit_pid"}, {"op": "stall"}])).timeout(ms),
        )
        .await;
        assert_cancelled(&run, true);
        assert!(
            run.elapsed < Duration::from_millis(ms) + MARGIN,
            "{ms}: {:?}",
            run.elapsed
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        run.assert_no_survivor();
    }
}

/// Runs a turn whose plugin holds on reading and logs the signals it reads;
/// returns `(method, ms since the turn began)` for each.
async fn signals_on_the_wire(timeout_ms: u64, grace_ms: u64) -> Vec<(String, u64)> {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("signals.log");
    let mut spec = TurnSpec::new(Launch::Direct, json!([{"op": "hold"}]))
        .timeout(timeout_ms)
        .grace(grace_ms);
    spec.env = vec![("SHAREDOS_TEST_SIGNAL_LOG".into(), log.display().to_string())];
    let started_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let run = run_turn(spec).await;
    assert_cancelled(&run, true);
    run.assert_no_survivor();
    std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let (m, t) = l.split_once(' ').unwrap();
            (m.to_owned(), t.parse::<u64>().unwrap() - started_ms)
        })
        .collect()
}

/// On the wire: `turn/draining` reaches the plugin at `timeout − grace`;
/// the hard stop at the limit kills it (a `turn/abort` it reads before the
/// kill comes at the limit, never earlier).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_sends_draining_on_the_wire_then_stops_at_the_limit() {
    let signals = signals_on_the_wire(2500, 1500).await;
    let methods: Vec<&str> = signals.iter().map(|(m, _)| m.as_str()).collect();
    assert!(
        methods == ["turn/draining"] || methods == ["turn/draining", "turn/abort"],
        "{signals:?}"
    );
    assert!(
        (1000..1000 + 3000).contains(&signals[0].1),
        "turn/draining at {} ms",
        signals[0].1
    );
    if let Some((_, abort_at)) = signals.get(1) {
        assert!(
            (2500..2500 + 3000).contains(abort_at),
            "turn/abort at {abort_at} ms"
        );
    }
}

/// Reported (spec deviation, minor): protocol.md B.3.4 says that at the
/// limit the host sends `turn/abort`, then kills the tree. The host queues
/// `turn/abort` (`Peer::try_notify`) and the run future is dropped right
/// after, whose `TreeGuard` SIGKILLs the tree at once: whether the
/// message reaches the plugin's stdin first is a race (about half of the
/// runs on the development VM). The kill is what bounds the turn, so the
/// envelope is unaffected; a plugin cannot count on seeing the abort.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turn_abort_always_reaches_the_plugin_before_the_kill() {
    for i in 0..6 {
        let signals = signals_on_the_wire(1200, 600).await;
        let methods: Vec<&str> = signals.iter().map(|(m, _)| m.as_str()).collect();
        assert_eq!(
            methods,
            ["turn/draining", "turn/abort"],
            "run {i}: {signals:?}"
        );
    }
}

/// A valid outcome during the drain is honoured; the plugin saw
/// `turn/draining` on the wire (it reports it in its output).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcome_during_drain_is_honoured() {
    let run = run_turn(
        TurnSpec::new(
            Launch::Direct,
            json!([
                {"op": "sleep", "ms": 1400},
                {"op": "call", "tool": "files.read", "arguments": {"path": "a.txt"}}
            ]),
        )
        .timeout(4000)
        .grace(3000),
    )
    .await;
    assert_eq!(
        run.result.status,
        ExecutionStatus::Succeeded,
        "{:?}",
        run.result
    );
    let output = run.result.output.clone().unwrap();
    assert_eq!(output["draining"], true, "{output}");
    assert_eq!(
        output["results"][0]["result"]["status"], "denied",
        "{output}"
    );
    assert_eq!(
        output["results"][0]["result"]["error"]["code"],
        "turn_draining"
    );
    assert_turn_ended(&run, "succeeded", None, None);
    run.assert_no_survivor();
}

/// A crash during the drain ends the turn `cancelled` (protocol.md B.3.6),
/// at once, not at the deadline.
async fn crash_during_drain_is_cancelled(launch: Launch) {
    let run = run_turn(
        TurnSpec::new(
            launch,
            json!([annotate("note", json!("kept")), {"op": "sleep", "ms": 1300}, {"op": "crash"}]),
        )
        .timeout(9000)
        .grace(8000),
    )
    .await;
    assert_cancelled(&run, true);
    assert!(
        run.elapsed < Duration::from_millis(7000),
        "{:?}",
        run.elapsed
    );
    assert_eq!(run.result.metadata.get("note"), Some(&json!("kept")));
    run.assert_provenance(launch);
    run.assert_no_survivor();
}

/// Garbage on stdout during the drain: `cancelled` too (protocol.md D).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_during_drain_is_cancelled() {
    let run = run_turn(
        TurnSpec::new(
            Launch::Direct,
            json!([{"op": "sleep", "ms": 1300}, {"op": "raw", "line": "not json"}, {"op": "hold"}]),
        )
        .timeout(9000)
        .grace(8000),
    )
    .await;
    assert_cancelled(&run, true);
    assert!(
        run.elapsed < Duration::from_millis(7000),
        "{:?}",
        run.elapsed
    );
    run.assert_no_survivor();
}

/// The plugin crashes while its non-idempotent call runs in the kernel:
/// `runtime_failed`, not retryable (a write is still with the kernel),
/// and the handler is stopped when the turn closes.
async fn crash_with_a_write_in_flight(launch: Launch) {
    let mut run = run_turn(TurnSpec::new(
        launch,
        json!([
            {"op": "send_call", "tool": "ledger.slow", "arguments": {"ms": 60000}},
            {"op": "sleep", "ms": 300},
            {"op": "crash"}
        ]),
    ))
    .await;
    assert_failed_by_envelope(&run, "runtime_failed");
    assert_eq!(run.retryable(), Some(false));
    assert!(run.elapsed < Duration::from_secs(10), "{:?}", run.elapsed);
    assert!(
        run.wait_audit(Duration::from_secs(5), |r| r.kind == "tool.invoked"
            && r.tool.as_deref() == Some("ledger.slow")
            && outcome_str(r) == "interrupted"),
        "the running handler was not stopped and recorded interrupted: {:?}",
        run.audit
    );
    run.assert_no_survivor();
}

/// The plugin crashes during the drain while a call it made before the
/// drain still runs: the catch path waits for that call (B.5), which
/// gives its real result; then `cancelled`, not retryable (the write
/// settled `succeeded`), before the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_during_drain_waits_for_the_call_in_flight() {
    let run = run_turn(
        TurnSpec::new(
            Launch::Direct,
            json!([
                {"op": "send_call", "tool": "ledger.slow", "arguments": {"ms": 2200}},
                {"op": "sleep", "ms": 1300},
                {"op": "crash"}
            ]),
        )
        .timeout(10000)
        .grace(9000),
    )
    .await;
    assert_cancelled(&run, false);
    assert!(
        run.elapsed >= Duration::from_millis(2000),
        "the turn did not wait for the call in flight: {:?}",
        run.elapsed
    );
    assert!(
        run.elapsed < Duration::from_millis(8000),
        "{:?}",
        run.elapsed
    );
    let rec = run
        .audit
        .iter()
        .find(|r| r.kind == "tool.invoked" && r.tool.as_deref() == Some("ledger.slow"))
        .expect("the call's outcome was recorded before the result");
    assert_eq!(outcome_str(rec), "succeeded", "{rec:?}");
    let done = run
        .result
        .events
        .iter()
        .find(|e| e.kind.as_str() == "tool.completed")
        .expect("tool.completed of the call in flight");
    assert_eq!(done.data["status"], "succeeded", "{}", done.data);
    run.assert_no_survivor();
}

/// Every emit and annotate written before the outcome is applied before
/// it, in wire order, even in a burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emits_before_the_outcome_all_land_in_order() {
    let run = run_turn(TurnSpec::new(
        Launch::Direct,
        json!([{"op": "flood", "n": 500}, annotate("after_flood", json!(true))]),
    ))
    .await;
    assert_eq!(
        run.result.status,
        ExecutionStatus::Succeeded,
        "{:?}",
        run.result.error
    );
    let flood = run.runtime_events("flood");
    assert_eq!(flood, (0..500).map(|i| json!(i)).collect::<Vec<_>>());
    assert_eq!(run.result.metadata.get("after_flood"), Some(&json!(true)));
    run.assert_no_survivor();
}

/// A plugin that floods emits without end is stopped (by the emit budget
/// or by the deadline) and killed; the host's memory stays bounded.
async fn endless_flood_is_stopped(launch: Launch) {
    let run = run_turn(
        TurnSpec::new(
            launch,
            json!([{"op": "emit_pid"}, {"op": "flood", "n": 100000000u64}]),
        )
        .timeout(1500),
    )
    .await;
    match run.result.status {
        ExecutionStatus::Cancelled => assert_cancelled(&run, true),
        ExecutionStatus::Failed => assert_failed_by_envelope(&run, "runtime_failed"),
        other => panic!("a flood ended {other:?}"),
    }
    assert!(
        run.elapsed < Duration::from_millis(1500) + MARGIN,
        "{:?}",
        run.elapsed
    );
    run.assert_no_survivor();
}

// ---------------------------------------------------------------- observers

/// Runs the slow-observer race: a call is in mediation, its
/// `tool.requested` held 1.5 s by a slow `on_event`, while the plugin
/// crashes and the turn ends. Returns the run, with `on_event`'s view
/// taken when `execute` returned and once the observer caught up.
async fn slow_observer_race() -> TurnRun {
    let mut spec = TurnSpec::new(
        Launch::Direct,
        json!([
            {"op": "send_call", "tool": "files.list", "arguments": {}},
            {"op": "sleep", "ms": 50},
            {"op": "crash"}
        ]),
    );
    spec.slow_observer_ms = Some(1500);
    spec.skip_invariants = true;
    let mut run = run_turn(spec).await;
    assert_eq!(run.code(), Some("runtime_failed"));
    // Let the observer and the call task finish.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    run.reload();
    run
}

/// A call whose mediation was held up (here by a slow `on_event` over its
/// `tool.requested`) while the turn ended does not go on after the turn
/// closed: no `tool.completed` (a `denied turn_draining` refusal, say)
/// reaches the observer after the terminal `turn.failed`, and no audit
/// record follows `turn.ended`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_observed_or_audited_after_the_turn_ended() {
    let run = slow_observer_race().await;
    let mut breaches = Vec::new();
    if run.streamed != run.result.events {
        let observed: Vec<(String, String)> = run
            .streamed
            .iter()
            .map(|e| (e.kind.as_str().to_owned(), e.data.to_string()))
            .collect();
        breaches.push(format!(
            "observed {observed:?} vs the result's {:?}",
            run.event_types()
        ));
    }
    let ended = run
        .audit
        .iter()
        .position(|r| r.kind == "turn.ended")
        .unwrap();
    let after: Vec<String> = run.audit[ended + 1..]
        .iter()
        .map(|r| {
            format!(
                "{} {:?} {:?} {:?} {:?}",
                r.kind, r.source, r.outcome, r.reason, r.cause
            )
        })
        .collect();
    if !after.is_empty() {
        breaches.push(format!("audit records after turn.ended: {after:?}"));
    }
    assert!(breaches.is_empty(), "{breaches:#?}");
}

/// Every event of the turn, its terminal `turn.failed` included, is
/// delivered to `on_event` before `execute` resolves (reference B.1), even
/// when a slow observer keeps delivery busy: a host that prints the result
/// and exits (`sharedos run` streams events to stderr) loses none and shows
/// none after the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_is_observed_before_execute_returns() {
    let run = slow_observer_race().await;
    let at_return: Vec<&str> = run
        .streamed_at_return
        .iter()
        .map(|e| e.kind.as_str())
        .collect();
    assert_eq!(
        at_return,
        run.event_types(),
        "events observed when execute returned vs the result's"
    );
}

// ------------------------------------------------------------------- denials

/// A denied turn never starts the plugin: `denied`, `turn.denied{code}`,
/// retryable false, metadata is `runtime` only.
async fn denied_starts_nothing(patch: fn(&mut Value), code: &str) {
    let mut spec = TurnSpec::new(
        Launch::Sandbox,
        json!([{"op": "emit_pid"}, annotate("note", json!(1))]),
    );
    spec.patch_request = Some(patch);
    let run = run_turn(spec).await;
    assert_eq!(
        run.result.status,
        ExecutionStatus::Denied,
        "{:?}",
        run.result
    );
    assert_eq!(run.code(), Some(code));
    assert_eq!(run.retryable(), Some(false));
    assert_eq!(run.event_types(), ["turn.denied"]);
    assert_eq!(run.last_event().1, json!({"code": code}));
    assert_eq!(
        run.result.metadata.keys().collect::<Vec<_>>(),
        ["runtime"],
        "{:?}",
        run.result.metadata
    );
    assert!(run.seen_pids.is_empty());
    assert!(run.turn_errors.is_empty());
    let ended = run.turn_ended();
    assert_eq!(outcome_str(ended), "denied");
    assert_eq!(ended.reason.as_deref(), Some(code));
    run.assert_no_survivor();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_denied_starts_nothing() {
    denied_starts_nothing(
        |r| {
            let bob = json!({"kind": "agent", "agentId": "bob"});
            r["agent"] = bob.clone();
            r["context"]["actor"] = bob.clone();
            r["message"]["receiver"] = bob;
        },
        "no_matching_grant",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_mismatch_denied_starts_nothing() {
    denied_starts_nothing(
        |r| r["context"]["actor"] = json!({"kind": "agent", "agentId": "mallory"}),
        "actor_mismatch",
    )
    .await;
}

// ------------------------------------------------ a decision that outlives the turn

/// The deadline fires while a call's decision record is still being made
/// durable (a slow disk): the turn ends at its limit, and when the
/// decision lands afterwards the handler is never called (C.1 step 13:
/// "never called if already aborted"), so the file is never written.
async fn decision_outliving_the_deadline_runs_nothing(launch: Launch) {
    let mut spec = TurnSpec::new(
        launch,
        json!([
            {"op": "emit", "type": "slow_disk", "data": null},
            {"op": "call", "tool": "files.write", "arguments": {"path": "late.txt", "content": "x"}},
            {"op": "stall"}
        ]),
    )
    .timeout(1500);
    spec.slow_decisions_on_event = Some(("slow_disk", 2500));
    let mut run = run_turn(spec).await;
    // files.write is idempotent: it never makes a retry unsafe.
    assert_cancelled(&run, true);
    assert_ended_by_deadline(&run, 1500);
    // Let the decision land and the kernel finish whatever it does next.
    let landed = run.wait_audit(Duration::from_secs(6), |r| {
        r.kind == "authorization.checked" && r.tool.as_deref() == Some("files.write")
    });
    assert!(landed, "the slow decision never landed");
    tokio::time::sleep(Duration::from_millis(500)).await;
    run.reload();
    assert!(
        !run.files_root.join("endings/alice/late.txt").exists(),
        "the handler ran after the turn was aborted"
    );
    let invoked: Vec<_> = run
        .audit
        .iter()
        .filter(|r| r.kind == "tool.invoked" && r.tool.as_deref() == Some("files.write"))
        .collect();
    assert!(
        invoked.is_empty() || outcome_str(invoked[0]) != "succeeded",
        "a write recorded succeeded after the abort: {invoked:?}"
    );
    run.assert_no_survivor();
}

// --------------------------------------------------------------- audit outage

fn break_audit() -> Value {
    json!({"op": "emit", "type": "break_audit", "data": null})
}

fn assert_audit_unavailable(run: &TurnRun, retryable: bool) {
    assert_eq!(
        run.result.status,
        ExecutionStatus::Failed,
        "{:?}",
        run.result
    );
    assert_eq!(run.code(), Some("audit_unavailable"));
    assert_eq!(run.retryable(), Some(retryable));
    assert_eq!(
        run.last_event(),
        (
            "turn.failed".into(),
            json!({"code": "audit_unavailable", "source": "envelope"})
        )
    );
    assert!(
        matches!(run.turn_errors.as_slice(), [TurnError::AuditUnavailable { cause }] if cause.contains("disk on fire")),
        "on_turn_error: {:?}",
        run.turn_errors
    );
    let ended = run.turn_ended();
    assert_eq!(outcome_str(ended), "failed");
    assert_eq!(ended.reason.as_deref(), Some("audit_unavailable"));
    assert_eq!(ended.ended_by.as_deref(), Some("envelope"));
    assert_eq!(ended.fail_closed, Some(true), "{ended:?}");
}

/// The decision record of a call cannot be written: the call is refused
/// (effect none), no grace, so the turn ends at once `audit_unavailable`,
/// retryable (nothing ran), annotations kept; the tree is killed.
async fn audit_outage(launch: Launch) {
    let mut spec = TurnSpec::new(
        launch,
        json!([
            annotate("note", json!("kept")),
            {"op": "emit_pid"},
            break_audit(),
            write_call("never.txt"),
            {"op": "ignore_abort"},
            {"op": "hold"}
        ]),
    );
    spec.audit_fault_on_event = Some("break_audit");
    let run = run_turn(spec).await;
    assert_audit_unavailable(&run, true);
    assert_eq!(run.result.metadata.get("note"), Some(&json!("kept")));
    assert!(!run.files_root.join("endings/alice/never.txt").exists());
    assert!(run.elapsed < Duration::from_secs(10), "{:?}", run.elapsed);
    run.assert_provenance(launch);
    run.assert_no_survivor();
}

/// An outage with a grace: the turn drains and the plugin's later outcome
/// does not hide the outage (B.1 step 15): `audit_unavailable`, not
/// retryable (a non-idempotent write ran before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_outage_is_not_hidden_by_a_later_outcome() {
    let mut spec = TurnSpec::new(
        Launch::Direct,
        json!([
            ledger_call(),
            break_audit(),
            {"op": "call", "tool": "files.read", "arguments": {"path": "a.txt"}},
            {"op": "call", "tool": "files.list", "arguments": {}}
        ]),
    )
    .grace(5000);
    spec.audit_fault_on_event = Some("break_audit");
    let run = run_turn(spec).await;
    assert_audit_unavailable(&run, false);
    assert_eq!(run.result.output, None);
    run.assert_no_survivor();
}

/// An outage with a grace and a plugin that stalls: the hard stop comes
/// when the grace after the outage ends, long before the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_outage_grace_ends_the_turn_before_the_deadline() {
    let mut spec = TurnSpec::new(
        Launch::Direct,
        json!([
            break_audit(),
            {"op": "call", "tool": "files.read", "arguments": {"path": "a.txt"}},
            {"op": "emit_pid"},
            {"op": "stall"}
        ]),
    )
    .timeout(30_000)
    .grace(1500);
    spec.audit_fault_on_event = Some("break_audit");
    let run = run_turn(spec).await;
    assert_audit_unavailable(&run, true);
    assert!(
        run.elapsed >= Duration::from_millis(1400)
            && run.elapsed < Duration::from_millis(1500) + MARGIN,
        "{:?}",
        run.elapsed
    );
    run.assert_no_survivor();
}

// ------------------------------------- hostile plugins stopped by the deadline

async fn deadline_stops(launch: Launch, script: Value) -> TurnRun {
    let run = run_turn(TurnSpec::new(launch, script).timeout(1500)).await;
    assert_cancelled(&run, true);
    assert_ended_by_deadline(&run, 1500);
    run.assert_provenance(launch);
    run
}

/// Ignores `turn/abort` and stdin EOF, keeps reading.
async fn ignores_abort(launch: Launch) {
    let run = deadline_stops(
        launch,
        json!([{"op": "ignore_abort"}, {"op": "emit_pid"}, {"op": "hold"}]),
    )
    .await;
    assert!(
        !run.seen_pids.is_empty(),
        "the plugin was never seen running"
    );
    run.assert_no_survivor();
}

/// Busy-loops forever.
async fn spins(launch: Launch) {
    let run = deadline_stops(
        launch,
        json!([{"op": "ignore_abort"}, {"op": "emit_pid"}, {"op": "spin"}]),
    )
    .await;
    run.assert_no_survivor();
}

/// Sleeps far past the deadline.
async fn sleeps(launch: Launch) {
    let run = deadline_stops(
        launch,
        json!([{"op": "emit_pid"}, {"op": "sleep", "ms": 120000}]),
    )
    .await;
    run.assert_no_survivor();
}

/// Emits and annotations keep arriving when the deadline fires: nothing
/// lands after `turn.cancelled`, and what landed before stays.
async fn emits_racing_the_deadline(launch: Launch) {
    let mut script = vec![json!({"op": "emit_pid"})];
    for i in 0..400 {
        script.push(json!({"op": "emit", "type": "tick", "data": i}));
        script.push(annotate("last_tick", json!(i)));
        script.push(json!({"op": "sleep", "ms": 10}));
    }
    let run = deadline_stops(launch, json!(script)).await;
    let ticks = run.runtime_events("tick");
    assert!(!ticks.is_empty(), "no tick before the deadline");
    assert_eq!(
        ticks,
        (0..ticks.len()).map(|i| json!(i)).collect::<Vec<_>>()
    );
    // The last annotation is the last tick's or the one before it (an
    // annotate follows its emit on the wire).
    let last = run
        .result
        .metadata
        .get("last_tick")
        .and_then(Value::as_u64)
        .unwrap();
    assert!(
        last as usize + 1 == ticks.len() || last as usize + 2 == ticks.len(),
        "last_tick {last} with {} ticks",
        ticks.len()
    );
    run.assert_no_survivor();
}

/// Forks children that keep the pipes open (same process group).
async fn forked_children(launch: Launch) {
    let run = deadline_stops(
        launch,
        json!([{"op": "fork", "n": 3}, {"op": "emit_pid"}, {"op": "ignore_abort"}, {"op": "hold"}]),
    )
    .await;
    if launch == Launch::Direct {
        // Host pids, checked one by one by assert_no_survivor.
        assert_eq!(run.reported_pids.len(), 4, "{:?}", run.reported_pids);
    }
    assert!(
        run.seen_pids.len() >= 4,
        "expected the plugin and 3 children, saw {:?} (reported {:?})",
        run.seen_pids,
        run.reported_pids
    );
    run.assert_no_survivor();
}

/// `setsid` children and double-forked (orphaned, reparented) grandchildren:
/// the sandbox's pid namespace takes them all down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setsid_and_double_fork_children_sandbox() {
    let run = deadline_stops(
        Launch::Sandbox,
        json!([
            {"op": "fork", "n": 2, "setsid": true},
            {"op": "fork", "n": 2, "double": true},
            {"op": "fork", "n": 1, "setsid": true, "double": true},
            {"op": "sleep", "ms": 200},
            {"op": "emit_pid"},
            {"op": "ignore_abort"},
            {"op": "hold"}
        ]),
    )
    .await;
    // The plugin, 2 + 1 setsid sleepers, 2 + 1 double-forked grandchildren.
    assert!(
        run.seen_pids.len() >= 6,
        "expected the plugin and 6 descendants, saw {:?}",
        run.seen_pids
    );
    run.assert_no_survivor();
}

/// The direct launcher contains its tree in a cgroup: the turn ends by its
/// deadline and the plugin, its same-group children and a `setsid` child
/// all die.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setsid_children_direct_end_by_deadline_and_die_with_the_tree() {
    let run = deadline_stops(
        Launch::Direct,
        json!([
            {"op": "fork", "n": 1},
            {"op": "fork", "n": 1, "setsid": true},
            {"op": "emit_pid"},
            {"op": "ignore_abort"},
            {"op": "hold"}
        ]),
    )
    .await;
    // forked [same-group], forked [setsid], pid [plugin].
    let [same_group, escaped, plugin] = run.reported_pids.as_slice() else {
        panic!("reported pids: {:?}", run.reported_pids);
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let alive = sharedos_tests::turns::is_alive;
    while (alive(*plugin) || alive(*same_group) || alive(*escaped))
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !sharedos_tests::turns::is_alive(*plugin),
        "the plugin survived"
    );
    assert!(
        !sharedos_tests::turns::is_alive(*same_group),
        "a same-group child survived"
    );
    let escaped_alive = alive(*escaped);
    kill_marked(&run.marker);
    assert!(!escaped_alive, "the setsid child survived the turn");
    assert!(wait_gone(&run.marker, Duration::from_secs(10)).is_empty());
}

// ---------------------------------------------- plugin broke: runtime_failed

async fn failed_runtime(launch: Launch, script: Value, mode: &'static str) -> TurnRun {
    let run = run_turn(TurnSpec::new(launch, script).mode(mode)).await;
    assert_failed_by_envelope(&run, "runtime_failed");
    assert_runtime_error_reported(&run);
    run.assert_provenance(launch);
    run.assert_no_survivor();
    run
}

/// `metadata.runtime.process`: how the plugin ended, its last stderr lines.
fn process(run: &TurnRun) -> Value {
    run.runtime_provenance()["process"].clone()
}

async fn crashed(launch: Launch) {
    let run = failed_runtime(
        launch,
        json!([annotate("note", json!("kept")), {"op": "emit_pid"},
               {"op": "stderr", "text": "about to crash \u{1b}[31m"}, {"op": "crash"}]),
        "normal",
    )
    .await;
    // A crash may pass on a retry: retryable, and it says what happened.
    assert_eq!(run.retryable(), Some(true));
    assert_eq!(details(&run), json!({"reason": "plugin_exited"}));
    let process = process(&run);
    let tail = process["stderrTail"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        tail.iter()
            .any(|l| l.as_str().is_some_and(|l| l.starts_with("about to crash"))),
        "the last stderr lines: {process}"
    );
    assert!(!process.to_string().contains('\x1b'), "escaped: {process}");
    if launch == Launch::Direct {
        assert_eq!(process["exit"]["name"], "SIGABRT", "{process}");
    }
    assert_eq!(run.result.metadata.get("note"), Some(&json!("kept")));
}

/// A crash after a non-idempotent write: not retryable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_after_write_is_not_retryable() {
    let run = failed_runtime(
        Launch::Direct,
        json!([ledger_call(), {"op": "crash"}]),
        "normal",
    )
    .await;
    assert_eq!(run.retryable(), Some(false));
}

async fn exited(launch: Launch) {
    let run = failed_runtime(
        launch,
        json!([annotate("note", json!("kept")), {"op": "exit", "code": 3}]),
        "normal",
    )
    .await;
    assert_eq!(run.retryable(), Some(true));
    if launch == Launch::Direct {
        assert_eq!(process(&run)["exit"], json!({"code": 3}));
    }
    assert_eq!(run.result.metadata.get("note"), Some(&json!("kept")));
}

/// Closes stdout but keeps running: the host must kill it.
async fn closed_stdout(launch: Launch) {
    let run = failed_runtime(
        launch,
        json!([annotate("note", json!("kept")), {"op": "emit_pid"}, {"op": "close_stdout"}]),
        "normal",
    )
    .await;
    assert_eq!(run.result.metadata.get("note"), Some(&json!("kept")));
    assert!(run.elapsed < Duration::from_secs(10), "{:?}", run.elapsed);
}

/// Closes its stdout while a forked child still holds the pipe: no EOF
/// ever comes (protocol.md D#47, do not rely on pipe EOF alone), so the
/// deadline ends the turn and the whole tree is killed.
async fn closed_stdout_with_a_child_holding_the_pipe(launch: Launch) {
    let run = deadline_stops(
        launch,
        json!([annotate("note", json!("kept")), {"op": "fork", "n": 1}, {"op": "emit_pid"}, {"op": "close_stdout"}]),
    )
    .await;
    assert_eq!(run.result.metadata.get("note"), Some(&json!("kept")));
    run.assert_no_survivor();
}

/// The plugin exits before the handshake: a failed load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_before_handshake_is_runtime_failed() {
    let run = failed_runtime(Launch::Direct, json!([]), "exit-early").await;
    assert_eq!(run.retryable(), Some(true));
}

async fn garbage(launch: Launch, step: Value) -> TurnRun {
    let run = failed_runtime(
        launch,
        json!([annotate("note", json!("kept")), {"op": "emit_pid"}, {"op": "fork", "n": 1}, step, {"op": "hold"}]),
        "normal",
    )
    .await;
    // The same plugin breaks the stream the same way on a retry.
    assert_eq!(run.retryable(), Some(false), "{:?}", run.result.error);
    assert_eq!(run.result.metadata.get("note"), Some(&json!("kept")));
    assert!(run.elapsed < Duration::from_secs(10), "{:?}", run.elapsed);
    run
}

async fn non_json_line(launch: Launch) {
    let run = garbage(launch, json!({"op": "raw", "line": "hello from println!"})).await;
    assert_eq!(details(&run), json!({"reason": "invalid_json"}));
}

async fn invalid_utf8(launch: Launch) {
    garbage(launch, json!({"op": "invalid_utf8"})).await;
}

async fn over_long_line(launch: Launch) {
    garbage(launch, json!({"op": "long_line", "bytes": 9u64 << 20})).await;
}

async fn batch(launch: Launch) {
    garbage(launch, json!({"op": "batch"})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_objects_on_one_line_is_runtime_failed() {
    garbage(
        Launch::Direct,
        json!({"op": "raw", "line": "{\"jsonrpc\":\"2.0\",\"method\":\"host/emit\"} {}"}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turn_run_answered_with_an_error_is_runtime_failed() {
    let run = failed_runtime(
        Launch::Direct,
        json!([annotate("note", json!("kept")), {"op": "error_outcome", "code": -32603, "message": "boom at /srv/secret.rs:1"}]),
        "normal",
    )
    .await;
    let text = serde_json::to_string(&run.result).unwrap();
    assert!(
        !text.contains("/srv/secret.rs"),
        "the plugin's text leaked into the result"
    );
    assert_eq!(run.result.metadata.get("note"), Some(&json!("kept")));
}

/// protocol.md D#22: a response with an unknown id is dropped and counted,
/// not fatal: the turn goes on and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_response_id_is_dropped() {
    let run = run_turn(TurnSpec::new(
        Launch::Direct,
        json!([{"op": "bogus_response"}, {"op": "emit", "type": "after", "data": 1}]),
    ))
    .await;
    assert_eq!(
        run.result.status,
        ExecutionStatus::Succeeded,
        "{:?}",
        run.result
    );
    assert_eq!(run.runtime_events("after"), vec![json!(1)]);
    run.assert_no_survivor();
}

/// A plugin that cannot be loaded (noise on stdout before the handshake,
/// another manifest, an unsupported protocol version) ends the turn
/// `runtime_failed` before `turn.started`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_that_cannot_be_loaded_are_runtime_failed() {
    for (mode, reason) in [
        ("noise", "stdout_before_handshake"),
        ("wrong-manifest", "manifest_mismatch"),
        ("bad-version", "handshake_rejected"),
    ] {
        let run = failed_runtime(Launch::Direct, json!([]), mode).await;
        // Each fails the same way on every try: not retryable.
        assert_eq!(run.retryable(), Some(false), "{mode}");
        assert_eq!(details(&run), json!({"reason": reason}), "{mode}");
        assert!(
            run.elapsed < Duration::from_secs(5),
            "{mode}: {:?}",
            run.elapsed
        );
    }
}

/// The sandbox comes out below the policy's minimum: the launch is refused,
/// nothing runs, the turn ends `runtime_failed`, not retryable (the same
/// machine refuses it again), `launch_refused`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_below_minimum_refuses_the_launch() {
    let run = run_turn(TurnSpec::new(
        Launch::SandboxBelowMinimum,
        json!([{"op": "emit_pid"}]),
    ))
    .await;
    assert_failed_by_envelope(&run, "runtime_failed");
    assert_eq!(run.retryable(), Some(false));
    assert_eq!(details(&run), json!({"reason": "launch_refused"}));
    assert_runtime_error_reported(&run);
    assert!(run.runtime_events("pid").is_empty());
    run.assert_no_survivor();
}

/// A sandboxed seat whose launch was refused (the sandbox came out below
/// the policy's minimum) never gets the provenance
/// `{"level":"none","reason":"launched without a sandbox"}`: the refused
/// report, saying which layers were missing, goes into the result's
/// `runtime` provenance (sandbox.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_sandbox_launch_provenance_does_not_claim_no_sandbox() {
    let run = run_turn(TurnSpec::new(
        Launch::SandboxBelowMinimum,
        json!([{"op": "emit_pid"}]),
    ))
    .await;
    assert_failed_by_envelope(&run, "runtime_failed");
    let sandbox = &run.runtime_provenance()["sandbox"];
    assert_ne!(
        sandbox["reason"], "launched without a sandbox",
        "provenance of a sandboxed seat: {sandbox}"
    );
    assert_eq!(sandbox["level"], "reduced", "the refused report: {sandbox}");
}

/// A sandboxed turn cancelled by the host while its sandbox is being built
/// is never reported "launched without a sandbox".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_during_sandbox_launch_provenance_does_not_claim_no_sandbox() {
    for ms in [10u64, 20, 30] {
        let mut spec = TurnSpec::new(Launch::Sandbox, json!([{"op": "stall"}]));
        spec.cancel_after = Some(Duration::from_millis(ms));
        let run = run_turn(spec).await;
        assert_eq!(run.result.status, ExecutionStatus::Cancelled);
        let sandbox = &run.runtime_provenance()["sandbox"];
        assert_ne!(
            sandbox["reason"], "launched without a sandbox",
            "cancel after {ms} ms: {sandbox}"
        );
        run.assert_no_survivor();
    }
}

/// The outcome comes, then the plugin stops reading and holds on (with a
/// `setsid` child): the result does not wait for it, and the tree dies.
async fn completed_then_stalls(launch: Launch) {
    let mut script = vec![json!({"op": "emit_pid"}), json!({"op": "fork", "n": 1})];
    if launch == Launch::Sandbox {
        script.push(json!({"op": "fork", "n": 1, "setsid": true}));
    }
    script.push(json!({"op": "outcome", "value": {"type": "complete", "output": "done"}}));
    script.push(json!({"op": "stall"}));
    let run = run_turn(TurnSpec::new(launch, json!(script))).await;
    assert_eq!(run.result.status, ExecutionStatus::Succeeded);
    assert_eq!(run.result.output, Some(json!("done")));
    assert!(run.elapsed < Duration::from_secs(5), "{:?}", run.elapsed);
    run.assert_no_survivor();
}

/// Nothing the plugin says replaces `metadata.runtime`: not an annotation
/// with that key (dropped, the turn goes on), not the outcome's metadata.
async fn provenance_cannot_be_forged(launch: Launch) {
    let forged = json!({"id": "forged", "sandbox": {"level": "strong"}});
    let run = run_turn(TurnSpec::new(
        launch,
        json!([
            annotate("runtime", forged.clone()),
            annotate("__proto__", json!(1)),
            annotate("kept", json!(1)),
            {"op": "outcome", "value": {"type": "complete", "output": 1, "metadata": {"runtime": forged, "own": 2}}}
        ]),
    ))
    .await;
    assert_eq!(
        run.result.status,
        ExecutionStatus::Succeeded,
        "{:?}",
        run.result
    );
    run.assert_provenance(launch);
    assert_eq!(run.result.metadata.get("kept"), Some(&json!(1)));
    assert_eq!(run.result.metadata.get("own"), Some(&json!(2)));
    assert_eq!(run.result.metadata.get("__proto__"), None);
    run.assert_no_survivor();
}

/// Semantic violations (here: annotations with the reserved key
/// `runtime`) are dropped and counted; past the budget of 100 the plugin
/// is killed and the turn ends `runtime_failed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn violations_are_dropped_until_the_budget_then_fatal() {
    let forged = |n: usize| -> Vec<Value> {
        (0..n)
            .map(|_| annotate("runtime", json!("forged")))
            .collect()
    };
    let run = run_turn(TurnSpec::new(Launch::Direct, json!(forged(50)))).await;
    assert_eq!(
        run.result.status,
        ExecutionStatus::Succeeded,
        "{:?}",
        run.result
    );
    run.assert_provenance(Launch::Direct);

    let mut script = forged(150);
    script.push(json!({"op": "hold"}));
    let run = failed_runtime(Launch::Direct, json!(script), "normal").await;
    assert!(run.elapsed < Duration::from_secs(10), "{:?}", run.elapsed);
}

/// A plugin that stops reading its stdin while the host has an answer to
/// write (a 256 KiB file read, beyond the pipe's buffer) is killed after
/// the write-stall timeout (10 s): `runtime_failed`, before the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_that_never_reads_stdin_is_killed_after_the_write_stall() {
    let big = "x".repeat(256 << 10);
    let run = run_turn(
        TurnSpec::new(
            Launch::Direct,
            json!([
                {"op": "call", "tool": "files.write", "arguments": {"path": "big.txt", "content": big}},
                {"op": "send_call", "tool": "files.read", "arguments": {"path": "big.txt"}},
                {"op": "emit_pid"},
                {"op": "stall"}
            ]),
        )
        .timeout(40_000),
    )
    .await;
    assert_failed_by_envelope(&run, "runtime_failed");
    assert_runtime_error_reported(&run);
    assert!(
        run.elapsed < Duration::from_secs(10) + MARGIN,
        "{:?}",
        run.elapsed
    );
    run.assert_no_survivor();
}

/// A burst of calls beyond the in-flight cap (64 by default): the excess is answered
/// `-32055 overloaded` and never taken (no `tool.requested`), the rest are
/// mediated; the turn goes on and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_burst_beyond_the_inflight_cap_is_overloaded_not_fatal() {
    let run = run_turn(TurnSpec::new(
        Launch::Direct,
        json!([{"op": "burst_calls", "n": 200, "tool": "files.list"}]),
    ))
    .await;
    assert_eq!(
        run.result.status,
        ExecutionStatus::Succeeded,
        "{:?}",
        run.result
    );
    let answers = run.result.output.as_ref().unwrap()["results"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(answers.len(), 200);
    let taken = answers.iter().filter(|a| a.get("result").is_some()).count();
    let overloaded = answers
        .iter()
        .filter(|a| a["error"]["code"] == -32055)
        .count();
    assert_eq!(taken + overloaded, 200, "{answers:?}");
    assert!(taken >= 1);
    assert!(overloaded >= 1, "200 calls at once never hit the cap of 64");
    let requested = run
        .event_types()
        .iter()
        .filter(|k| **k == "tool.requested")
        .count();
    assert_eq!(requested, taken, "an overloaded call was taken");
    run.assert_no_survivor();
}

/// A flood of stderr (48 MiB, far past the 16 MiB per-turn budget) is
/// drained and dropped; it never blocks the plugin, whose outcome comes
/// through.
async fn stderr_flood_does_not_block(launch: Launch) {
    let run = run_turn(TurnSpec::new(
        launch,
        json!([{"op": "stderr_flood", "bytes": 48u64 << 20}, {"op": "emit", "type": "after", "data": 1}]),
    ))
    .await;
    assert_eq!(
        run.result.status,
        ExecutionStatus::Succeeded,
        "{:?}",
        run.result
    );
    assert_eq!(run.runtime_events("after"), vec![json!(1)]);
    assert!(run.elapsed < Duration::from_secs(15), "{:?}", run.elapsed);
    run.assert_no_survivor();
}

/// Observed, and a question for the protocol: the outcome's line written
/// without its `\n`, then the plugin exits. protocol.md B.1 says every
/// message is terminated by `\n`, but the host's line reader hands the
/// unterminated final frame over at EOF and the turn succeeds. (Harmless
/// as far as the envelope goes: the frame is complete JSON; a truncated
/// frame would not parse.) This test pins the behaviour so that a change
/// is deliberate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unterminated_final_outcome_line_is_accepted_at_eof() {
    let run = run_turn(TurnSpec::new(
        Launch::Direct,
        json!([
            {"op": "outcome_unterminated", "value": {"type": "complete", "output": 1}},
            {"op": "exit", "code": 0}
        ]),
    ))
    .await;
    assert_eq!(
        run.result.status,
        ExecutionStatus::Succeeded,
        "{:?}",
        run.result
    );
    assert_eq!(run.result.output, Some(json!(1)));
    run.assert_no_survivor();
}

/// A frame cut short by the plugin's exit does not parse: `runtime_failed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_final_line_is_runtime_failed() {
    failed_runtime(
        Launch::Direct,
        json!([
            {"op": "raw_unterminated", "line": "{\"jsonrpc\":\"2.0\",\"method\":\"host/emit\",\"params\":{\"turnId\""},
            {"op": "exit", "code": 0}
        ]),
        "normal",
    )
    .await;
}

// ------------------------------------------------------------- the outcome

async fn invalid_outcome(launch: Launch) {
    let run = run_turn(TurnSpec::new(
        launch,
        json!([annotate("note", json!("kept")), {"op": "outcome", "value": {"type": "complete", "metadata": {"lost": 1}}}]),
    ))
    .await;
    // The outcome's own metadata is lost with it.
    assert_eq!(run.result.metadata.get("lost"), None);
    assert_failed_by_envelope(&run, "invalid_runtime_outcome");
    assert_eq!(run.retryable(), Some(false));
    assert!(run.turn_errors.is_empty(), "{:?}", run.turn_errors);
    assert_eq!(run.result.metadata.get("note"), Some(&json!("kept")));
    run.assert_provenance(launch);
    run.assert_no_survivor();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcome_with_an_unknown_type_or_extra_key_is_invalid() {
    for value in [
        json!({"type": "win", "output": 1}),
        json!({"type": "complete", "output": 1, "extra": true}),
        json!({"type": "fail", "error": {"code": "x"}}),
        json!({"type": "fail", "error": {"code": "x", "message": "m", "retryable": "yes"}}),
        json!({"type": "escalate", "reason": ""}),
        json!({"type": "escalate"}),
        json!(null),
        json!("complete"),
    ] {
        let run = run_turn(TurnSpec::new(
            Launch::Direct,
            json!([{"op": "outcome", "value": value}]),
        ))
        .await;
        assert_failed_by_envelope(&run, "invalid_runtime_outcome");
        assert_eq!(run.retryable(), Some(false), "{value}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_answer_to_turn_run_is_ignored() {
    let run = run_turn(TurnSpec::new(
        Launch::Direct,
        json!([
            {"op": "outcome", "value": {"type": "complete", "output": "first"}},
            {"op": "outcome", "value": {"type": "fail", "error": {"code": "second", "message": "m"}}}
        ]),
    ))
    .await;
    assert_eq!(run.result.status, ExecutionStatus::Succeeded);
    assert_eq!(run.result.output, Some(json!("first")));
    assert_eq!(run.last_event(), ("turn.completed".into(), json!({})));
    assert_turn_ended(&run, "succeeded", None, None);
    run.assert_no_survivor();
}

async fn emits_after_outcome_are_dropped(launch: Launch) {
    let run = run_turn(TurnSpec::new(
        launch,
        json!([
            {"op": "emit", "type": "before", "data": 1},
            annotate("before", json!(1)),
            {"op": "outcome", "value": {"type": "complete", "output": "done"}},
            {"op": "emit", "type": "late", "data": 1},
            annotate("late", json!(1)),
            {"op": "call", "tool": "files.write", "arguments": {"path": "late.txt", "content": "x"}}
        ]),
    ))
    .await;
    assert_eq!(run.result.status, ExecutionStatus::Succeeded);
    assert_eq!(run.runtime_events("before"), vec![json!(1)]);
    assert!(run.runtime_events("late").is_empty());
    assert_eq!(run.result.metadata.get("before"), Some(&json!(1)));
    assert_eq!(run.result.metadata.get("late"), None);
    assert_eq!(run.last_event(), ("turn.completed".into(), json!({})));
    // Nothing after the outcome reached the kernel or the disk.
    assert!(!run.files_root.join("endings/alice/late.txt").exists());
    assert!(
        !run.audit
            .iter()
            .any(|r| r.tool.as_deref() == Some("files.write")),
        "a call after the outcome reached the kernel"
    );
    // Nothing was appended to the result after it was returned either.
    assert_eq!(run.streamed, run.result.events);
    run.assert_no_survivor();
}

both!(
    completed,
    plugin_fail_after_write_is_lowered,
    escalated_when_offered,
    host_cancel_after_write,
    deadline_without_grace,
    deadline_during_handshake,
    deadline_interrupts_a_running_handler,
    deadline_with_grace,
    crash_during_drain_is_cancelled,
    audit_outage,
    decision_outliving_the_deadline_runs_nothing,
    crash_with_a_write_in_flight,
    endless_flood_is_stopped,
    ignores_abort,
    tiny_deadline_during_launch,
    emits_racing_the_deadline,
    spins,
    sleeps,
    forked_children,
    crashed,
    exited,
    closed_stdout,
    closed_stdout_with_a_child_holding_the_pipe,
    non_json_line,
    invalid_utf8,
    over_long_line,
    batch,
    invalid_outcome,
    completed_then_stalls,
    stderr_flood_does_not_block,
    provenance_cannot_be_forged,
    emits_after_outcome_are_dropped,
);
