//! `sharedos conformance`, from the outside: the three SDKs' echo examples
//! conform in the full sandbox; programs that are not plugins are reported
//! as such within their time budget and leave no process behind.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use sharedos_tests::plugin_bin;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn conformance(args: &[&str]) -> (Output, Value) {
    let out = Command::new(plugin_bin("sharedos"))
        .arg("conformance")
        .arg("--json")
        .args(args)
        .current_dir(repo())
        .env_remove("SHAREDOS_LOG")
        .output()
        .expect("run sharedos conformance");
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, report)
}

fn status<'a>(report: &'a Value, id: &str) -> &'a str {
    report["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["id"] == id))
        .and_then(|c| c["status"].as_str())
        .unwrap_or_else(|| panic!("no check {id} in {report}"))
}

/// Every check passed: none failed, none was inapplicable.
fn assert_conforms(out: &Output, report: &Value) {
    let checks = report["checks"].as_array().expect("checks");
    let not_passed: Vec<&Value> = checks.iter().filter(|c| c["status"] != "pass").collect();
    assert!(not_passed.is_empty(), "{not_passed:#?}");
    assert!(checks.len() >= 15, "{checks:#?}");
    assert_eq!(report["passed"], true);
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn the_rust_echo_conforms_in_the_sandbox_and_directly() {
    let echo = plugin_bin("sharedos-echo");
    let echo = echo.to_str().expect("utf-8 path");
    let (out, report) = conformance(&["--", echo]);
    assert_eq!(report["launcher"], "sandbox");
    assert_conforms(&out, &report);
    let (out, report) = conformance(&["--launcher", "direct", "--", echo]);
    assert_eq!(report["launcher"], "direct");
    assert_conforms(&out, &report);
}

#[test]
fn the_python_echo_examples_conform_in_the_sandbox() {
    for script in [
        "sdk/python/examples/echo.py",
        "sdk/python/examples/echo_blocking.py",
    ] {
        let (out, report) = conformance(&["--", "python3", script]);
        assert_conforms(&out, &report);
        // The script's package (and so the SDK next to it) was bound.
        let ro = report["read_only_paths"][0].as_str().expect("a bound path");
        assert!(ro.ends_with("sdk/python"), "{ro}");
    }
}

#[test]
fn the_typescript_echo_conforms_in_the_sandbox() {
    let (out, report) = conformance(&["--", "node", "sdk/typescript/examples/echo.mjs"]);
    assert_conforms(&out, &report);
}

/// Processes whose command line holds `marker`.
fn with_marker(marker: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        })
        .collect()
}

#[test]
fn programs_that_are_not_plugins_are_reported_and_leave_nothing() {
    let marker = format!("{}", 86_000 + std::process::id() % 10_000);
    let daemon = format!("(setsid sleep {marker} &); (sleep {marker} &); read x; sleep {marker}");
    let garbage = format!("echo garbage; sleep {marker}");
    let cases: [(&str, Vec<&str>); 4] = [
        ("a shell", vec!["sh"]),
        ("garbage", vec!["sh", "-c", &garbage]),
        ("a hang", vec!["sleep", &marker]),
        ("a daemon-forker", vec!["sh", "-c", &daemon]),
    ];
    for launcher in ["sandbox", "direct"] {
        for (what, cmd) in &cases {
            let started = Instant::now();
            let mut args = vec![
                "--launcher",
                launcher,
                "--handshake-timeout-ms",
                "1500",
                "--",
            ];
            args.extend(cmd.iter().copied());
            let (out, report) = conformance(&args);
            assert_eq!(out.status.code(), Some(1), "{what} ({launcher}): {report}");
            // One cause: it ended, spoke out of turn, or never answered.
            let failed: Vec<&str> = ["starts", "silent_before_initialize", "handshake"]
                .into_iter()
                .filter(|id| status(&report, id) == "fail")
                .collect();
            assert_eq!(failed.len(), 1, "{what} ({launcher}): {report}");
            assert_eq!(status(&report, "drain"), "not_run", "{what} ({launcher})");
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{what} ({launcher}) took {:?}",
                started.elapsed()
            );
            let left = with_marker(&format!("sleep\0{marker}"));
            assert!(left.is_empty(), "{what} ({launcher}) left {left:?}");
        }
    }
}

/// A daemon forked with `setsid` no longer escapes a direct launch: the
/// launch's own cgroup kills it with the tree, so nothing is left behind
/// (the check would name a survivor, as it does for a launch without a
/// cgroup).
#[test]
fn a_daemon_forked_in_a_direct_launch_is_contained() {
    let marker = format!("{}", 76_000 + std::process::id() % 10_000);
    let daemon = format!("(setsid sleep {marker} &); read x; sleep {marker}");
    let (_, report) = conformance(&[
        "--launcher",
        "direct",
        "--handshake-timeout-ms",
        "1000",
        "--",
        "sh",
        "-c",
        &daemon,
    ]);
    let left = with_marker(&format!("sleep\0{marker}"));
    assert!(left.is_empty(), "the daemon survived: {left:?}");
    assert_eq!(status(&report, "nothing_left_behind"), "pass", "{report}");
}

#[test]
fn a_plugin_choosing_a_version_it_was_not_offered_fails_the_handshake() {
    let script = r#"
import sys, json
sys.stdin.readline()
sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": 7,
  "manifest": {"id": "x", "version": "1", "protocolVersion": "1"}}}) + "\n")
sys.stdout.flush()
sys.stdin.read()
"#;
    let (out, report) = conformance(&["--", "python3", "-c", script]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(status(&report, "handshake"), "fail");
    let handshake = report["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["id"] == "handshake"))
        .expect("the handshake check");
    let detail = handshake["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("not offered"), "{detail}");
    // Run by hand it does not say what it is: it waits on stdin.
    assert_eq!(status(&report, "run_by_hand"), "fail");
}

#[test]
fn the_fifty_line_plugin_of_protocol_md_conforms_in_the_sandbox() {
    let (out, report) = conformance(&["--", "python3", "sdk/python/examples/no_sdk.py"]);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(report["passed"], true);
    for c in report["checks"].as_array().expect("checks") {
        // It ignores payload.outcome: every other check passes.
        let expected = if c["id"] == "outcome_kinds" {
            "not_applicable"
        } else {
            "pass"
        };
        assert_eq!(c["status"], expected, "{c}");
    }
}
