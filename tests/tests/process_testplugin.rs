//! The real `sharedos-testplugin` binary through `ProcessRuntime`: a good
//! turn, every bad input of the wire, exits, aborts, forks, floods. After
//! each test: no child survived, no fd leaked.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use sharedos_host::process::ProcessRuntime;
use sharedos_plugin_sdk::{RuntimeError, RuntimePlugin, RuntimeTurnOutcome, Signal, SignalSource};
use sharedos_tests::{
    Record, RecordingHost, isolated, kill_all, live_children, runtime, survivors, testplugin,
    turn_request,
};

const BOUND: Duration = Duration::from_secs(5);

/// Runs one scripted turn and checks that nothing outlived it.
async fn turn(
    rt: &ProcessRuntime,
    script: Value,
    host: &Arc<RecordingHost>,
    abort: Signal,
) -> Result<RuntimeTurnOutcome, RuntimeError> {
    rt.run(
        turn_request("exec-1", json!({ "script": script })),
        host.clone(),
        abort,
    )
    .await
}

/// Waits (bounded) until `what` holds, then a little longer so that what
/// follows it on the wire has arrived too.
async fn settle(what: impl Fn() -> bool) {
    let until = std::time::Instant::now() + BOUND;
    while !what() && std::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
}

fn tool_calls(host: &RecordingHost) -> usize {
    host.records()
        .iter()
        .filter(|r| matches!(r, Record::Tool { .. }))
        .count()
}

fn assert_clean(host: &RecordingHost) {
    let pids = host.reported_pids();
    let left = survivors(&pids, BOUND);
    kill_all(&left);
    assert!(left.is_empty(), "processes survived the turn: {left:?}");
    // The teardown runs off the turn's path; settle_kills waits for it.
    sharedos_host::process::settle_kills();
    let children = live_children();
    assert!(children.is_empty(), "live children remain: {children:?}");
}

fn protocol_error(r: Result<RuntimeTurnOutcome, RuntimeError>, reason: &str) {
    match r {
        Err(RuntimeError::Protocol(m)) => assert!(m.contains(reason), "expected {reason}, got {m}"),
        other => panic!("expected Protocol({reason}), got {other:?}"),
    }
}

#[test]
fn a_turn_with_tool_calls_emits_and_annotations_in_order() {
    isolated(async {
        let host = RecordingHost::new();
        let script = json!([
            {"op":"emit_pid"},
            {"op":"emit","type":"progress","data":{"pct":10}},
            {"op":"annotate","key":"model","value":"m-1"},
            {"op":"call","tool":"echo","arguments":{"n":1},"step":0},
            {"op":"call","tool":"forbidden","arguments":{},"step":1},
            {"op":"annotate","key":"runtime","value":"refused by the host"},
            {"op":"emit","type":"progress","data":{"pct":100}},
        ]);
        let out = turn(&testplugin("normal"), script, &host, Signal::never())
            .await
            .unwrap();
        let RuntimeTurnOutcome::Complete { output, .. } = out else {
            panic!("{out:?}")
        };
        let results = output["results"].as_array().unwrap();
        assert_eq!(results[0]["result"]["status"], "succeeded");
        assert_eq!(results[0]["result"]["output"]["echo"], json!({"n":1}));
        assert_eq!(
            results[1]["result"]["status"], "denied",
            "refusals are results"
        );
        let records = host.records();
        assert_eq!(
            records[1..],
            [
                Record::Emit {
                    kind: "progress".into(),
                    data: json!({"pct":10})
                },
                Record::Annotate {
                    key: "model".into(),
                    value: json!("m-1")
                },
                Record::Tool {
                    tool: "echo".into(),
                    step: Some(0),
                    arguments: json!({"n":1})
                },
                Record::Tool {
                    tool: "forbidden".into(),
                    step: Some(1),
                    arguments: json!({})
                },
                Record::Emit {
                    kind: "progress".into(),
                    data: json!({"pct":100})
                },
            ]
        );
        assert_clean(&host);
    })
}

async fn bad_input(step: Value, reason: &str) {
    let host = RecordingHost::new();
    let rt = runtime(
        "sharedos-testplugin",
        &["normal"],
        ("sharedos-testplugin", "0.1.0"),
        |c| {
            c.max_message_bytes = 64 * 1024;
        },
    );
    let r = turn(
        &rt,
        json!([{"op":"emit_pid"}, step, {"op":"stall"}]),
        &host,
        Signal::never(),
    )
    .await;
    protocol_error(r, reason);
    assert_clean(&host);
}

#[test]
fn plugin_writes_non_json() {
    isolated(async {
        bad_input(
            json!({"op":"raw","line":"panic: something went wrong"}),
            "invalid_json",
        )
        .await;
    })
}

