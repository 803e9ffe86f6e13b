//! The result does not wait for teardown (issue 15), and `settle_kills`
//! waits for all of it. This binary holds a single test so that every
//! child of the test process belongs to it: once `settle_kills` has
//! returned, with no further wait, the test process has no descendant
//! left (the sandbox helpers and their pid 1 included), the private
//! `TMPDIR` holds no `sharedos-ws-*` workspace and no `sharedos-<pid>-*`
//! cgroup of this process exists; nor does any process of a sandboxed
//! turn (the cgroup's `populated 0` is what the teardown waited for).

use std::time::Duration;

use serde_json::json;
use sharedos_protocol::ExecutionStatus;
use sharedos_tests::leftovers::{own_cgroups, workspaces_in};
use sharedos_tests::turns::{Launch, TurnSpec, descendants, marked_pids, run_turn, wait_gone};

#[test]
fn settle_kills_leaves_no_process_workspace_or_cgroup() {
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
    // Completed turns whose plugin leaves children behind: same-group ones,
    // and in the sandbox `setsid` and double-forked ones too; enough of
    // them that the teardown is still running when the last result is in.
    let sandboxed = || {
        json!([{"op": "fork", "n": 40}, {"op": "fork", "n": 1, "setsid": true},
               {"op": "fork", "n": 1, "double": true}])
    };
    let direct = || json!([{"op": "emit_pid"}, {"op": "fork", "n": 2}]);
    let runs = rt.block_on(async {
        let mut turns = Vec::new();
        for i in 0..12 {
            let spec = if i % 3 == 2 {
                TurnSpec::new(Launch::Direct, direct())
            } else {
                TurnSpec::new(Launch::Sandbox, sandboxed())
            };
            turns.push(tokio::spawn(run_turn(spec)));
        }
        let mut runs = Vec::new();
        for t in turns {
            runs.push(t.await.unwrap());
        }
        runs
    });
    for run in &runs {
        assert_eq!(
            run.result.status,
            ExecutionStatus::Succeeded,
            "{:?}",
            run.result
        );
    }
    sharedos_host::process::settle_kills();
    // No wait from here on: settle_kills is the wait.
    let kids = descendants(std::process::id());
    assert!(
        kids.is_empty(),
        "processes left after settle_kills: {kids:?}"
    );
    let ws = workspaces_in(tmp.path());
    assert!(ws.is_empty(), "workspaces left after settle_kills: {ws:?}");
    let cgroups = own_cgroups();
    assert!(
        cgroups.is_empty(),
        "cgroups left after settle_kills: {cgroups:?}"
    );
    for run in runs.iter().filter(|r| r.launch == Launch::Sandbox) {
        let left = marked_pids(&run.marker);
        assert!(
            left.is_empty(),
            "a sandboxed turn's process outlived settle_kills: {left:?}"
        );
    }
    // Direct launch: the plugin's group was signalled; its children, once
    // orphaned, belong to init and go as soon as the kill lands.
    for run in runs.iter().filter(|r| r.launch == Launch::Direct) {
        assert!(wait_gone(&run.marker, Duration::from_secs(10)).is_empty());
    }
}
