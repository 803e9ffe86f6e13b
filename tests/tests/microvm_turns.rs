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
use sharedos_egress::mock::{MockModel, Wire, plan_script};
use sharedos_host::seat::configured_launcher;
use sharedos_tests::egress::{egress_grant, key_file, run_request_launched, run_requests_launched};
use sharedos_tests::leftovers::processes_naming;
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
    let boot_ms = report["boot_ms"]
        .as_u64()
        .expect("the report gives the boot's time");
    eprintln!(
        "microvm under {accel}: QEMU start to the guest init's ready line {boot_ms} ms; `sharedos run` of the turn (host start, accelerator probe, image, boot, initialize, two tool calls) {:?}",
        run.elapsed
    );
    nothing_left(report);
}

#[test]
fn a_plugin_ignoring_the_abort_is_killed_at_the_deadline_and_leaves_nothing() {
    let script = json!([
        {"op": "fork", "n": 2},
        {"op": "ignore_abort"},
        {"op": "hold"}
    ]);
    let run = run_cli(&microvm_toml("deadline", RAM_256), script, 30_000);
    assert_eq!(
        run.result["status"], "cancelled",
        "{}\n{}",
        run.result, run.stderr
    );
    assert_eq!(run.result["error"]["code"], "turn_cancelled");
    assert_eq!(run.code, 1);
    assert!(
        run.elapsed >= Duration::from_millis(29_900),
        "{:?}",
        run.elapsed
    );
    assert!(
        run.elapsed < Duration::from_secs(30 + 30),
        "sharedos run took {:?} for a 30 s deadline",
        run.elapsed
    );
    let report = sandbox_report(&run);
    assert_eq!(report["engine"], "microvm", "{report}");
    nothing_left(report);
}

#[test]
fn a_crash_is_reported_with_its_signal_and_leaves_nothing() {
    let script = json!([
        {"op": "call", "tool": "files.write", "arguments": {"path": "c.txt", "content": "before"}},
        {"op": "crash"}
    ]);
    let run = run_cli(&microvm_toml("crash", RAM_256), script, 120_000);
    assert_eq!(
        run.result["status"], "failed",
        "{}\n{}",
        run.result, run.stderr
    );
    assert_eq!(
        run.result["error"]["code"], "runtime_failed",
        "{}",
        run.result
    );
    let exit = &run.result["metadata"]["runtime"]["process"]["exit"];
    assert_eq!(exit["name"], "SIGABRT", "{}", run.result);
    nothing_left(sandbox_report(&run));
}

/// The VM's RAM bounds the plugin: allocating past it ends the turn, the
/// exit names the kill and the stderr tail says it was the guest's
/// out-of-memory killer; the host goes on.
#[test]
fn a_plugin_allocating_past_the_vms_ram_ends_the_turn_naming_it() {
    let script = json!([{"op": "alloc", "mib": 512}, {"op": "hold"}]);
    let config = microvm_toml("oom", "microvm = { memoryMib = 192 }");
    let run = run_cli(&config, script, 120_000);
    assert_eq!(
        run.result["status"], "failed",
        "{}\n{}",
        run.result, run.stderr
    );
    assert_eq!(
        run.result["error"]["code"], "runtime_failed",
        "{}",
        run.result
    );
    let process = &run.result["metadata"]["runtime"]["process"];
    assert_eq!(process["exit"]["name"], "SIGKILL", "{}", run.result);
    let tail = process["stderrTail"].to_string();
    assert!(
        tail.contains("out of memory") && tail.contains("192 MiB"),
        "{}",
        run.result
    );
    let report = sandbox_report(&run);
    assert_eq!(
        report["memory"]["tree_bound_bytes"],
        192u64 << 20,
        "{report}"
    );
    nothing_left(report);
}

