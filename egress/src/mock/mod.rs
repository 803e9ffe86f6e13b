//! A scripted model server on the host's loopback, plain HTTP or TLS: the
//! upstream of `sharedos demo --model --mock` (nothing to install, no key),
//! of the egress tests, of the gateway's benchmark and of the vendor
//! runtimes' tests. It answers request `i` with reply `i` of its script
//! (past the end, the last reply again: a model that never stops), takes
//! more replies while it runs, and records every request it received.
//! [`wire`] writes the answers of the four model APIs as their wires do.

pub mod wire;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};

pub use wire::{ScriptedCall, Wire};

/// How the mock answers one request.
#[derive(Clone)]
pub enum Reply {
    /// 200 `text/event-stream`, these events, one body frame each.
    Stream(Vec<String>),
    /// 200 `application/json` with this body.
    Json(Value),
    /// This status with a JSON body.
    Status(u16, Value),
    /// 200, these events, then the connection is cut mid-body.
    Cut(Vec<String>),
    /// The response head is never sent.
    Hang,
    /// 200, the events `before` at once, then `after` once `gate` is
    /// notified (a slow model; a stream the test releases).
    Gated {
        before: Vec<String>,
        gate: Arc<Notify>,
        after: Vec<String>,
    },
}

impl Reply {
    /// The whole stream, held until `gate` is notified.
    pub fn held(events: Vec<String>, gate: Arc<Notify>) -> Reply {
        Reply::Gated {
            before: Vec::new(),
            gate,
            after: events,
        }
    }
}

/// One request as the mock saw it.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    pub method: String,
    pub path: String,
    /// The query, as received (`alt=sse`).
    pub query: Option<String>,
    /// Every header, lowercase names, in the order received.
    pub headers: Vec<(String, String)>,
    /// The body as JSON (`Null` when it was not JSON).
    pub body: Value,
    /// The body's length in bytes.
    pub body_len: usize,
}

impl SeenRequest {
    /// The first value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
    pub fn authorization(&self) -> Option<&str> {
        self.header("authorization")
    }
    /// Anthropic's key header.
    pub fn api_key(&self) -> Option<&str> {
        self.header("x-api-key")
    }
    /// Gemini's key header.
    pub fn goog_api_key(&self) -> Option<&str> {
        self.header("x-goog-api-key")
    }
}

/// Called with the request's index (from 0) before it is answered: a test
/// looks at the plugin while it waits for its model.
pub type OnRequest = Arc<dyn Fn(usize) + Send + Sync>;

/// How the mock is served.
#[derive(Clone, Default)]
pub struct MockOptions {
    /// TLS with this acceptor's certificate (a test CA's `localhost`).
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    pub on_request: Option<OnRequest>,
}

#[derive(Default)]
struct State {
    script: Mutex<Vec<Reply>>,
    seen: Mutex<Vec<SeenRequest>>,
    connections: AtomicUsize,
    on_request: Option<OnRequest>,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running mock model; it stops with the tokio runtime that started it.
#[derive(Clone)]
pub struct MockModel {
    pub port: u16,
    tls: bool,
    state: Arc<State>,
}

impl MockModel {
    /// Serves `script` over plain HTTP on `127.0.0.1:<any port>`.
    pub async fn start(script: Vec<Reply>) -> std::io::Result<MockModel> {
        MockModel::start_with(script, MockOptions::default()).await
    }

    /// Serves `script` on `127.0.0.1:<any port>` as `options` say.
    pub async fn start_with(
        script: Vec<Reply>,
        options: MockOptions,
    ) -> std::io::Result<MockModel> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let state = Arc::new(State {
            script: Mutex::new(script),
            on_request: options.on_request,
            ..State::default()
        });
        let tls = options.tls.is_some();
        tokio::spawn(accept(listener, Arc::clone(&state), options.tls));
        Ok(MockModel { port, tls, state })
    }

    /// Appends replies to the script (the next turns of the model).
    pub fn push(&self, replies: impl IntoIterator<Item = Reply>) {
        locked(&self.state.script).extend(replies);
    }

