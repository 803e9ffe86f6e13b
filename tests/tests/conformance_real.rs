//! `sharedos conformance` judged by the real host: the SDK examples and a
//! raw plugin pass the real turn (the executor, the process runtime, the
//! kernel's file tools); each broken variant of the raw plugin
//! (tests/conformance/variants.py) fails with exactly one cause and its
//! fix, the checks after it "not run"; the JSON report's shape is pinned;
//! a venv's symlinked interpreter given as an argument stays that path.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use sharedos_tests::plugin_bin;

const VARIANTS: &str = "tests/conformance/variants.py";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository")
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

fn checks(report: &Value) -> &Vec<Value> {
    report["checks"].as_array().expect("checks")
}

fn find<'a>(report: &'a Value, id: &str) -> &'a Value {
    checks(report)
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no check {id} in {report}"))
}

/// The real turn passed: both calls answered by the kernel's file tools and
/// the probe written and read back; no check failed.
fn assert_real_turn_passes(what: &str, out: &Output, report: &Value) {
    let real = find(report, "real_turn");
    assert_eq!(real["status"], "pass", "{what}: {real}");
    let detail = real["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("2 call(s) answered by the kernel's file tools")
            && detail.contains("probe file written and read back"),
        "{what}: {detail}"
    );
    let bad: Vec<&Value> = checks(report)
        .iter()
        .filter(|c| c["status"] == "fail" || c["status"] == "not_run")
        .collect();
    assert!(bad.is_empty(), "{what}: {bad:#?}");
    assert_eq!(out.status.code(), Some(0), "{what}");
}

/// The checks that run through the real envelope passed: the drain (the
/// real deadline's), every outcome kind (the real host's answers), and the
/// calls, `parallel` of them observed in flight at once at the real tool.
fn assert_envelope_checks_pass(what: &str, report: &Value, parallel: bool) {
    for id in [
        "drain",
        "outcome_kinds",
        "concurrent_calls_out_of_order",
        "tool_call_round_trip",
    ] {
        assert_eq!(find(report, id)["status"], "pass", "{what}: {id}");
    }
    let detail = |id| find(report, id)["detail"].as_str().unwrap_or_default();
    assert!(
        detail("tool_call_round_trip").contains(
            "2 call(s) answered by the real conformance.echo tool, 2 of its answers back"
        ),
        "{what}: {}",
        detail("tool_call_round_trip")
    );
    // The SDK examples emit a progress event per call and annotate the
    // count; the raw plugin sends neither, which is not applicable.
    let notes = find(report, "emit_annotate");
    if what == "raw" {
        assert_eq!(notes["status"], "not_applicable", "{what}: {notes}");
    } else {
        assert_eq!(notes["status"], "pass", "{what}: {notes}");
        assert!(
            detail("emit_annotate")
                .contains("2 events and 1 annotations recorded by the real host, none dropped"),
            "{what}: {}",
            detail("emit_annotate")
        );
    }
    assert!(
        detail("drain").contains("the real deadline's turn/draining came with a call in flight"),
        "{what}: {}",
        detail("drain")
    );
    assert!(
        detail("outcome_kinds").contains("asked escalate, got escalate")
            && detail("outcome_kinds").contains("succeeded, failed and denied"),
        "{what}: {}",
        detail("outcome_kinds")
    );
    let concurrency = detail("concurrent_calls_out_of_order");
    let expected = if parallel {
        "in flight at once at the real tool"
    } else {
        "one at a time"
    };
    assert!(concurrency.contains(expected), "{what}: {concurrency}");
}

#[test]
fn the_sdk_examples_and_a_raw_plugin_pass_the_real_turn() {
    let cases: [(&str, Vec<&str>); 3] = [
        (
            "python sdk",
            vec!["--", "python3", "sdk/python/examples/echo.py"],
        ),
        (
            "typescript sdk",
            vec!["--", "node", "sdk/typescript/examples/echo.mjs"],
        ),
        ("raw", vec!["--", "python3", VARIANTS, "ok"]),
    ];
    for (what, args) in &cases {
        let (out, report) = conformance(args);
        assert_real_turn_passes(what, &out, &report);
        // The SDK examples run the echo payload's calls in parallel when
        // asked; the raw plugin one at a time, which the protocol allows.
        assert_envelope_checks_pass(what, &report, *what != "raw");
    }
}

