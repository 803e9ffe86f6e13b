//! The host dies while the sandbox is still being built or the plugin is
//! in its handshake: SIGKILL of `sharedos run` at many early points.
//! Afterwards no sandbox helper, sandbox pid 1 or plugin of that host is
//! left (the helper's lifeline is armed before anything else), and the
//! audit trail still parses to its last line. One test in this binary, so
//! every `__sandbox-exec` process that appears belongs to it.

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use sharedos_tests::turns::{
    is_alive, marked_pids, parse_jsonl_strict, request, testplugin_host_toml, workspace_bin,
};

/// Live processes of this worktree's sandbox helper (`sharedos
/// __sandbox-exec`, the helper and the sandbox's pid 1).
fn helpers() -> HashSet<u32> {
    let exe = workspace_bin("sharedos");
    let exe = exe.to_string_lossy().into_owned();
    let mut out = HashSet::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        // A helper runs under a neutral argv[0]: find it by its executable.
        // A host that is not root cannot read the link of a helper (it is
        // not dumpable): its `__sandbox-exec` argument must do.
        // Unreadable, it must at least run under this user's uid: another
        // user's hosts (a second checkout's suite) run helpers of their own.
        let runs_exe = match std::fs::read_link(e.path().join("exe")) {
            Ok(p) => p.to_string_lossy() == exe,
            Err(err) => {
                err.kind() == std::io::ErrorKind::PermissionDenied
                    && real_uid(&e.path()) == Some(rustix::process::getuid().as_raw())
            }
        };
        if cmd.contains("__sandbox-exec") && runs_exe && is_alive(pid) {
            out.insert(pid);
        }
    }
    out
}

/// The real uid of the process at `proc_dir`, as this namespace sees it.
fn real_uid(proc_dir: &std::path::Path) -> Option<u32> {
    let status = std::fs::read_to_string(proc_dir.join("status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn host_sigkill_during_launch_and_handshake_leaves_nothing() {
    let before = helpers();
    // How many kills landed while a helper of this host was running, and
    // while the plugin itself was: the test is not vacuous.
    let (mut with_helper, mut with_plugin) = (0, 0);
    for delay_ms in [0u64, 2, 5, 10, 20, 35, 50, 80, 120, 200, 350] {
        let dir = tempfile::tempdir().unwrap();
        let marker = format!("early-{}-{delay_ms}", std::process::id());
        std::fs::write(
            dir.path().join("host.toml"),
            testplugin_host_toml(&marker, "sandbox", 60_000),
        )
        .unwrap();
        let script = json!([
            {"op": "fork", "n": 1, "setsid": true},
            {"op": "call", "tool": "files.write", "arguments": {"path": "a.txt", "content": "x"}},
            {"op": "stall"}
        ]);
        std::fs::write(
            dir.path().join("turn.json"),
            request("early", script, &["files.write"], 60_000).to_string(),
        )
        .unwrap();
        let mut host = Command::new(workspace_bin("sharedos"))
            .arg("run")
            .arg("--config")
            .arg(dir.path().join("host.toml"))
            .arg("--request")
            .arg(dir.path().join("turn.json"))
            .env("TMPDIR", dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        if !helpers().difference(&before).collect::<Vec<_>>().is_empty() {
            with_helper += 1;
        }
        if !marked_pids(&marker).is_empty() {
            with_plugin += 1;
        }
        // SAFETY: kill(2) on the child we spawned.
        unsafe {
            libc::kill(host.id() as i32, libc::SIGKILL);
        }
        host.wait().unwrap();
        // Give a late exec the chance to show up, then require that
        // nothing of this host is left.
        std::thread::sleep(Duration::from_millis(300));
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let helpers_left: Vec<u32> = helpers().difference(&before).copied().collect();
            let plugins_left = marked_pids(&marker);
            if helpers_left.is_empty() && plugins_left.is_empty() {
                break;
            }
            assert!(
                Instant::now() < until,
                "killed after {delay_ms} ms: helpers {helpers_left:?} and plugin processes {plugins_left:?} outlived the host"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let audit = dir.path().join("audit.jsonl");
        if audit.exists() {
            let records = parse_jsonl_strict(&audit);
            assert!(
                !records.iter().any(|r| r["type"] == "turn.ended"),
                "killed after {delay_ms} ms, yet the turn ended"
            );
        }
    }
    assert!(
        with_helper >= 2 && with_plugin >= 1,
        "the kills never caught the sandbox at work: {with_helper} with a helper, {with_plugin} with the plugin"
    );
}
