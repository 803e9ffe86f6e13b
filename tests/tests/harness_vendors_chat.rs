//! The vendor CLIs whose shipped specs speak OpenAI's chat completions
//! (opencode, Qwen Code) or Gemini's API (Gemini CLI), seated like Codex
//! and Claude Code in harness_vendors.rs: the
//! spec in `plugins/harness/specs/` loaded through `HostConfig`, the full
//! sandbox, the real kernel with its JSONL audit trail, a scripted mock
//! model on the host's loopback reached only through the egress gateway.
//! Needs the pinned CLIs that `scripts/test` installs (tests/vendor-cli);
//! without them every test fails naming it.

use std::time::Duration;

use serde_json::{Value, json};
use sharedos_egress::mock::wire::{calls_turn, results_sent, text_turn, tools_offered};
use sharedos_egress::mock::{MockModel, Reply, ScriptedCall, SeenRequest, Wire};
use sharedos_tests::engines::Engine;
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

fn case(vendor: Vendor, prompt: Value) -> VendorCase {
    VendorCase {
        vendor,
        prompt,
        tools: TOOLS.to_vec(),
        timeout_ms: 60_000,
        http: false,
        max_tool_calls: None,
        route_granted: true,
        engine: Engine::Sandbox,
    }
}

/// The function names a request offered its model.
fn offered(vendor: Vendor, body: &Value) -> Vec<String> {
    tools_offered(vendor.wire(), body)
}

/// The tool results a request carried back to its model: the `tool`
/// messages' contents (a string, or the JSON text of content parts, as
/// Qwen Code sends them) or Gemini's `functionResponse`s.
fn tool_results(vendor: Vendor, body: &Value) -> Vec<String> {
    if vendor.wire() == Wire::Gemini {
        return results_sent(Wire::Gemini, body)
            .into_iter()
            .map(|(_, r)| r)
            .collect();
    }
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "tool")
        .map(|m| match &m["content"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect()
}

/// The user texts a request carried (chat `messages`, Gemini `contents`).
fn user_texts(vendor: Vendor, body: &Value) -> Vec<String> {
    let (list, parts) = match vendor.wire() {
        Wire::Gemini => ("contents", "parts"),
        _ => ("messages", "content"),
    };
    body[list]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .flat_map(|m| match &m[parts] {
            Value::String(s) => vec![s.clone()],
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p["text"].as_str().map(str::to_owned))
                .collect(),
            _ => vec![],
        })
        .collect()
}

/// The path every model request of `vendor`'s spec takes at the mock.
fn model_path(vendor: Vendor) -> &'static str {
    match vendor.wire() {
        Wire::Gemini => "/v1beta/models/gemini-2.5-flash:streamGenerateContent",
        _ => "/v1/chat/completions",
    }
}