    /// Every request so far, in order.
    pub fn seen(&self) -> Vec<SeenRequest> {
        locked(&self.state.seen).clone()
    }

    /// How many TCP connections it accepted.
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// The upstream base URL of a route to this model: `http://127.0.0.1`,
    /// or `https://localhost` (the test certificate's name) with TLS.
    pub fn base_url(&self) -> String {
        if self.tls {
            format!("https://localhost:{}/v1", self.port)
        } else {
            format!("http://127.0.0.1:{}/v1", self.port)
        }
    }
}

async fn accept(listener: TcpListener, state: Arc<State>, tls: Option<tokio_rustls::TlsAcceptor>) {
    while let Ok((tcp, _)) = listener.accept().await {
        state.connections.fetch_add(1, Ordering::SeqCst);
        // As model APIs' servers do: without it a response head on a kept
        // connection waits for the ACK of the previous answer's tail.
        let _ = tcp.set_nodelay(true);
        let (state, tls) = (Arc::clone(&state), tls.clone());
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let state = Arc::clone(&state);
                async move { Ok::<_, Infallible>(answer(req, &state).await) }
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
}

type Body = BoxBody<Bytes, std::io::Error>;

fn full(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut resp = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|e: Infallible| match e {})
            .boxed(),
    );
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    resp
}

/// An SSE body sending `before`, then (once `gate` opens) `after`, then
/// an error frame when `cut`.
fn streamed(
    before: Vec<String>,
    gate: Option<Arc<Notify>>,
    after: Vec<String>,
    cut: bool,
) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(4);
    tokio::spawn(async move {
        let send = |e: String| tx.send(Ok(Frame::data(Bytes::from(e))));
        for e in before {
            if send(e).await.is_err() {
                return;
            }
        }
        if let Some(gate) = gate {
            gate.notified().await;
        }
        for e in after {
            if send(e).await.is_err() {
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
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/event-stream"),
    );
    resp
}

async fn answer(req: Request<Incoming>, state: &State) -> Response<Body> {
    let headers = req
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    let (method, path) = (req.method().to_string(), req.uri().path().to_owned());
    let query = req.uri().query().map(str::to_owned);
    let bytes = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let index = {
        let mut seen = locked(&state.seen);
        seen.push(SeenRequest {
            method,
            path,
            query,
            headers,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            body_len: bytes.len(),
        });
        seen.len() - 1
    };
    if let Some(hook) = &state.on_request {
        hook(index);
    }
    let reply = {
        let script = locked(&state.script);
        script.get(index).or(script.last()).cloned()
    };
    match reply {
        None => full(
            StatusCode::INTERNAL_SERVER_ERROR,
            "application/json",
            json!({"error": {"message": "the mock model has no script"}}).to_string(),
        ),
        Some(Reply::Stream(events)) => streamed(events, None, Vec::new(), false),
        Some(Reply::Cut(events)) => streamed(events, None, Vec::new(), true),
        Some(Reply::Gated {
            before,
            gate,
            after,
        }) => streamed(before, Some(gate), after, false),
        Some(Reply::Json(body)) => full(StatusCode::OK, "application/json", body.to_string()),
        Some(Reply::Status(code, body)) => full(
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            "application/json",
            body.to_string(),
        ),
        Some(Reply::Hang) => std::future::pending().await,
    }
}

/// The demo's script on `wire`: the model writes its plan with
/// `files.write`, then answers "Plan written." with usage (40+6 tokens).
pub fn plan_script(wire: Wire) -> Vec<Reply> {
    let call = ScriptedCall {
        id: "call_1",
        namespace: None,
        name: "files__write",
        arguments: r#"{"path": "notes/plan.md", "content": "step one"}"#,
    };
    vec![
        Reply::Stream(wire::calls_turn(wire, &[call])),
        Reply::Stream(wire::text_turn_with_usage(
            wire,
            &["Plan ", "written."],
            (40, 6),
        )),
    ]
}
