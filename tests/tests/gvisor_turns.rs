//! `launcher = "gvisor"` through the whole host (`sharedos run`): the test
//! plugin in a real runsc container, its tool calls through the envelope,
//! the deadline of a plugin that ignores the abort, a crash mid-turn, and
//! what each leaves: no runsc process naming the container, no bundle, no
//! container state; a prepared container (`warm`) serving a turn; a host
//! without runsc gets the fix. The cases every engine shares (egress, the
//! harness, the adversary) are in engines.rs.
//!
//! A host that is not root runs runsc `--rootless`; a root host checks that
//! path too, running `sharedos run` as nobody.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_tests::is_root;
use sharedos_tests::leftovers::processes_naming;
use sharedos_tests::turns::{parse_jsonl_strict, request, testplugin_host_toml, workspace_bin};

struct CliRun {
    code: i32,
    result: Value,
    stderr: String,
    audit: Vec<Value>,
    elapsed: Duration,
}

/// `sharedos run` of `script` with `config` (the test plugin's host.toml).
fn run_cli(config: &str, script: Value, timeout_ms: u64, path: Option<&str>) -> CliRun {
    run_cli_as(config, script, timeout_ms, path, None)
}

/// [`run_cli`] as `uid` (a root test), its TMPDIR the run's directory.
fn run_cli_as(
    config: &str,
    script: Value,
    timeout_ms: u64,
    path: Option<&str>,
    uid: Option<u32>,
) -> CliRun {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("host.toml"), config).unwrap();
    let turn = request(
        "gvisor-turn",
        script,
        &["files.read", "files.write"],
        timeout_ms,
    );
    std::fs::write(dir.path().join("turn.json"), turn.to_string()).unwrap();
    let started = Instant::now();
    let mut cmd = Command::new(workspace_bin("sharedos"));
    if let Some(path) = path {
        cmd.env("PATH", path);
    }
    if let Some(uid) = uid {
        use std::os::unix::process::CommandExt;
        for f in ["", "host.toml", "turn.json"] {
            std::os::unix::fs::chown(dir.path().join(f), Some(uid), Some(uid)).unwrap();
        }
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
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let result = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let audit_path = dir.path().join("audit.jsonl");
    let audit = if audit_path.exists() {
        parse_jsonl_strict(&audit_path)
    } else {
        Vec::new()
    };
    CliRun {
        code: out.status.code().unwrap_or(-1),
        result,
        stderr,
        audit,
        elapsed,
    }
}

fn gvisor_toml(tag: &str) -> String {
    let marker = format!("gvisor-{tag}-{}", std::process::id());
    testplugin_host_toml(&marker, "gvisor", 60_000)
}

/// The report's container and bundle are gone: no process names the
/// container (runsc, its sandbox, its gofer), the bundle directory (and
/// with it runsc's state directory for the container) does not exist.
fn nothing_left(report: &Value) {
    let id = report["container"]
        .as_str()
        .expect("the report names the container");
    let bundle = report["bundle"]
        .as_str()
        .expect("the report names the bundle");
    assert!(id.starts_with("sharedos-"), "{report}");
    let end = Instant::now() + Duration::from_secs(10);
    let mut left = processes_naming(id);
    while !left.is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
        left = processes_naming(id);
    }
    assert!(
        left.is_empty(),
        "processes of container {id} outlived the turn: {left:?}"
    );
    assert!(
        !Path::new(bundle).exists(),
        "the bundle and state of {id} are left at {bundle}"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(bundle),
        "a mount of the bundle {bundle} is left on the host: {mounts}"
    );
}

fn sandbox_report(run: &CliRun) -> &Value {
    &run.result["metadata"]["runtime"]["sandbox"]
}

