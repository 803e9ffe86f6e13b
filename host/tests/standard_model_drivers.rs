//! The standard runtime's four model drivers (`openai-chat`,
//! `openai-responses`, `anthropic-messages`, `gemini-generate-content`),
//! each in process against the
//! real kernel, reaching a mock model (scripted turn by turn, plain HTTP
//! or TLS with the test CA) only through the real egress gateway: a turn
//! with a tool call and streamed text, and each kind of bad input.

#[path = "../../egress/tests/egress_support/mod.rs"]
mod egress_support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use egress_support::*;
use serde_json::{Value, json};
use sharedos_egress::GatewayLimits;
use sharedos_egress::mock::{ScriptedCall, SeenRequest, Wire, wire};
use sharedos_host::config::HostConfig;
use sharedos_host::executor::{ExecuteOptions, Executor, ExecutorOptions, Seat};
use sharedos_kernel::{Kernel, MemoryAuditSink};
use sharedos_plugin_sdk::{RuntimeError, RuntimeHost, RuntimePlugin, Signal};
use sharedos_protocol::{
    ExecutionRequest, ExecutionResult, ExecutionStatus, RuntimeManifest, RuntimeTurnOutcome,
    RuntimeTurnRequest,
};
use sharedos_standard::DriverKind;
use tokio::sync::Notify;

/// Raises `drained` when the turn's host starts draining: how a test
/// holds the model's answer until the drain has begun. It wraps the real
/// standard plugin (the one under test), which a test plugin script cannot
/// stand in for, so it stays a wrapper rather than a script.
struct DrainWatch {
    inner: Arc<dyn RuntimePlugin>,
    drained: Arc<Notify>,
}

#[async_trait]
impl RuntimePlugin for DrainWatch {
    fn manifest(&self) -> RuntimeManifest {
        self.inner.manifest()
    }
    async fn run(
        &self,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
    ) -> Result<RuntimeTurnOutcome, RuntimeError> {
        let (draining, drained) = (host.draining(), self.drained.clone());
        tokio::spawn(async move {
            draining.raised().await;
            drained.notify_one();
        });
        self.inner.run(request, host, abort).await
    }
}

#[derive(Default)]
struct Setup {
    tls: bool,
    /// The request's `options`.
    options: Option<Value>,
    drain_grace_ms: u64,
    drained: Option<Arc<Notify>>,
    /// The driver's `max_tokens` (Anthropic only).
    max_tokens: Option<u64>,
    /// The route's upstream instead of the mock's.
    upstream: Option<String>,
}

struct Ran {
    result: ExecutionResult,
    seen: Vec<SeenRequest>,
    files_root: PathBuf,
    _dir: tempfile::TempDir,
}

impl Ran {
    fn code(&self) -> &str {
        self.result.error.as_ref().map_or("", |e| e.code.as_str())
    }
    fn message(&self) -> &str {
        self.result
            .error
            .as_ref()
            .map_or("", |e| e.message.as_str())
    }
    fn deltas(&self) -> Vec<String> {
        self.result
            .events
            .iter()
            .filter(|e| e.kind.as_str() == "runtime.event" && e.data["type"] == "text_delta")
            .map(|e| e.data["data"]["text"].as_str().unwrap().to_owned())
            .collect()
    }
}

/// The mock's wire for a driver kind.
fn wire_of(kind: DriverKind) -> Wire {
    Wire::from_kind(kind.as_str()).expect("a wire for each driver kind")
}

fn text_turn(kind: DriverKind, pieces: &[&str]) -> Vec<String> {
    wire::text_turn(wire_of(kind), pieces)
}

fn results_sent(kind: DriverKind, body: &Value) -> Vec<(String, String)> {
    wire::results_sent(wire_of(kind), body)
}