/// A plugin that keeps calling after `turn/draining`, answers with an
/// outcome kind that does not exist, prints on stdout, sends malformed
/// emits or annotations (judged from the real result), or ignores
/// `turn/abort` and the end of its input, fails that check alone (nothing depends on it), with its
/// cause and the fix.
#[test]
fn each_check_through_the_envelope_or_the_abort_fails_alone_for_its_defect() {
    // (mode, the failing check, in its cause, in its fix)
    let cases = [
        (
            "ignore-drain",
            "drain",
            "started 2 new tool call(s) after turn/draining; the real host denied each turn_draining",
            "start no new tool call",
        ),
        (
            "wrong-outcome",
            "outcome_kinds",
            "asked for fail: the turn ended failed invalid_runtime_outcome",
            "{type: fail, error: {code, message}}",
        ),
        (
            "stdout-noise",
            "stderr_noise",
            "the real host refused a line that is not JSON",
            "write only JSON-RPC lines on stdout",
        ),
        (
            "bad-emit",
            "emit_annotate",
            "the real host dropped and counted 2 message(s) of the plugin: invalid_emit x2",
            "send host/emit {turnId, event: {type, data}}",
        ),
        (
            "bad-annotate",
            "emit_annotate",
            "the real host dropped and counted 1 message(s) of the plugin: invalid_annotate x1",
            "host/annotate {turnId, key, value}",
        ),
        (
            "ignore-abort",
            "abort",
            "still running 5 s after the real deadline's turn/abort",
            "on turn/abort stop at once",
        ),
    ];
    for (mode, id, cause, fix) in cases {
        let (out, report) = conformance(&["--", "python3", VARIANTS, mode]);
        assert_eq!(out.status.code(), Some(1), "{mode}");
        let failed: Vec<&Value> = checks(&report)
            .iter()
            .filter(|c| c["status"] == "fail" || c["status"] == "not_run")
            .collect();
        assert_eq!(failed.len(), 1, "{mode}: {failed:#?}");
        assert_eq!(failed[0]["id"], id, "{mode}: {:#}", failed[0]);
        assert_eq!(failed[0]["status"], "fail", "{mode}");
        let text = failed[0]["cause"].as_str().unwrap_or_default();
        assert!(text.contains(cause), "{mode}: {text}");
        let f = failed[0]["fix"].as_str().unwrap_or_default();
        assert!(f.contains(fix), "{mode}: {f}");
        assert_eq!(find(&report, "real_turn")["status"], "pass", "{mode}");
    }
}

/// Exactly one check failed, `id`; every check that did not pass or was
/// not applicable was not run because of it.
fn assert_one_cause<'a>(what: &str, report: &'a Value, id: &str) -> &'a Value {
    let failed: Vec<&Value> = checks(report)
        .iter()
        .filter(|c| c["status"] == "fail")
        .collect();
    assert_eq!(failed.len(), 1, "{what}: {failed:#?}");
    assert_eq!(failed[0]["id"], id, "{what}: {:#}", failed[0]);
    let not_run: Vec<&Value> = checks(report)
        .iter()
        .filter(|c| c["status"] == "not_run")
        .collect();
    assert!(!not_run.is_empty(), "{what}: nothing was not run");
    for c in not_run {
        assert_eq!(c["blocked_by"], id, "{what}: {c}");
        assert_eq!(
            c["cause"].as_str(),
            Some(format!("not run because {id} failed").as_str()),
            "{what}: {c}"
        );
    }
    assert_eq!(report["passed"], false);
    failed[0]
}

