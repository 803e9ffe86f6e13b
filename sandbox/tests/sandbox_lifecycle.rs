//! Real processes: the sandbox's lifecycle. Killing and reaping the whole
//! tree (with and without a pid namespace or cgroup), dropping a child, the
//! host's death, exit statuses, a helper that never reports, and prepared
//! sandboxes; each checked on the host side (no pid, cgroup or dir left).

// Tests tweak one field of the default policy at a time, which reads best
// as an assignment.
#![allow(clippy::field_reassign_with_default)]

mod common;

use std::io::{BufRead, BufReader};
use std::time::Duration;

use common::*;
use sharedos_sandbox::{LayerStatus, SandboxError, SandboxLevel, SandboxPolicy, spawn};

fn kill_tree_leaves_nothing(mut policy: SandboxPolicy, tag: &str) {
    policy.min_level = SandboxLevel::Minimal;
    let policy_wants_cgroup = policy.cgroup.enabled;
    let ws = workspace();
    let token = format!("daemon:{tag}-{}", std::process::id());
    let mut child = spawn(&spec(ws.path(), policy, std::slice::from_ref(&token))).unwrap();
    let mut stdout = wait_started(&mut child);
    if child.report.pidns != LayerStatus::Applied && policy_wants_cgroup {
        // This variant is about the cgroup: it must be there.
        assert!(
            child.report.cgroup.kill && !child.report.cgroup.paths.is_empty(),
            "no pid namespace and no cgroup: {:?}",
            child.report.cgroup
        );
    }
    // The probe and its setsid'd grandchild, by pid, from the host side.
    let mut pids = Vec::new();
    assert!(
        eventually(Duration::from_secs(10), || {
            pids = pids_with_token(&token);
            pids.len() >= 2
        }),
        "daemon tree not found: {pids:?}"
    );
    child.kill_tree();
    child.wait().unwrap();
    assert!(
        eventually(Duration::from_secs(10), || pids.iter().all(|p| is_dead(*p))),
        "survivors: {:?}",
        pids.iter().filter(|p| !is_dead(**p)).collect::<Vec<_>>()
    );
    // The grandchild held stdout: with it dead, the host sees EOF.
    let mut rest = String::new();
    std::io::Read::read_to_string(stdout.get_mut(), &mut rest).unwrap();
    assert!(pids_with_token(&token).is_empty());
}

#[test]
fn kill_tree_kills_a_setsid_grandchild_through_the_pid_namespace() {
    // No cgroup: the pid namespace alone must take the whole tree down.
    let mut policy = SandboxPolicy::default();
    policy.cgroup.enabled = false;
    kill_tree_leaves_nothing(policy, "pidns");
}

#[test]
fn kill_tree_without_a_pid_namespace_uses_the_cgroup() {
    if !needs_root(
        "sandbox_lifecycle::kill_tree_without_a_pid_namespace_uses_the_cgroup",
        "a plugin's own cgroup needs root or a delegated cgroup subtree",
    ) {
        return;
    }
    let mut policy = SandboxPolicy::default();
    policy.layers.pidns = false;
    policy.layers.mountns = false;
    kill_tree_leaves_nothing(policy, "cgroup");
}

#[test]
fn dropping_the_child_kills_the_tree() {
    let ws = workspace();
    let token = format!("daemon:drop-{}", std::process::id());
    let mut child = spawn(&spec(
        ws.path(),
        SandboxPolicy::default(),
        std::slice::from_ref(&token),
    ))
    .unwrap();
    let _stdout = wait_started(&mut child);
    let mut pids = Vec::new();
    assert!(eventually(Duration::from_secs(10), || {
        pids = pids_with_token(&token);
        pids.len() >= 2
    }));
    let cgroups: Vec<String> = child.report.cgroup.paths.clone();
    // A root host gives the tree a cgroup too (one without root has only
    // the pid namespace, which this test still shows kills everything).
    let root = rustix::process::geteuid().is_root();
    assert!(!root || !cgroups.is_empty(), "{:?}", child.report.cgroup);
    drop(child);
    assert!(eventually(Duration::from_secs(10), || pids
        .iter()
        .all(|p| is_dead(*p))));
    for cg in cgroups {
        assert!(
            !std::path::Path::new(&cg).exists(),
            "cgroup {cg} left behind"
        );
    }
}