#[test]
fn a_turn_with_tool_calls_runs_in_gvisor_and_reports_the_engine() {
    let script = json!([
        {"op": "call", "tool": "files.write", "arguments": {"path": "g.txt", "content": "in gvisor"}},
        {"op": "call", "tool": "files.read", "arguments": {"path": "g.txt"}}
    ]);
    let run = run_cli(&gvisor_toml("tools"), script, 30_000, None);
    assert_eq!(
        run.result["status"], "succeeded",
        "{}\n{}",
        run.result, run.stderr
    );
    assert_eq!(run.code, 0);
    let text = run.result.to_string();
    assert!(
        text.contains("in gvisor"),
        "the read did not return the write: {text}"
    );
    let report = sandbox_report(&run);
    assert_eq!(report["engine"], "gvisor", "{report}");
    assert_eq!(report["level"], "isolated", "{report}");
    let platform = report["platform"]["name"].as_str().unwrap_or_default();
    assert!(platform == "ptrace" || platform == "kvm", "{report}");
    assert!(
        !report["platform"]["why"]
            .as_str()
            .unwrap_or_default()
            .is_empty()
    );
    let version = report["runsc"]["version"].as_str().unwrap_or_default();
    assert!(version.starts_with("runsc version "), "{report}");
    assert!(
        report["network"]
            .as_str()
            .unwrap_or_default()
            .starts_with("none")
    );
    assert_eq!(
        report["memory"]["tree_bound_bytes"],
        Value::Null,
        "{report}"
    );
    assert_eq!(report["missing"][0]["layer"], "memory", "{report}");
    assert_eq!(
        report["uid"],
        sharedos_sandbox::SandboxPolicy::default().uids.first
    );
    assert_eq!(run.audit.last().unwrap()["type"], "turn.ended");
    nothing_left(report);
}

#[test]
fn a_plugin_ignoring_the_abort_is_killed_at_the_deadline_and_leaves_nothing() {
    let script = json!([
        {"op": "fork", "n": 2},
        {"op": "fork", "n": 1, "setsid": true, "double": true},
        {"op": "ignore_abort"},
        {"op": "hold"}
    ]);
    let run = run_cli(&gvisor_toml("deadline"), script, 3000, None);
    assert_eq!(
        run.result["status"], "cancelled",
        "{}\n{}",
        run.result, run.stderr
    );
    assert_eq!(run.result["error"]["code"], "turn_cancelled");
    assert_eq!(run.code, 1);
    assert!(
        run.elapsed >= Duration::from_millis(2900),
        "{:?}",
        run.elapsed
    );
    assert!(
        run.elapsed < Duration::from_millis(3000) + Duration::from_secs(15),
        "sharedos run took {:?} for a 3000 ms deadline",
        run.elapsed
    );
    let report = sandbox_report(&run);
    assert_eq!(report["engine"], "gvisor", "{report}");
    nothing_left(report);
}

#[test]
fn a_crash_mid_turn_fails_the_turn_and_leaves_nothing() {
    let script = json!([
        {"op": "call", "tool": "files.write", "arguments": {"path": "c.txt", "content": "before"}},
        {"op": "crash"}
    ]);
    let run = run_cli(&gvisor_toml("crash"), script, 30_000, None);
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
    let report = sandbox_report(&run);
    assert_eq!(report["engine"], "gvisor", "{report}");
    nothing_left(report);
}

#[test]
fn a_host_without_runsc_gets_the_fix() {
    // No runsc on PATH.
    let run = run_cli(
        &gvisor_toml("missing"),
        json!([]),
        5000,
        Some("/nonexistent"),
    );
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("runsc (gVisor) is not installed")
            && run.stderr.contains("apt-get install runsc"),
        "{}",
        run.stderr
    );
    // A configured path that is not runsc.
    let config = gvisor_toml("broken").replace(
        "launcher = \"gvisor\"",
        "launcher = \"gvisor\"\ngvisor = { runsc = \"/nonexistent/runsc\" }",
    );
    let run = run_cli(&config, json!([]), 5000, None);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("runsc at /nonexistent/runsc cannot be used"),
        "{}",
        run.stderr
    );
}

