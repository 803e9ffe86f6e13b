//! Sandboxes prepared ahead of turns (`warm` in a runtime's sandbox
//! policy), through the whole host with the real helper: the first turn
//! builds its sandbox, later ones take a prepared one (and say so in their
//! provenance) at the same level; each prepared sandbox has its own fresh
//! workspace (a tmpfs in its own mount namespace, never on the host), gone
//! with its turn; dropping the runtime leaves no process and no workspace; a sandbox that cannot be built refuses every
//! turn without a prepared one ever standing in for it. One test per
//! binary: it counts every descendant of this process.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sharedos_host::executor::{ExecuteOptions, Executor, ExecutorOptions};
use sharedos_host::process::{ProcessRuntime, ProcessRuntimeConfig};
use sharedos_host::sandboxed::SandboxLauncher;
use sharedos_host::seat::process_seat;
use sharedos_protocol::{ExecutionRequest, ExecutionResult, ExecutionStatus, RuntimeManifest};
use sharedos_sandbox::SandboxPolicy;
use sharedos_tests::leftovers::{eventually, own_workspaces};
use sharedos_tests::turns::descendants;
use sharedos_tests::{demo_kernel, plugin_bin};

fn request(id: &str) -> ExecutionRequest {
    let mut r: ExecutionRequest =
        serde_json::from_str(include_str!("../../host/demo/turn.json")).unwrap();
    r.execution_id = sharedos_protocol::ident(id);
    r.message.payload = json!({"calls": []});
    r
}

/// The deepest process below `pid` (the prepared tree's waiting plugin
/// process), following first children.
fn deepest(pid: u32) -> u32 {
    let mut p = pid;
    for _ in 0..8 {
        let kids =
            std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
        match kids.split_whitespace().next().and_then(|k| k.parse().ok()) {
            Some(k) => p = k,
            None => break,
        }
    }
    p
}

/// The workspace of each prepared sandbox ready now, seen from the host
/// through its waiting process's root: (unique mount id, empty). Mount ids
/// from `STATX_MNT_ID_UNIQUE` are never reused, so a new id is a new tmpfs.
fn spare_workspaces(launcher: &SandboxLauncher) -> Vec<(u64, bool)> {
    launcher
        .warm_pids()
        .iter()
        .map(|&pid| {
            let ws = format!("/proc/{}/root/workspace", deepest(pid as u32));
            let entries = std::fs::read_dir(&ws).unwrap_or_else(|e| panic!("{ws}: {e}"));
            let c = std::ffi::CString::new(ws.clone()).unwrap();
            // SAFETY: statx is plain old data; the kernel fills it.
            let mut st: libc::statx = unsafe { std::mem::zeroed() };
            // SAFETY: `c` is NUL-terminated and `st` a valid out pointer.
            let rc = unsafe {
                libc::statx(
                    libc::AT_FDCWD,
                    c.as_ptr(),
                    0,
                    libc::STATX_MNT_ID_UNIQUE,
                    &mut st,
                )
            };
            assert_eq!(rc, 0, "statx {ws}: {}", std::io::Error::last_os_error());
            assert_ne!(
                st.stx_mask & libc::STATX_MNT_ID_UNIQUE,
                0,
                "no unique mount id"
            );
            (st.stx_mnt_id, entries.count() == 0)
        })
        .collect()
}

/// No process of this test's host and no workspace of it is left.
fn nothing_left(me: u32) {
    sharedos_host::process::settle_kills();
    assert!(
        eventually(Duration::from_secs(10), || descendants(me).is_empty()),
        "survivors: {:?}",
        descendants(me)
    );
    assert!(
        eventually(Duration::from_secs(10), || own_workspaces().is_empty()),
        "{:?}",
        own_workspaces()
    );
}

fn sandbox_of(r: &ExecutionResult) -> serde_json::Value {
    r.metadata["runtime"]["sandbox"].clone()
}

