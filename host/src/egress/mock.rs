//! A scripted OpenAI-compatible model server on the host's loopback: the
//! upstream of `sharedos demo --model --mock` (nothing to install, no key)
//! and of the end-to-end egress tests. It answers Chat Completions
//! requests with a fixed script of server-sent events, one answer per
//! request in order (the last one repeats), and records what it was sent.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// One request as the mock model saw it.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    pub path: String,
    /// The `authorization` header, as received.
    pub authorization: Option<String>,
    /// The body (JSON; `Null` when it was not).
    pub body: Value,
}

/// Called with the request's index before it is answered (a test looks
/// at the plugin while it waits for its model).
pub type OnRequest = Arc<dyn Fn(usize) + Send + Sync>;

/// A running mock model; it stops when the host's runtime does.
#[derive(Clone)]
pub struct MockModel {
    pub port: u16,
    seen: Arc<Mutex<Vec<SeenRequest>>>,
    connections: Arc<std::sync::atomic::AtomicUsize>,
}

impl MockModel {
    /// Serves `script` on `127.0.0.1:<any port>`: answer `i` is a list of
    /// Chat Completions chunks sent as `data:` events, then `[DONE]`.
    pub async fn start(
        script: Vec<Vec<Value>>,
        on_request: Option<OnRequest>,
    ) -> std::io::Result<MockModel> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let seen: Arc<Mutex<Vec<SeenRequest>>> = Arc::default();
        let state = (Arc::new(script), Arc::clone(&seen), on_request);
        let connections: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let accepted = Arc::clone(&connections);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (script, seen, hook) = state.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let (script, seen, hook) = (script.clone(), seen.clone(), hook.clone());
                        async move { Ok::<_, Infallible>(answer(req, &script, &seen, hook).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        Ok(MockModel {
            port,
            seen,
            connections,
        })
    }

    /// Every request so far, in order.
    pub fn seen(&self) -> Vec<SeenRequest> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How many TCP connections it accepted.
    pub fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The upstream base URL of a route to this model.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }
}

async fn answer(
    req: Request<Incoming>,
    script: &[Vec<Value>],
    seen: &Mutex<Vec<SeenRequest>>,
    hook: Option<OnRequest>,
) -> Response<Full<Bytes>> {
    let authorization = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let path = req.uri().path().to_owned();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let index = {
        let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
        s.push(SeenRequest {
            path,
            authorization,
            body,
        });
        s.len() - 1
    };
    if let Some(hook) = hook {
        hook(index);
    }
    let chunks = script
        .get(index)
        .or(script.last())
        .cloned()
        .unwrap_or_default();
    let mut text: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    text.push_str("data: [DONE]\n\n");
    let mut resp = Response::new(Full::new(Bytes::from(text)));
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/event-stream"),
    );
    resp
}

/// The demo's script: the model writes its plan with `files.write`, then
/// answers with text, usage and `stop`.
pub fn plan_script() -> Vec<Vec<Value>> {
    vec![
        vec![
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "files__write", "arguments": "{\"path\": \"notes/plan.md\", "}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\"content\": \"step one\"}"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        ],
        vec![
            json!({"choices": [{"index": 0, "delta": {"content": "Plan "}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "written."}, "finish_reason": "stop"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 6, "total_tokens": 46}}),
        ],
    ]
}
