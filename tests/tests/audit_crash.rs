//! The audit trail survives a host crash: a real `sharedos run` process,
//! seating the testplugin in the sandbox, writes files through the kernel
//! in a loop and is SIGKILLed in the middle of the turn. Afterwards the
//! JSONL trail parses to its last line (no torn record), every file on
//! disk has the allowed `authorization.checked` decision of its call, and
//! no process of the turn survived the host (the sandbox's lifeline).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_tests::leftovers::workspaces_in;
use sharedos_tests::turns::{
    AGENT, NAMESPACE, descendants, is_alive, marked_pids, parse_jsonl_strict, request,
    testplugin_host_toml, wait_gone, workspace_bin,
};

/// Files (relative to the agent's directory, as path segments) under `dir`.
fn files_under(dir: &Path, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        prefix.push(name);
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            files_under(&e.path(), prefix, out);
        } else {
            out.push(prefix.clone());
        }
        prefix.pop();
    }
}

/// Files in place (a write's temp file is not one yet).
fn count_files(dir: &Path) -> usize {
    let mut out = Vec::new();
    files_under(dir, &mut Vec::new(), &mut out);
    out.iter()
        .filter(|f| !f.last().is_some_and(|n| n.starts_with(".sharedos-tmp-")))
        .count()
}

/// What a crash left for the next host to clean up.
struct Crashed {
    host_pid: u32,
    /// The crashed host's `TMPDIR`.
    tmp: PathBuf,
    _dir: tempfile::TempDir,
}

fn crash_once(launcher: &str, after_files: usize) -> Crashed {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let marker = format!("crash-{launcher}-{}-{after_files}", std::process::id());
    let config = dir.path().join("host.toml");
    std::fs::write(&config, testplugin_host_toml(&marker, launcher, 120_000)).unwrap();

    const N: usize = 200;
    // Sleepers in their own sessions that never exit on their own: only
    // the sandbox's lifeline can take them down with the host.
    let mut script = vec![json!({"op": "fork", "n": 2, "setsid": true})];
    for i in 0..N {
        script.push(json!({"op": "call", "tool": "files.write",
            "arguments": {"path": format!("notes/f{i:03}.txt"), "content": format!("entry {i}\n")}}));
        script.push(json!({"op": "sleep", "ms": 15}));
    }
    let req: PathBuf = dir.path().join("turn.json");
    std::fs::write(
        &req,
        request(
            "crash-turn-1",
            Value::Array(script),
            &["files.write"],
            120_000,
        )
        .to_string(),
    )
    .unwrap();

    let stdout = std::fs::File::create(dir.path().join("stdout")).unwrap();
    let stderr = std::fs::File::create(dir.path().join("stderr")).unwrap();
    let mut host = Command::new(workspace_bin("sharedos"))
        .arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--request")
        .arg(&req)
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap();
    let host_pid = host.id();

    // Wait until the turn is well under way.
    let agent_dir = dir.path().join("files").join(NAMESPACE).join(AGENT);
    let until = Instant::now() + Duration::from_secs(60);
    while count_files(&agent_dir) < after_files {
        if let Ok(Some(status)) = host.try_wait() {
            panic!(
                "sharedos run ended before the crash ({status}): {}",
                std::fs::read_to_string(dir.path().join("stderr")).unwrap_or_default()
            );
        }
        assert!(Instant::now() < until, "the turn never got going");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Every process of the turn: the host's descendants (the sandbox
    // helper, its pid 1, the plugin) and anything carrying the marker.
    let mut tree = descendants(host_pid);
    for p in marked_pids(&marker) {
        if !tree.contains(&p) {
            tree.push(p);
        }
    }
    if launcher == "sandbox" {
        // The helper, its pid 1, the plugin and the two sleepers.
        assert!(tree.len() >= 5, "turn processes before the crash: {tree:?}");
    }
    assert!(
        marked_pids(&marker).len() >= 3,
        "the plugin and its two sleepers are not all running (tree {tree:?})"
    );
    // The crash.
    // SAFETY: kill(2) on the child we spawned.
    unsafe {
        libc::kill(host_pid as i32, libc::SIGKILL);
    }
    let status = host.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );

    // No process of the turn survives its host.
    let until = Instant::now() + Duration::from_secs(10);
    let mut alive: Vec<u32> = tree.iter().copied().filter(|p| is_alive(*p)).collect();
    while !alive.is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
        alive = tree.iter().copied().filter(|p| is_alive(*p)).collect();
    }
    assert!(
        alive.is_empty(),
        "processes outlived the host: {alive:?} of {tree:?}"
    );
    assert!(
        wait_gone(&marker, Duration::from_secs(5)).is_empty(),
        "a marked process outlived the host"
    );

    // The trail parses to its last line.
    let records = parse_jsonl_strict(&dir.path().join("audit.jsonl"));
    assert!(!records.is_empty());
    assert!(
        !records.iter().any(|r| r["type"] == "turn.ended"),
        "the host was killed mid-turn, yet the turn ended"
    );
    let kinds: Vec<&str> = records
        .iter()
        .map(|r| r["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        &kinds[..3],
        [
            "authority.resolved",
            "authorization.checked",
            "tool.catalog.listed"
        ]
    );

    // Every file on disk has its call's allowed decision, written before
    // the effect.
    let mut files = Vec::new();
    files_under(&agent_dir, &mut Vec::new(), &mut files);
    let (temps, finals): (Vec<_>, Vec<_>) = files
        .into_iter()
        .partition(|f| f.last().is_some_and(|n| n.starts_with(".sharedos-tmp-")));
    assert!(
        finals.len() >= after_files && finals.len() < N,
        "{} files: not a crash mid-turn",
        finals.len()
    );
    let allowed_write = |r: &Value| {
        r["type"] == "authorization.checked"
            && r["outcome"] == "allowed"
            && r["action"] == "write"
            && r["resource"]["namespace"] == "files"
    };
    for f in &finals {
        let mut path = vec![json!(AGENT)];
        path.extend(f.iter().map(|s| json!(s)));
        let decision = records
            .iter()
            .position(|r| allowed_write(r) && r["resource"]["path"] == Value::Array(path.clone()));
        let Some(decision) = decision else {
            panic!("{f:?} is on disk without an allowed authorization.checked record");
        };
        let op = &records[decision]["operationId"];
        assert!(
            op.is_string(),
            "the decision names its call: {}",
            records[decision]
        );
        // The call's outcome record, when written, comes after its decision
        // and says it succeeded.
        if let Some(outcome) = records
            .iter()
            .position(|r| r["type"] == "tool.invoked" && &r["operationId"] == op)
        {
            assert!(outcome > decision);
            assert_eq!(
                records[outcome]["outcome"], "succeeded",
                "{}",
                records[outcome]
            );
        }
    }
    // A leftover temp file can only belong to the call that was in flight:
    // an allowed write whose outcome was never recorded.
    let in_flight = records
        .iter()
        .filter(|r| allowed_write(r))
        .filter(|d| {
            !records
                .iter()
                .any(|r| r["type"] == "tool.invoked" && r["operationId"] == d["operationId"])
        })
        .count();
    assert!(in_flight <= 1, "{in_flight} calls without an outcome");
    assert!(
        temps.len() <= in_flight,
        "temp files {temps:?}, in flight {in_flight}"
    );
    // No argument or file content reached the trail.
    let text = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
    assert!(!text.contains("entry "), "file contents in the audit trail");
    assert!(
        !text.contains("\"arguments\""),
        "arguments in the audit trail"
    );
    Crashed {
        host_pid,
        tmp,
        _dir: dir,
    }
}

