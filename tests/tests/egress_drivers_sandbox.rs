//! Each model driver of the standard runtime (`openai-chat`,
//! `openai-responses`, `anthropic-messages`, `gemini-generate-content`)
//! in the full sandbox, reaching
//! a mock model on the host's loopback only through the gateway's listener
//! in its own network namespace (docs/EGRESS.md). Observed from the host:
//! what the upstream received, the plugin's environment read from /proc
//! while it waits for its model, the result, the events and the audit.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use sharedos_egress::mock::{
    MockModel, MockOptions, OnRequest, Reply, ScriptedCall, Wire, plan_script, wire,
};
use sharedos_protocol::ExecutionStatus;
use sharedos_protocol::api_names::is_api_tool_name;
use sharedos_tests::egress::{
    DEMO_REQUEST, PLACEHOLDER, REAL_KEY, environments_of, key_file, model_text, run, run_request,
};

/// What a result names its call by: the call's id, or on Gemini (whose
/// calls come without one) the function's name.
fn result_id(w: Wire) -> &'static str {
    match w {
        Wire::Gemini => "files__write",
        _ => "call_1",
    }
}

async fn mock(script: Vec<Reply>, hook: Option<OnRequest>) -> MockModel {
    let options = MockOptions {
        tls: None,
        on_request: hook,
    };
    MockModel::start_with(script, options)
        .await
        .expect("the mock model")
}

