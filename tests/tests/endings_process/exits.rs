//! How the plugin ended, said by the result of a turn it failed: its exit
//! code or the signal that killed it (before `initialize` too), and its
//! last stderr lines, read to the end of its stderr before the turn
//! settles (protocol.md section 6).

use super::*;

/// `metadata.runtime.process`.
fn process(run: &TurnRun) -> Value {
    run.runtime_provenance()["process"].clone()
}

/// The kept stderr lines, as text.
fn tail(run: &TurnRun) -> Vec<String> {
    process(run)["stderrTail"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l.as_str().map(str::to_owned))
        .collect()
}

/// The 20 lines the tail keeps of `n` numbered ones: the last 20.
fn last_numbered(n: u64) -> Vec<String> {
    (n - 19..=n)
        .map(|i| format!("testplugin: stderr line {i} of {n}"))
        .collect()
}

async fn failed(launch: Launch, script: Value, mode: &'static str) -> TurnRun {
    let run = run_turn(TurnSpec::new(launch, script).mode(mode)).await;
    assert_failed_by_envelope(&run, "runtime_failed");
    run.assert_provenance(launch);
    run.assert_no_survivor();
    run
}

/// A crash before `initialize` is named by its signal, not "running".
async fn crash_before_initialize(launch: Launch) {
    let run = failed(launch, json!([]), "crash-early").await;
    let p = process(&run);
    assert_eq!(p["exit"]["signal"], libc::SIGABRT, "{p}");
    assert_eq!(p["exit"]["name"], "SIGABRT", "{p}");
    assert!(
        tail(&run).contains(&"testplugin: crashing before initialize".to_owned()),
        "{p}"
    );
}

/// An exit before `initialize` is named by its code.
async fn exit_before_initialize(launch: Launch) {
    let run = failed(launch, json!([]), "exit-early").await;
    let p = process(&run);
    assert_eq!(p["exit"]["code"], 3, "{p}");
    assert!(p["exit"].get("signal").is_none(), "{p}");
}

/// A plugin killed by SIGKILL mid-turn: the signal is named.
async fn killed_mid_turn(launch: Launch) {
    let run = failed(
        launch,
        json!([{"op": "kill_self", "signal": "KILL"}]),
        "normal",
    )
    .await;
    assert_eq!(details(&run), json!({"reason": "plugin_exited"}));
    let p = process(&run);
    assert_eq!(p["exit"]["signal"], libc::SIGKILL, "{p}");
    assert_eq!(p["exit"]["name"], "SIGKILL", "{p}");
}

both!(
    crash_before_initialize,
    exit_before_initialize,
    killed_mid_turn
);

/// 200 stderr lines, then an exit before `initialize`: the last 20 lines
/// are in the result every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_stderr_lines_before_an_early_exit_are_never_lost() {
    for i in 0..20 {
        let run = failed(Launch::Sandbox, json!([]), "stderr-exit").await;
        assert_eq!(process(&run)["exit"]["code"], 4, "run {i}");
        assert_eq!(tail(&run), last_numbered(200), "run {i}");
    }
}

/// 20,000 stderr lines (about 800 KB), then an exit mid-turn: the last 20 lines are in the
/// result every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_stderr_lines_before_an_exit_mid_turn_are_never_lost() {
    let script = json!([{"op": "stderr_lines", "n": 20_000}, {"op": "exit", "code": 5}]);
    for i in 0..20 {
        let run = failed(Launch::Sandbox, script.clone(), "normal").await;
        assert_eq!(details(&run), json!({"reason": "plugin_exited"}), "run {i}");
        assert_eq!(process(&run)["exit"]["code"], 5, "run {i}");
        assert_eq!(tail(&run), last_numbered(20_000), "run {i}");
    }
}

/// A turn stopped at its deadline says how its process ended: by itself
/// on the `turn/abort` (code 0), or by the host's SIGKILL when it reads
/// nothing any more (a spinning plugin).
async fn stopped_turns_carry_the_exit(launch: Launch) {
    let run = deadline_stops(launch, json!([{"op": "hold"}])).await;
    let p = process(&run);
    assert_eq!(p["exit"], json!({"code": 0}), "{p}");
    run.assert_no_survivor();
    let run = deadline_stops(launch, json!([{"op": "spin"}])).await;
    let p = process(&run);
    assert_eq!(p["exit"]["signal"], libc::SIGKILL, "{p}");
    assert_eq!(p["exit"]["name"], "SIGKILL", "{p}");
    run.assert_no_survivor();
}

both!(stopped_turns_carry_the_exit);