/// `sharedos sandbox check` with `PATH` set to `path`: its stdout, and
/// the pid it ran as.
fn sandbox_check(path: Option<&str>) -> (String, u32) {
    let mut cmd = Command::new(workspace_bin("sharedos"));
    if let Some(path) = path {
        cmd.env("PATH", path);
    }
    let child = cmd
        .args(["sandbox", "check"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    (String::from_utf8_lossy(&out.stdout).into_owned(), pid)
}

#[test]
fn sandbox_check_lists_every_engine_and_the_fix_for_a_missing_runsc() {
    let (text, pid) = sandbox_check(None);
    let line = |engine: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(engine))
            .unwrap_or_else(|| panic!("no {engine} line in: {text}"))
            .to_owned()
    };
    assert!(line("namespace (").contains(": yes, at level "), "{text}");
    let gvisor = line("gvisor (");
    assert!(gvisor.contains(": yes, runsc version "), "{gvisor}");
    assert!(
        gvisor.contains("platform ptrace") || gvisor.contains("platform kvm"),
        "{gvisor}"
    );
    assert!(line("direct (").contains("no isolation"), "{text}");
    // Its KVM probe (if /dev/kvm opens) left no process behind.
    let probe = format!("sharedos-probe-{pid}");
    assert!(
        processes_naming(&probe).is_empty(),
        "{probe} outlived the check"
    );
    let (text, _) = sandbox_check(Some("/nonexistent"));
    assert!(
        text.contains("gvisor (launcher = \"gvisor\"): no: runsc (gVisor) is not installed")
            && text.contains("apt-get install runsc"),
        "{text}"
    );
}

/// The protocol battery (`sharedos conformance`) against a real plugin
/// under gVisor: every check passes, nothing outlives a launch.
#[test]
fn the_echo_plugin_conforms_under_gvisor() {
    let echo = workspace_bin("sharedos-echo");
    let out = Command::new(workspace_bin("sharedos"))
        .args(["conformance", "--launcher", "gvisor", "--"])
        .arg(&echo)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("(gvisor launcher)"), "{text}");
    assert!(text.contains("sandbox level \"isolated\""), "{text}");
    assert!(text.contains("PASS nothing_left_behind"), "{text}");
    assert!(text.contains("PASS real_turn"), "{text}");
    assert!(
        text.contains("CONFORMS: ") && text.contains(" passed, 0 failed, "),
        "{text}"
    );
}

/// The report's `network: none` checked from outside: a listener on the
/// host's loopback is not reachable from the container, and sees nothing.
#[test]
fn the_container_has_no_network_to_the_host() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let target = listener.local_addr().unwrap().to_string();
    let script = json!([{"op": "net_probe", "targets": [target]}]);
    let run = run_cli(&gvisor_toml("net"), script, 30_000, None);
    assert_eq!(
        run.result["status"], "succeeded",
        "{}\n{}",
        run.result, run.stderr
    );
    let probe = run.result["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "runtime.event" && e["data"]["type"] == "net_probe")
        .unwrap_or_else(|| panic!("no net_probe event: {}", run.result))["data"]["data"]
        .clone();
    let got = probe[&target].as_str().unwrap_or_default();
    assert!(!got.is_empty() && got != "connected", "{probe}");
    // No capability: no raw socket either.
    assert_ne!(probe["raw"], "created", "{probe}");
    assert!(
        listener.accept().is_err(),
        "the host's listener accepted a connection from the container"
    );
    nothing_left(sandbox_report(&run));
}

/// A pinned program runs from its staged copy, bound at `/plugin/<name>`,
/// and the report names the digest.
#[test]
fn a_pinned_program_runs_from_its_staged_copy() {
    let program = workspace_bin("sharedos-testplugin");
    let out = Command::new("sha256sum").arg(&program).output().unwrap();
    let digest = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(digest.len(), 64, "sha256sum: {out:?}");
    let config = gvisor_toml("pinned").replace(
        "launcher = \"gvisor\"",
        &format!("launcher = \"gvisor\"\nsha256 = \"{digest}\""),
    );
    let run = run_cli(&config, json!([]), 30_000, None);
    assert_eq!(
        run.result["status"], "succeeded",
        "{}\n{}",
        run.result, run.stderr
    );
    let report = sandbox_report(&run);
    assert_eq!(report["program_sha256"], digest.as_str(), "{report}");
    assert_eq!(report["program"], "/plugin/sharedos-testplugin", "{report}");
    let root = report["root"].as_array().unwrap();
    let bound = root
        .iter()
        .find(|m| m["path"] == "/plugin/sharedos-testplugin")
        .unwrap_or_else(|| panic!("{report}"));
    assert!(
        bound["what"]
            .as_str()
            .unwrap_or_default()
            .contains("staged copy"),
        "{report}"
    );
    nothing_left(report);
}

