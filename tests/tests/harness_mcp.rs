//! The real Python `mcp` SDK client (1.20.0) seated by `sharedos-harness`
//! in the full sandbox, over the stdio relay: G 95–97 and 100–105 asserted
//! on the turn's events, result and audit trail (docs/HARNESS.md); it and
//! the real TypeScript SDK client over streamable HTTP.
//! Needs the `mcp` package that `scripts/test` installs into its
//! environment (tests/requirements.lock) and the `@modelcontextprotocol/sdk`
//! it installs from tests/vendor-cli (SHAREDOS_VENDOR_CLI_DIR); without
//! them the tests that seat them fail saying so.

use std::path::Path;

use serde_json::{Value, json};
use sharedos_tests::harness::{
    HarnessCase, HarnessTurn, fixture_dir, mcp_client, python_with_mcp, run_harness, ts_mcp_client,
};

/// The Node the TypeScript client runs under (as tests/tests/runtime_fs.rs).
const NODE: &str = "/usr/bin/node";

/// A case seating the Python client with these steps.
fn client_case(steps: Value) -> (HarnessCase, tempfile::TempDir) {
    let py = python_with_mcp();
    let dir = fixture_dir();
    let client = mcp_client(dir.path());
    let harness = format!(
        r#"[runtimes.harness]
command = {exe:?}
args = [{client:?}, "stdio", "{{mcpCommand}}", "{{mcpArgs}}"]
mcp = "stdio"
env = {{ STEPS = '{steps}', SHAREDOS_TEST_MARKER = "MARKER" }}
final = {{ from = "stdout" }}
escalation = true
"#,
        exe = py.exe.display().to_string(),
        client = client.display().to_string(),
    );
    let mut ro = py.ro_paths;
    ro.push(dir.path().to_path_buf());
    (HarnessCase::new(&harness, ro), dir)
}

fn step(tool: &str, args: Value) -> Value {
    json!({"tool": tool, "args": args})
}

fn run(case: HarnessCase) -> HarnessTurn {
    let _serial = sharedos_tests::serial();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let turn = rt.block_on(run_harness(case));
    turn.assert_no_survivor();
    turn
}

