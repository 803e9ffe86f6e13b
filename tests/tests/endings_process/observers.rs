//! Observers, denials that start nothing, and a decision that outlives
//! the turn.

use super::*;

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
/// record follows `turn.ended` but the outcome of a call decided before it.
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
    // Only a call's outcome may follow `turn.ended`, and only for a call
    // whose decision was on record before it: a call admitted to the
    // kernel just before the turn closed answers when the kernel does
    // (docs/ENVELOPE.md, "A call can outlive its turn's turn.ended").
    let decided_before: Vec<&str> = run.audit[..ended]
        .iter()
        .filter(|r| r.kind == "authorization.checked")
        .filter_map(|r| r.operation_id.as_deref())
        .collect();
    let after: Vec<String> = run.audit[ended + 1..]
        .iter()
        .filter(|r| {
            !(r.kind == "tool.invoked"
                && r.operation_id
                    .as_deref()
                    .is_some_and(|op| decided_before.contains(&op)))
        })
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

both!(decision_outliving_the_deadline_runs_nothing,);
