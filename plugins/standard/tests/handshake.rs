//! The `sharedos-standard` binary on its own, over real pipes: run by hand it says what
//! it is and refuses to start; started as a host starts it, it answers
//! `initialize` with its manifest. (Being an integration test of this
//! package also makes `cargo test --workspace` build the binary, which the
//! workspace's process tests launch.)

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_sharedos-standard");
const ARGS: &[&str] = &[
    "--transcript",
    r#"[{"type": "complete", "output": "done"}]"#,
];

#[test]
fn run_by_hand_it_says_it_is_a_plugin_and_exits_non_zero() {
    let out = Command::new(BIN)
        .args(ARGS)
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

#[test]
fn started_by_a_host_it_answers_initialize_with_its_manifest() {
    let mut child = Command::new(BIN)
        .args(ARGS)
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
    assert_eq!(
        answer["result"]["manifest"]["id"], "sharedos.standard",
        "{answer}"
    );
    assert!(
        status.success(),
        "a clean EOF ends the plugin cleanly: {status:?}"
    );
}