/// The cgroups named after a host pid (`sharedos-<pid>-<n>`), in the
/// hierarchies the sandbox uses.
fn cgroups_of(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("sharedos-{pid}-");
    let mut out = Vec::new();
    for parent in [
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup",
    ] {
        if let Ok(dir) = std::fs::read_dir(parent) {
            for e in dir.flatten() {
                if e.file_name().to_string_lossy().starts_with(&prefix) {
                    out.push(e.path());
                }
            }
        }
    }
    out
}

/// A short turn through `sharedos run` with `launcher`, as the next host
/// after a crash.
fn next_host_run(tmp: &Path, launcher: &str) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("host.toml");
    std::fs::write(&config, testplugin_host_toml("next-host", launcher, 30_000)).unwrap();
    let req = dir.path().join("turn.json");
    std::fs::write(
        &req,
        request("next-turn", json!([]), &["files.read"], 30_000).to_string(),
    )
    .unwrap();
    let out = Command::new(workspace_bin("sharedos"))
        .arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--request")
        .arg(&req)
        .env("TMPDIR", tmp)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the next host's turn failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Five crashes at different points of the turn.
#[test]
fn host_sigkill_mid_turn_sandboxed() {
    for after_files in [1, 5, 15, 30, 70] {
        let crashed = crash_once("sandbox", after_files);
        // The dead host could not remove its plugin cgroups (where this
        // machine gives the sandbox a cgroup at all)...
        let before = cgroups_of(crashed.host_pid);
        eprintln!("cgroups left by host {}: {before:?}", crashed.host_pid);
        // ...the next host's first spawn sweeps them, once empty.
        next_host_run(&crashed.tmp, "sandbox");
        let left = cgroups_of(crashed.host_pid);
        assert!(left.is_empty(), "cgroups of the dead host left: {left:?}");
    }
}

/// A host killed mid-turn leaves its sandbox workspace
/// (`$TMPDIR/sharedos-ws-*`, holding whatever the plugin wrote) behind;
/// the next host to start removes it, so host crashes do not leak one
/// directory per running sandboxed turn.
#[test]
fn host_sigkill_leaves_no_sandbox_workspace_after_the_next_host_starts() {
    let crashed = crash_once("sandbox", 5);
    next_host_run(&crashed.tmp, "sandbox");
    let left = workspaces_in(&crashed.tmp);
    assert!(
        left.is_empty(),
        "workspaces of the dead host left: {left:?}"
    );
}

/// The direct launcher's working directories (`$TMPDIR/sharedos-direct-
/// <host pid>-cwd…`) that a dead host left are removed by the next host's
/// first direct launch; a live host's are kept.
#[test]
fn a_dead_hosts_direct_working_directories_are_removed_by_the_next_host() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    // A pid above the kernel's maximum is never alive; this process is.
    let dead = tmp.join("sharedos-direct-99999999-cwd0-0123456789abcdef");
    let live = tmp.join(format!("sharedos-direct-{}-cwd0-x", std::process::id()));
    for d in [&dead, &live] {
        std::fs::create_dir(d).unwrap();
        std::fs::write(d.join("left.txt"), b"written by a plugin").unwrap();
    }
    next_host_run(&tmp, "direct");
    assert!(!dead.exists(), "the dead host's working directory is left");
    assert!(live.exists(), "a live host's working directory was removed");
}
