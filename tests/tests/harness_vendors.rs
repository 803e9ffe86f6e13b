//! The real Codex CLI (0.171.0) and Claude Code (2.1.332), seated by the
//! specs in `plugins/harness/specs/` in the full sandbox, their model API a
//! scripted mock on the host's loopback reached only through the egress
//! gateway (docs/HARNESS.md, "Codex CLI" and "Claude Code"). Asserted from
//! the host: the turn's result and events, the JSONL audit trail, what the
//! mock model was sent (the tool result the CLI saw, the key it carried)
//! and /proc. Needs the pinned CLIs that `scripts/test` installs
//! (tests/vendor-cli); without them every test fails naming it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use sharedos_egress::mock::wire::{calls_turn, text_turn};
use sharedos_egress::mock::{MockModel, MockOptions, OnRequest, Reply, ScriptedCall, Wire};
use sharedos_tests::engines::Engine;
use sharedos_tests::turns::marked_pids;
use sharedos_tests::vendors::{
    Vendor, VendorCase, VendorTurn, assert_key_kept, every_model_api_accepts, run_vendor,
    unique_marker,
};

const TOOLS: [&str; 5] = [
    "files.read",
    "files.write",
    "files.list",
    "files.delete",
    "sharedos.escalate",
];

fn runtime() -> tokio::runtime::Runtime {
    // The plugin's stderr (the CLI's stderr tail on a failure) is logged by
    // the host; shown with the test's output when it fails.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_test_writer()
        .try_init();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn case(vendor: Vendor, timeout_ms: u64) -> VendorCase {
    VendorCase {
        vendor,
        prompt: json!("Write a note for the team, then tell me you did."),
        tools: TOOLS.to_vec(),
        timeout_ms,
        http: false,
        max_tool_calls: None,
        route_granted: true,
        engine: Engine::Sandbox,
    }
}

/// A Codex function call to a tool of the `sharedos` MCP server: the
/// namespace and the name in separate fields, as Codex requires.
fn codex_call<'a>(name: &'a str, arguments: &'a str) -> ScriptedCall<'a> {
    ScriptedCall {
        id: "call_1",
        namespace: Some("mcp__sharedos"),
        name,
        arguments,
    }
}

/// The text of every tool result the CLI sent back to its model, in order,
/// and whether it flagged it as an error (Claude's `is_error`; Codex keeps
/// the MCP error in the text).
fn results_sent(wire: Wire, body: &Value) -> Vec<(String, bool)> {
    let items = |v: &Value| v.as_array().cloned().unwrap_or_default();
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .map(|p| p["text"].as_str().unwrap_or("").to_owned())
            .collect::<Vec<_>>()
            .join("\n"),
        other => other.to_string(),
    };
    match wire {
        Wire::OpenaiResponses => items(&body["input"])
            .iter()
            .filter(|i| i["type"] == "function_call_output")
            .map(|i| (text(&i["output"]), false))
            .collect(),
        _ => items(&body["messages"])
            .iter()
            .flat_map(|m| items(&m["content"]))
            .filter(|b| b["type"] == "tool_result")
            .map(|b| (text(&b["content"]), b["is_error"] == true))
            .collect(),
    }
}

