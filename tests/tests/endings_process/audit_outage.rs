//! An audit outage ends the turn (`audit_unavailable`).

use super::*;

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

both!(audit_outage,);