/// A runtime asking for a memory bound is refused at launch: a gVisor
/// container here has none, and the refusal's report says so.
#[test]
fn a_runtime_requiring_a_memory_bound_is_refused_with_the_report() {
    let config = gvisor_toml("strong").replace(
        "launcher = \"gvisor\"",
        "launcher = \"gvisor\"\nsandbox = { minLevel = \"strong\" }",
    );
    let run = run_cli(&config, json!([]), 30_000, None);
    assert_eq!(
        run.result["status"], "failed",
        "{}\n{}",
        run.result, run.stderr
    );
    let report = sandbox_report(&run);
    assert_eq!(report["engine"], "gvisor", "{report}");
    assert_eq!(report["refused"], true, "{report}");
    assert_eq!(report["level"], "isolated", "{report}");
    let reason = report["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("memory unbounded") && reason.contains("strong"),
        "{report}"
    );
}

/// The bundle directories of the host process `pid`.
fn bundles_of(pid: u32) -> Vec<std::path::PathBuf> {
    let prefix = format!("sharedos-gvisor-{pid}-");
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

/// A host SIGKILLed mid-turn: its container dies with it (runsc has a
/// parent-death signal, its sandbox is attached), and the next host's
/// first gVisor seat removes the bundle and state it left.
#[test]
fn a_killed_host_leaves_no_container_and_the_next_host_removes_its_bundle() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("host.toml"), gvisor_toml("killed")).unwrap();
    let script = json!([{"op": "ignore_abort"}, {"op": "hold"}]);
    let turn = request("gvisor-killed", script, &[], 120_000);
    std::fs::write(dir.path().join("turn.json"), turn.to_string()).unwrap();
    let mut host = Command::new(workspace_bin("sharedos"))
        .arg("run")
        .arg("--config")
        .arg(dir.path().join("host.toml"))
        .arg("--request")
        .arg(dir.path().join("turn.json"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = host.id();
    // The turn's container is running once runsc names its id.
    let id_prefix = format!("sharedos-{pid}-");
    let end = Instant::now() + Duration::from_secs(60);
    while processes_naming(&id_prefix).is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !processes_naming(&id_prefix).is_empty(),
        "no container started"
    );
    let left = bundles_of(pid);
    assert!(!left.is_empty(), "the running host has no bundle");
    host.kill().unwrap();
    host.wait().unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while !processes_naming(&id_prefix).is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        processes_naming(&id_prefix).is_empty(),
        "the container outlived its host: {:?}",
        processes_naming(&id_prefix)
    );
    // The next host seats a gVisor runtime: the dead host's bundle goes
    // (a host of another test of this binary may have swept it first).
    let run = run_cli(&gvisor_toml("after"), json!([]), 30_000, None);
    assert_eq!(run.result["status"], "succeeded", "{}", run.stderr);
    assert!(bundles_of(pid).is_empty(), "left: {left:?}");
}

/// A host that is not root runs runsc `--rootless`: the plugin still runs
/// as the sandbox uid inside, the report says `rootless`, and nothing is
/// left. (A root test runs the host as nobody; a test that is not root
/// already is such a host.)
#[test]
fn a_host_that_is_not_root_runs_runsc_rootless() {
    let uid = is_root().then_some(65534);
    let script = json!([
        {"op": "call", "tool": "files.write", "arguments": {"path": "r.txt", "content": "rootless"}},
        {"op": "fork", "n": 1}
    ]);
    let run = run_cli_as(&gvisor_toml("rootless"), script, 30_000, None, uid);
    assert_eq!(
        run.result["status"], "succeeded",
        "{}\n{}",
        run.result, run.stderr
    );
    let report = sandbox_report(&run);
    assert_eq!(report["runsc"]["rootless"], true, "{report}");
    assert_eq!(
        report["uid"],
        sharedos_sandbox::SandboxPolicy::default().uids.first
    );
    nothing_left(report);
}

