//! A mock model server on the host's loopback (plain HTTP, or TLS with
//! the test CA), scripted turn by turn, and the streamed answers of the
//! three model APIs written as their wires write them.
#![allow(dead_code)]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sharedos_standard::DriverKind;
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};

/// What the mock saw of one request.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    pub path: String,
    pub authorization: Option<String>,
    pub api_key: Option<String>,
    pub anthropic_version: Option<String>,
    pub body: Value,
}

/// How the mock answers one request.
#[derive(Clone)]
pub enum Reply {
    /// 200 with these SSE events, one frame each.
    Stream(Vec<String>),
    /// An error status with a JSON body.
    Status(u16, Value),
    /// 200, these events, then the connection is cut mid-body.
    Cut(Vec<String>),
    /// Headers are never sent.
    Hang,
    /// The stream, once `release` is notified.
    Held(Vec<String>, Arc<Notify>),
}

pub struct MockModel {
    pub port: u16,
    pub seen: Arc<Mutex<Vec<SeenRequest>>>,
}

impl MockModel {
    pub fn seen(&self) -> Vec<SeenRequest> {
        self.seen.lock().unwrap().clone()
    }
}

type Body = BoxBody<Bytes, std::io::Error>;

fn streamed(events: Vec<String>, cut: bool, release: Option<Arc<Notify>>) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(4);
    tokio::spawn(async move {
        if let Some(r) = release {
            r.notified().await;
        }
        for e in events {
            if tx.send(Ok(Frame::data(Bytes::from(e)))).await.is_err() {
                return;
            }
        }
        if cut {
            let _ = tx.send(Err(std::io::Error::other("cut"))).await;
        }
    });
    let stream =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|i| (i, rx)) });
    let mut resp = Response::new(StreamBody::new(stream).boxed());
    resp.headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    resp
}

async fn answer(
    req: Request<Incoming>,
    script: Arc<Vec<Reply>>,
    seen: Arc<Mutex<Vec<SeenRequest>>>,
) -> Response<Body> {
    let header = |n: &str| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (authorization, api_key, anthropic_version) = (
        header("authorization"),
        header("x-api-key"),
        header("anthropic-version"),
    );
    let path = req.uri().path().to_owned();
    let bytes = req.into_body().collect().await.unwrap().to_bytes();
    let n = {
        let mut s = seen.lock().unwrap();
        s.push(SeenRequest {
            path,
            authorization,
            api_key,
            anthropic_version,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        });
        s.len()
    };
    // Past the script, the last reply again (a model that never stops).
    let reply = script[(n - 1).min(script.len() - 1)].clone();
    match reply {
        Reply::Stream(events) => streamed(events, false, None),
        Reply::Cut(events) => streamed(events, true, None),
        Reply::Held(events, release) => streamed(events, false, Some(release)),
        Reply::Status(code, body) => {
            let mut resp = Response::new(
                Full::new(Bytes::from(body.to_string()))
                    .map_err(|e: Infallible| match e {})
                    .boxed(),
            );
            *resp.status_mut() = hyper::StatusCode::from_u16(code).unwrap();
            resp
        }
        Reply::Hang => std::future::pending().await,
    }
}

/// Serves `script` on 127.0.0.1, with `tls` when given.
pub async fn mock_model(script: Vec<Reply>, tls: Option<tokio_rustls::TlsAcceptor>) -> MockModel {
    assert!(!script.is_empty());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (seen2, script) = (Arc::clone(&seen), Arc::new(script));
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (script, seen, tls) = (script.clone(), Arc::clone(&seen2), tls.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let (script, seen) = (script.clone(), Arc::clone(&seen));
                    async move { Ok::<_, Infallible>(answer(req, script, seen).await) }
                });
                let http = hyper::server::conn::http1::Builder::new();
                match tls {
                    Some(acceptor) => {
                        if let Ok(s) = acceptor.accept(tcp).await {
                            let _ = http.serve_connection(TokioIo::new(s), svc).await;
                        }
                    }
                    None => {
                        let _ = http.serve_connection(TokioIo::new(tcp), svc).await;
                    }
                }
            });
        }
    });
    MockModel { port, seen }
}

/// A tool call the scripted model makes: id, function name, and its
/// arguments as text (sent in two fragments).
pub struct ScriptedCall<'a> {
    pub id: &'a str,
    pub name: &'a str,
    pub arguments: &'a str,
}

fn halves(s: &str) -> (&str, &str) {
    let mut at = s.len() / 2;
    while !s.is_char_boundary(at) {
        at += 1;
    }
    s.split_at(at)
}

fn data(v: Value) -> String {
    format!("data: {v}\n\n")
}

fn typed(v: Value) -> String {
    format!("event: {}\ndata: {v}\n\n", v["type"].as_str().unwrap())
}

