//! `launcher = "microvm"` through the whole host (`sharedos run`): the test
//! plugin in a real QEMU microVM (under TCG on machines without nested
//! virtualization), its tool calls through the envelope, the deadline of a
//! plugin that ignores the abort, a crash, a plugin that allocates past the
//! VM's RAM, and what each leaves: no QEMU process, no run directory.
//! Configurations the engine cannot carry are refused with the reason; a
//! kernel that does not exist gets a typed error with the fix.
//!
//! A machine without QEMU or the guest kernel fails these tests with the
//! fix (`scripts/test` provisions both).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_tests::turns::{request, testplugin_host_toml, workspace_bin};

struct CliRun {
    code: i32,
    result: Value,
    stderr: String,
    elapsed: Duration,
}

/// `sharedos run` of `script` with `config` (the test plugin's host.toml).
fn run_cli(config: &str, script: Value, timeout_ms: u64) -> CliRun {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("host.toml"), config).unwrap();
    let turn = request(
        "microvm-turn",
        script,
        &["files.read", "files.write"],
        timeout_ms,
    );
    std::fs::write(dir.path().join("turn.json"), turn.to_string()).unwrap();
    let started = Instant::now();
    let out = Command::new(workspace_bin("sharedos"))
        .arg("run")
        .arg("--config")
        .arg(dir.path().join("host.toml"))
        .arg("--request")
        .arg(dir.path().join("turn.json"))
        .output()
        .unwrap();
    CliRun {
        code: out.status.code().unwrap_or(-1),
        result: serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: started.elapsed(),
    }
}

/// The test plugin's host.toml under the microVM launcher, with `extra`
/// lines in its runtime entry.
fn microvm_toml(tag: &str, extra: &str) -> String {
    // The guest init is built with the workspace's binaries.
    workspace_bin("sharedos-guest-init");
    let marker = format!("microvm-{tag}-{}", std::process::id());
    testplugin_host_toml(&marker, "microvm", 120_000).replace(
        "launcher = \"microvm\"",
        &format!("launcher = \"microvm\"\nhandshakeTimeoutMs = 60000\n{extra}"),
    )
}

/// The VM's RAM the tests give (the default policy's memory bound, 4 GiB,
/// would be the default).
const RAM_256: &str = "microvm = { memoryMib = 256 }";

fn sandbox_report(run: &CliRun) -> &Value {
    &run.result["metadata"]["runtime"]["sandbox"]
}

/// Processes whose command line names `needle`.
fn processes_naming(needle: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains(needle).then(|| format!("{pid}: {cmd}"))
        })
        .collect()
}

/// The run's QEMU is gone (no process names its run directory) and so is
/// the run directory.
fn nothing_left(report: &Value) {
    let dir = report["run_dir"]
        .as_str()
        .expect("the report names the run");
    assert!(dir.contains("sharedos-microvm-"), "{report}");
    let end = Instant::now() + Duration::from_secs(10);
    let mut left = processes_naming(dir);
    while !left.is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
        left = processes_naming(dir);
    }
    assert!(left.is_empty(), "QEMU of {dir} outlived the turn: {left:?}");
    assert!(!Path::new(dir).exists(), "the run directory {dir} is left");
}

#[test]
fn a_turn_with_tool_calls_runs_in_a_microvm_and_reports_the_engine() {
    let script = json!([
        {"op": "call", "tool": "files.write", "arguments": {"path": "m.txt", "content": "in a microvm"}},
        {"op": "call", "tool": "files.read", "arguments": {"path": "m.txt"}}
    ]);
    let run = run_cli(&microvm_toml("tools", RAM_256), script, 120_000);
    assert_eq!(
        run.result["status"], "succeeded",
        "{}\n{}",
        run.result, run.stderr
    );
    assert_eq!(run.code, 0);
    assert!(
        run.result.to_string().contains("in a microvm"),
        "{}",
        run.result
    );
    let report = sandbox_report(&run);
    assert_eq!(report["engine"], "microvm", "{report}");
    assert_eq!(report["level"], "strong", "{report}");
    let accel = report["accelerator"]["name"].as_str().unwrap_or_default();
    assert!(accel == "tcg" || accel == "kvm", "{report}");
    assert!(
        !report["accelerator"]["why"]
            .as_str()
            .unwrap_or_default()
            .is_empty()
    );
    let version = report["qemu"]["version"].as_str().unwrap_or_default();
    assert!(version.starts_with("QEMU emulator version"), "{report}");
    assert!(
        report["kernel"]
            .as_str()
            .unwrap_or_default()
            .contains("vmlinuz"),
        "{report}"
    );
    assert!(
        report["network"]
            .as_str()
            .unwrap_or_default()
            .starts_with("none"),
        "{report}"
    );
    assert_eq!(report["vm"]["memory_mib"], 256, "{report}");
    assert_eq!(
        report["memory"]["tree_bound_bytes"],
        256u64 << 20,
        "{report}"
    );
    assert_eq!(report["memory"]["unbounded"], json!([]), "{report}");
    assert_eq!(report["missing"], json!([]), "{report}");
    eprintln!(
        "microvm turn with two tool calls under {accel}: {:?}",
        run.elapsed
    );
    nothing_left(report);
}
