//! Shared by the plugin packages' `tests/handshake.rs`: a plugin binary on
//! its own, over real pipes. Being an integration test of each plugin
//! package also makes `cargo test --workspace` build the binary, which the
//! workspace's process tests launch.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

/// Run by hand (no `SHAREDOS_PLUGIN`), the binary says it is a sharedos
/// plugin on stderr, writes nothing on stdout and exits non-zero.
pub fn refuses_to_run_by_hand(bin: &str, args: &[&str]) {
    let out = Command::new(bin)
        .args(args)
        .env_remove("SHAREDOS_PLUGIN")
        .stdin(Stdio::null())
        .output()
        .expect("the binary runs");
    assert!(!out.status.success(), "exit status {:?}", out.status);
    assert!(out.stdout.is_empty(), "nothing on stdout: {:?}", out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("sharedos"),
        "stderr names sharedos: {stderr}"
    );
}

/// Started as a host starts it, the binary answers `initialize` with
/// protocol version 1 and the manifest `id`, and ends cleanly at EOF.
pub fn answers_initialize(bin: &str, args: &[&str], id: &str) {
    let mut child = Command::new(bin)
        .args(args)
        .env("SHAREDOS_PLUGIN", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the binary starts");
    let mut stdin = child.stdin.take().expect("stdin piped");
    stdin
        .write_all(
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersions":[1],"host":{"name":"test","version":"0"},"limits":{"maxMessageBytes":8388608,"maxInflightToolCalls":8,"maxConcurrentTurns":1},"capabilities":{}}}
"#,
        )
        .expect("write initialize");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout piped"))
        .read_line(&mut line)
        .expect("read the answer");
    drop(stdin);
    let status = child.wait().expect("the plugin exits at EOF");
    let answer: serde_json::Value = serde_json::from_str(&line).expect("one JSON line");
    assert_eq!(answer["id"], 1, "{answer}");
    assert_eq!(answer["result"]["protocolVersion"], 1, "{answer}");
    assert_eq!(answer["result"]["manifest"]["id"], id, "{answer}");
    assert!(
        status.success(),
        "a clean EOF ends the plugin cleanly: {status:?}"
    );
}