async fn run(kind: DriverKind, script: Vec<Reply>, setup: Setup) -> Ran {
    let dir = tempfile::tempdir().unwrap();
    let (model, upstream, ca) = if setup.tls {
        let (acceptor, ca) = test_ca(dir.path());
        let options = MockOptions {
            tls: Some(acceptor),
            on_request: None,
        };
        let m = MockModel::start_with(script, options).await.unwrap();
        let url = m.base_url();
        (m, url, Some(ca))
    } else {
        let m = MockModel::start(script).await.unwrap();
        let url = m.base_url();
        (m, url, None)
    };
    let upstream = setup.upstream.clone().unwrap_or(upstream);
    let mut policy = json!({"routes": [{"name": "model", "upstream": upstream,
        "secret": key_file(dir.path()), "api": wire_of(kind).route_api(), "allow": ["loopback"]}]});
    if let Some(ca) = ca {
        policy["caFile"] = json!(ca);
    }
    let grants = vec![egress_grant("alice", "model", "request", None)];
    let gw = serve(policy, grants, "alice", GatewayLimits::default()).await;

    let config = HostConfig::parse(
        include_str!("../demo/host.toml"),
        "demo/host.toml",
        dir.path(),
    )
    .unwrap();
    let files_root = config.resolve(&config.host.files_root);
    std::fs::create_dir_all(&files_root).unwrap();
    let kernel = Arc::new(
        Kernel::from_config(
            &config.kernel,
            &files_root,
            Arc::new(MemoryAuditSink::new()),
        )
        .unwrap(),
    );
    let base = format!("http://{}/model", gw.addr);
    let mut plugin = sharedos_standard::model_plugin_with(
        kind,
        &base,
        "test-model",
        PLACEHOLDER,
        setup.max_tokens,
    )
    .unwrap();
    if let Some(drained) = setup.drained {
        plugin = Arc::new(DrainWatch {
            inner: plugin,
            drained,
        });
    }
    let options = ExecutorOptions {
        drain_grace_ms: setup.drain_grace_ms,
        ..ExecutorOptions::default()
    };
    let executor = Executor::new(kernel, Seat::in_process(plugin), options).unwrap();
    let mut request: Value = serde_json::from_str(include_str!("../demo/turn.json")).unwrap();
    if let Some(o) = setup.options {
        request["options"] = o;
    }
    let request: ExecutionRequest = serde_json::from_value(request).unwrap();
    let result = executor
        .execute(request, ExecuteOptions::default())
        .await
        .unwrap();
    Ran {
        result,
        seen: model.seen(),
        files_root,
        _dir: dir,
    }
}

/// What a result names its call by: the call's id, or on Gemini (whose
/// calls come without one) the function's name.
fn result_id(kind: DriverKind) -> &'static str {
    match kind {
        DriverKind::GeminiGenerateContent => "files__write",
        _ => "call_1",
    }
}

const WRITE_ARGS: &str = r#"{"path": "notes/plan.md", "content": "step one"}"#;

fn call(kind: DriverKind, name: &str, arguments: &str) -> Vec<String> {
    wire::calls_turn(
        wire_of(kind),
        &[ScriptedCall {
            id: "call_1",
            namespace: None,
            name,
            arguments,
        }],
    )
}

fn written(ran: &Ran) -> Option<String> {
    std::fs::read_to_string(ran.files_root.join("demo/alice/notes/plan.md")).ok()
}

