//! One turn through the `sharedos run` binary: the whole host process
//! with a configuration and a request of the test's own.

use std::process::Command;

use serde_json::Value;

use super::workspace_bin;

/// What `sharedos run` left: its exit code, its result and its stderr.
pub struct CliRun {
    pub code: i32,
    /// The result on stdout; `Null` when there was none.
    pub result: Value,
    pub stderr: String,
}

/// Runs `sharedos run` with `config` as its host.toml and `request` as
/// its turn, in a directory of its own (the audit and files roots the
/// configuration names relatively land there).
pub fn sharedos_run(config: &str, request: &Value) -> CliRun {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let host = dir.path().join("host.toml");
    let turn = dir.path().join("turn.json");
    std::fs::write(&host, config).expect("host.toml written");
    std::fs::write(&turn, request.to_string()).expect("turn.json written");
    let out = Command::new(workspace_bin("sharedos"))
        .current_dir(dir.path())
        .arg("run")
        .arg("--config")
        .arg(&host)
        .arg("--request")
        .arg(&turn)
        .output()
        .expect("sharedos run started");
    CliRun {
        code: out.status.code().unwrap_or(-1),
        result: serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
