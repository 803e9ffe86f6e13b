//! Operator safety from the outside: a real `sharedos run` seats the
//! testplugin, which writes control, format and bidi characters to its
//! stderr, into an emitted event and its outcome, and tries a file name
//! with a right-to-left override. The CLI's stderr (its log and the live
//! events) shows only the escaped form, the file is refused and nothing is
//! created on disk, and a tool call sent without an id is reported.

use std::process::Command;

use serde_json::{Value, json};
use sharedos_tests::turns::{AGENT, NAMESPACE, request, testplugin_host_toml, workspace_bin};

/// Every character the terminal must never receive raw.
const HOSTILE: &[char] = &[
    '\u{1b}',
    '\u{9b}',
    '\u{7}',
    '\u{202e}',
    '\u{2066}',
    '\u{2069}',
    '\u{200b}',
    '\u{feff}',
    '\u{61c}',
    '\u{ad}',
    '\u{e0041}',
    '\u{2028}',
];

#[test]
fn plugin_text_reaches_the_terminal_escaped_and_hostile_file_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let config = dir.path().join("host.toml");
    std::fs::write(&config, testplugin_host_toml("opsafety", "sandbox", 30_000)).unwrap();
    let text = "forged\u{1b}[2J\u{9b}31m \u{202e}cod.exe\u{2066}x\u{2069} zw\u{200b}\u{feff}\u{61c}\u{ad}\u{e0041}\u{2028}\u{7}end";
    let script = json!([
        {"op": "stderr", "text": format!("plugin-log {text}")},
        {"op": "emit", "type": "progress", "data": {"note": format!("plugin-event {text}")}},
        {"op": "call", "tool": "files.write",
         "arguments": {"path": "invoice\u{202e}fdp.exe", "content": "pwned"}},
        {"op": "call", "tool": "files.write",
         "arguments": {"path": "ok.txt", "content": "kept"}},
        {"op": "invoke_as_notification", "tool": "files.write"},
        {"op": "error_outcome", "code": -32603, "message": format!("plugin-failure {text}")}
    ]);
    let req = dir.path().join("turn.json");
    std::fs::write(
        &req,
        request("opsafety-1", script, &["files.write"], 30_000).to_string(),
    )
    .unwrap();
    let out = Command::new(workspace_bin("sharedos"))
        .args(["run", "--config"])
        .arg(&config)
        .arg("--request")
        .arg(&req)
        .env("TMPDIR", &tmp)
        .env("SHAREDOS_LOG", "info")
        .output()
        .unwrap();
    let stderr = String::from_utf8(out.stderr).expect("the CLI writes UTF-8");
    let stdout: Value = serde_json::from_slice(&out.stdout).expect("the result JSON");
    assert_eq!(stdout["status"], "failed", "{stderr}");

    // The plugin's stderr line, the live event and the failure all made
    // it to the terminal, escaped.
    for what in ["plugin-log", "plugin-event", "plugin-failure"] {
        let line = stderr
            .lines()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what} line in: {stderr}"));
        // (An event's JSON data writes C0 controls as `\u001b` itself.)
        assert!(
            line.contains("\\u{1b}[2J") || line.contains("\\u001b[2J"),
            "{line:?}"
        );
        for esc in ["\\u{9b}31m", "\\u{202e}cod.exe", "\\u{2066}x\\u{2069}"] {
            assert!(line.contains(esc), "{what}: {esc} missing in {line:?}");
        }
    }
    let raw: Vec<char> = stderr.chars().filter(|c| HOSTILE.contains(c)).collect();
    assert!(
        raw.is_empty(),
        "raw control/format characters on the terminal: {raw:?}"
    );
    // The request without an id was reported, not silently dropped.
    assert!(
        stderr.contains("without an id") && stderr.contains("request_without_id"),
        "{stderr}"
    );

    // The bidi name was refused; the good one written; nothing else made.
    let agent_dir = dir.path().join("files").join(NAMESPACE).join(AGENT);
    let names: Vec<String> = std::fs::read_dir(&agent_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["ok.txt".to_owned()], "{stderr}");
    let audit = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
    assert!(
        audit.contains("invalid_tool_arguments"),
        "the refusal is on the record"
    );
}