fn executor(launcher: Arc<SandboxLauncher>, dir: &std::path::Path) -> Executor {
    let kernel = demo_kernel(dir);
    let manifest = RuntimeManifest::new("sharedos-echo", env!("CARGO_PKG_VERSION")).unwrap();
    let runtime = ProcessRuntime::new(
        ProcessRuntimeConfig::new(plugin_bin("sharedos-echo"), manifest),
        launcher,
    )
    .unwrap();
    Executor::new(
        Arc::new(kernel),
        process_seat(Arc::new(runtime)),
        ExecutorOptions::default(),
    )
    .unwrap()
}

#[test]
fn warm_runtimes_take_prepared_sandboxes_and_leave_nothing() {
    if !sharedos_tests::needs_root(
        "sandbox_warm::warm_runtimes_take_prepared_sandboxes_and_leave_nothing",
        "a prepared sandbox's workspace is seen through /proc/<pid>/root of a process that is not dumpable, which only root may read",
    ) {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let me = std::process::id();
    let dir = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let policy = SandboxPolicy {
            warm: 1,
            ..Default::default()
        };
        let launcher = Arc::new(SandboxLauncher::new(plugin_bin("sharedos"), policy));
        let exec = executor(launcher.clone(), dir.path());

        // The runtime prepares its sandbox as soon as it exists: a live
        // tree of this host with a fresh, empty workspace of its own, which
        // is not on the host.
        assert_eq!(launcher.wait_warm(Duration::from_secs(30)), 1);
        let mut spare_ws = spare_workspaces(&launcher);
        assert_eq!(spare_ws.len(), 1, "{spare_ws:?}");
        assert!(spare_ws[0].1, "the workspace is not empty");
        assert!(own_workspaces().is_empty(), "{:?}", own_workspaces());
        assert!(!descendants(me).is_empty(), "no prepared tree is alive");
        let first = exec
            .execute(request("warm-1"), ExecuteOptions::default())
            .await
            .unwrap();
        assert_eq!(first.status, ExecutionStatus::Succeeded, "{first:#?}");
        assert_eq!(sandbox_of(&first)["level"], sharedos_tests::full_level());
        assert_eq!(sandbox_of(&first)["prepared"], true);
        sharedos_host::process::settle_kills();
        assert_eq!(launcher.wait_warm(Duration::from_secs(30)), 1);
        let now = spare_workspaces(&launcher);
        assert_eq!(now.len(), 1, "{now:?}");
        assert!(
            now[0].1 && now[0].0 != spare_ws[0].0,
            "a workspace was reused"
        );
        spare_ws = now;

        // The same from a plain launcher that never prepares: the report
        // is the same but for `prepared`.
        let cold = SandboxLauncher::new(plugin_bin("sharedos"), SandboxPolicy::default());
        let cold_dir = tempfile::tempdir().unwrap();
        let plain = executor(Arc::new(cold), cold_dir.path())
            .execute(request("cold-1"), ExecuteOptions::default())
            .await
            .unwrap();
        assert_eq!(plain.status, ExecutionStatus::Succeeded, "{plain:#?}");
        assert!(sandbox_of(&plain).get("prepared").is_none());
        assert_eq!(plain.output, first.output);
        let strip = |mut v: serde_json::Value| {
            let o = v.as_object_mut().unwrap();
            // Each sandbox runs as a uid of its own.
            for k in ["prepared", "cgroup", "timings_us", "host_uid"] {
                o.remove(k);
            }
            if let Some(sc) = o.get_mut("self_check").and_then(|s| s.as_object_mut()) {
                for k in ["uid", "gid", "uid_map"] {
                    sc.remove(k);
                }
            }
            v
        };
        assert_eq!(strip(sandbox_of(&plain)), strip(sandbox_of(&first)));
        sharedos_host::process::settle_kills();

        for i in 2..=4 {
            let r = exec
                .execute(request(&format!("warm-{i}")), ExecuteOptions::default())
                .await
                .unwrap();
            assert_eq!(r.status, ExecutionStatus::Succeeded, "{r:#?}");
            let sb = sandbox_of(&r);
            assert_eq!(sb["prepared"], true, "turn {i}: {sb}");
            assert_eq!(sb["level"], sharedos_tests::full_level(), "{sb}");
            assert!(sharedos_tests::full_missing(&sb).is_empty(), "{sb}");
            assert_eq!(sb["fds"], json!([0, 1, 2]), "{sb}");
            assert_eq!(r.output, first.output);
            sharedos_host::process::settle_kills();
            // The turn's workspace went with it; the next one is new.
            assert_eq!(launcher.wait_warm(Duration::from_secs(30)), 1);
            let now = spare_workspaces(&launcher);
            assert_eq!(now.len(), 1, "{now:?}");
            assert!(
                now[0].1 && now[0].0 != spare_ws[0].0,
                "turn {i}: a workspace was reused"
            );
            spare_ws = now;
        }

        // A prepared tree killed from outside while it waits is noticed
        // when taken: the turn builds its own, and succeeds.
        let pids = launcher.warm_pids();
        assert_eq!(pids.len(), 1, "{pids:?}");
        // SAFETY: signalling a helper this test's host started, by pid.
        assert_eq!(unsafe { libc::kill(pids[0], libc::SIGKILL) }, 0);
        // Dead for sure (a zombie until the launcher reaps it) before the
        // turn asks: a tree that dies while being taken fails that turn.
        assert!(eventually(Duration::from_secs(10), || {
            std::fs::read_to_string(format!("/proc/{}/stat", pids[0]))
                .map(|s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')))
                .unwrap_or(true)
        }));
        let r = exec
            .execute(request("warm-killed"), ExecuteOptions::default())
            .await
            .unwrap();
        assert_eq!(r.status, ExecutionStatus::Succeeded, "{r:#?}");
        assert!(
            sandbox_of(&r).get("prepared").is_none(),
            "{}",
            sandbox_of(&r)
        );
        assert_eq!(sandbox_of(&r)["level"], sharedos_tests::full_level());
        sharedos_host::process::settle_kills();
        assert_eq!(launcher.wait_warm(Duration::from_secs(30)), 1);
        assert_eq!(spare_workspaces(&launcher).len(), 1);
        assert!(own_workspaces().is_empty(), "{:?}", own_workspaces());

        // Turns at once: each gets a sandbox of its own, prepared or built
        // in its path, never one shared.
        let exec = Arc::new(exec);
        let mut tasks = Vec::new();
        for i in 0..6 {
            let ex = exec.clone();
            tasks.push(tokio::spawn(async move {
                ex.execute(request(&format!("warm-c{i}")), ExecuteOptions::default())
                    .await
                    .unwrap()
            }));
        }
        let mut prepared = 0;
        let mut cgroups = std::collections::HashSet::new();
        for t in tasks {
            let r = t.await.unwrap();
            assert_eq!(r.status, ExecutionStatus::Succeeded, "{r:#?}");
            let sb = sandbox_of(&r);
            assert_eq!(sb["level"], sharedos_tests::full_level(), "{sb}");
            prepared += usize::from(sb["prepared"] == true);
            assert!(cgroups.insert(sb["cgroup"]["paths"].to_string()), "{sb}");
        }
        assert!(
            prepared >= 1,
            "no concurrent turn took the prepared sandbox"
        );

        drop(exec);
        drop(launcher);
    });
    drop(rt);
    // The last launcher gone: every prepared tree killed, every workspace
    // removed.
    nothing_left(me);

    // A warm runtime whose sandbox is below its minimum: every turn is
    // refused with the report, and no prepared sandbox ever stands in.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let policy = SandboxPolicy {
            warm: 2,
            emulate_no_userns: true,
            ..Default::default()
        };
        let launcher = Arc::new(SandboxLauncher::new(plugin_bin("sharedos"), policy));
        let exec = executor(launcher.clone(), dir.path());
        for i in 0..3 {
            let r = exec
                .execute(request(&format!("refused-{i}")), ExecuteOptions::default())
                .await
                .unwrap();
            assert_ne!(r.status, ExecutionStatus::Succeeded, "{r:#?}");
            let sb = sandbox_of(&r);
            assert_eq!(sb["refused"], true, "{sb}");
            assert_eq!(sb["required"], "isolated", "{sb}");
            launcher.wait_warm(Duration::from_secs(30));
            assert_eq!(launcher.warm_ready(), 0);
        }
        drop(exec);
        drop(launcher);
    });
    drop(rt);
    nothing_left(me);
}
