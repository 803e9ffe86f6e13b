//! The turn's own endings: completed, the plugin's `fail`, escalation,
//! and the outcome line itself.

use super::*;

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
    invalid_outcome,
    emits_after_outcome_are_dropped,
);