#[test]
fn each_broken_variant_fails_with_one_cause_and_its_fix() {
    // (mode, the failing check, in its cause, in its fix)
    let cases = [
        (
            "silent",
            "handshake",
            "did not answer within 2000 ms",
            "answer initialize",
        ),
        ("null-id", "real_turn", "(invalid_envelope)", "never null"),
        (
            "long-line",
            "real_turn",
            "(frame_too_large)",
            "maxMessageBytes",
        ),
        (
            "unlisted",
            "real_turn",
            "\"conformance.undeclared\", which the host answered denied",
            "call only the tools the request lists",
        ),
    ];
    for (mode, id, cause, fix) in cases {
        let (out, report) = conformance(&[
            "--handshake-timeout-ms",
            "2000",
            "--",
            "python3",
            VARIANTS,
            mode,
        ]);
        assert_eq!(out.status.code(), Some(1), "{mode}");
        let failed = assert_one_cause(mode, &report, id);
        let text = failed["cause"].as_str().unwrap_or_default();
        assert!(text.contains(cause), "{mode}: {text}");
        let f = failed["fix"].as_str().unwrap_or_default();
        assert!(f.contains(fix), "{mode}: {f}");
        // The checks that do not depend on the turn still ran.
        assert_eq!(find(&report, "run_by_hand")["status"], "pass", "{mode}");
        assert_eq!(find(&report, "nothing_left_behind")["status"], "pass");
    }
}

#[test]
fn a_plugin_that_crashes_at_start_gets_its_exit_status_and_whole_stderr() {
    for launcher in ["sandbox", "direct"] {
        let (out, report) =
            conformance(&["--launcher", launcher, "--", "python3", VARIANTS, "crash"]);
        assert_eq!(out.status.code(), Some(1), "{launcher}");
        let starts = assert_one_cause(launcher, &report, "starts");
        let cause = starts["cause"].as_str().unwrap_or_default();
        assert!(cause.contains("exit status: 1"), "{launcher}: {cause}");
        assert!(!cause.contains("write nothing on stdout"), "{cause}");
        let stderr: Vec<&str> = starts["stderr"]
            .as_array()
            .expect("stderr lines")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            stderr.contains(
                &"ModuleNotFoundError: No module named 'sharedos_conformance_missing_module'"
            ),
            "{launcher}: {stderr:#?}"
        );
        assert!(
            stderr.contains(&"variants: loading the model client"),
            "{stderr:#?}"
        );
        for id in [
            "silent_before_initialize",
            "handshake",
            "real_turn",
            "drain",
        ] {
            assert_eq!(find(&report, id)["status"], "not_run", "{launcher} {id}");
        }
    }
}

/// The shape documented in docs/PLUGINS.md ("The JSON report").
#[test]
fn the_json_report_has_the_documented_shape() {
    let (_, report) = conformance(&["--", "python3", VARIANTS, "unlisted"]);
    let keys = |v: &Value| -> BTreeSet<String> {
        v.as_object().expect("an object").keys().cloned().collect()
    };
    let top: BTreeSet<String> = [
        "command",
        "program",
        "launcher",
        "read_only_paths",
        "passed",
        "checks",
    ]
    .map(String::from)
    .into();
    assert_eq!(keys(&report), top);
    let fields: BTreeSet<String> = [
        "id",
        "section",
        "status",
        "detail",
        "cause",
        "blocked_by",
        "fix",
        "stderr",
    ]
    .map(String::from)
    .into();
    let order: Vec<&str> = checks(&report)
        .iter()
        .filter_map(|c| c["id"].as_str())
        .collect();
    assert_eq!(
        order,
        [
            "starts",
            "silent_before_initialize",
            "handshake",
            "manifest",
            "version_newer_host",
            "version_unsupported",
            "real_turn",
            "tool_call_round_trip",
            "emit_annotate",
            "concurrent_calls_out_of_order",
            "drain",
            "abort",
            "outcome_kinds",
            "large_messages",
            "stderr_noise",
            "run_by_hand",
            "nothing_left_behind",
        ]
    );
    for c in checks(&report) {
        assert_eq!(keys(c), fields, "{c}");
        let status = c["status"].as_str().expect("status");
        assert!(
            ["pass", "fail", "not_applicable", "not_run"].contains(&status),
            "{c}"
        );
        assert!(c["fix"].is_string() && c["detail"].is_string(), "{c}");
        assert!(c["stderr"].is_array(), "{c}");
        match status {
            "pass" | "not_applicable" => {
                assert!(c["cause"].is_null() && c["blocked_by"].is_null(), "{c}")
            }
            "fail" => assert!(c["cause"].is_string() && c["blocked_by"].is_null(), "{c}"),
            _ => assert!(c["cause"].is_string() && c["blocked_by"].is_string(), "{c}"),
        }
    }
}

