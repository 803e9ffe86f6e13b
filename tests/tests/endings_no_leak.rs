//! No ending leaks a process or a sandbox workspace. This binary holds a
//! single test so that every child of the test process belongs to it: after
//! each sandboxed turn, the test process must have no live descendant at
//! all (the sandbox helper and its pid 1 included, which do not carry the
//! turn's marker), and the private `TMPDIR` no `sharedos-ws-*` workspace.
//! The host's cancellation is also fired at many points of the launch and
//! the handshake.

use std::time::{Duration, Instant};

use serde_json::json;
use sharedos_protocol::ExecutionStatus;
use sharedos_tests::leftovers::workspaces_in;
use sharedos_tests::turns::{Launch, TurnSpec, descendants, run_turn, wait_gone};

/// Waits (bounded) until the test process has no live descendant and no
/// sandbox workspace is left; panics naming what is left.
fn assert_clean(what: &str, tmp: &std::path::Path, marker: &str) {
    let me = std::process::id();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let kids = descendants(me);
        let ws = workspaces_in(tmp);
        if kids.is_empty() && ws.is_empty() {
            break;
        }
        if Instant::now() >= until {
            let cmdlines: Vec<String> = kids
                .iter()
                .map(|p| {
                    std::fs::read(format!("/proc/{p}/cmdline"))
                        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                        .unwrap_or_default()
                })
                .collect();
            panic!("{what}: left behind processes {kids:?} {cmdlines:?}, workspaces {ws:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        wait_gone(marker, Duration::from_secs(5)).is_empty(),
        "{what}: a marked process survived"
    );
}

#[test]
fn sandboxed_endings_leave_no_process_and_no_workspace() {
    let tmp = tempfile::tempdir().unwrap();
    // SAFETY: set before any thread of this test binary's own runtime
    // exists; the harness's other threads do not read the environment.
    unsafe {
        std::env::set_var("TMPDIR", tmp.path());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let stall = || json!([{"op": "emit_pid"}, {"op": "fork", "n": 1, "setsid": true}, {"op": "ignore_abort"}, {"op": "hold"}]);
    let cases: Vec<(&str, TurnSpec)> = vec![
        ("completed", TurnSpec::new(Launch::Sandbox, json!([]))),
        (
            "deadline",
            TurnSpec::new(Launch::Sandbox, stall()).timeout(1200),
        ),
        (
            "crash",
            TurnSpec::new(
                Launch::Sandbox,
                json!([{"op": "fork", "n": 1, "setsid": true}, {"op": "crash"}]),
            ),
        ),
        (
            "garbage",
            TurnSpec::new(
                Launch::Sandbox,
                json!([{"op": "fork", "n": 1, "double": true}, {"op": "raw", "line": "x"}, {"op": "hold"}]),
            ),
        ),
        (
            "handshake deadline",
            TurnSpec::new(Launch::Sandbox, json!([]))
                .mode("silent")
                .timeout(800),
        ),
    ];
    for (what, spec) in cases {
        let run = rt.block_on(run_turn(spec));
        // Let a late exec show up, if a cancelled launch still had one.
        std::thread::sleep(Duration::from_millis(200));
        assert_clean(what, tmp.path(), &run.marker);
    }
    // The host's cancellation at many points of the launch and handshake.
    for delay_ms in [0u64, 1, 3, 5, 10, 20, 40, 80, 150, 300] {
        let mut spec = TurnSpec::new(Launch::Sandbox, stall());
        spec.cancel_after = Some(Duration::from_millis(delay_ms));
        let run = rt.block_on(run_turn(spec));
        assert_eq!(
            run.result.status,
            ExecutionStatus::Cancelled,
            "cancel after {delay_ms} ms: {:?}",
            run.result
        );
        assert_eq!(run.code(), Some("turn_cancelled"));
        std::thread::sleep(Duration::from_millis(200));
        assert_clean(
            &format!("cancel after {delay_ms} ms"),
            tmp.path(),
            &run.marker,
        );
    }
}