#[test]
fn a_kernel_that_does_not_exist_is_refused_at_load_with_the_fix() {
    let config = microvm_toml(
        "nokernel",
        "microvm = { kernel = \"/nonexistent/vmlinuz\" }",
    );
    let run = run_cli(&config, json!([]), 5000);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("runtimes[0].microvm.kernel: /nonexistent/vmlinuz cannot be read")
            && run.stderr.contains("linux-image-cloud-amd64"),
        "{}",
        run.stderr
    );
    // A file that is not a kernel gets past the load and is refused when
    // the runtime is seated, naming what it is not.
    let not_kernel = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(not_kernel.path(), vec![0u8; 4096]).unwrap();
    let extra = format!(
        "microvm = {{ kernel = \"{}\" }}",
        not_kernel.path().display()
    );
    let run = run_cli(&microvm_toml("badkernel", &extra), json!([]), 5000);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("is not an x86 bzImage")
            && run
                .stderr
                .contains("apt-get install --no-install-recommends linux-image-cloud-amd64"),
        "{}",
        run.stderr
    );
}

/// The egress gateway in a microVM: the guest has no network device; its
/// init listens on the gateway's port of the guest's loopback and carries
/// each connection over a third serial line to the host's gateway, which
/// serves it as it serves a namespace sandbox's (the same route, grant and
/// `SHAREDOS_EGRESS_URL`). Forty connections held open at once, then one
/// model request through to the scripted mock model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_turn_reaches_the_gateway_over_the_guests_serial_channel() {
    let dir = tempfile::tempdir().unwrap();
    let model = MockModel::start(plan_script(Wire::OpenaiChat))
        .await
        .unwrap();
    let network = format!(
        "network = {{ routes = [{{ name = \"openai\", upstream = \"{}\", secret = \"file:{}\", api = \"openai\", allow = [\"loopback\"] }}] }}\n",
        model.base_url(),
        key_file(dir.path()).display()
    );
    let init = workspace_bin("sharedos-guest-init");
    let extra = format!(
        "microvm = {{ memoryMib = 256, init = \"{}\" }}\n{network}",
        init.display()
    );
    let text = microvm_toml("egress", &extra) + &egress_grant("alice-model", "openai", "request");
    let script = json!([{"op": "egress_flood", "n": 40, "path": "/openai/chat/completions"}]);
    let req = request("microvm-egress-1", script, &[], 120_000).to_string();
    let turn = run_request_launched(
        dir.path(),
        &text,
        "sharedos-testplugin",
        &req,
        None,
        &configured_launcher,
    )
    .await;
    let result = serde_json::to_value(&turn.result).unwrap();
    assert_eq!(result["status"], "succeeded", "{result}");
    let flood = turn
        .events_of("runtime.event")
        .into_iter()
        .find(|e| e["type"] == "egress_flood")
        .expect("the flood's event")["data"]
        .clone();
    assert_eq!(flood["connected"], 40, "{flood}");
    assert_eq!(flood["status"], "200", "{flood}");
    assert_eq!(model.seen().len(), 1, "{:?}", model.seen());
    let requests = turn.events_of("egress.request");
    assert!(requests.iter().any(|r| r["status"] == 200), "{requests:?}");
    let report = &result["metadata"]["runtime"]["sandbox"];
    assert_eq!(report["engine"], "microvm", "{report}");
    assert!(
        report["network"]
            .as_str()
            .unwrap_or_default()
            .contains("vport0p2"),
        "{report}"
    );
    nothing_left(report);
}

/// `sandbox.warm = 1`: a VM is booted when the runtime is seated, with
/// the plugin started and waiting for `initialize`; a turn takes it (its
/// report says `warm`) and a replacement is booted; the host's end kills
/// every warm VM and removes its run directory. The turns' wall times,
/// cold (no warm VM) and warm (one booted during the pause), are printed,
/// never asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_vm_serves_the_turn_and_none_outlives_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let init = workspace_bin("sharedos-guest-init");
    let vm = format!(
        "microvm = {{ memoryMib = 256, init = \"{}\" }}\n",
        init.display()
    );
    let requests: Vec<String> = (0..2)
        .map(|i| request(&format!("microvm-warm-{i}"), json!([]), &[], 120_000).to_string())
        .collect();
    let pause = Duration::from_secs(45);
    let cold_text = microvm_toml("cold", &vm);
    let cold = run_requests_launched(
        dir.path(),
        &cold_text,
        "sharedos-testplugin",
        &requests,
        pause,
        &configured_launcher,
    )
    .await;
    let warm_text = microvm_toml("warm", &format!("{vm}sandbox = {{ warm = 1 }}\n"));
    let warm = run_requests_launched(
        dir.path(),
        &warm_text,
        "sharedos-testplugin",
        &requests,
        pause,
        &configured_launcher,
    )
    .await;
    for (name, turns) in [("cold", &cold), ("warm", &warm)] {
        for (result, elapsed) in turns.iter() {
            let result = serde_json::to_value(result).unwrap();
            assert_eq!(result["status"], "succeeded", "{name}: {result}");
            let report = &result["metadata"]["runtime"]["sandbox"];
            assert_eq!(
                report["warm"].as_bool() == Some(true),
                name == "warm",
                "{name}: {report}"
            );
            eprintln!(
                "{name} zero-call turn: {} ms (boot {} ms)",
                elapsed.as_millis(),
                report["boot_ms"]
            );
            nothing_left(report);
        }
    }
    // The replacement booted after the last turn is gone too.
    let prefix = format!("sharedos-microvm-{}-", std::process::id());
    assert!(
        processes_naming(&prefix).is_empty(),
        "a QEMU outlived the host"
    );
    let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "run directories left: {left:?}");
}