#[tokio::test]
async fn each_driver_calls_a_tool_through_the_kernel_streams_its_text_and_answers() {
    for tls in [false, true] {
        for kind in DriverKind::ALL {
            let k = kind.as_str();
            let script = vec![
                Reply::Stream(call(kind, "files__write", WRITE_ARGS)),
                Reply::Stream(text_turn(kind, &["Plan ", "writ", "ten."])),
            ];
            let setup = Setup {
                tls,
                ..Setup::default()
            };
            let ran = run(kind, script, setup).await;
            let r = &ran.result;
            assert_eq!(
                r.status,
                ExecutionStatus::Succeeded,
                "{k} tls={tls}: {r:#?}"
            );
            assert_eq!(r.output.as_ref().unwrap()["text"], "Plan written.", "{k}");
            // The tool call ran through the kernel: the file exists.
            assert_eq!(written(&ran).as_deref(), Some("step one"), "{k}");

            assert_eq!(ran.seen.len(), 2, "{k}");
            for s in &ran.seen {
                assert_eq!(s.path, wire_of(kind).upstream_path("test-model"), "{k}");
                if kind == DriverKind::GeminiGenerateContent {
                    // The model is in the path; streaming is the method
                    // and `alt=sse`.
                    assert_eq!(s.query.as_deref(), Some("alt=sse"), "{k}");
                    assert!(s.body.get("model").is_none(), "{k}");
                } else {
                    assert_eq!(s.body["model"], "test-model", "{k}");
                    assert_eq!(s.body["stream"], true, "{k}");
                }
                // The upstream saw the real key, in the API's own header.
                match kind {
                    DriverKind::AnthropicMessages => {
                        assert_eq!(s.api_key(), Some(REAL_KEY), "{k}");
                        assert_eq!(s.authorization(), None, "{k}");
                        assert_eq!(s.header("anthropic-version"), Some("2023-06-01"));
                    }
                    DriverKind::GeminiGenerateContent => {
                        assert_eq!(s.goog_api_key(), Some(REAL_KEY), "{k}");
                        assert_eq!(s.authorization(), None, "{k}");
                        assert_eq!(s.api_key(), None, "{k}");
                    }
                    _ => {
                        let bearer = format!("Bearer {REAL_KEY}");
                        assert_eq!(s.authorization(), Some(bearer.as_str()), "{k}");
                        assert_eq!(s.api_key(), None, "{k}");
                    }
                }
            }
            // The catalogue was offered as functions; the result went back
            // with the call's id.
            let offered = wire::tools_offered(wire_of(kind), &ran.seen[0].body);
            assert!(
                offered.contains(&"files__write".to_owned()),
                "{k}: {offered:?}"
            );
            let results = results_sent(kind, &ran.seen[1].body);
            assert_eq!(results.len(), 1, "{k}");
            assert_eq!(results[0].0, result_id(kind), "{k}");
            if kind == DriverKind::GeminiGenerateContent {
                // The call went back with its thought signature.
                let model_turn = &ran.seen[1].body["contents"][1];
                let dump = model_turn.to_string();
                assert!(dump.contains(wire::gemini::SIGNATURE), "{dump}");
            }
            assert!(results[0].1.contains("succeeded"), "{k}: {results:?}");

            // The text streamed as runtime events, coalesced, in order.
            let deltas = ran.deltas();
            assert!(!deltas.is_empty() && deltas.len() <= 3, "{k}: {deltas:?}");
            assert_eq!(deltas.concat(), "Plan written.", "{k}");

            // Usage (both answers added up) and the finish reason.
            let md = serde_json::to_value(&r.metadata).unwrap();
            let dump = format!("{md}");
            assert!(dump.contains(&format!("\"driver\":\"{k}\"")), "{k}: {dump}");
            let finish = format!("\"finishReason\":\"{}\"", wire_of(kind).stop_reason());
            assert!(dump.contains(&finish), "{k}: {dump}");
            let total = match kind {
                DriverKind::AnthropicMessages => "\"input_tokens\":80",
                DriverKind::OpenaiResponses => "\"total_tokens\":96",
                DriverKind::OpenaiChat => "\"total_tokens\":96",
                DriverKind::GeminiGenerateContent => "\"total_tokens\":96",
            };
            assert!(dump.contains(total), "{k}: {dump}");
            assert!(!format!("{r:?}").contains(REAL_KEY), "{k}");
        }
    }
}

#[tokio::test]
async fn an_http_error_ends_the_turn_with_its_status_and_the_upstream_answer() {
    for kind in DriverKind::ALL {
        for status in [401, 500] {
            let body = json!({"error": {"message": format!("upstream says {status}")}});
            let ran = run(kind, vec![Reply::Status(status, body)], Setup::default()).await;
            let k = kind.as_str();
            assert_eq!(ran.result.status, ExecutionStatus::Failed, "{k}");
            assert_eq!(ran.code(), format!("model_http_{status}"), "{k}");
            assert!(
                ran.message().contains(&format!("upstream says {status}")),
                "{k}"
            );
        }
    }
}

#[tokio::test]
async fn a_stream_cut_or_ended_before_the_answer_is_done_ends_the_turn() {
    for kind in DriverKind::ALL {
        let k = kind.as_str();
        let mut events = text_turn(kind, &["Half ", "an ", "answer"]);
        events.truncate(3);
        for reply in [Reply::Cut(events.clone()), Reply::Stream(events)] {
            let ran = run(kind, vec![reply], Setup::default()).await;
            assert_eq!(ran.result.status, ExecutionStatus::Failed, "{k}");
            assert_eq!(ran.code(), "model_stream_cut", "{k}: {}", ran.message());
        }
    }
}

