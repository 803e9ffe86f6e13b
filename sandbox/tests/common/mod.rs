//! Shared harness: launch the real helper against the probe binary.

#![allow(dead_code)]

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use sharedos_sandbox::{SandboxPolicy, SandboxedChild, SpawnSpec, spawn};

pub fn helper() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sharedos-sandbox-helper"))
}

pub fn probe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sharedos-sandbox-probe"))
}

/// A per-test workspace under the system temp dir, removed by `TempDir`.
pub fn workspace() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("sharedos-sandbox-test-")
        .tempdir()
        .expect("create workspace")
}

pub fn spec(ws: &std::path::Path, policy: SandboxPolicy, ops: &[String]) -> SpawnSpec {
    SpawnSpec {
        helper_exe: helper(),
        program: probe(),
        args: ops.iter().map(Into::into).collect(),
        env: vec![],
        policy,
        workspace: Some(ws.to_path_buf()),
    }
}

pub fn read_all(fd: OwnedFd) -> String {
    let mut s = String::new();
    let _ = std::fs::File::from(fd).read_to_string(&mut s);
    s
}

/// Run the probe to completion; returns (report, parsed stdout, stderr).
pub fn run(
    policy: SandboxPolicy,
    ops: &[&str],
) -> (sharedos_sandbox::SandboxReport, serde_json::Value, String) {
    let ws = workspace();
    run_in(&ws, policy, ops)
}

pub fn run_in(
    ws: &tempfile::TempDir,
    policy: SandboxPolicy,
    ops: &[&str],
) -> (sharedos_sandbox::SandboxReport, serde_json::Value, String) {
    let ops: Vec<String> = ops.iter().map(|s| s.to_string()).collect();
    let mut child = spawn(&spec(ws.path(), policy, &ops)).expect("spawn the probe");
    drop(child.stdin.take());
    let stderr = child.stderr.take().unwrap();
    let err_thread = std::thread::spawn(move || read_all(stderr));
    let out = read_all(child.stdout.take().unwrap());
    let status = child.wait().expect("wait");
    let err = err_thread.join().unwrap();
    assert!(
        status.success(),
        "probe failed: {status} stderr={err} stdout={out}"
    );
    let v: serde_json::Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("probe output {out:?}: {e}; stderr={err}"));
    (child.report.clone(), v, err)
}

/// Poll `cond` until true or `limit` passes (generous bounds only).
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// Host pids whose command line contains `token`.
pub fn pids_with_token(token: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| c.split(|b| *b == 0).any(|a| a == token.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}

/// True when `pid` is gone or a zombie.
pub fn is_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => {
            let state = s.rsplit_once(") ").map(|(_, r)| r.chars().next());
            matches!(state, Some(Some('Z' | 'X')))
        }
    }
}

pub fn kill_child(c: SandboxedChild) {
    c.kill_tree();
    drop(c);
}

/// Whether `uid` (decimal) is the uid a sandbox runs as on this host: one
/// of the policy's default per-sandbox uids as root, the host's own
/// otherwise.
pub fn is_sandbox_uid(uid: &str) -> bool {
    let r = sharedos_sandbox::UidPolicy::default();
    let me = rustix::process::geteuid().as_raw();
    uid.parse::<u32>().is_ok_and(|u| {
        if me == 0 {
            (r.first..r.first + r.count).contains(&u)
        } else {
            // A host that is not root has no uid range to give: its
            // sandboxes run as its own uid (mapped to itself in their user
            // namespace), which the report says (`own_uid` unavailable).
            u == me
        }
    })
}

/// A string member of the probe's report (empty when absent).
pub fn ok(v: &serde_json::Value, key: &str) -> String {
    v[key].as_str().unwrap_or_default().to_string()
}

/// Read the probe's "started" line, so the daemon tree exists.
pub fn wait_started(child: &mut SandboxedChild) -> std::io::BufReader<std::fs::File> {
    use std::io::BufRead;
    let mut r = std::io::BufReader::new(std::fs::File::from(child.stdout.take().unwrap()));
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.contains("started"), "{line}");
    r
}

/// The host pid of the sandbox's pid 1: the process in a child pid
/// namespace whose NSpid ends in 1, below the helper `helper`.
pub fn sandbox_pid1(helper: i32) -> Option<i32> {
    let mut pid = helper;
    for _ in 0..4 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let nspid = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
        let ids: Vec<&str> = nspid.split_whitespace().collect();
        if ids.len() > 1 && ids.last() == Some(&"1") {
            return Some(pid);
        }
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
        pid = children.split_whitespace().next()?.parse().ok()?;
    }
    None
}

/// The level a full sandbox reaches on this host: `strong` where the
/// memory controller is delegated (the tree's memory bounded), else
/// `isolated`.
pub fn full_level() -> sharedos_sandbox::SandboxLevel {
    if sharedos_sandbox::cgroup::memory_delegated() {
        sharedos_sandbox::SandboxLevel::Strong
    } else {
        sharedos_sandbox::SandboxLevel::Isolated
    }
}

/// Whether a check that only a root host can make runs here; on a host
/// that is not root it is skipped and said so (stderr, and the file
/// `SHAREDOS_TEST_SKIPS` names, which `scripts/test` lists at the end).
pub fn needs_root(test: &str, why: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    let line = format!("{test}: {why}\n");
    eprint!("skipped {line}");
    if let Some(path) = std::env::var_os("SHAREDOS_TEST_SKIPS") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(line.as_bytes());
        }
    }
    false
}