/// `/usr/bin/env VENV/bin/python plugin.py`: the venv's interpreter is a
/// symlink to the system one, and only run by its own path does it find
/// its `pyvenv.cfg` and the module installed in the venv.
#[test]
fn a_venv_interpreter_given_as_an_argument_keeps_its_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let venv = dir.path().join("venv");
    let made = Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .expect("python3 -m venv");
    assert!(made.success());
    let python = venv.join("bin/python");
    assert!(python.symlink_metadata().expect("bin/python").is_symlink());
    let site = std::fs::read_dir(venv.join("lib"))
        .expect("lib")
        .filter_map(Result::ok)
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.is_dir())
        .expect("site-packages");
    std::fs::write(site.join("conformance_venv_marker.py"), "").expect("marker");
    let plugin = dir.path().join("plugin.py");
    let variants = repo().join(VARIANTS);
    std::fs::write(
        &plugin,
        format!(
            "import sys\nimport conformance_venv_marker  # only in the venv\n\
             sys.argv = [sys.argv[0], 'ok']\n\
             exec(compile(open({v:?}).read(), {v:?}, 'exec'))\n",
            v = variants.display().to_string()
        ),
    )
    .expect("plugin");
    let python = python.to_str().expect("utf-8");
    let plugin = plugin.to_str().expect("utf-8");
    let (out, report) =
        conformance(&["--launcher", "direct", "--", "/usr/bin/env", python, plugin]);
    assert_real_turn_passes("venv", &out, &report);
}

/// The configuration and request of `sharedos run` for the raw plugin in
/// `mode`, with the catalogue and payload of conformance's real turn.
fn run_files(dir: &Path, program: &str, mode: &str) -> (PathBuf, PathBuf) {
    let tests = repo().join("tests");
    let config = format!(
        r#"[host]
auditPath = "audit.jsonl"
filesRoot = "files"

[[runtimes]]
id = "conformance-variants"
version = "1.0.0"
program = {program:?}
args = [{variants:?}, {mode:?}]
[runtimes.sandbox]
extraRoPaths = [{tests:?}]

[[agents]]
agentId = "conformance"
runtime = "conformance-variants"

[[kernel.grants]]
id = "admission"
subject = {{ kind = "agent", agentId = "conformance" }}
issuer = {{ kind = "service", serviceId = "sharedos-conformance" }}
namespaceId = "conformance"
capabilities = [{{ namespace = "sharedos.execution", path = ["agent", "conformance"], scope = "exact", actions = ["invoke"] }}]

[[kernel.grants]]
id = "files"
subject = {{ kind = "agent", agentId = "conformance" }}
issuer = {{ kind = "service", serviceId = "sharedos-conformance" }}
namespaceId = "conformance"
capabilities = [{{ namespace = "files", path = ["conformance"], scope = "descendants", actions = ["read", "write", "list"] }}]
"#,
        variants = repo().join(VARIANTS).display().to_string(),
        tests = tests.display().to_string(),
    );
    let tool = |name: &str, action: &str| {
        serde_json::json!({"name": name, "description": name, "namespace": "files",
            "source": "request", "readWrite": if action == "write" { "write" } else { "read" },
            "inputSchema": {},
            "requiredCapability": {"resource": {"namespace": "files", "path": []}, "action": action}})
    };
    let agent = serde_json::json!({"kind": "agent", "agentId": "conformance"});
    let human = serde_json::json!({"kind": "human", "userId": "conformance"});
    let now = "2026-12-01T00:00:00Z";
    let request = serde_json::json!({
        "version": "1", "executionId": "exec-run", "agent": agent,
        "context": {"namespaceId": "conformance", "actor": agent, "owner": human,
                    "authority": {"kind": "service", "serviceId": "sharedos-conformance"},
                    "purpose": "conformance", "traceId": "trace-run",
                    "enabledToolNamespaces": ["files"], "now": now},
        "message": {"version": "1", "id": "msg-run", "sender": human, "receiver": agent,
                    "purpose": "conformance", "traceId": "trace-run", "createdAt": now,
                    "payload": {"calls": [
                        {"tool": "files.write", "arguments": {"path": "probe/run.txt", "content": "x"}},
                        {"tool": "files.read", "arguments": {"path": "probe/run.txt"}}]}},
        "tools": [tool("files.write", "write"), tool("files.read", "read")]
    });
    let (c, r) = (dir.join("host.toml"), dir.join("turn.json"));
    std::fs::write(&c, config).expect("host.toml");
    std::fs::write(&r, request.to_string()).expect("turn.json");
    (c, r)
}

