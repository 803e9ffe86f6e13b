//! The `sharedos` command line, from the outside: the demo, `run`, and the
//! errors a person at the terminal gets for bad input.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use sharedos_tests::plugin_bin;

/// `sharedos` with `TMPDIR` at `tmp`. A host that is not root keeps its
/// state directory (staged plugins, kept across runs) in
/// `$XDG_RUNTIME_DIR/sharedos`, else in `$TMPDIR/sharedos-<uid>`; it gets a
/// runtime directory of its own here, so `tmp` shows only what a run
/// leaves behind.
fn sharedos(args: &[&str], tmp: &Path) -> Output {
    let runtime_dir = tempfile::tempdir().unwrap();
    Command::new(plugin_bin("sharedos"))
        .args(args)
        .env("TMPDIR", tmp)
        .env("XDG_RUNTIME_DIR", runtime_dir.path())
        .env_remove("SHAREDOS_LOG")
        .output()
        .expect("run sharedos")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A copy of the demo's configuration and request in `dir`, with `edit`
/// applied to the configuration text.
fn demo_files(dir: &Path, edit: impl FnOnce(String) -> String) -> (String, String) {
    let config = dir.join("host.toml");
    let request = dir.join("turn.json");
    std::fs::write(
        &config,
        edit(include_str!("../../host/demo/host.toml").to_owned()),
    )
    .unwrap();
    std::fs::write(&request, include_str!("../../host/demo/turn.json")).unwrap();
    (config.display().to_string(), request.display().to_string())
}

#[test]
fn demo_runs_a_sandboxed_turn_and_leaves_no_temp_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let out = sharedos(&["demo"], tmp.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let result: Value = serde_json::from_slice(&out.stdout).expect("the result JSON on stdout");
    assert_eq!(result["status"], "succeeded");
    assert_eq!(
        result["metadata"]["runtime"]["sandbox"]["level"],
        sharedos_tests::full_level()
    );
    assert!(
        stderr(&out).contains("turn.started"),
        "live events on stderr"
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn run_takes_a_config_and_a_request() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, request) = demo_files(tmp.path(), |s| s);
    let out = sharedos(
        &["run", "--config", &config, "--request", &request],
        tmp.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "succeeded");
    assert!(tmp.path().join("audit.jsonl").is_file());
    assert!(tmp.path().join("files/demo/alice/notes/plan.md").is_file());
}

#[test]
fn a_malformed_config_names_the_file_and_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, request) = demo_files(tmp.path(), |s| s.replace("drainGraceMs", "drainGrace"));
    let out = sharedos(
        &["run", "--config", &config, "--request", &request],
        tmp.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("host.toml") && err.contains("drainGrace"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "no half-built result");
}

#[test]
fn a_grant_that_makes_no_sense_is_refused_at_load() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, request) = demo_files(tmp.path(), |s| {
        s.replace("namespace = \"files\"", "namespace = \"filez\"")
    });
    let out = sharedos(
        &["run", "--config", &config, "--request", &request],
        tmp.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("filez") && err.contains("alice-memory"),
        "{err}"
    );
}

#[test]
fn a_malformed_request_names_the_file_and_what_is_expected() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, request) = demo_files(tmp.path(), |s| s);
    let text = std::fs::read_to_string(&request).unwrap().replacen(
        "\"version\": \"1\",",
        "\"version\": \"1\", \"runtimeId\": \"x\",",
        1,
    );
    std::fs::write(&request, text).unwrap();
    let out = sharedos(
        &["run", "--config", &config, "--request", &request],
        tmp.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("turn.json") && err.contains("runtimeId"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn a_missing_plugin_binary_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, request) = demo_files(tmp.path(), |s| {
        s.replace(
            "program = \"sharedos-standard\"",
            "program = \"/nonexistent/plugin\"",
        )
    });
    let out = sharedos(
        &["run", "--config", &config, "--request", &request],
        tmp.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("/nonexistent/plugin") && err.contains("does not exist"),
        "{err}"
    );
}

#[test]
fn an_agent_without_a_runtime_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let (config, request) = demo_files(tmp.path(), |s| {
        s.replace("agentId = \"alice\"\nruntime", "agentId = \"bob\"\nruntime")
    });
    let out = sharedos(
        &["run", "--config", &config, "--request", &request],
        tmp.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("\"alice\"") && err.contains("[[agents]]"),
        "{err}"
    );
}

#[test]
fn sandbox_check_says_what_this_machine_enforces() {
    let tmp = tempfile::tempdir().unwrap();
    let out = sharedos(&["sandbox", "check"], tmp.path());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    for layer in ["userns", "pidns", "netns", "landlock", "seccomp"] {
        assert!(text.contains(layer), "{layer} missing:\n{text}");
    }
    let level = format!("level: {}\n", sharedos_tests::full_level());
    assert!(text.contains(&level), "{text}");
}
