//! The quick start of docs/SERVE.md, run as written: its `host.toml`, its
//! session (tools named, resolved from the host's catalogue) and run bodies
//! and its scope, under a real `sharedos serve` (the standard runtime in the
//! real sandbox); the run's tool calls succeed with exactly the output the
//! page shows, and the store's audit trail holds exactly the lines it
//! shows. A name the host does not have is `400 unknown_tool`.

use std::path::Path;

use serde_json::Value;
use sharedos_tests::served::{call_as, start, wait_state_as};

/// The quick start section of docs/SERVE.md.
fn quick_start() -> String {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/SERVE.md");
    let page = std::fs::read_to_string(page).unwrap();
    let start = page.find("## Quick start").expect("a quick start section");
    let end = page[start..].find("\n## Running it").expect("its end") + start;
    page[start..end].to_owned()
}

/// The code blocks of `text` fenced as `lang`, in order.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let fence = format!("```{lang}\n");
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(&fence) {
        let body = &rest[at + fence.len()..];
        let end = body.find("```").expect("a closed block");
        found.push(body[..end].to_owned());
        rest = &body[end..];
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quick_start_runs_its_tools_and_audits_them_as_documented() {
    let section = quick_start();
    let toml = blocks(&section, "toml");
    let json = blocks(&section, "json");
    let sh = blocks(&section, "sh");
    let text = blocks(&section, "text");
    assert_eq!((toml.len(), json.len(), sh.len(), text.len()), (1, 3, 2, 1));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("host.toml"), &toml[0]).unwrap();
    let scope = sh[0]
        .lines()
        .find_map(|l| l.strip_prefix("SCOPE='Sharedos-Scope: "))
        .and_then(|l| l.strip_suffix('\''))
        .expect("the SCOPE line")
        .to_owned();
    let session: Value = serde_json::from_str(&json[0]).unwrap();
    let run: Value = serde_json::from_str(&json[1]).unwrap();
    let documented_output: Value = serde_json::from_str(&json[2]).unwrap();

    let server = start(dir.path());
    let socket = server.socket();
    let mut unknown = session.clone();
    unknown["tools"] = serde_json::json!(["files.write", "files.shred"]);
    let (status, err) = call_as(&socket, "POST", "/v1/sessions", &scope, unknown).await;
    assert_eq!(
        (status, &err["error"]["code"]),
        (400, &serde_json::json!("unknown_tool")),
        "{err}"
    );
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("files.shred") && message.contains("files.delete, files.list"),
        "the names the host has: {message}"
    );
    let (status, opened) = call_as(&socket, "POST", "/v1/sessions", &scope, session).await;
    assert_eq!(status, 201, "{opened}");
    let session = opened["session"]["id"].as_str().unwrap();
    let runs = format!("/v1/sessions/{session}/runs");
    let (status, admitted) = call_as(&socket, "POST", &runs, &scope, run).await;
    assert_eq!(status, 201, "{admitted}");
    let run_id = admitted["run"]["id"].as_str().unwrap().to_owned();
    let ended = wait_state_as(&socket, &run_id, &scope, "ended").await;
    assert_eq!(ended["result"]["status"], "succeeded", "{ended}");
    assert_eq!(
        ended["result"]["output"], documented_output,
        "the output SERVE.md shows"
    );
    let plan = dir.path().join("files/demo/alice/notes/plan.md");
    assert!(plan.is_file(), "the plan was written");

    let conn = rusqlite::Connection::open(dir.path().join("sharedos.db")).unwrap();
    let mut stmt = conn
        .prepare("SELECT kind, outcome FROM audit_records WHERE trace_id = ?1 ORDER BY seq")
        .unwrap();
    let lines: Vec<String> = stmt
        .query_map([&run_id], |r| {
            Ok(format!(
                "{}|{}",
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        lines.join("\n"),
        text[0].trim_end(),
        "the audit lines SERVE.md shows"
    );
}
