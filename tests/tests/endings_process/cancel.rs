//! The host's cancel: before, during the handshake, with a handler
//! running, and what a drain leaves alone.

use super::*;

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

both!(
    host_cancel_after_write,
    deadline_during_handshake,
    deadline_interrupts_a_running_handler,
);
