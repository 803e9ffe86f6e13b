//! Endings through the `sharedos run` binary: the whole host process, the
//! configured launcher, the JSONL trail. A turn stopped by its deadline
//! exits promptly, prints the `cancelled` result, records `turn.ended`, and
//! leaves no process behind once the host has exited.

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_tests::is_root;
use sharedos_tests::turns::{
    parse_jsonl_strict, request, testplugin_host_toml, wait_gone, workspace_bin,
};

/// The uid the host runs as where it must not be root: nobody's.
const NOBODY: u32 = 65534;

fn run_cli(
    launcher: &str,
    script: Value,
    timeout_ms: u64,
) -> (i32, Value, Vec<Value>, Duration, String) {
    run_cli_as(launcher, script, timeout_ms, None)
}

/// `sharedos run` with the test plugin, as `uid` when given (the test then
/// runs as root).
fn run_cli_as(
    launcher: &str,
    script: Value,
    timeout_ms: u64,
    uid: Option<u32>,
) -> (i32, Value, Vec<Value>, Duration, String) {
    run_cli_with(launcher, script, timeout_ms, uid, |config| config)
}

/// [`run_cli_as`] with `edit` applied to the host's configuration.
fn run_cli_with(
    launcher: &str,
    script: Value,
    timeout_ms: u64,
    uid: Option<u32>,
    edit: impl FnOnce(String) -> String,
) -> (i32, Value, Vec<Value>, Duration, String) {
    let dir = tempfile::tempdir().unwrap();
    if let Some(uid) = uid {
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(uid)).unwrap();
    }
    let marker = format!("cli-{launcher}-{}-{timeout_ms}", std::process::id());
    std::fs::write(
        dir.path().join("host.toml"),
        edit(testplugin_host_toml(&marker, launcher, 60_000)),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("turn.json"),
        request(
            "cli-turn",
            script,
            &["files.read", "files.write"],
            timeout_ms,
        )
        .to_string(),
    )
    .unwrap();
    let started = Instant::now();
    let mut cmd = Command::new(workspace_bin("sharedos"));
    if let Some(uid) = uid {
        // Its state directory (staged copies) goes under its own TMPDIR.
        cmd.uid(uid)
            .gid(uid)
            .current_dir(dir.path())
            .env("TMPDIR", dir.path())
            .env_remove("XDG_RUNTIME_DIR");
    }
    let out = cmd
        .arg("run")
        .arg("--config")
        .arg(dir.path().join("host.toml"))
        .arg("--request")
        .arg(dir.path().join("turn.json"))
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    let result: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no result on stdout ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let audit = parse_jsonl_strict(&dir.path().join("audit.jsonl"));
    (
        out.status.code().unwrap_or(-1),
        result,
        audit,
        elapsed,
        marker,
    )
}

fn deadline(launcher: &str) {
    deadline_as(launcher, None);
}

fn deadline_as(launcher: &str, uid: Option<u32>) {
    // Both launchers contain the whole tree: a `setsid` daemon and a
    // double-forked one included.
    let mut script = vec![json!({"op": "fork", "n": 2})];
    script.push(json!({"op": "fork", "n": 1, "setsid": true}));
    script.push(json!({"op": "fork", "n": 1, "setsid": true, "double": true}));
    script.push(json!({"op": "annotate", "key": "note", "value": "kept"}));
    script.push(json!({"op": "ignore_abort"}));
    script.push(json!({"op": "hold"}));
    let (code, result, audit, elapsed, marker) = run_cli_as(launcher, json!(script), 1500, uid);
    assert_eq!(code, 1, "a cancelled turn exits 1");
    assert_eq!(result["status"], "cancelled", "{result}");
    assert_eq!(result["error"]["code"], "turn_cancelled");
    assert_eq!(result["error"]["retryable"], true);
    assert_eq!(result["metadata"]["note"], "kept");
    let expected_level = if launcher == "sandbox" {
        sharedos_tests::full_level()
    } else {
        "none"
    };
    assert_eq!(
        result["metadata"]["runtime"]["sandbox"]["level"],
        expected_level
    );
    let engine = if launcher == "sandbox" {
        "namespace"
    } else {
        "direct"
    };
    assert_eq!(result["metadata"]["runtime"]["sandbox"]["engine"], engine);
    if launcher == "direct" {
        let sandbox = &result["metadata"]["runtime"]["sandbox"];
        assert_eq!(sandbox["launcher"], "direct", "{sandbox}");
        // A root host makes a cgroup for the plugin; a host that is not
        // root and has no delegated cgroup holds the tree with a subreaper,
        // and says so and why.
        if uid.is_none() {
            sharedos_tests::assert_direct_containment(&sandbox["containment"]);
        } else {
            let containment = sandbox["containment"].as_str().unwrap_or_default();
            assert!(
                containment.starts_with("subreaper (no cgroup: "),
                "{sandbox}"
            );
        }
    }
    assert_eq!(
        result["events"].as_array().unwrap().last().unwrap()["type"],
        "turn.cancelled"
    );
    assert!(
        elapsed < Duration::from_millis(1500) + Duration::from_secs(3),
        "sharedos run took {elapsed:?} for a 1500 ms deadline"
    );
    let last = audit.last().unwrap();
    assert_eq!(last["type"], "turn.ended");
    assert_eq!(last["outcome"], "failed");
    assert_eq!(last["reason"], "turn_cancelled");
    let left = wait_gone(&marker, Duration::from_secs(10));
    assert!(
        left.is_empty(),
        "processes outlived `sharedos run`: {left:?}"
    );
}