/// The streamed text of the turn, from its `text_delta` runtime events.
fn streamed_text(turn: &sharedos_tests::egress::Turn) -> String {
    turn.events_of("runtime.event")
        .iter()
        .filter(|e| e["type"] == "text_delta")
        .map(|e| e["data"]["text"].as_str().unwrap_or("").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sandboxed_driver_calls_a_tool_streams_and_answers_through_the_gateway() {
    for w in Wire::ALL {
        let k = w.kind();
        let dir = tempfile::tempdir().unwrap();
        let environs: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen_env = environs.clone();
        let hook: OnRequest =
            Arc::new(move |_| seen_env.lock().unwrap().extend(environments_of(k)));
        let model = mock(plan_script(w), Some(hook)).await;
        // Anthropic's max_tokens from the driver table reaches the model.
        let driver_extra = match w {
            Wire::AnthropicMessages => "maxTokens = 1234",
            _ => "",
        };
        let key = key_file(dir.path());
        let text = model_text(k, &model.base_url(), &key, "", driver_extra, true);
        let turn = run(dir.path(), &text).await;

        let result = &turn.result;
        assert_eq!(
            result.status,
            ExecutionStatus::Succeeded,
            "{k}: {result:#?}"
        );
        assert_eq!(
            result.output.as_ref().unwrap()["text"],
            "Plan written.",
            "{k}"
        );
        // The tool call went through the envelope and the kernel.
        let written = std::fs::read_to_string(dir.path().join("files/demo/alice/notes/plan.md"));
        assert_eq!(written.unwrap(), "step one", "{k}");
        // The text streamed as runtime events while the model wrote it.
        assert_eq!(streamed_text(&turn), "Plan written.", "{k}");
        // The sandbox said what it allowed: TCP to the gateway's port only.
        let sandbox = &result.metadata["runtime"]["sandbox"];
        assert_eq!(
            sandbox["level"],
            sharedos_tests::full_level(),
            "{k}: {sandbox}"
        );
        assert_eq!(sandbox["landlock"]["net"], "tcp-connect:8787", "{k}");
        assert_eq!(sandbox["seccomp"]["mode"], "namespace+egress", "{k}");

        // The upstream saw the real key, in the API's own header, on every
        // request; the tool's result went back on the second.
        let seen = model.seen();
        assert_eq!(seen.len(), 2, "{k}: {seen:?}");
        for s in &seen {
            assert_eq!(s.path, w.upstream_path("test-model"), "{k}");
            match w {
                Wire::AnthropicMessages => {
                    assert_eq!(s.body["max_tokens"], 1234, "{k}");
                    assert_eq!(s.api_key(), Some(REAL_KEY), "{k}");
                    assert_eq!(s.authorization(), None, "{k}");
                }
                Wire::Gemini => {
                    assert_eq!(s.query.as_deref(), Some("alt=sse"), "{k}");
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
        let offered = wire::tools_offered(w, &seen[0].body);
        assert!(
            offered.contains(&"files__write".to_owned()),
            "{k}: {offered:?}"
        );
        let results = wire::results_sent(w, &seen[1].body);
        assert_eq!(results.len(), 1, "{k}");
        assert_eq!(results[0].0, result_id(w), "{k}");
        // Every tool name the model received is one each API accepts.
        for s in &seen {
            for name in wire::tools_offered(w, &s.body) {
                assert!(is_api_tool_name(&name), "{k}: {name:?}");
            }
        }
        assert!(results[0].1.contains("succeeded"), "{k}: {results:?}");

        // The plugin's own environment, read while it waited for its
        // model: the gateway's URL and the placeholder, never the key.
        let environs = environs.lock().unwrap().clone();
        assert!(
            !environs.is_empty(),
            "{k}: the driver was not found in /proc"
        );
        for env in &environs {
            assert!(
                env.contains(&format!("SHAREDOS_MODEL_KEY={PLACEHOLDER}")),
                "{k}: {env}"
            );
            assert!(
                env.contains("SHAREDOS_EGRESS_URL=http://127.0.0.1:8787"),
                "{k}: {env}"
            );
            assert!(!env.contains(REAL_KEY), "{k}: the key is in the plugin");
        }
        // Each model request is an event of the turn and an audit record.
        let requests = turn.events_of("egress.request");
        assert_eq!(requests.len(), 2, "{k}: {:?}", turn.events);
        for r in &requests {
            assert_eq!(r["status"], 200, "{k}: {r}");
            assert_eq!(r["route"], w.route_api(), "{k}");
        }
        assert_eq!(requests[1]["inputTokens"], 40, "{k}: {requests:?}");
        assert_eq!(
            turn.audit.matches("\"effect.authorized\"").count(),
            2,
            "{k}"
        );
        assert_eq!(turn.audit.matches("\"effect.completed\"").count(), 2, "{k}");
        // Nothing the host wrote holds the key.
        assert!(!turn.everything().contains(REAL_KEY), "{k}: the key leaked");
    }
}

/// Drain from 5 s of a 30 s turn (grace 25 s); the model's answer is held
/// until 7 s after the turn began, so it lands while the turn drains.
/// The request itself must be in flight before the drain: the bound is
/// generous (5 s for a sandbox to start and ask).
async fn drained_turn(w: Wire, held: Vec<String>) -> (sharedos_tests::egress::Turn, MockModel) {
    let k = w.kind();
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(tokio::sync::Notify::new());
    let started = Instant::now();
    let asked_at: Arc<Mutex<Option<Duration>>> = Arc::default();
    let (open, asked) = (gate.clone(), asked_at.clone());
    let hook: OnRequest = Arc::new(move |index| {
        if index > 0 {
            return;
        }
        *asked.lock().unwrap() = Some(started.elapsed());
        let open = open.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(7).saturating_sub(started.elapsed()));
            open.notify_one();
        });
    });
    let script = vec![
        Reply::held(held, gate),
        Reply::Stream(wire::text_turn(w, &["never"])),
    ];
    let model = mock(script, Some(hook)).await;
    let text = model_text(k, &model.base_url(), &key_file(dir.path()), "", "", true)
        .replace("drainGraceMs = 2000", "drainGraceMs = 25000");
    let turn = run(dir.path(), &text).await;
    let asked = asked_at.lock().unwrap().expect("the model was asked");
    assert!(
        asked < Duration::from_secs(5),
        "{k}: the model was asked {asked:?} into the turn, after the drain began"
    );
    (turn, model)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sandboxed_driver_lands_an_answer_in_flight_when_the_drain_begins() {
    for w in Wire::ALL {
        let k = w.kind();
        let (turn, model) = drained_turn(w, wire::text_turn(w, &["Late ", "but whole."])).await;
        let result = &turn.result;
        assert_eq!(
            result.status,
            ExecutionStatus::Succeeded,
            "{k}: {result:#?}"
        );
        assert_eq!(
            result.output.as_ref().unwrap()["text"],
            "Late but whole.",
            "{k}"
        );
        assert_eq!(streamed_text(&turn), "Late but whole.", "{k}");
        assert_eq!(model.seen().len(), 1, "{k}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sandboxed_driver_makes_no_new_decision_once_draining() {
    for w in Wire::ALL {
        let k = w.kind();
        let call = ScriptedCall {
            id: "call_1",
            namespace: None,
            name: "files__write",
            arguments: r#"{"path": "notes/plan.md", "content": "step one"}"#,
        };
        let (turn, model) = drained_turn(w, wire::calls_turn(w, &[call])).await;
        assert_eq!(
            turn.result.status,
            ExecutionStatus::Cancelled,
            "{k}: {:#?}",
            turn.result
        );
        // The call that landed while draining had no effect, and the model
        // was not asked again.
        let tools: Vec<Value> = turn.events_of("tool.completed");
        assert!(
            tools.iter().all(|t| t["status"] != "succeeded"),
            "{k}: {tools:?}"
        );
        assert_eq!(model.seen().len(), 1, "{k}: no new decision once draining");
    }
}

/// The demo's request with `options`.
fn request_with(options: Value) -> String {
    let mut request: Value = serde_json::from_str(DEMO_REQUEST).unwrap();
    request["options"] = options;
    request.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sandboxed_driver_keeps_the_loops_rules_on_a_misbehaving_model() {
    for w in Wire::ALL {
        let k = w.kind();
        let call = |name, arguments| ScriptedCall {
            id: "call_1",
            namespace: None,
            name,
            arguments,
        };
        // A tool outside the catalogue: refused by the envelope, the model
        // reads the refusal and answers.
        let dir = tempfile::tempdir().unwrap();
        let model = mock(
            vec![
                Reply::Stream(wire::calls_turn(w, &[call("transfer_funds", "{}")])),
                Reply::Stream(wire::text_turn(w, &["I cannot."])),
            ],
            None,
        )
        .await;
        let text = model_text(k, &model.base_url(), &key_file(dir.path()), "", "", true);
        let turn = run(dir.path(), &text).await;
        assert_eq!(
            turn.result.status,
            ExecutionStatus::Succeeded,
            "{k}: {:#?}",
            turn.result
        );
        let results = wire::results_sent(w, &model.seen()[1].body);
        assert!(results[0].1.contains("denied"), "{k}: {results:?}");
        let tools = turn.events_of("tool.completed");
        assert_eq!(tools.len(), 1, "{k}");
        assert_eq!(tools[0]["status"], "denied", "{k}");

        // Arguments that are not JSON: the turn ends before any effect.
        let dir = tempfile::tempdir().unwrap();
        let args = r#"{"path": "notes/plan.md", "#;
        let model = mock(
            vec![Reply::Stream(wire::calls_turn(
                w,
                &[call("files__write", args)],
            ))],
            None,
        )
        .await;
        let text = model_text(k, &model.base_url(), &key_file(dir.path()), "", "", true);
        let turn = run(dir.path(), &text).await;
        let code = turn
            .result
            .error
            .as_ref()
            .map(|e| e.code.as_str().to_owned());
        assert_eq!(code.as_deref(), Some("model_arguments_invalid"), "{k}");
        assert!(turn.events_of("tool.completed").is_empty(), "{k}");

        // A model that never stops calling tools meets the step ceiling.
        let dir = tempfile::tempdir().unwrap();
        let write = r#"{"path": "notes/plan.md", "content": "again"}"#;
        let model = mock(
            vec![Reply::Stream(wire::calls_turn(
                w,
                &[call("files__write", write)],
            ))],
            None,
        )
        .await;
        let text = model_text(k, &model.base_url(), &key_file(dir.path()), "", "", true);
        let request = request_with(serde_json::json!({"maxSteps": 3}));
        let turn = run_request(dir.path(), &text, "sharedos.standard", &request, None).await;
        let code = turn
            .result
            .error
            .as_ref()
            .map(|e| e.code.as_str().to_owned());
        assert_eq!(code.as_deref(), Some("step_limit_exceeded"), "{k}");
        assert_eq!(model.seen().len(), 3, "{k}: one decision per step");
    }
}

/// The code the turn ended with.
fn code_of(turn: &sharedos_tests::egress::Turn) -> String {
    let error = turn.result.error.as_ref();
    error.map_or(String::new(), |e| e.code.as_str().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sandboxed_drivers_usage_is_charged_against_the_token_budget() {
    for w in Wire::ALL {
        let k = w.kind();
        let dir = tempfile::tempdir().unwrap();
        let model = mock(plan_script(w), None).await;
        // The first answer reports 30+10 tokens: past 35, so the second
        // request is refused before it reaches the model.
        let budget = "budget = { tokens = 35 }";
        let text = model_text(
            k,
            &model.base_url(),
            &key_file(dir.path()),
            budget,
            "",
            true,
        );
        let turn = run(dir.path(), &text).await;
        assert_eq!(
            turn.result.status,
            ExecutionStatus::Failed,
            "{k}: {:#?}",
            turn.result
        );
        assert_eq!(code_of(&turn), "egress_budget_exceeded", "{k}");
        assert_eq!(model.seen().len(), 1, "{k}");
        let exceeded = turn.events_of("egress.budget_exceeded");
        assert_eq!(exceeded.len(), 1, "{k}: {:?}", turn.events);
        assert_eq!(exceeded[0]["budget"], "tokens", "{k}");
        // Charged what the wire reported, not an estimate from its bytes.
        let first = &turn.events_of("egress.request")[0];
        assert_eq!(first["inputTokens"], 30, "{k}: {first}");
        assert_eq!(first["outputTokens"], 10, "{k}: {first}");
        assert!(first["estimatedTokens"].is_null(), "{k}: {first}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sandboxed_driver_maps_the_models_failures_to_typed_codes() {
    for w in Wire::ALL {
        let k = w.kind();
        let mut early = wire::text_turn(w, &["Half ", "an ", "answer"]);
        early.truncate(3);
        let body = serde_json::json!({"error": {"message": "upstream says 500"}});
        let cases = [
            (
                Reply::Status(500, body),
                "model_http_500",
                "upstream says 500",
            ),
            (Reply::Stream(early), "model_stream_cut", "ended before"),
            (
                Reply::Stream(vec!["data: {not json\n\n".into()]),
                "model_stream_invalid",
                "",
            ),
        ];
        for (reply, code, message) in cases {
            let dir = tempfile::tempdir().unwrap();
            let model = mock(vec![reply], None).await;
            let text = model_text(k, &model.base_url(), &key_file(dir.path()), "", "", true);
            let turn = run(dir.path(), &text).await;
            assert_eq!(turn.result.status, ExecutionStatus::Failed, "{k} {code}");
            assert_eq!(code_of(&turn), code, "{k}: {:#?}", turn.result);
            let error = turn.result.error.as_ref().unwrap();
            assert!(error.message.as_str().contains(message), "{k}: {error:?}");
            assert!(turn.events_of("tool.completed").is_empty(), "{k}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_gemini_refusal_ends_the_turn_model_error_naming_its_reason() {
    let k = Wire::Gemini.kind();
    let blocked = serde_json::json!({"promptFeedback": {"blockReason": "SAFETY"},
        "usageMetadata": {"promptTokenCount": 8, "totalTokenCount": 8}});
    let stopped = serde_json::json!({"candidates": [{"content": {"role": "model",
        "parts": [{"text": "The song goes"}]}, "finishReason": "RECITATION", "index": 0}]});
    for (chunk, reason) in [(blocked, "SAFETY"), (stopped, "RECITATION")] {
        let dir = tempfile::tempdir().unwrap();
        let model = mock(
            vec![Reply::Stream(vec![format!("data: {chunk}\r\n\r\n")])],
            None,
        )
        .await;
        let text = model_text(k, &model.base_url(), &key_file(dir.path()), "", "", true);
        let turn = run(dir.path(), &text).await;
        assert_eq!(turn.result.status, ExecutionStatus::Failed, "{reason}");
        assert_eq!(
            code_of(&turn),
            "model_error",
            "{reason}: {:#?}",
            turn.result
        );
        let error = turn.result.error.as_ref().unwrap();
        assert!(error.message.as_str().starts_with(reason), "{error:?}");
        assert_eq!(
            turn.result.metadata["driver"], k,
            "{:?}",
            turn.result.metadata
        );
    }
}
