//! The standard runtime's Chat Completions driver, in process against the
//! real kernel, reaching a scripted mock model only through the egress
//! gateway.

mod egress_support;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use egress_support::*;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sharedos_host::config::HostConfig;
use sharedos_host::egress::GatewayLimits;
use sharedos_host::executor::{ExecuteOptions, Executor, ExecutorOptions, Seat};
use sharedos_kernel::{Kernel, MemoryAuditSink};
use sharedos_protocol::{ExecutionRequest, ExecutionStatus};

fn sse(chunks: &[Value]) -> String {
    let mut out: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    out.push_str("data: [DONE]\n\n");
    out
}

/// Answers the first request with a streamed tool call (its arguments in
/// two fragments), the second with text, usage and `stop`.
/// What the mock model saw: the authorization header and the body.
type Seen = Arc<Mutex<Vec<(Option<String>, Value)>>>;

async fn mock_model() -> (u16, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let seen2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let seen = seen2.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let auth = req
                            .headers()
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_owned);
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let body: Value = serde_json::from_slice(&body).unwrap();
                        let n = {
                            let mut s = seen.lock().unwrap();
                            s.push((auth, body));
                            s.len()
                        };
                        let text = if n == 1 {
                            sse(&[
                                json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "files__write", "arguments": "{\"path\": \"notes/plan.md\", "}}]}}]}),
                                json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\"content\": \"step one\"}"}}]}}]}),
                                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
                            ])
                        } else {
                            sse(&[
                                json!({"choices": [{"index": 0, "delta": {"content": "Plan "}}]}),
                                json!({"choices": [{"index": 0, "delta": {"content": "written."}, "finish_reason": "stop"}]}),
                                json!({"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 6, "total_tokens": 46}}),
                            ])
                        };
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(text))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (port, seen)
}

#[tokio::test]
async fn chat_driver_calls_a_tool_through_the_kernel_and_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (port, seen) = mock_model().await;
    let policy = json!({"routes": [{"name": "openai", "upstream": format!("http://127.0.0.1:{port}/v1"),
        "secret": key_file(dir.path()), "api": "openai", "allow": ["loopback"]}]});
    let gw = serve(
        policy,
        vec![egress_grant("alice", "openai", "request", None)],
        "alice",
        GatewayLimits::default(),
    )
    .await;

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
    let plugin = sharedos_standard::chat_plugin(
        &format!("http://{}/openai", gw.addr),
        "test-model",
        PLACEHOLDER,
    )
    .unwrap();
    let executor =
        Executor::new(kernel, Seat::in_process(plugin), ExecutorOptions::default()).unwrap();
    let request: ExecutionRequest =
        serde_json::from_str(include_str!("../demo/turn.json")).unwrap();
    let result = executor
        .execute(request, ExecuteOptions::default())
        .await
        .unwrap();

    assert_eq!(result.status, ExecutionStatus::Succeeded, "{result:#?}");
    assert_eq!(result.output.as_ref().unwrap()["text"], "Plan written.");
    // The tool call ran through the kernel: the file exists.
    let written = std::fs::read_to_string(files_root.join("demo/alice/notes/plan.md")).unwrap();
    assert_eq!(written, "step one");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    // The model got the catalogue as functions with their schemas, and
    // the tool's result back on the second request.
    let tools = seen[0].1["tools"].as_array().unwrap();
    assert!(
        tools
            .iter()
            .any(|t| t["function"]["name"] == "files__write"),
        "{tools:?}"
    );
    let messages = seen[1].1["messages"].as_array().unwrap();
    let tool_msg = messages.iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(tool_msg["tool_call_id"], "call_1");
    assert!(tool_msg["content"].as_str().unwrap().contains("succeeded"));
    // The upstream saw the real key; the driver only ever held the placeholder.
    for (auth, _) in &seen {
        assert_eq!(auth.as_deref(), Some(format!("Bearer {REAL_KEY}").as_str()));
    }
    let dump = format!("{result:?}");
    assert!(!dump.contains(REAL_KEY));
    assert!(
        dump.contains("finishReason") && dump.contains("\"stop\""),
        "{dump}"
    );
}