#[test]
fn cli_deadline_sandboxed() {
    deadline("sandbox");
}

#[test]
fn cli_deadline_direct() {
    deadline("direct");
}

/// The direct launcher of a host that cannot make a cgroup (here: a root
/// test runs `sharedos run` as nobody; a test that is not root already is
/// such a host) still ends a `setsid` and a double-forked daemon with the
/// turn.
#[test]
fn cli_deadline_direct_without_a_cgroup() {
    deadline_as("direct", is_root().then_some(NOBODY));
}

/// A pinned program through the direct launcher of a host that cannot
/// make a cgroup: the subreaper forks the plugin, which executes the very
/// descriptor the host hashed, and the result names the digest.
#[test]
fn a_pinned_direct_plugin_runs_through_the_subreaper() {
    let program = workspace_bin("sharedos-testplugin");
    let out = Command::new("sha256sum").arg(&program).output().unwrap();
    let digest = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(digest.len(), 64, "sha256sum: {out:?}");
    let pin = |config: String| {
        let pinned = config.replacen(
            "launcher = \"direct\"",
            &format!("launcher = \"direct\"\nsha256 = \"{digest}\""),
            1,
        );
        assert!(pinned.contains("sha256 = "), "{pinned}");
        pinned
    };
    let script = json!([{"op": "emit", "type": "x", "data": 1}]);
    let (code, result, _, _, marker) =
        run_cli_with("direct", script, 20_000, is_root().then_some(NOBODY), pin);
    assert_eq!(code, 0, "{result:#}");
    let runtime = &result["metadata"]["runtime"];
    assert_eq!(runtime["programSha256"], digest.as_str(), "{runtime}");
    assert_eq!(runtime["programPinned"], true, "{runtime}");
    let containment = runtime["sandbox"]["containment"]
        .as_str()
        .unwrap_or_default();
    assert!(
        containment.starts_with("subreaper (no cgroup: "),
        "{runtime}"
    );
    assert!(wait_gone(&marker, Duration::from_secs(10)).is_empty());
}

/// A plugin that exits on its own while a `setsid` daemon of its holds its
/// stdout open: the turn ends with the plugin's failure, and the daemon
/// dies with it, with or without a cgroup.
#[test]
fn direct_crash_with_a_daemon_ends_the_daemon() {
    for uid in [None, is_root().then_some(NOBODY)] {
        let (code, result, _, elapsed, marker) = run_cli_as(
            "direct",
            json!([{"op": "fork", "n": 1, "setsid": true}, {"op": "crash"}]),
            20_000,
            uid,
        );
        assert_eq!(code, 1, "{result}");
        assert_eq!(result["error"]["code"], "runtime_failed", "{result}");
        assert!(
            elapsed < Duration::from_secs(15),
            "a crashed plugin's turn took {elapsed:?}"
        );
        let left = wait_gone(&marker, Duration::from_secs(10));
        assert!(left.is_empty(), "processes outlived the turn: {left:?}");
    }
}

#[test]
fn cli_crash_is_runtime_failed() {
    let (code, result, audit, _, marker) = run_cli(
        "sandbox",
        json!([{"op": "fork", "n": 1, "setsid": true}, {"op": "crash"}]),
        20_000,
    );
    assert_eq!(code, 1);
    assert_eq!(result["status"], "failed");
    assert_eq!(result["error"]["code"], "runtime_failed");
    let last = audit.last().unwrap();
    assert_eq!(last["type"], "turn.ended");
    assert_eq!(last["reason"], "runtime_failed");
    assert_eq!(last["endedBy"], "envelope");
    assert!(wait_gone(&marker, Duration::from_secs(10)).is_empty());
}