/// `^[a-zA-Z0-9_-]{1,64}$`: OpenAI's function names, Anthropic's tool
/// names.
fn is_api_name(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn is_hex64(v: &Value) -> bool {
    v.as_str().is_some_and(|s| {
        s.len() == 64
            && s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    })
}

#[test]
fn g95_to_g97_the_client_lists_calls_and_is_refused_through_the_envelope() {
    let (case, _dir) = client_case(json!([
        step(
            "files__write",
            json!({"path": "notes/a.md", "content": "hello from the harness"})
        ),
        step("files__read", json!({"path": "notes/a.md"})),
        step("files__delete", json!({"path": "notes/a.md"})),
        step("files__shred", json!({"path": "notes/a.md"})),
    ]));
    let turn = run(case);
    assert_eq!(turn.status(), "succeeded", "{:#}", turn.json());
    let client = turn.client();
    let meta = turn.metadata();
    // G95: only the permission-filtered names, server `sharedos`, the hash.
    assert_eq!(
        client["tools"],
        json!([
            "files__list",
            "files__read",
            "files__write",
            "ledger__slow",
            "sharedos__escalate"
        ])
    );
    // Every name as OpenAI's and Anthropic's APIs accept it.
    for name in client["tools"].as_array().unwrap() {
        assert!(is_api_name(name.as_str().unwrap()), "{name}");
    }
    assert_eq!(client["serverName"], "sharedos");
    assert_eq!(client["protocolVersion"], "2025-06-18");
    assert!(is_hex64(&client["catalogHash"]), "{client}");
    assert_eq!(client["catalogHash"], meta["catalogHash"]);
    assert_eq!(meta["toolshare"], "mcp");
    assert!(is_hex64(&meta["promptHash"]), "{meta}");
    assert_eq!(meta["harnessOutcome"], "complete");
    // G96: a granted call, then an ungranted one.
    let r = &client["results"];
    assert_eq!(r[0]["isError"], false, "{r}");
    assert_eq!(r[1]["isError"], false, "{r}");
    assert!(
        r[1]["text"]
            .as_str()
            .unwrap()
            .contains("hello from the harness"),
        "{r}"
    );
    assert_eq!(r[2]["isError"], true, "{r}");
    assert_eq!(r[2]["meta"]["sharedos/status"], "denied", "{r}");
    // G97: a guessed tool.
    assert_eq!(r[3]["isError"], true, "{r}");
    assert_eq!(r[3]["meta"]["sharedos/code"], "tool_unavailable", "{r}");
    // The listed names the client called reach the catalogue's tools; the
    // names it was never offered go on as given, for the envelope to
    // refuse.
    let requested: Vec<Value> = turn
        .events("tool.requested")
        .iter()
        .map(|e| e["tool"].clone())
        .collect();
    assert_eq!(
        requested,
        vec![
            json!("files.write"),
            json!("files.read"),
            json!("files__delete"),
            json!("files__shred")
        ]
    );
    // The calls are the kernel's: in the audit trail, no arguments there.
    let invoked: Vec<(String, String)> = turn
        .audit_of("tool.invoked")
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
        .collect();
    let want: Vec<(String, String)> = [
        ("files.write", "succeeded/-"),
        ("files.read", "succeeded/-"),
        ("files__delete", "denied/tool_unavailable"),
        ("files__shred", "denied/tool_unavailable"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(invoked, want, "{:?}", turn.audit);
    let audit_text = serde_json::to_string(&turn.audit).unwrap();
    assert!(!audit_text.contains("hello from the harness"));
    // A stdio harness gets the ordinary sandbox: no TCP at all.
    let sandbox = &turn.json()["metadata"]["runtime"]["sandbox"];
    assert_eq!(sandbox["seccomp"]["mode"], "namespace", "{sandbox:#}");
    assert_eq!(sandbox["landlock"]["net"], "tcp-deny", "{sandbox:#}");
    // The final message is the client's last line, not the progress line.
    assert!(turn.json()["output"].as_str().unwrap().starts_with('{'));
}

#[test]
fn g100_g105_read_ask_read_escalates_and_counts_the_late_call() {
    let (case, _dir) = client_case(json!([
        step(
            "files__write",
            json!({"path": "notes/b.md", "content": "b"})
        ),
        step(
            "sharedos__escalate",
            json!({"reason": "  a human must approve the refund  "})
        ),
        step("files__read", json!({"path": "notes/b.md"})),
    ]));
    let turn = run(case);
    let v = turn.json();
    assert_eq!(turn.status(), "escalated", "{v:#}");
    assert_eq!(v["escalation"]["reason"], "a human must approve the refund");
    let meta = turn.metadata();
    assert_eq!(meta["callsAfterEscalation"], 1);
    assert_eq!(meta["harnessOutcome"], "complete");
    assert_eq!(
        meta["escalationAsked"]["reason"],
        "a human must approve the refund"
    );
    assert_eq!(meta["escalationAsked"]["tool"], "sharedos.escalate");
    let r = &turn.client()["results"];
    assert_eq!(r[1]["isError"], false, "{r}");
    assert!(
        r[1]["text"]
            .as_str()
            .unwrap()
            .contains("make no further tool calls"),
        "{r}"
    );
    assert_eq!(r[2]["isError"], true, "{r}");
    assert_eq!(r[2]["meta"]["sharedos/code"], "escalation_pending", "{r}");
    assert_eq!(turn.events("tool.requested").len(), 1, "{v:#}");
    assert_eq!(turn.audit_of("escalation.requested").len(), 1);
}

#[test]
fn g101_g102_a_reason_that_is_not_text_falls_back_and_a_second_ask_is_pending() {
    let (case, _dir) = client_case(json!([
        step("sharedos__escalate", json!({"reason": {"not": "text"}})),
        step("sharedos__escalate", json!({"reason": "second"})),
    ]));
    let turn = run(case);
    let v = turn.json();
    assert_eq!(turn.status(), "escalated", "{v:#}");
    let reason = v["escalation"]["reason"].as_str().unwrap();
    assert!(reason.contains("without giving a reason"), "{reason}");
    let r = &turn.client()["results"];
    assert_eq!(r[0]["isError"], false, "{r}");
    assert_eq!(r[1]["meta"]["sharedos/code"], "escalation_pending", "{r}");
    assert!(turn.events("tool.requested").is_empty(), "{v:#}");
    assert_eq!(turn.audit_of("escalation.requested").len(), 1);
    assert_eq!(turn.metadata()["callsAfterEscalation"], 1);
}

#[test]
fn g103_a_call_in_flight_when_the_ask_comes_completes() {
    let (case, _dir) = client_case(json!([{"parallel": [
        {"tool": "ledger__slow", "args": {"ms": 400}},
        {"tool": "sharedos__escalate", "args": {"reason": "ask while the ledger writes"}, "delayMs": 60},
    ]}]));
    let turn = run(case);
    let v = turn.json();
    assert_eq!(turn.status(), "escalated", "{v:#}");
    let r = &turn.client()["results"];
    assert_eq!(r[0]["tool"], "ledger__slow");
    assert_eq!(r[0]["isError"], false, "{r}");
    assert_eq!(turn.metadata()["callsAfterEscalation"], 0);
    assert_eq!(turn.audit_of("tool.invoked").len(), 1);
}

#[test]
fn g104_an_ask_without_the_escalation_grant_is_tool_unavailable() {
    let (mut case, _dir) = client_case(json!([step(
        "sharedos__escalate",
        json!({"reason": "let me out"})
    ),]));
    case.escalation_grant = false;
    let turn = run(case);
    let v = turn.json();
    assert_eq!(turn.status(), "succeeded", "{v:#}");
    let client = turn.client();
    assert!(
        !client["tools"]
            .as_array()
            .unwrap()
            .contains(&json!("sharedos__escalate"))
    );
    assert_eq!(client["results"][0]["isError"], true);
    assert_eq!(
        client["results"][0]["meta"]["sharedos/code"],
        "tool_unavailable"
    );
    assert_eq!(turn.events("tool.requested").len(), 1);
    assert!(turn.metadata().get("escalationAsked").is_none());
}

/// A harness spec seating `exe script http {mcpUrl} {mcpToken}` with the
/// steps both HTTP clients run: write, read, then an ungranted delete.
fn http_harness(exe: &Path, script: &Path) -> String {
    let steps = json!([
        step(
            "files__write",
            json!({"path": "notes/h.md", "content": "over http"})
        ),
        step("files__read", json!({"path": "notes/h.md"})),
        step("files__delete", json!({"path": "notes/h.md"})),
    ]);
    sharedos_tests::harness::http_harness(exe, script, &steps) + "escalation = true\n"
}

/// What a client seated by `http_harness` saw and did: `401` without the
/// token and with a wrong one, the server, the protocol version the client
/// asked for (`version`: each SDK asks for its latest, which the server
/// speaks), the catalogue, the steps' results through the envelope, in the
/// harness sandbox mode.
fn assert_http_turn(turn: &HarnessTurn, version: &str) {
    let v = turn.json();
    assert_eq!(turn.status(), "succeeded", "{v:#}");
    let client = turn.client();
    assert_eq!(client["unauthorized"], json!([401, 401]), "{client}");
    assert_eq!(client["serverName"], "sharedos");
    assert_eq!(client["protocolVersion"], version, "{client}");
    assert_eq!(
        client["tools"],
        json!([
            "files__list",
            "files__read",
            "files__write",
            "ledger__slow",
            "sharedos__escalate"
        ])
    );
    assert_eq!(client["catalogHash"], turn.metadata()["catalogHash"]);
    let r = &client["results"];
    assert_eq!(r[0]["isError"], false, "{r}");
    assert_eq!(r[1]["isError"], false, "{r}");
    assert!(r[1]["text"].as_str().unwrap().contains("over http"), "{r}");
    assert_eq!(r[2]["isError"], true, "{r}");
    assert_eq!(r[2]["meta"]["sharedos/status"], "denied", "{r}");
    assert_eq!(turn.events("tool.requested").len(), 3);
    let invoked: Vec<String> = turn
        .audit_of("tool.invoked")
        .iter()
        .map(|r| r.tool.clone().unwrap_or_default())
        .collect();
    assert_eq!(invoked, ["files.write", "files.read", "files__delete"]);
    // The harness sandbox mode, named in the report.
    let sandbox = &v["metadata"]["runtime"]["sandbox"];
    assert_eq!(
        sandbox["seccomp"]["mode"], "namespace+harness",
        "{sandbox:#}"
    );
    assert_eq!(
        sandbox["landlock"]["net"], "tcp-bind-connect:8788",
        "{sandbox:#}"
    );
}

/// The same client over streamable HTTP on the sandbox's loopback, with
/// the per-turn bearer token; without it or with a wrong one, `401`.
#[test]
fn the_client_over_streamable_http_lists_and_calls_with_the_turn_token() {
    let py = python_with_mcp();
    let dir = fixture_dir();
    let client = mcp_client(dir.path());
    let mut ro = py.ro_paths;
    ro.push(dir.path().to_path_buf());
    let turn = run(HarnessCase::new(&http_harness(&py.exe, &client), ro));
    assert_http_turn(&turn, "2025-06-18");
}

/// The TypeScript SDK's client (`Client` over
/// `StreamableHTTPClientTransport`, the bearer token in its headers) under
/// `/usr/bin/node`, in the default sandbox policy: no rlimit is set. It
/// guards the address-space bound's removal: with the old
/// `rlimits.addressSpace = 4294967296` Node cannot instantiate the
/// WebAssembly HTTP parser of its `fetch` (undici), which both the token
/// probe and the SDK's transport use, and this test fails.
#[test]
fn the_typescript_sdk_client_over_streamable_http_runs_under_the_default_policy() {
    let dir = fixture_dir();
    let (client, ro) = ts_mcp_client(dir.path());
    let case = HarnessCase::new(&http_harness(Path::new(NODE), &client), ro);
    assert!(case.sandbox.is_empty());
    let turn = run(case);
    assert_http_turn(&turn, "2025-11-25");
    // The sandbox's own report: no address-space bound was applied.
    let rlimits = &turn.json()["metadata"]["runtime"]["sandbox"]["rlimits"];
    assert!(rlimits.is_object(), "{rlimits}");
    assert!(rlimits.get("as").is_none(), "{rlimits}");
}

/// A catalogue with two tools the CLI would see under one name
/// (`ledger.slow` and `ledger__slow`) ends the turn before the CLI starts,
/// naming both.
#[test]
fn a_catalogue_whose_names_collide_for_the_cli_is_refused() {
    let (mut case, _dir) = client_case(json!([step("ledger__slow", json!({"ms": 1}))]));
    case.tools = vec!["files.read", "ledger.slow", "ledger__slow"];
    let turn = run(case);
    let v = turn.json();
    assert_eq!(turn.status(), "failed", "{v:#}");
    assert_eq!(turn.code(), "harness_tool_names_collide", "{v:#}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("`ledger.slow` and `ledger__slow` both become `ledger__slow`"),
        "{message}"
    );
    assert_eq!(v["error"]["retryable"], false, "{v:#}");
    // Nothing ran: no call reached the envelope, no CLI exit was recorded.
    assert!(turn.events("tool.requested").is_empty(), "{v:#}");
    assert!(turn.audit_of("tool.invoked").is_empty());
    assert!(turn.metadata().get("exitCode").is_none(), "{v:#}");
}