/// `sharedos sandbox check` with `PATH` set to `path`: its stdout.
fn sandbox_check(path: &str) -> String {
    let out = Command::new(workspace_bin("sharedos"))
        .args(["sandbox", "check"])
        .env("PATH", path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn sandbox_check_lists_the_microvm_engine_and_the_fix_for_a_missing_qemu() {
    workspace_bin("sharedos-guest-init");
    // The PATH the suite runs with: scripts/test puts its QEMU there (it
    // is not installed into the system).
    let path = std::env::var("PATH").unwrap_or_default();
    let text = sandbox_check(&path);
    let line = text
        .lines()
        .find(|l| l.contains("microvm (launcher = \"microvm\")"))
        .unwrap_or_else(|| panic!("no microvm engine line: {text}"));
    assert!(
        line.contains(": yes, QEMU emulator version")
            && line.contains("a probe guest booted to its init in")
            && line.contains("level strong"),
        "{line}"
    );
    let text = sandbox_check("/nonexistent");
    assert!(
        text.contains("microvm (launcher = \"microvm\"): no: QEMU is not installed")
            && text.contains("apt-get install --no-install-recommends qemu-system-x86"),
        "{text}"
    );
}

/// The guest holds `extraRoPaths` read-only, a writable workspace, and
/// nothing else of the host.
#[test]
fn extra_ro_paths_are_in_the_guest_read_only_and_nothing_else_of_the_host() {
    // Outside /tmp: a host that is not root refuses an `extraRoPaths`
    // entry under /tmp (the policy's rule for every launcher).
    let shared = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    std::fs::write(shared.path().join("data.txt"), "granted").unwrap();
    let dir = shared.path().display().to_string();
    let file = format!("{dir}/data.txt");
    let extra = format!("{RAM_256}\nsandbox = {{ extraRoPaths = [\"{dir}\"] }}");
    let script = json!([{
        "op": "fs_probe",
        "read": [file, "/etc/hostname", "/etc/passwd"],
        "write": [file, format!("{dir}/new.txt"), "/workspace/w.txt", "/etc/x"]
    }]);
    let run = run_cli(&microvm_toml("ro", &extra), script, 120_000);
    assert_eq!(
        run.result["status"], "succeeded",
        "{}\n{}",
        run.result, run.stderr
    );
    let probe = run.result["events"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["data"]["type"] == "fs_probe")
        .unwrap_or_else(|| panic!("no fs_probe event: {}", run.result))["data"]["data"]
        .clone();
    assert_eq!(probe["read"][&file], "granted", "{probe}");
    let host_only = probe["read"]["/etc/hostname"].as_str().unwrap_or_default();
    assert!(host_only.starts_with("error:"), "{probe}");
    assert!(
        probe["read"]["/etc/passwd"]
            .as_str()
            .unwrap_or_default()
            .starts_with("sandbox:x:"),
        "{probe}"
    );
    for denied in [file.clone(), format!("{dir}/new.txt"), "/etc/x".into()] {
        let got = probe["write"][&denied].as_str().unwrap_or_default();
        assert!(got.starts_with("error:"), "{denied}: {probe}");
    }
    assert_eq!(probe["write"]["/workspace/w.txt"], "ok", "{probe}");
    assert_eq!(sandbox_report(&run)["extra_ro_paths"], json!([dir]));
    nothing_left(sandbox_report(&run));
}