/// What conformance's real turn says is what `sharedos run` says of the
/// same plugin with the same catalogue: a pass where the turn succeeds,
/// the host's own violation reason where it fails.
#[test]
fn the_real_turn_agrees_with_sharedos_run() {
    for (mode, reason) in [
        ("ok", None),
        ("null-id", Some("invalid_envelope")),
        ("long-line", Some("frame_too_large")),
    ] {
        let (_, report) = conformance(&["--", "python3", VARIANTS, mode]);
        let program = report["program"].as_str().expect("program");
        let (result, _) = sharedos_run(program, mode);
        let real = find(&report, "real_turn");
        match reason {
            None => {
                assert_eq!(result["status"], "succeeded", "{mode}: {result:#}");
                assert_eq!(real["status"], "pass", "{mode}: {real}");
            }
            Some(r) => {
                assert_eq!(result["status"], "failed", "{mode}: {result:#}");
                assert_eq!(
                    result["error"]["details"]["reason"], r,
                    "{mode}: {result:#}"
                );
                assert_eq!(real["status"], "fail", "{mode}: {real}");
                let cause = real["cause"].as_str().unwrap_or_default();
                assert!(cause.contains(&format!("({r})")), "{mode}: {cause}");
            }
        }
    }
}

/// `sharedos run` of the raw plugin in `mode` with conformance's catalogue
/// and payload: the result, and what the host logged.
fn sharedos_run(program: &str, mode: &str) -> (Value, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (config, request) = run_files(dir.path(), program, mode);
    let out = Command::new(plugin_bin("sharedos"))
        .arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--request")
        .arg(&request)
        .env("SHAREDOS_LOG", "warn")
        .output()
        .expect("sharedos run");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let result: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{mode}: no result ({e}): {stderr}"));
    (result, stderr)
}

/// A real plugin's malformed emits and annotations are dropped by the
/// host, and the result of the turn says so by name and count
/// (`metadata.runtime.protocolViolations`), as does the log of its ending;
/// a turn that sent none has no such field.
#[test]
fn the_result_names_the_messages_the_host_dropped() {
    let python = which_python();
    for (mode, counted) in [
        ("ok", None),
        ("bad-emit", Some(("invalid_emit", 2))),
        ("bad-annotate", Some(("invalid_annotate", 1))),
    ] {
        let (result, log) = sharedos_run(&python, mode);
        assert_eq!(result["status"], "succeeded", "{mode}: {result:#}");
        let dropped = &result["metadata"]["runtime"]["protocolViolations"];
        match counted {
            None => assert!(dropped.is_null(), "{mode}: {result:#}"),
            Some((name, n)) => {
                assert_eq!(
                    dropped,
                    &serde_json::json!({ name: n }),
                    "{mode}: {result:#}"
                );
                assert!(
                    log.contains("dropped and counted") && log.contains(name),
                    "{mode}: {log}"
                );
            }
        }
    }
}

/// The interpreter `python3` resolves to, as a path the host can launch.
fn which_python() -> String {
    let out = Command::new("python3")
        .args([
            "-c",
            "import os, sys; print(os.path.realpath(sys.executable))",
        ])
        .output()
        .expect("python3");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}