#[test]
fn plugin_writes_a_line_over_the_limit() {
    isolated(async {
        bad_input(json!({"op":"long_line","bytes":200_000}), "frame_too_large").await;
    })
}

#[test]
fn plugin_writes_invalid_utf8() {
    isolated(async {
        bad_input(json!({"op":"invalid_utf8"}), "invalid_utf8").await;
    })
}

#[test]
fn plugin_writes_a_batch() {
    isolated(async {
        bad_input(json!({"op":"batch"}), "batch_not_supported").await;
    })
}

#[test]
fn plugin_writes_duplicate_keys() {
    isolated(async {
        bad_input(
            json!({"op":"raw","line":"{\"jsonrpc\":\"2.0\",\"id\":1,\"id\":2,\"result\":{}}"}),
            "invalid_envelope",
        )
        .await;
    })
}

#[test]
fn a_response_to_an_id_never_sent_is_dropped_and_the_turn_goes_on() {
    // protocol.md D #22: drop and count, not fatal.
    isolated(async {
        let host = RecordingHost::new();
        let script = json!([{"op":"emit_pid"}, {"op":"bogus_response"}, {"op":"emit","type":"after","data":null}]);
        let out = turn(&testplugin("normal"), script, &host, Signal::never())
            .await
            .unwrap();
        assert!(matches!(out, RuntimeTurnOutcome::Complete { .. }));
        assert!(host.records().contains(&Record::Emit {
            kind: "after".into(),
            data: Value::Null
        }));
        assert_clean(&host);
    })
}

#[test]
fn plugin_exits_mid_turn() {
    isolated(async {
        bad_input(json!({"op":"exit","code":3}), "plugin_exited").await;
    })
}

#[test]
fn plugin_crashes_mid_turn() {
    isolated(async {
        bad_input(json!({"op":"crash"}), "plugin_exited").await;
    })
}

#[test]
fn plugin_closes_stdout_mid_turn() {
    isolated(async {
        bad_input(json!({"op":"close_stdout"}), "plugin_exited").await;
    })
}

#[test]
fn children_holding_the_pipes_do_not_keep_the_turn_alive() {
    // The plugin forks two children that inherit stdout, then exits: no
    // EOF ever comes, the exit is noticed through the process handle, and
    // the process-group kill takes the children too.
    isolated(async {
        let host = RecordingHost::new();
        let script = json!([{"op":"emit_pid"}, {"op":"fork","n":2}, {"op":"exit","code":0}]);
        let started = std::time::Instant::now();
        let r = turn(&testplugin("normal"), script, &host, Signal::never()).await;
        protocol_error(r, "plugin_exited");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the turn did not hang"
        );
        assert_eq!(host.reported_pids().len(), 3);
        assert_clean(&host);
    })
}

#[test]
fn an_outcome_that_does_not_parse_is_invalid_outcome() {
    isolated(async {
        let host = RecordingHost::new();
        let script = json!([{"op":"emit_pid"}, {"op":"outcome","value":{"type":"complete"}}]);
        let r = turn(&testplugin("normal"), script, &host, Signal::never()).await;
        assert!(matches!(r, Err(RuntimeError::InvalidOutcome(_))), "{r:?}");
        assert_clean(&host);
    })
}

#[test]
fn an_error_answer_to_turn_run_is_failed() {
    isolated(async {
        let host = RecordingHost::new();
        let script =
            json!([{"op":"emit_pid"}, {"op":"error_outcome","message":"the model exploded"}]);
        let r = turn(&testplugin("normal"), script, &host, Signal::never()).await;
        assert!(
            matches!(r, Err(RuntimeError::Failed(ref m)) if m.contains("the model exploded")),
            "{r:?}"
        );
        assert_clean(&host);
    })
}

#[test]
fn the_first_outcome_wins_and_later_messages_are_not_applied() {
    isolated(async {
        let host = RecordingHost::new();
        let script = json!([
            {"op":"emit_pid"},
            {"op":"emit","type":"before","data":1},
            {"op":"outcome","value":{"type":"complete","output":"first"}},
            {"op":"outcome","value":{"type":"complete","output":"second"}},
            {"op":"emit","type":"after","data":1},
            {"op":"annotate","key":"late","value":1},
        ]);
        let out = turn(&testplugin("normal"), script, &host, Signal::never())
            .await
            .unwrap();
        assert_eq!(out, RuntimeTurnOutcome::complete(json!("first")));
        let kinds: Vec<Record> = host.records().into_iter().skip(1).collect();
        assert_eq!(
            kinds,
            [Record::Emit {
                kind: "before".into(),
                data: json!(1)
            }]
        );
        assert_clean(&host);
    })
}