/// The MCP tools Codex offered its model: the `mcp__sharedos` namespace.
fn codex_offered(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["type"] == "namespace" && t["name"] == "mcp__sharedos")
        .flat_map(|t| t["tools"].as_array().cloned().unwrap_or_default())
        .map(|t| t["name"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// `(tool, outcome/reason)` of every `tool.invoked` audit record.
fn invoked(turn: &VendorTurn) -> Vec<(String, String)> {
    turn.audit_of("tool.invoked")
        .iter()
        .map(|r| {
            let outcome = serde_json::to_value(r.outcome).unwrap();
            (
                r.tool.clone().unwrap_or_default(),
                format!(
                    "{}/{}",
                    outcome.as_str().unwrap_or(""),
                    r.reason.as_deref().unwrap_or("-")
                ),
            )
        })
        .collect()
}

#[test]
fn codex_calls_a_granted_tool_through_the_envelope_and_its_final_message_is_the_output() {
    let _serial = sharedos_tests::serial();
    let rt = runtime();
    let marker = unique_marker();
    let args = r#"{"path": "notes/team.md", "content": "standup moved to 10:00"}"#;
    let first_request: Arc<std::sync::OnceLock<std::time::Instant>> = Arc::default();
    let first = first_request.clone();
    let hook: OnRequest = Arc::new(move |_| {
        let _ = first.set(std::time::Instant::now());
    });
    let turn = rt.block_on(async {
        let options = MockOptions {
            on_request: Some(hook),
            ..MockOptions::default()
        };
        let mock = MockModel::start_with(
            vec![
                Reply::Stream(calls_turn(
                    Wire::OpenaiResponses,
                    &[codex_call("files__write", args)],
                )),
                Reply::Stream(text_turn(Wire::OpenaiResponses, &["Wrote ", "the note."])),
            ],
            options,
        )
        .await
        .unwrap();
        let turn = run_vendor(case(Vendor::Codex, 60_000), &mock, &marker).await;
        (turn, mock.seen())
    });
    let (turn, seen) = turn;
    let v = turn.json();
    let offered = seen.first().map(|s| codex_offered(&s.body));
    let tools = seen.first().map(|s| s.body["tools"].clone());
    assert_eq!(
        v["status"], "succeeded",
        "{v:#}\noffered: {offered:?} in {tools:#?}"
    );
    assert_eq!(v["output"], "Wrote the note.", "{v:#}");
    assert_eq!(v["metadata"]["toolshare"], "mcp");
    assert_eq!(v["metadata"]["harnessOutcome"], "complete");
    // The model saw the permission-filtered catalogue, and nothing of
    // files.delete (not granted).
    let offered = offered.unwrap_or_default();
    assert!(
        offered.contains(&"files__write".to_owned()),
        "{offered:?} {:?} {}",
        seen[0].headers,
        seen[0].body_len
    );
    assert!(!offered.iter().any(|t| t.contains("delete")), "{offered:?}");
    // Every name the model got is one OpenAI's and Anthropic's APIs accept.
    assert!(
        offered.iter().all(|t| every_model_api_accepts(t)),
        "{offered:?}"
    );
    // The call is the kernel's: requested, invoked, in the audit trail.
    let requested: Vec<Value> = turn
        .events("tool.requested")
        .iter()
        .map(|e| e["tool"].clone())
        .collect();
    assert_eq!(requested, vec![json!("files.write")], "{v:#}");
    assert_eq!(
        invoked(&turn),
        vec![("files.write".to_owned(), "succeeded/-".to_owned())]
    );
    // Codex got the envelope's result and sent it to its model.
    assert_eq!(seen.len(), 2, "{seen:?}");
    let results = results_sent(Wire::OpenaiResponses, &seen[1].body);
    assert_eq!(results.len(), 1, "{:#}", seen[1].body["input"]);
    assert!(!results[0].0.contains("isError"), "{results:?}");
    assert_key_kept(&turn, &seen, Vendor::Codex);
    let left = sharedos_tests::turns::wait_gone(&marker, Duration::from_secs(5));
    assert!(left.is_empty(), "survivors: {left:?}");
    // A figure, not a pass/fail bound (docs/BENCHMARKS.md): with
    // `required = true` Codex lists the server's tools before its first
    // model request, so this bounds execute() → its first tools/list.
    if let Some(at) = first_request.get() {
        eprintln!(
            "figure: execute() to Codex's first model request {:.0} ms (turn {:.0} ms)",
            at.duration_since(turn.started).as_secs_f64() * 1e3,
            turn.elapsed.as_secs_f64() * 1e3
        );
    }
}

#[test]
fn codex_calling_an_ungranted_tool_or_past_a_ceiling_gets_an_error_result() {
    let _serial = sharedos_tests::serial();
    let rt = runtime();
    let marker = unique_marker();
    let write = r#"{"path": "notes/team.md", "content": "one"}"#;
    let (turn, seen) = rt.block_on(async {
        let mock = MockModel::start(vec![
            // Not granted, so not in the catalogue Codex listed.
            Reply::Stream(calls_turn(
                Wire::OpenaiResponses,
                &[codex_call("files__delete", r#"{"path": "notes/team.md"}"#)],
            )),
            // Listed; the first passes, the second is over the turn's
            // maxToolCalls and the envelope refuses it.
            Reply::Stream(calls_turn(
                Wire::OpenaiResponses,
                &[codex_call("files__write", write)],
            )),
            Reply::Stream(calls_turn(
                Wire::OpenaiResponses,
                &[codex_call("files__write", write)],
            )),
            Reply::Stream(text_turn(Wire::OpenaiResponses, &["Refused twice."])),
        ])
        .await
        .unwrap();
        let mut case = case(Vendor::Codex, 60_000);
        case.max_tool_calls = Some(1);
        let turn = run_vendor(case, &mock, &marker).await;
        (turn, mock.seen())
    });
    let v = turn.json();
    assert_eq!(v["status"], "succeeded", "{v:#}");
    assert_eq!(v["output"], "Refused twice.", "{v:#}");
    assert_eq!(seen.len(), 4, "{seen:?}");
    // Codex refuses a name outside the catalogue it listed itself: its
    // model gets an error, and nothing reaches the MCP server or the
    // envelope (no tool.requested for it).
    let first = results_sent(Wire::OpenaiResponses, &seen[1].body);
    assert_eq!(first.len(), 1, "{:#}", seen[1].body["input"]);
    assert!(
        first[0].0.contains("unsupported call") && first[0].0.contains("files__delete"),
        "{first:?}"
    );
    // The refusal of the envelope reached Codex as an MCP error result
    // carrying its code, and its model saw it.
    let last = results_sent(Wire::OpenaiResponses, &seen[3].body);
    assert_eq!(last.len(), 3, "{:#}", seen[3].body["input"]);
    assert!(!last[1].0.contains("tool_call_limit_exceeded"), "{last:?}");
    assert!(last[2].0.contains("tool_call_limit_exceeded"), "{last:?}");
    let requested: Vec<Value> = turn
        .events("tool.requested")
        .iter()
        .map(|e| e["tool"].clone())
        .collect();
    assert_eq!(
        requested,
        vec![json!("files.write"), json!("files.write")],
        "{v:#}"
    );
    assert_eq!(
        invoked(&turn),
        vec![
            ("files.write".to_owned(), "succeeded/-".to_owned()),
            (
                "files.write".to_owned(),
                "denied/tool_call_limit_exceeded".to_owned()
            ),
        ]
    );
    assert_key_kept(&turn, &seen, Vendor::Codex);
}

#[test]
fn codex_over_streamable_http_calls_a_granted_tool() {
    let _serial = sharedos_tests::serial();
    let rt = runtime();
    let marker = unique_marker();
    let args = r#"{"path": "notes/http.md", "content": "over http"}"#;
    let (turn, seen) = rt.block_on(async {
        let mock = MockModel::start(vec![
            Reply::Stream(calls_turn(
                Wire::OpenaiResponses,
                &[codex_call("files__write", args)],
            )),
            Reply::Stream(text_turn(Wire::OpenaiResponses, &["Done over HTTP."])),
        ])
        .await
        .unwrap();
        let mut case = case(Vendor::Codex, 60_000);
        case.http = true;
        let turn = run_vendor(case, &mock, &marker).await;
        (turn, mock.seen())
    });
    let v = turn.json();
    assert_eq!(v["status"], "succeeded", "{v:#}");
    assert_eq!(v["output"], "Done over HTTP.", "{v:#}");
    let sandbox = &v["metadata"]["runtime"]["sandbox"];
    assert_eq!(
        sandbox["seccomp"]["mode"], "namespace+harness",
        "{sandbox:#}"
    );
    let offered = codex_offered(&seen[0].body);
    assert!(offered.contains(&"files__write".to_owned()), "{offered:?}");
    assert!(
        offered.iter().all(|t| every_model_api_accepts(t)),
        "{offered:?}"
    );
    assert_eq!(
        invoked(&turn),
        vec![("files.write".to_owned(), "succeeded/-".to_owned())]
    );
    let results = results_sent(Wire::OpenaiResponses, &seen[1].body);
    assert_eq!(results.len(), 1, "{:#}", seen[1].body["input"]);
    assert!(results[0].0.contains("notes/http.md"), "{results:?}");
    assert_key_kept(&turn, &seen, Vendor::Codex);
    let left = sharedos_tests::turns::wait_gone(&marker, Duration::from_secs(5));
    assert!(left.is_empty(), "survivors: {left:?}");
}

/// The pids of the processes carrying `marker` and all their descendants,
/// with their start times (so a reused pid is not mistaken for a survivor).
fn tree_of(marker: &str) -> BTreeMap<u32, (String, String)> {
    let mut out = BTreeMap::new();
    let mut todo: Vec<u32> = marked_pids(marker);
    while let Some(pid) = todo.pop() {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let start = stat
            .rsplit(')')
            .next()
            .and_then(|s| s.split_whitespace().nth(19))
            .unwrap_or("")
            .to_owned();
        if out.insert(pid, (comm.trim().to_owned(), start)).is_some() {
            continue;
        }
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten();
        for t in tasks.flatten() {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            todo.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
    }
    out
}

fn still_alive(tree: &BTreeMap<u32, (String, String)>) -> Vec<(u32, String)> {
    tree.iter()
        .filter(|(pid, (_, start))| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .and_then(|s| s.split_whitespace().nth(19))
                    == Some(start.as_str())
            })
        })
        .map(|(pid, (comm, _))| (*pid, comm.clone()))
        .collect()
}

#[test]
fn codex_waiting_on_a_model_that_never_answers_is_killed_by_the_deadline_with_its_children() {
    let _serial = sharedos_tests::serial();
    let rt = runtime();
    let marker = unique_marker();
    let seen_tree: Arc<Mutex<BTreeMap<u32, (String, String)>>> = Arc::default();
    let alive_at_record: Arc<Mutex<usize>> = Arc::default();
    let (turn, seen) = rt.block_on(async {
        // While Codex waits for its model, the host records the turn's
        // whole process tree (harness, codex, the MCP relay it spawned).
        let (m, t) = (marker.clone(), seen_tree.clone());
        let a = alive_at_record.clone();
        let hook: OnRequest = Arc::new(move |_| {
            let tree = tree_of(&m);
            // The survivor check sees them while they live (so it can fail).
            *a.lock().unwrap() = still_alive(&tree).len();
            *t.lock().unwrap() = tree;
        });
        let options = MockOptions {
            on_request: Some(hook),
            ..MockOptions::default()
        };
        let mock = MockModel::start_with(vec![Reply::Hang], options)
            .await
            .unwrap();
        let turn = run_vendor(case(Vendor::Codex, 6_000), &mock, &marker).await;
        (turn, mock.seen())
    });
    let v = turn.json();
    assert_eq!(v["status"], "cancelled", "{v:#}");
    assert_eq!(v["error"]["code"], "turn_cancelled", "{v:#}");
    assert!(!seen.is_empty(), "codex never asked its model");
    assert!(turn.audit_of("tool.invoked").is_empty());
    let tree = seen_tree.lock().unwrap().clone();
    let comms: Vec<&str> = tree.values().map(|(c, _)| c.as_str()).collect();
    assert!(comms.contains(&"codex"), "{tree:?}");
    assert!(comms.contains(&"sharedos-harnes"), "{tree:?}");
    assert!(
        tree.len() >= 3,
        "the relay Codex spawned is in the tree: {tree:?}"
    );
    assert_eq!(*alive_at_record.lock().unwrap(), tree.len(), "{tree:?}");
    // Well before the deadline's generous bound, every one is gone.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let mut left = still_alive(&tree);
    while !left.is_empty() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
        left = still_alive(&tree);
    }
    assert!(left.is_empty(), "survivors: {left:?}");
    assert!(turn.elapsed < Duration::from_secs(30), "{:?}", turn.elapsed);
}

#[test]
fn claude_code_calls_a_granted_tool_end_to_end() {
    let _serial = sharedos_tests::serial();
    let rt = runtime();
    let marker = unique_marker();
    let args = r#"{"path": "notes/team.md", "content": "standup moved to 10:00"}"#;
    let (turn, seen) = rt.block_on(async {
        let call = ScriptedCall {
            id: "toolu_1",
            namespace: None,
            name: "mcp__sharedos__files__write",
            arguments: args,
        };
        let mock = MockModel::start(vec![
            Reply::Stream(calls_turn(Wire::AnthropicMessages, &[call])),
            Reply::Stream(text_turn(Wire::AnthropicMessages, &["Wrote ", "the note."])),
        ])
        .await
        .unwrap();
        let turn = run_vendor(case(Vendor::ClaudeCode, 60_000), &mock, &marker).await;
        (turn, mock.seen())
    });
    let v = turn.json();
    let offered: Vec<String> = seen
        .first()
        .map(|s| {
            s.body["tools"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| t["name"].as_str().unwrap_or("").to_owned())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(v["status"], "succeeded", "{v:#}\noffered: {offered:?}");
    assert_eq!(v["output"], "Wrote the note.", "{v:#}");
    // Only the sharedos tools (`--tools ""`: no built-in Bash, Edit, Read,
    // ...; the placeholder Claude Code always sends is no tool it runs),
    // and not the ungranted files.delete.
    assert!(
        offered
            .iter()
            .all(|t| t.starts_with("mcp__sharedos__") || t == "DeferredToolPlaceholder"),
        "{offered:?}"
    );
    assert!(
        offered.contains(&"mcp__sharedos__files__write".to_owned()),
        "{offered:?}"
    );
    assert!(
        offered.iter().all(|t| every_model_api_accepts(t)),
        "{offered:?}"
    );
    assert!(!offered.iter().any(|t| t.contains("delete")), "{offered:?}");
    assert_eq!(
        invoked(&turn),
        vec![("files.write".to_owned(), "succeeded/-".to_owned())]
    );
    let results = results_sent(Wire::AnthropicMessages, &seen[seen.len() - 1].body);
    assert_eq!(results.len(), 1, "{seen:?}");
    assert!(!results[0].1, "the call was not allowed: {results:?}");
    assert_key_kept(&turn, &seen, Vendor::ClaudeCode);
    let left = sharedos_tests::turns::wait_gone(&marker, Duration::from_secs(5));
    assert!(left.is_empty(), "survivors: {left:?}");
}

/// Claude Code over streamable HTTP MCP (docs/HARNESS.md, "Claude Code"):
/// the `--mcp-config` server entry `type: "http"` with the turn's bearer
/// token in its headers, in the harness sandbox mode.
#[test]
fn claude_code_over_streamable_http_calls_a_granted_tool() {
    let _serial = sharedos_tests::serial();
    let rt = runtime();
    let marker = unique_marker();
    let args = r#"{"path": "notes/http.md", "content": "over http"}"#;
    let (turn, seen) = rt.block_on(async {
        let call = ScriptedCall {
            id: "toolu_1",
            namespace: None,
            name: "mcp__sharedos__files__write",
            arguments: args,
        };
        let mock = MockModel::start(vec![
            Reply::Stream(calls_turn(Wire::AnthropicMessages, &[call])),
            Reply::Stream(text_turn(Wire::AnthropicMessages, &["Done over HTTP."])),
        ])
        .await
        .unwrap();
        let mut case = case(Vendor::ClaudeCode, 60_000);
        case.http = true;
        let turn = run_vendor(case, &mock, &marker).await;
        (turn, mock.seen())
    });
    let v = turn.json();
    assert_eq!(v["status"], "succeeded", "{v:#}");
    assert_eq!(v["output"], "Done over HTTP.", "{v:#}");
    let sandbox = &v["metadata"]["runtime"]["sandbox"];
    assert_eq!(
        sandbox["seccomp"]["mode"], "namespace+harness",
        "{sandbox:#}"
    );
    assert_eq!(
        invoked(&turn),
        vec![("files.write".to_owned(), "succeeded/-".to_owned())]
    );
    let results = results_sent(Wire::AnthropicMessages, &seen[seen.len() - 1].body);
    assert_eq!(results.len(), 1, "{seen:?}");
    assert!(
        !results[0].1 && results[0].0.contains("notes/http.md"),
        "{results:?}"
    );
    assert_key_kept(&turn, &seen, Vendor::ClaudeCode);
    let left = sharedos_tests::turns::wait_gone(&marker, Duration::from_secs(5));
    assert!(left.is_empty(), "survivors: {left:?}");
}

/// The user text of every message a request carried (both wires).
fn user_texts(body: &Value) -> Vec<String> {
    let list = if body["input"].is_array() {
        &body["input"]
    } else {
        &body["messages"]
    };
    list.as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .flat_map(|m| match &m["content"] {
            Value::String(s) => vec![s.clone()],
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p["text"].as_str().map(str::to_owned))
                .collect(),
            _ => vec![],
        })
        .collect()
}

#[test]
fn a_hostile_prompt_reaches_each_model_as_one_unchanged_string() {
    // A leading dash (a flag?), quotes and brackets of TOML and JSON, a
    // template variable, shell syntax and a newline: the specs pass the
    // prompt as one argument after `--`, never through a shell or a file.
    let prompt = "--version\n\"\"\" ]] {home} {json:prompt} $(id) `id` '; exit 1";
    for (vendor, wire) in [
        (Vendor::Codex, Wire::OpenaiResponses),
        (Vendor::ClaudeCode, Wire::AnthropicMessages),
    ] {
        let _serial = sharedos_tests::serial();
        let rt = runtime();
        let marker = unique_marker();
        let (turn, seen) = rt.block_on(async {
            let mock = MockModel::start(vec![Reply::Stream(text_turn(wire, &["Understood."]))])
                .await
                .unwrap();
            let mut case = case(vendor, 60_000);
            case.prompt = json!(prompt);
            let turn = run_vendor(case, &mock, &marker).await;
            (turn, mock.seen())
        });
        let v = turn.json();
        assert_eq!(v["status"], "succeeded", "{vendor:?}: {v:#}");
        assert_eq!(v["output"], "Understood.", "{vendor:?}: {v:#}");
        assert_eq!(seen.len(), 1, "{vendor:?}");
        let texts = user_texts(&seen[0].body);
        assert!(
            texts.iter().any(|t| t.trim_end() == prompt),
            "{vendor:?}: the prompt arrived changed: {texts:#?}"
        );
    }
}

/// A model that answers 500: Claude Code does not retry it
/// (`CLAUDE_CODE_MAX_RETRIES = "0"` in the shipped spec), so the turn ends
/// after one request, the CLI's failure naming no success; without the
/// setting Claude Code retries with backoff until the gateway's
/// `maxFailures` (3) ends the turn.
#[test]
fn claude_code_does_not_retry_a_failing_model() {
    let _serial = sharedos_tests::serial();
    let rt = runtime();
    let marker = unique_marker();
    let (turn, seen) = rt.block_on(async {
        let error = json!({"type": "error", "error": {"type": "api_error", "message": "down"}});
        let mock = MockModel::start((0..5).map(|_| Reply::Status(500, error.clone())).collect())
            .await
            .unwrap();
        let turn = run_vendor(case(Vendor::ClaudeCode, 60_000), &mock, &marker).await;
        (turn, mock.seen())
    });
    let v = turn.json();
    assert_eq!(v["status"], "failed", "{v:#}");
    let paths: Vec<&str> = seen.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(paths, ["/v1/messages"], "{v:#}");
}