#[test]
fn kill_handle_works_from_another_thread() {
    let ws = workspace();
    let token = format!("daemon:handle-{}", std::process::id());
    let mut child = spawn(&spec(
        ws.path(),
        SandboxPolicy::default(),
        std::slice::from_ref(&token),
    ))
    .unwrap();
    let _stdout = wait_started(&mut child);
    let handle = child.kill_handle().unwrap();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        handle.kill_tree();
    });
    let status = child.wait().unwrap();
    killer.join().unwrap();
    assert!(!status.success());
    assert!(eventually(Duration::from_secs(10), || pids_with_token(
        &token
    )
    .is_empty()));
}

#[test]
fn host_death_takes_the_sandbox_down() {
    // A stand-in host spawns a sandboxed daemon tree; SIGKILL the host and
    // nothing it launched may survive (lifeline socket + parent-death chain).
    let ws = workspace();
    let token = format!("lifeline-{}", std::process::id());
    let mut host = std::process::Command::new(env!("CARGO_BIN_EXE_sharedos-sandbox-host-stub"))
        .arg(helper())
        .arg(probe())
        .arg(ws.path())
        .arg(&token)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(host.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let helper_pid: i32 = line.trim().parse().expect("helper pid");
    let daemon = format!("daemon:{token}");
    let mut pids = Vec::new();
    assert!(eventually(Duration::from_secs(10), || {
        pids = pids_with_token(&daemon);
        pids.len() >= 2
    }));
    host.kill().unwrap();
    host.wait().unwrap();
    pids.push(helper_pid);
    assert!(
        eventually(Duration::from_secs(10), || pids.iter().all(|p| is_dead(*p))),
        "survivors after the host died: {:?}",
        pids.iter().filter(|p| !is_dead(**p)).collect::<Vec<_>>()
    );
    // The dead host could not remove its cgroups; the next host sweeps them.
    let stub = format!("sharedos-{}-", host.id());
    let stale = |p: &str| {
        std::fs::read_dir(p)
            .map(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with(&stub))
            })
            .unwrap_or(false)
    };
    assert!(eventually(Duration::from_secs(10), || {
        sharedos_sandbox::cgroup::sweep_stale();
        !stale("/sys/fs/cgroup/pids") && !stale("/sys/fs/cgroup/unified")
    }));
}

#[test]
fn exit_status_and_kill_with_and_without_the_fork_server() {
    for fork_server in [true, false] {
        let mut policy = SandboxPolicy::default();
        policy.fork_server = fork_server;
        policy.timings = true;
        let ws = workspace();
        let mut child = spawn(&spec(ws.path(), policy.clone(), &["exit:7".to_string()])).unwrap();
        let forked = child
            .report
            .timings_us
            .iter()
            .any(|t| t.stage.contains("fork server"));
        assert_eq!(forked, fork_server);
        assert_eq!(
            child.wait().unwrap().code(),
            Some(7),
            "fork_server={fork_server}"
        );
        // A tree killed from the host: the helper dies by SIGKILL.
        let mut child = spawn(&spec(ws.path(), policy, &["daemon:x".to_string()])).unwrap();
        let _ = wait_started(&mut child);
        child.kill_tree();
        let st = child.wait().unwrap();
        assert!(!st.success(), "fork_server={fork_server}: {st:?}");
        assert!(child.try_wait().unwrap().is_some());
    }
}

#[test]
fn kill_tree_without_pid_namespace_or_cgroup_still_reaps_descendants() {
    // Best effort of the reduced mode: pid 1 is a subreaper and kills every
    // descendant when the supervisor dies.
    let mut policy = SandboxPolicy::default();
    policy.layers.pidns = false;
    policy.layers.mountns = false;
    policy.cgroup.enabled = false;
    kill_tree_leaves_nothing(policy, "subreaper");
}