fn invoked(turn: &VendorTurn) -> Vec<(String, String)> {
    turn.audit_of("tool.invoked")
        .iter()
        .map(|r| {
            let outcome = serde_json::to_value(r.outcome).unwrap();
            (
                r.tool.clone().unwrap_or_default(),
                outcome.as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// The real key reached only the upstream, never the result, the events
/// or the audit; every model request went through the gateway to the
/// spec's one model endpoint and was answered 200.
fn assert_only_the_model_reached(turn: &VendorTurn, seen: &[SeenRequest], vendor: Vendor) {
    assert_key_kept(turn, seen, vendor);
    for s in seen {
        assert_eq!(s.path, model_path(vendor), "{vendor:?}");
    }
}

/// One turn of `vendor` whose model calls `files.write` under `name` (as
/// the CLI lists the sharedos tools to its model: `prefix` then the MCP
/// name), then answers in text; everything the tests of a granted call
/// assert.
fn a_granted_call_goes_through_the_envelope(vendor: Vendor, prefix: &str, http: bool) {
    let _serial = sharedos_tests::serial();
    let rt = runtime();
    let marker = unique_marker();
    let args = r#"{"path": "notes/team.md", "content": "standup moved to 10:00"}"#;
    let name = format!("{prefix}files__write");
    let (turn, seen) = rt.block_on(async {
        let call = ScriptedCall {
            id: "call_1",
            namespace: None,
            name: &name,
            arguments: args,
        };
        let mock = MockModel::start(vec![
            Reply::Stream(calls_turn(vendor.wire(), &[call])),
            Reply::Stream(text_turn(vendor.wire(), &["Wrote ", "the note."])),
        ])
        .await
        .unwrap();
        let prompt = json!("Write a note for the team, then tell me you did.");
        let mut case = case(vendor, prompt);
        case.http = http;
        let turn = run_vendor(case, &mock, &marker).await;
        (turn, mock.seen())
    });
    let v = turn.json();
    let mode = &v["metadata"]["runtime"]["sandbox"]["seccomp"]["mode"];
    let want = if http {
        "namespace+harness"
    } else {
        "namespace+egress"
    };
    assert_eq!(mode, want, "{v:#}");
    let names = seen
        .first()
        .map(|s| offered(vendor, &s.body))
        .unwrap_or_default();
    assert_eq!(v["status"], "succeeded", "{v:#}\noffered: {names:?}");
    assert_eq!(v["output"], "Wrote the note.", "{v:#}");
    assert_eq!(v["metadata"]["harnessOutcome"], "complete");
    // Only the sharedos tools (no built-in, no tool search), not the
    // ungranted files.delete, and every name one every model API accepts.
    assert!(names.contains(&name), "{names:?}");
    assert!(names.iter().all(|t| t.starts_with(prefix)), "{names:?}");
    assert!(!names.iter().any(|t| t.contains("delete")), "{names:?}");
    for s in &seen {
        let all = offered(vendor, &s.body);
        assert!(all.iter().all(|t| every_model_api_accepts(t)), "{all:?}");
    }
    assert_eq!(
        invoked(&turn),
        vec![("files.write".to_owned(), "succeeded".to_owned())]
    );
    // No title, memory or other side request: the call, then the answer.
    assert_eq!(seen.len(), 2, "{seen:?}");
    let results = tool_results(vendor, &seen[1].body);
    assert_eq!(results.len(), 1, "{:#}", seen[1].body);
    assert!(results[0].contains("notes/team.md"), "{results:?}");
    assert_only_the_model_reached(&turn, &seen, vendor);
    let left = sharedos_tests::turns::wait_gone(&marker, Duration::from_secs(5));
    assert!(left.is_empty(), "survivors: {left:?}");
}

/// Gemini CLI lists MCP tools to its model as `mcp_<server>_<tool>`.
#[test]
fn gemini_calls_a_granted_tool_through_the_envelope_and_its_final_message_is_the_output() {
    a_granted_call_goes_through_the_envelope(Vendor::Gemini, "mcp_sharedos_", false);
}

/// Gemini CLI over streamable HTTP MCP: `httpUrl` with the turn's bearer
/// token in its headers.
#[test]
fn gemini_over_streamable_http_calls_a_granted_tool() {
    a_granted_call_goes_through_the_envelope(Vendor::Gemini, "mcp_sharedos_", true);
}

/// Cline lists MCP tools to its model as `<server>__<tool>`.
#[test]
fn cline_calls_a_granted_tool_through_the_envelope_and_its_final_message_is_the_output() {
    a_granted_call_goes_through_the_envelope(Vendor::Cline, "sharedos__", false);
}

/// Cline over streamable HTTP MCP: a `streamableHttp` server with the
/// turn's bearer token in its headers.
#[test]
fn cline_over_streamable_http_calls_a_granted_tool() {
    a_granted_call_goes_through_the_envelope(Vendor::Cline, "sharedos__", true);
}

/// opencode lists MCP tools to its model as `<server>_<tool>`.
#[test]
fn opencode_calls_a_granted_tool_through_the_envelope_and_its_final_message_is_the_output() {
    a_granted_call_goes_through_the_envelope(Vendor::Opencode, "sharedos_", false);
}

/// opencode over streamable HTTP MCP: a `remote` server with the turn's
/// bearer token in its headers, OAuth discovery off.
#[test]
fn opencode_over_streamable_http_calls_a_granted_tool() {
    a_granted_call_goes_through_the_envelope(Vendor::Opencode, "sharedos_", true);
}

/// Qwen Code lists MCP tools as `mcp__<server>__<tool>`, directly (its
/// tool search off).
#[test]
fn qwen_code_calls_a_granted_tool_through_the_envelope_and_its_final_message_is_the_output() {
    a_granted_call_goes_through_the_envelope(Vendor::QwenCode, "mcp__sharedos__", false);
}

/// Qwen Code over streamable HTTP MCP: `httpUrl` with the turn's bearer
/// token in its headers.
#[test]
fn qwen_code_over_streamable_http_calls_a_granted_tool() {
    a_granted_call_goes_through_the_envelope(Vendor::QwenCode, "mcp__sharedos__", true);
}

/// A prompt with a leading `--version`, quotes, brackets, a template
/// variable, shell syntax and newlines.
const HOSTILE: &str = "--version\n\"\"\" ]] {home} {json:prompt} $(id) `id` '; exit 1";

/// One turn of `vendor` given [`HOSTILE`]: it reaches the model as one
/// unchanged user message and the model's answer is the output.
fn the_hostile_prompt_reaches_the_model_unchanged(vendor: Vendor) {
    let _serial = sharedos_tests::serial();
    let rt = runtime();
    let marker = unique_marker();
    let (turn, seen) = rt.block_on(async {
        let mock = MockModel::start(vec![Reply::Stream(text_turn(
            vendor.wire(),
            &["Understood."],
        ))])
        .await
        .unwrap();
        let turn = run_vendor(case(vendor, json!(HOSTILE)), &mock, &marker).await;
        (turn, mock.seen())
    });
    let v = turn.json();
    assert_eq!(v["status"], "succeeded", "{vendor:?}: {v:#}");
    assert_eq!(v["output"], "Understood.", "{vendor:?}: {v:#}");
    assert_eq!(seen.len(), 1, "{vendor:?}: {seen:?}");
    let texts = user_texts(vendor, &seen[0].body);
    assert!(
        texts.iter().any(|t| t.trim() == HOSTILE),
        "{vendor:?}: the prompt arrived changed: {texts:#?}"
    );
    assert_only_the_model_reached(&turn, &seen, vendor);
}

/// The opencode, Qwen Code and Gemini CLI specs give the CLI the prompt
/// on its stdin.
#[test]
fn a_hostile_prompt_on_stdin_reaches_each_model_unchanged() {
    for vendor in [Vendor::Opencode, Vendor::QwenCode, Vendor::Gemini] {
        the_hostile_prompt_reaches_the_model_unchanged(vendor);
    }
}

/// Cline reads no prompt from a pipe in its JSON mode: its spec passes it
/// as the argument after `--`.
#[test]
fn a_hostile_prompt_after_the_separator_reaches_cline_unchanged() {
    the_hostile_prompt_reaches_the_model_unchanged(Vendor::Cline);
}

/// One turn of `vendor` against a model that answers only 500: the
/// result and how many requests the model saw.
fn against_a_failing_model(vendor: Vendor) -> (Value, usize) {
    let _serial = sharedos_tests::serial();
    let rt = runtime();
    let marker = unique_marker();
    let (turn, seen) = rt.block_on(async {
        let error = match vendor.wire() {
            Wire::Gemini => {
                json!({"error": {"code": 500, "message": "down", "status": "INTERNAL"}})
            }
            _ => json!({"error": {"message": "down", "type": "server_error"}}),
        };
        let replies = (0..8).map(|_| Reply::Status(500, error.clone())).collect();
        let mock = MockModel::start(replies).await.unwrap();
        let turn = run_vendor(case(vendor, json!("Say hi.")), &mock, &marker).await;
        (turn, mock.seen())
    });
    let left = sharedos_tests::turns::wait_gone(&marker, Duration::from_secs(5));
    assert!(left.is_empty(), "survivors: {left:?}");
    (turn.json(), seen.len())
}

/// None of these CLIs has a setting for its own retry loop (opencode
/// 1.18.33: five retries with backoff; Qwen Code 0.24.4: seven attempts;
/// Cline 3.0.65: its client's and its agent loop's, fixed in their code),
/// so the route's `maxFailures` (3 by default) ends the turn
/// `model_unavailable` after the third 500, long before the deadline,
/// with nothing of the CLI left.
#[test]
fn a_cli_retrying_a_failing_model_is_stopped_by_the_routes_max_failures() {
    for vendor in [Vendor::Opencode, Vendor::QwenCode, Vendor::Cline] {
        let (v, requests) = against_a_failing_model(vendor);
        assert_eq!(v["status"], "failed", "{vendor:?}: {v:#}");
        assert_eq!(v["error"]["code"], "model_unavailable", "{vendor:?}: {v:#}");
        assert_eq!(requests, 3, "{vendor:?}: {v:#}");
    }
}

/// Gemini CLI's own retries are off (`general.maxAttempts = 1`): one
/// request to a model answering 500, and the turn fails at once, in the
/// CLI's words, with nothing of it left.
#[test]
fn gemini_does_not_retry_a_failing_model() {
    let (v, requests) = against_a_failing_model(Vendor::Gemini);
    assert_eq!(v["status"], "failed", "{v:#}");
    assert_eq!(v["error"]["code"], "harness_cli_failed", "{v:#}");
    assert_eq!(requests, 1, "{v:#}");
}

/// Without the grant of its route (docs/HARNESS.md, "The grants a route
/// needs") the CLI's model request is refused by the kernel before a byte
/// leaves: the model sees nothing, the turn fails, and the refusal is an
/// `egress.request` event with the kernel's code and a denied
/// `effect.authorized` in the audit.
#[test]
fn a_route_without_its_grant_reaches_no_model() {
    let _serial = sharedos_tests::serial();
    let rt = runtime();
    let marker = unique_marker();
    let (turn, seen) = rt.block_on(async {
        let mock = MockModel::start(vec![Reply::Stream(text_turn(
            Wire::OpenaiChat,
            &["never sent"],
        ))])
        .await
        .unwrap();
        let mut case = case(Vendor::Opencode, json!("Say hi."));
        case.route_granted = false;
        let turn = run_vendor(case, &mock, &marker).await;
        (turn, mock.seen())
    });
    let v = turn.json();
    // opencode reads the gateway's 403 as a failure it does not retry.
    assert_eq!(v["status"], "failed", "{v:#}");
    assert_eq!(v["error"]["code"], "harness_cli_failed", "{v:#}");
    assert!(seen.is_empty(), "{seen:?}");
    // Refused before forwarding: the kernel's code, no upstream status.
    let requests = turn.events("egress.request");
    assert!(!requests.is_empty(), "{v:#}");
    assert!(
        requests
            .iter()
            .all(|r| r["code"] == "no_matching_grant" && r["status"].is_null()),
        "{requests:?}"
    );
    let denied: Vec<_> = turn
        .audit_of("effect.authorized")
        .into_iter()
        .filter(|r| serde_json::to_value(r.outcome).unwrap() == "denied")
        .collect();
    assert_eq!(denied.len(), requests.len(), "{}", turn.audit_text);
    let left = sharedos_tests::turns::wait_gone(&marker, Duration::from_secs(5));
    assert!(left.is_empty(), "survivors: {left:?}");
}
