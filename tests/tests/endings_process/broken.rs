//! A plugin that broke: crashes, exits, closed pipes, garbage on the
//! wire, plugins that cannot be loaded (`runtime_failed`).

use super::*;

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

both!(
    crashed,
    exited,
    closed_stdout,
    closed_stdout_with_a_child_holding_the_pipe,
    non_json_line,
    invalid_utf8,
    over_long_line,
    batch,
    completed_then_stalls,
    stderr_flood_does_not_block,
    provenance_cannot_be_forged,
);