/// An answer that calls these tools.
pub fn calls_turn(kind: DriverKind, calls: &[ScriptedCall]) -> Vec<String> {
    let mut out = Vec::new();
    match kind {
        DriverKind::OpenaiChat => {
            for (i, c) in calls.iter().enumerate() {
                let (a, b) = halves(c.arguments);
                out.push(data(json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": a}}]}}]})));
                out.push(data(json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "function": {"arguments": b}}]}}]})));
            }
            out.push(data(
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            ));
            out.push(data(json!({"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 10, "total_tokens": 40}})));
            out.push("data: [DONE]\n\n".into());
        }
        DriverKind::OpenaiResponses => {
            out.push(typed(
                json!({"type": "response.created", "response": {"status": "in_progress"}}),
            ));
            for (i, c) in calls.iter().enumerate() {
                let (a, b) = halves(c.arguments);
                let item = json!({"type": "function_call", "id": format!("fc_{i}"), "call_id": c.id, "name": c.name, "arguments": "", "status": "in_progress"});
                out.push(typed(
                    json!({"type": "response.output_item.added", "output_index": i, "item": item}),
                ));
                for d in [a, b] {
                    out.push(typed(json!({"type": "response.function_call_arguments.delta", "output_index": i, "item_id": format!("fc_{i}"), "delta": d})));
                }
                out.push(typed(json!({"type": "response.function_call_arguments.done", "output_index": i, "item_id": format!("fc_{i}"), "arguments": c.arguments})));
                let mut done = item.clone();
                done["arguments"] = json!(c.arguments);
                done["status"] = json!("completed");
                out.push(typed(
                    json!({"type": "response.output_item.done", "output_index": i, "item": done}),
                ));
            }
            out.push(typed(json!({"type": "response.completed", "response": {"status": "completed", "usage": {"input_tokens": 30, "output_tokens": 10, "total_tokens": 40}}})));
        }
        DriverKind::AnthropicMessages => {
            out.push(typed(json!({"type": "message_start", "message": {"id": "msg_1", "role": "assistant", "content": [], "usage": {"input_tokens": 30, "output_tokens": 1}}})));
            for (i, c) in calls.iter().enumerate() {
                let (a, b) = halves(c.arguments);
                out.push(typed(json!({"type": "content_block_start", "index": i, "content_block": {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}})));
                for d in [a, b] {
                    out.push(typed(json!({"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": d}})));
                }
                out.push(typed(json!({"type": "content_block_stop", "index": i})));
            }
            out.push(typed(json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 10}})));
            out.push(typed(json!({"type": "message_stop"})));
        }
    }
    out
}

/// An answer that writes these pieces of text and stops.
pub fn text_turn(kind: DriverKind, pieces: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    match kind {
        DriverKind::OpenaiChat => {
            for p in pieces {
                out.push(data(
                    json!({"choices": [{"index": 0, "delta": {"content": p}}]}),
                ));
            }
            out.push(data(
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            ));
            out.push(data(json!({"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 6, "total_tokens": 56}})));
            out.push("data: [DONE]\n\n".into());
        }
        DriverKind::OpenaiResponses => {
            out.push(typed(
                json!({"type": "response.created", "response": {"status": "in_progress"}}),
            ));
            let item = json!({"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress", "content": []});
            out.push(typed(
                json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
            ));
            for p in pieces {
                out.push(typed(json!({"type": "response.output_text.delta", "output_index": 0, "item_id": "msg_1", "content_index": 0, "delta": p})));
            }
            let text: String = pieces.concat();
            out.push(typed(json!({"type": "response.output_item.done", "output_index": 0, "item": {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": text, "annotations": []}]}})));
            out.push(typed(json!({"type": "response.completed", "response": {"status": "completed", "usage": {"input_tokens": 50, "output_tokens": 6, "total_tokens": 56}}})));
        }
        DriverKind::AnthropicMessages => {
            out.push(typed(json!({"type": "message_start", "message": {"id": "msg_2", "role": "assistant", "content": [], "usage": {"input_tokens": 50, "output_tokens": 1}}})));
            out.push(typed(json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})));
            out.push(typed(json!({"type": "ping"})));
            for p in pieces {
                out.push(typed(json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}})));
            }
            out.push(typed(json!({"type": "content_block_stop", "index": 0})));
            out.push(typed(json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 6}})));
            out.push(typed(json!({"type": "message_stop"})));
        }
    }
    out
}

/// The finish reason each wire states for a text answer.
pub fn stop_reason(kind: DriverKind) -> &'static str {
    match kind {
        DriverKind::OpenaiChat => "stop",
        DriverKind::OpenaiResponses => "completed",
        DriverKind::AnthropicMessages => "end_turn",
    }
}

/// The path each wire posts to, under the route's upstream `/v1`.
pub fn upstream_path(kind: DriverKind) -> &'static str {
    match kind {
        DriverKind::OpenaiChat => "/v1/chat/completions",
        DriverKind::OpenaiResponses => "/v1/responses",
        DriverKind::AnthropicMessages => "/v1/messages",
    }
}

/// The gateway route's API shape (how the real key is added).
pub fn route_api(kind: DriverKind) -> &'static str {
    match kind {
        DriverKind::AnthropicMessages => "anthropic",
        _ => "openai",
    }
}

/// The tool results the model was sent back, in order, as
/// `(call id, content text)`, read from a request body.
pub fn results_sent(kind: DriverKind, body: &Value) -> Vec<(String, String)> {
    let s = |v: &Value| v.as_str().unwrap_or("").to_owned();
    match kind {
        DriverKind::OpenaiChat => body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| (s(&m["tool_call_id"]), s(&m["content"])))
            .collect(),
        DriverKind::OpenaiResponses => body["input"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["type"] == "function_call_output")
            .map(|i| (s(&i["call_id"]), s(&i["output"])))
            .collect(),
        DriverKind::AnthropicMessages => body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "user")
            .filter_map(|m| m["content"].as_array())
            .flatten()
            .filter(|b| b["type"] == "tool_result")
            .map(|b| (s(&b["tool_use_id"]), s(&b["content"])))
            .collect(),
    }
}

/// The function names the model was offered, read from a request body.
pub fn tools_offered(kind: DriverKind, body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| match kind {
            DriverKind::OpenaiChat => t["function"]["name"].as_str().unwrap().to_owned(),
            _ => t["name"].as_str().unwrap().to_owned(),
        })
        .collect()
}
