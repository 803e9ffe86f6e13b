//! Endings through the `sharedos run` binary: the whole host process, the
//! configured launcher, the JSONL trail. A turn stopped by its deadline
//! exits promptly, prints the `cancelled` result, records `turn.ended`, and
//! leaves no process behind once the host has exited.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_tests::turns::{
    parse_jsonl_strict, request, testplugin_host_toml, wait_gone, workspace_bin,
};

fn run_cli(
    launcher: &str,
    script: Value,
    timeout_ms: u64,
) -> (i32, Value, Vec<Value>, Duration, String) {
    let dir = tempfile::tempdir().unwrap();
    let marker = format!("cli-{launcher}-{}-{timeout_ms}", std::process::id());
    std::fs::write(
        dir.path().join("host.toml"),
        testplugin_host_toml(&marker, launcher, 60_000),
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
    let out = Command::new(workspace_bin("sharedos"))
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
    // Both launchers contain the whole tree: a `setsid` daemon and a
    // double-forked one included.
    let mut script = vec![json!({"op": "fork", "n": 2})];
    script.push(json!({"op": "fork", "n": 1, "setsid": true}));
    script.push(json!({"op": "fork", "n": 1, "setsid": true, "double": true}));
    script.push(json!({"op": "annotate", "key": "note", "value": "kept"}));
    script.push(json!({"op": "ignore_abort"}));
    script.push(json!({"op": "hold"}));
    let (code, result, audit, elapsed, marker) = run_cli(launcher, json!(script), 1500);
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
    if launcher == "direct" {
        let sandbox = &result["metadata"]["runtime"]["sandbox"];
        assert_eq!(sandbox["launcher"], "direct", "{sandbox}");
        assert_eq!(sandbox["containment"], "cgroup", "{sandbox}");
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