#[tokio::test]
async fn an_upstream_that_never_answers_ends_the_turn_at_its_deadline() {
    for kind in DriverKind::ALL {
        let started = Instant::now();
        let setup = Setup {
            options: Some(json!({"timeoutMs": 1000})),
            ..Setup::default()
        };
        let ran = run(kind, vec![Reply::Hang], setup).await;
        assert_eq!(ran.result.status, ExecutionStatus::Cancelled, "{kind:?}");
        assert_eq!(ran.code(), "turn_cancelled");
        assert_eq!(ran.seen.len(), 1);
        // Generous: the deadline is 1 s; the bound only catches a hang.
        assert!(started.elapsed() < Duration::from_secs(30));
    }
}

#[tokio::test]
async fn a_tool_outside_the_catalogue_is_refused_by_the_envelope_and_the_model_told() {
    for kind in DriverKind::ALL {
        let k = kind.as_str();
        let script = vec![
            Reply::Stream(call(kind, "transfer_funds", r#"{"amount": 100}"#)),
            Reply::Stream(text_turn(kind, &["I cannot do that."])),
        ];
        let ran = run(kind, script, Setup::default()).await;
        assert_eq!(ran.result.status, ExecutionStatus::Succeeded, "{k}");
        assert_eq!(ran.seen.len(), 2, "{k}");
        let results = results_sent(kind, &ran.seen[1].body);
        assert_eq!(results.len(), 1, "{k}");
        assert!(results[0].1.contains("denied"), "{k}: {results:?}");
        let completed: Vec<&Value> = ran
            .result
            .events
            .iter()
            .filter(|e| e.kind.as_str() == "tool.completed")
            .map(|e| &*e.data)
            .collect();
        assert_eq!(completed.len(), 1, "{k}");
        assert_eq!(completed[0]["tool"], "transfer_funds");
        assert_eq!(completed[0]["status"], "denied");
    }
}

#[tokio::test]
async fn arguments_that_are_not_a_json_object_end_the_turn_before_any_effect() {
    for kind in DriverKind::ALL {
        for args in [r#"{"path": "notes/plan.md", "#, "[1, 2]"] {
            let ran = run(
                kind,
                vec![Reply::Stream(call(kind, "files__write", args))],
                Setup::default(),
            )
            .await;
            let k = kind.as_str();
            assert_eq!(ran.result.status, ExecutionStatus::Failed, "{k}");
            assert_eq!(ran.code(), "model_arguments_invalid", "{k}");
            assert!(ran.message().contains("files__write"), "{k}");
            assert_eq!(written(&ran), None, "{k}");
            assert_eq!(ran.seen.len(), 1, "{k}");
        }
    }
}

#[tokio::test]
async fn a_model_that_never_stops_calling_tools_meets_the_step_ceiling() {
    for kind in DriverKind::ALL {
        // The mock repeats its last reply: a call, forever.
        let script = vec![Reply::Stream(call(kind, "files__write", WRITE_ARGS))];
        let setup = Setup {
            options: Some(json!({"maxSteps": 3})),
            ..Setup::default()
        };
        let ran = run(kind, script, setup).await;
        assert_eq!(ran.result.status, ExecutionStatus::Failed, "{kind:?}");
        assert_eq!(ran.code(), "step_limit_exceeded");
        assert_eq!(ran.seen.len(), 3, "one decision per step, none past it");
    }
}

/// Drain from 1 s of a 10 s turn: the model's answer is held until the
/// drain began.
fn draining(drained: &Arc<Notify>) -> Setup {
    Setup {
        options: Some(json!({"timeoutMs": 10_000})),
        drain_grace_ms: 9_000,
        drained: Some(drained.clone()),
        ..Setup::default()
    }
}

#[tokio::test]
async fn an_answer_in_flight_when_the_drain_begins_lands() {
    for kind in DriverKind::ALL {
        let drained = Arc::new(Notify::new());
        let script = vec![Reply::held(
            text_turn(kind, &["Late ", "but whole."]),
            drained.clone(),
        )];
        let ran = run(kind, script, draining(&drained)).await;
        assert_eq!(ran.result.status, ExecutionStatus::Succeeded, "{kind:?}");
        assert_eq!(
            ran.result.output.as_ref().unwrap()["text"],
            "Late but whole."
        );
        // Emits still work while draining: the text streamed as events.
        assert_eq!(ran.deltas().concat(), "Late but whole.", "{kind:?}");
    }
}

#[tokio::test]
async fn a_call_landing_during_the_drain_is_refused_and_the_model_not_asked_again() {
    for kind in DriverKind::ALL {
        let drained = Arc::new(Notify::new());
        let script = vec![
            Reply::held(call(kind, "files__write", WRITE_ARGS), drained.clone()),
            Reply::Stream(text_turn(kind, &["never"])),
        ];
        let ran = run(kind, script, draining(&drained)).await;
        assert_eq!(ran.result.status, ExecutionStatus::Cancelled, "{kind:?}");
        assert_eq!(written(&ran), None, "no effect once draining");
        assert_eq!(ran.seen.len(), 1, "no new decision once draining");
    }
}

#[tokio::test]
async fn many_small_deltas_are_coalesced_into_few_events() {
    for kind in DriverKind::ALL {
        let pieces = vec!["ab"; 4000];
        let ran = run(
            kind,
            vec![Reply::Stream(text_turn(kind, &pieces))],
            Setup::default(),
        )
        .await;
        assert_eq!(ran.result.status, ExecutionStatus::Succeeded, "{kind:?}");
        let deltas = ran.deltas();
        assert_eq!(deltas.concat(), "ab".repeat(4000));
        // 8,000 bytes at 1 KiB a delta is 8 events, plus one per 100 ms
        // the stream took: far under one per piece.
        assert!(deltas.len() <= 100, "{kind:?}: {} events", deltas.len());
    }
}

#[tokio::test]
async fn anthropic_max_tokens_is_the_configured_value_or_4096() {
    let kind = DriverKind::AnthropicMessages;
    for (max_tokens, sent) in [(None, 4096), (Some(512), 512), (Some(131_072), 131_072)] {
        let script = vec![Reply::Stream(text_turn(kind, &["ok"]))];
        let setup = Setup {
            max_tokens,
            ..Setup::default()
        };
        let ran = run(kind, script, setup).await;
        assert_eq!(
            ran.result.status,
            ExecutionStatus::Succeeded,
            "{max_tokens:?}"
        );
        assert_eq!(ran.seen[0].body["max_tokens"], sent, "{max_tokens:?}");
    }
}

#[tokio::test]
async fn an_upstream_refusing_connections_ends_the_turn_with_the_gateways_code() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    for kind in DriverKind::ALL {
        let k = kind.as_str();
        let setup = Setup {
            upstream: Some(format!("http://127.0.0.1:{port}/v1")),
            ..Setup::default()
        };
        let ran = run(kind, vec![Reply::Hang], setup).await;
        assert_eq!(ran.result.status, ExecutionStatus::Failed, "{k}");
        assert_eq!(ran.code(), "model_http_502", "{k}: {}", ran.message());
        assert!(
            ran.message().contains("upstream_unreachable"),
            "{k}: {}",
            ran.message()
        );
        assert!(ran.seen.is_empty(), "{k}");
    }
}

#[tokio::test]
async fn gemini_max_output_tokens_is_sent_only_when_configured() {
    let kind = DriverKind::GeminiGenerateContent;
    for (max_tokens, sent) in [(None, Value::Null), (Some(512), json!(512))] {
        let script = vec![Reply::Stream(text_turn(kind, &["ok"]))];
        let setup = Setup {
            max_tokens,
            ..Setup::default()
        };
        let ran = run(kind, script, setup).await;
        assert_eq!(
            ran.result.status,
            ExecutionStatus::Succeeded,
            "{max_tokens:?}"
        );
        let body = &ran.seen[0].body;
        let limit = body.pointer("/generationConfig/maxOutputTokens");
        assert_eq!(limit.cloned().unwrap_or(Value::Null), sent, "{body}");
    }
}