#[test]
fn an_emit_flood_is_fatal() {
    isolated(async {
        // More than the per-turn count budget (100 000), so the outcome does
        // not depend on how fast this machine drains the pipe.
        bad_input(json!({"op":"flood","n":120_000}), "rate_limit_exceeded").await;
    })
}

/// Tool calls take from the per-turn byte budget of notifications (64 MiB
/// by default): 80 MiB of calls, each answered, end the turn. Before, a
/// plugin could push any volume through requests uncounted.
#[test]
fn tool_calls_count_against_the_byte_budget() {
    isolated(async {
        let host = RecordingHost::new();
        let rt = runtime(
            "sharedos-testplugin",
            &["normal"],
            ("sharedos-testplugin", "0.1.0"),
            |_| {},
        );
        let script =
            json!([{"op":"emit_pid"}, {"op":"big_calls","n":40,"bytes":2 << 20,"tool":"echo"}]);
        let r = turn(&rt, script, &host, Signal::never()).await;
        protocol_error(r, "rate_limit_exceeded");
        let served = tool_calls(&host);
        assert!(
            (30..40).contains(&served),
            "the calls within the budget were served, the rest not: {served}"
        );
        assert_clean(&host);
    })
}

/// `host/invokeTool` without an id is never served and counts against the
/// dropped-message budget (100 per turn).
#[test]
fn tool_calls_sent_without_an_id_are_counted_not_served() {
    isolated(async {
        let host = RecordingHost::new();
        let rt = runtime(
            "sharedos-testplugin",
            &["normal"],
            ("sharedos-testplugin", "0.1.0"),
            |_| {},
        );
        let script =
            json!([{"op":"emit_pid"}, {"op":"invoke_as_notification","tool":"echo","n":101}]);
        let r = turn(&rt, script, &host, Signal::never()).await;
        protocol_error(r, "violation_budget_exceeded");
        assert_eq!(tool_calls(&host), 0);
        assert_clean(&host);
    })
}

#[test]
fn tool_calls_over_the_inflight_cap_are_not_taken() {
    isolated(async {
        let host = RecordingHost::new();
        let rt = runtime(
            "sharedos-testplugin",
            &["normal"],
            ("sharedos-testplugin", "0.1.0"),
            |c| {
                c.max_inflight_tool_calls = 2;
            },
        );
        let abort = SignalSource::new();
        let script = json!([{"op":"emit_pid"}, {"op":"burst_calls","n":4,"tool":"slow"}]);
        let run = turn(&rt, script, &host, abort.signal());
        let stop = async {
            settle(|| tool_calls(&host) >= 2).await;
            abort.raise();
        };
        let (r, ()) = tokio::join!(run, stop);
        assert!(matches!(r, Err(RuntimeError::Failed(_))), "{r:?}");
        assert_eq!(
            tool_calls(&host),
            2,
            "only the calls within the cap reach the host"
        );
        assert_clean(&host);
    })
}

#[test]
fn abort_ends_the_turn_and_kills_a_plugin_that_ignores_it() {
    isolated(async {
        let host = RecordingHost::new();
        let abort = SignalSource::new();
        let script =
            json!([{"op":"emit_pid"}, {"op":"ignore_abort"}, {"op":"fork","n":1}, {"op":"spin"}]);
        let rt = testplugin("normal");
        let run = turn(&rt, script, &host, abort.signal());
        let raised = std::sync::Mutex::new(None);
        let stop = async {
            settle(|| host.reported_pids().len() >= 2).await;
            *raised.lock().unwrap() = Some(std::time::Instant::now());
            abort.raise();
        };
        let (r, ()) = tokio::join!(run, stop);
        assert!(matches!(r, Err(RuntimeError::Failed(_))), "{r:?}");
        let raised = raised.lock().unwrap().unwrap();
        assert!(
            raised.elapsed() < Duration::from_secs(2),
            "the abort does not wait for the plugin"
        );
        assert_eq!(host.reported_pids().len(), 2);
        assert_clean(&host);
    })
}

#[test]
fn draining_reaches_the_plugin() {
    isolated(async {
        let host = RecordingHost::new();
        host.drain.raise();
        let script = json!([{"op":"emit_pid"}, {"op":"call","tool":"echo","arguments":{}}]);
        let out = turn(&testplugin("normal"), script, &host, Signal::never())
            .await
            .unwrap();
        let RuntimeTurnOutcome::Complete { output, .. } = out else {
            panic!()
        };
        assert_eq!(output["draining"], true);
        assert_clean(&host);
    })
}