#[test]
fn a_helper_that_never_reports_is_an_error() {
    // A "helper" that exits without reading its request: EOF on the report
    // pipe without a report must fail the spawn, never count as success.
    let ws = workspace();
    let mut s = spec(ws.path(), SandboxPolicy::default(), &[]);
    s.helper_exe = "/bin/true".into();
    match spawn(&s) {
        Err(SandboxError::NoReport { .. }) | Err(SandboxError::Io { .. }) => {}
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("spawn succeeded without a report"),
    }
}

#[test]
fn a_prepared_sandbox_runs_nothing_until_started() {
    let ws = workspace();
    let token = format!("daemon:prepared-{}", std::process::id());
    let mut prepared = sharedos_sandbox::prepare(&spec(
        ws.path(),
        SandboxPolicy::default(),
        std::slice::from_ref(&token),
    ))
    .unwrap();
    assert_eq!(prepared.report().level, full_level());
    assert!(!prepared.report().prepared);
    assert!(prepared.is_alive());
    // The helper is up; the plugin binary is not running.
    assert!(!is_dead(prepared.pid()));
    std::thread::sleep(Duration::from_millis(100));
    assert!(pids_with_token(&token).is_empty(), "the plugin ran early");
    let mut child = prepared.start().unwrap();
    assert!(child.report.prepared);
    assert_eq!(child.report.level, full_level());
    let _stdout = wait_started(&mut child);
    let mut pids = Vec::new();
    assert!(eventually(Duration::from_secs(10), || {
        pids = pids_with_token(&token);
        pids.len() >= 2
    }));
    drop(child);
    assert!(eventually(Duration::from_secs(10), || pids
        .iter()
        .all(|p| is_dead(*p))));
}

#[test]
fn a_prepared_sandbox_runs_the_probe_with_every_layer() {
    let ws = workspace();
    let ops = ["uid", "status", "fds", "procs", "cwd"].map(String::from);
    let prepared =
        sharedos_sandbox::prepare(&spec(ws.path(), SandboxPolicy::default(), &ops)).unwrap();
    let mut child = prepared.start().unwrap();
    drop(child.stdin.take());
    let out = read_all(child.stdout.take().unwrap());
    assert!(child.wait().unwrap().success(), "{out}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    // The plugin sees the same sandbox a plain spawn gives: no root, no
    // capabilities, seccomp filter mode, only fds 0-2.
    assert_ne!(ok(&v, "uid"), "0", "{v}");
    let status = ok(&v, "status");
    assert!(status.contains("CapEff: 0000000000000000"), "{status}");
    assert!(status.contains("CapBnd: 0000000000000000"), "{status}");
    assert!(status.contains("NoNewPrivs: 1"), "{status}");
    assert!(status.contains("Seccomp: 2"), "{status}");
    assert_eq!(ok(&v, "fds"), "0,1,2", "{v}");
    assert_eq!(ok(&v, "cwd"), "/workspace");
    // The start pipe did not follow the plugin, and only the reaper and
    // the probe exist in its pid namespace.
    assert_eq!(ok(&v, "procs"), "2");
    assert_eq!(child.report.fds, vec![0, 1, 2]);
}

#[test]
fn dropping_a_prepared_sandbox_leaves_nothing() {
    let ws = workspace();
    let token = format!("daemon:discarded-{}", std::process::id());
    let prepared = sharedos_sandbox::prepare(&spec(
        ws.path(),
        SandboxPolicy::default(),
        std::slice::from_ref(&token),
    ))
    .unwrap();
    let helper = prepared.pid();
    let cgroups = prepared.report().cgroup.paths.clone();
    drop(prepared);
    assert!(eventually(Duration::from_secs(10), || is_dead(helper)));
    for cg in cgroups {
        assert!(
            !std::path::Path::new(&cg).exists(),
            "cgroup {cg} left behind"
        );
    }
    assert!(
        pids_with_token(&token).is_empty(),
        "the discarded plugin ran"
    );
}