/// `sharedos sandbox check --runtime` of a gVisor runtime: runsc, the
/// platform, the level and every mount of the container's root, with
/// nothing run and nothing left.
#[test]
fn sandbox_check_of_a_gvisor_runtime_shows_its_container() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("host.toml"), gvisor_toml("check")).unwrap();
    let out = Command::new(workspace_bin("sharedos"))
        .args([
            "sandbox",
            "check",
            "--runtime",
            "sharedos-testplugin",
            "--config",
        ])
        .arg(dir.path().join("host.toml"))
        .env("TMPDIR", dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("launcher: gvisor: runsc version "), "{text}");
    assert!(text.contains("level: isolated"), "{text}");
    assert!(
        text.contains("program: /plugin/sharedos-testplugin"),
        "{text}"
    );
    assert!(text.contains("ro  /usr/lib "), "{text}");
    assert!(text.contains("rw  /workspace "), "{text}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("sharedos-gvisor-"))
        .collect();
    assert!(left.is_empty(), "the check left {left:?}");
}

/// `sandbox.warm = 1` on the pool every launcher shares: two turns on one
/// seat, each served by a prepared container (the first by the one
/// prepared at seating, the second by the replacement ordered when the
/// first was taken: another container), each container gone after its
/// turn. (That the host's end takes the last replacement with it is the
/// next test's, through `sharedos run`: here other tests of this binary
/// share the host's pid in their containers' names.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_container_is_taken_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let config = gvisor_toml("replaced").replace(
        "launcher = \"gvisor\"",
        "launcher = \"gvisor\"\nsandbox = { warm = 1 }",
    );
    let requests: Vec<String> = (0..2)
        .map(|i| request(&format!("gvisor-warm-{i}"), json!([]), &[], 60_000).to_string())
        .collect();
    let launcher_for = |e: &sharedos_host::config::RuntimeEntry| {
        Ok(sharedos_tests::engines::Engine::Gvisor.launcher(e))
    };
    let turns = sharedos_tests::egress::run_requests_launched(
        dir.path(),
        &config,
        "sharedos-testplugin",
        &requests,
        Duration::from_millis(200),
        &launcher_for,
    )
    .await;
    let mut containers = Vec::new();
    for (result, _) in &turns {
        let result = serde_json::to_value(result).unwrap();
        assert_eq!(result["status"], "succeeded", "{result}");
        let report = &result["metadata"]["runtime"]["sandbox"];
        assert_eq!(report["prepared"], true, "{report}");
        nothing_left(report);
        containers.push(report["container"].as_str().unwrap().to_owned());
    }
    assert_ne!(
        containers[0], containers[1],
        "the second turn was not served by a replacement"
    );
}

/// `sandbox.warm = 1`: the turn takes the container prepared when the
/// runtime was seated (its report says `prepared`, and the plugin ran its
/// script in it), a replacement is prepared after it, and when the host
/// ends every container of it is torn down: no process names one of its
/// containers, no bundle of its pid is left.
#[test]
fn a_prepared_container_serves_the_turn_and_the_host_leaves_none() {
    let config = gvisor_toml("warm").replace(
        "launcher = \"gvisor\"",
        "launcher = \"gvisor\"\nsandbox = { warm = 1 }",
    );
    let script = json!([
        {"op": "call", "tool": "files.write", "arguments": {"path": "w.txt", "content": "warm"}},
        {"op": "call", "tool": "files.read", "arguments": {"path": "w.txt"}}
    ]);
    let run = run_cli(&config, script, 60_000, None);
    assert_eq!(
        run.result["status"], "succeeded",
        "{}\n{}",
        run.result, run.stderr
    );
    assert!(run.result.to_string().contains("warm"), "{}", run.result);
    let report = sandbox_report(&run);
    assert_eq!(report["prepared"], true, "{report}");
    let id = report["container"].as_str().unwrap();
    let host_pid = id.split('-').nth(1).unwrap();
    let prefix = format!("sharedos-{host_pid}-");
    let left = sharedos_tests::leftovers::processes_naming_after(&prefix, Duration::from_secs(10));
    assert!(
        left.is_empty(),
        "containers of the host outlived it: {left:?}"
    );
    let bundles: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("sharedos-gvisor-{host_pid}-")))
        .collect();
    assert!(
        bundles.is_empty(),
        "bundles of the host are left: {bundles:?}"
    );
}