#[test]
fn dropping_the_run_future_kills_the_tree() {
    isolated(async {
        let host = RecordingHost::new();
        let script = json!([{"op":"emit_pid"}, {"op":"fork","n":2}, {"op":"stall"}]);
        let rt = testplugin("normal");
        let mut run = Box::pin(turn(&rt, script, &host, Signal::never()));
        tokio::select! {
            r = &mut run => panic!("the turn should still be running: {r:?}"),
            () = settle(|| host.reported_pids().len() >= 3) => {}
        }
        // The executor drops `run` at its deadline; so do we.
        drop(run);
        assert_eq!(host.reported_pids().len(), 3);
        assert_clean(&host);
    })
}

#[test]
fn setsid_escapees_do_not_hang_the_turn() {
    // A daemon that calls `setsid` and double-forks is reparented to init
    // and escapes the direct launcher's kill (the sandbox's pid namespace
    // is what stops that). What this test pins: the turn still ends
    // promptly although the escapee holds the pipes, and the plugin itself
    // is gone.
    isolated(async {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pids");
        let host = RecordingHost::new();
        let script = json!([
            {"op":"emit_pid"},
            {"op":"fork","n":1,"setsid":true,"double":true,"pidfile":pidfile},
            {"op":"sleep","ms":200},
            {"op":"exit","code":0},
        ]);
        let started = std::time::Instant::now();
        let r = turn(&testplugin("normal"), script, &host, Signal::never()).await;
        protocol_error(r, "plugin_exited");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the turn did not hang"
        );
        let plugin_pid = host.reported_pids()[0];
        assert!(survivors(&[plugin_pid], BOUND).is_empty());
        // The grandchild writes its pid once it runs; wait for it (bounded).
        let read_pids = || -> Vec<u32> {
            std::fs::read_to_string(&pidfile)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect()
        };
        settle(|| !read_pids().is_empty()).await;
        let escaped = read_pids();
        assert_eq!(escaped.len(), 1, "the double-forked daemon reported itself");
        kill_all(&escaped);
        assert!(survivors(&escaped, BOUND).is_empty());
        let path = dir.path().to_owned();
        drop(dir);
        assert!(!path.exists(), "temp dir left behind");
    })
}

/// The direct launcher contains the whole tree in a cgroup of its own: the
/// plugin, the children in its group and a child that left the group with
/// `setsid` all die with the turn, and the cgroup and the plugin's working
/// directory are gone once the kills are settled.
#[test]
fn the_direct_launch_kills_the_whole_tree_a_setsid_child_included() {
    isolated(async {
        let host = RecordingHost::new();
        let script = json!([{"op":"emit_pid"}, {"op":"fork","n":2}, {"op":"fork","n":1,"setsid":true}, {"op":"stall"}]);
        let rt = testplugin("normal");
        let abort = SignalSource::new();
        let stop = async {
            settle(|| host.reported_pids().len() >= 4).await;
            abort.raise();
        };
        let (r, ()) = tokio::join!(turn(&rt, script, &host, abort.signal()), stop);
        assert!(matches!(r, Err(RuntimeError::Failed(_))), "{r:?}");
        sharedos_host::process::settle_kills();
        let pids = host.reported_pids();
        assert_eq!(pids.len(), 4, "reported pids: {pids:?}");
        let left = survivors(&pids, BOUND);
        kill_all(&left);
        assert!(left.is_empty(), "the plugin's tree survived: {left:?}");
        let children = live_children();
        assert!(children.is_empty(), "live children remain: {children:?}");
        // Nothing of this host's direct launches is left: no cgroup, no
        // working directory.
        let mine = format!("sharedos-direct-{}-", std::process::id());
        for dir in [Path::new("/sys/fs/cgroup/unified"), &std::env::temp_dir()] {
            let left: Vec<_> = std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&mine))
                .map(|e| e.path())
                .collect();
            assert!(left.is_empty(), "left behind: {left:?}");
        }
    })
}

#[test]
fn a_plugin_that_does_not_read_its_stdin_is_a_write_stall() {
    isolated(async {
        let host = RecordingHost::new();
        let rt = runtime(
            "sharedos-testplugin",
            &["normal"],
            ("sharedos-testplugin", "0.1.0"),
            |c| c.write_stall_timeout = Duration::from_millis(300),
        );
        // The answer to `big` (512 KiB) cannot fit the pipe of a plugin that
        // stopped reading.
        let script = json!([{"op":"emit_pid"}, {"op":"call_nowait","tool":"big","arguments":{}}, {"op":"stall"}]);
        let started = std::time::Instant::now();
        let r = turn(&rt, script, &host, Signal::never()).await;
        protocol_error(r, "write_stall");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the turn did not hang"
        );
        assert_clean(&host);
    })
}
