//! The streamable HTTP transport (MCP 2025-06-18 / 2025-11-25) on the
//! sandbox's own loopback, `http://127.0.0.1:8788/mcp`, for CLIs that take
//! an MCP URL. Every request must carry `Authorization: Bearer <token>`,
//! the per-turn token the CLI is given (`{mcpToken}`); anything else is
//! `401`. A `POST` of one JSON-RPC request is answered `200` with one JSON
//! body; a notification or a response is `202` with none. The server offers
//! no SSE stream (`GET` is `405`, which the transport allows) and no
//! session id. Closing the server stops accepting and drops every
//! connection.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use crate::bridge::MAX_LINE_BYTES;
use crate::mcp::TurnServer;

/// The endpoint's path.
pub const MCP_PATH: &str = "/mcp";

/// A listening HTTP server; dropped or closed, it is gone.
pub struct HttpServer {
    task: JoinHandle<()>,
}

impl HttpServer {
    /// Binds `127.0.0.1:<port>` and serves `server` to holders of `token`.
    pub async fn bind(port: u16, token: String, server: Arc<TurnServer>) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let token = Arc::new(format!("Bearer {token}"));
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { break };
                        let (server, token) = (server.clone(), token.clone());
                        conns.spawn(async move {
                            let service = hyper::service::service_fn(move |req| {
                                handle(req, server.clone(), token.clone())
                            });
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        });
                    }
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
        });
        Ok(Self { task })
    }

    pub fn close(self) {
        drop(self);
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn reply(status: StatusCode, body: Option<Value>) -> Response<Full<Bytes>> {
    let mut r = Response::builder().status(status);
    let bytes = match body {
        Some(v) => {
            r = r.header("content-type", "application/json");
            Bytes::from(v.to_string())
        }
        None => Bytes::new(),
    };
    r.body(Full::new(bytes))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

async fn handle(
    req: Request<Incoming>,
    server: Arc<TurnServer>,
    token: Arc<String>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let authorized = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| constant_time_eq(v.as_bytes(), token.as_bytes()));
    if !authorized {
        return Ok(reply(StatusCode::UNAUTHORIZED, None));
    }
    if req.uri().path() != MCP_PATH {
        return Ok(reply(StatusCode::NOT_FOUND, None));
    }
    match *req.method() {
        Method::POST => {}
        // Ending a session we never created: nothing to do.
        Method::DELETE => return Ok(reply(StatusCode::OK, None)),
        _ => return Ok(reply(StatusCode::METHOD_NOT_ALLOWED, None)),
    }
    let body = match Limited::new(req.into_body(), MAX_LINE_BYTES)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => return Ok(reply(StatusCode::PAYLOAD_TOO_LARGE, None)),
    };
    let message: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            let err = serde_json::json!({"jsonrpc": "2.0", "id": null,
                "error": {"code": -32700, "message": format!("parse error: {e}")}});
            return Ok(reply(StatusCode::BAD_REQUEST, Some(err)));
        }
    };
    Ok(match server.handle(message).await {
        Some(answer) => reply(StatusCode::OK, Some(answer)),
        None => reply(StatusCode::ACCEPTED, None),
    })
}

/// Compares without an early exit, so the token cannot be guessed byte by
/// byte from response times.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A fresh per-turn token: 32 bytes from the kernel, hex.
pub fn new_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(crate::mcp::hex(&b))
}
