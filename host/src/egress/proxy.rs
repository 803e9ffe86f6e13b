//! Model routes: `/<route>/<rest>` forwarded to the route's upstream with
//! the real key put in and the plugin's placeholder taken out; the answer
//! streamed back chunk by chunk (server-sent events are never buffered)
//! while bytes and token usage are counted.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};
use sharedos_protocol::JsonObject;
use tokio::sync::mpsc;

use super::gateway::{EgressEvent, Gateway, GatewayBody, Route, TurnBinding, refusal};
use super::policy::ApiShape;
use super::pool::{Sender, UpstreamPool, handshake};
use super::upstream::{connect_tcp, connect_tls};
use super::usage::UsageScanner;

/// Headers never forwarded: hop-by-hop ones, and every header a key can
/// travel in (the plugin's placeholder is dropped, the host adds the key).
const DROPPED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "accept-encoding",
    "authorization",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
];

/// What one request did, for its event and audit record.
struct Outcome {
    status: Option<u16>,
    code: Option<String>,
    request_bytes: u64,
    response_bytes: u64,
    usage: Option<super::usage::TokenUsage>,
}

impl Gateway {
    pub(super) async fn model_request(
        &self,
        req: Request<Incoming>,
        binding: Arc<TurnBinding>,
    ) -> Response<GatewayBody> {
        let started = Instant::now();
        let path = req.uri().path().to_owned();
        let mut parts = path.trim_start_matches('/').splitn(2, '/');
        let name = parts.next().unwrap_or_default().to_owned();
        let rest = parts.next().unwrap_or_default().to_owned();
        let refuse = |status, code: &str, message: &str| {
            let event = EgressEvent::Request {
                route: name.clone(),
                status: None,
                code: Some(code.to_owned()),
                request_bytes: 0,
                response_bytes: 0,
                duration_ms: started.elapsed().as_millis() as u64,
                usage: None,
            };
            (event, refusal(status, code, message))
        };
        let Some(route) = self.routes.get(&name).cloned() else {
            let (event, resp) = refuse(
                StatusCode::NOT_FOUND,
                "egress_route_unknown",
                "no such model route in this runtime's network policy",
            );
            let meta = meta_of(&event);
            binding.emit(event);
            binding
                .record(std::slice::from_ref(&name), "request", false, meta)
                .await;
            return resp;
        };
        if let Err(budget) = self.take_request(&binding) {
            binding.emit(EgressEvent::BudgetExceeded { budget });
            let (event, resp) = refuse(
                StatusCode::TOO_MANY_REQUESTS,
                "egress_budget_exceeded",
                &format!("the turn's egress {budget} budget is spent"),
            );
            binding.emit(event);
            return resp;
        }
        let route_path = vec![route.name.clone()];
        if let Err(code) = binding.authorize(&route_path, "request").await {
            // The kernel wrote the refusal (`effect.authorized`, denied).
            let (event, resp) = refuse(StatusCode::FORBIDDEN, &code, "refused by the kernel");
            binding.emit(event);
            return resp;
        }
        let query = req
            .uri()
            .query()
            .map(|q| format!("?{q}"))
            .unwrap_or_default();
        let target = format!("{}/{rest}{query}", route.url.base_path);
        let (outcome, resp) = match self.forward(req, &route, &target, &binding).await {
            Ok(resp) => return resp,
            Err(outcome) => {
                let code = outcome.code.clone().unwrap_or_default();
                let status = if code == "egress_body_too_large" {
                    StatusCode::PAYLOAD_TOO_LARGE
                } else {
                    StatusCode::BAD_GATEWAY
                };
                let resp = refusal(status, &code, "the request did not reach the model");
                (outcome, resp)
            }
        };
        finish(&binding, &route.name, outcome, started).await;
        resp
    }

    /// Sends the request upstream; the response streams back through a
    /// pump task that records the outcome when the body ends.
    async fn forward(
        &self,
        req: Request<Incoming>,
        route: &Arc<Route>,
        target: &str,
        binding: &Arc<TurnBinding>,
    ) -> Result<Response<GatewayBody>, Outcome> {
        let started = Instant::now();
        let failed = |code: &str, request_bytes| Outcome {
            status: None,
            code: Some(code.to_owned()),
            request_bytes,
            response_bytes: 0,
            usage: None,
        };
        let (head, body) = req.into_parts();
        let max = self.limits.max_body_bytes;
        let declared = head
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max) {
            return Err(failed("egress_body_too_large", 0));
        }
        let body = Limited::new(body, max as usize)
            .collect()
            .await
            .map_err(|_| failed("egress_body_too_large", 0))?
            .to_bytes();
        let request_bytes = body.len() as u64;
        if !take(binding, &self.budget, request_bytes) {
            binding.emit(EgressEvent::BudgetExceeded { budget: "bytes" });
            return Err(failed("egress_budget_exceeded", request_bytes));
        }
        let (sender, response) = self
            .exchange(&head, route, target, body)
            .await
            .map_err(|code| failed(code, request_bytes))?;
        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        let status = parts.status.as_u16();
        let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(2);
        let pump = Pump {
            keep: Some((Arc::clone(&self.pool), sender)),
            binding: Arc::clone(binding),
            route: route.name.clone(),
            status,
            request_bytes,
            started,
            timeout: self.limits.upstream_timeout,
        };
        tokio::spawn(pump.run_owned(body, tx, self.budget.clone()));
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        Ok(Response::from_parts(parts, StreamBody::new(stream).boxed()))
    }
}

/// Copies the answer to the client frame by frame and records it.
struct Pump {
    /// The connection, kept for the route's next request once the answer
    /// was read to its end.
    keep: Option<(Arc<UpstreamPool>, Sender)>,
    binding: Arc<TurnBinding>,
    route: String,
    status: u16,
    request_bytes: u64,
    started: Instant,
    timeout: std::time::Duration,
}

impl Pump {
    fn run_owned(
        self,
        body: Incoming,
        tx: mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>,
        budget: super::policy::EgressBudget,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (keep, binding, route, status, request_bytes, started, timeout) = (
            self.keep,
            self.binding,
            self.route,
            self.status,
            self.request_bytes,
            self.started,
            self.timeout,
        );
        async move {
            let mut body = body;
            let mut scanner = UsageScanner::default();
            let mut response_bytes = 0u64;
            let mut code = None;
            loop {
                let frame = match tokio::time::timeout(timeout, body.frame()).await {
                    Err(_) => {
                        code = Some("upstream_timeout");
                        break;
                    }
                    Ok(None) => break,
                    Ok(Some(Err(_))) => {
                        code = Some("upstream_stream_cut");
                        break;
                    }
                    Ok(Some(Ok(f))) => f,
                };
                if let Some(data) = frame.data_ref() {
                    response_bytes += data.len() as u64;
                    scanner.feed(data);
                    if !take(&binding, &budget, data.len() as u64) {
                        binding.emit(EgressEvent::BudgetExceeded { budget: "bytes" });
                        code = Some("egress_budget_exceeded");
                        break;
                    }
                }
                if tx.send(Ok(frame)).await.is_err() {
                    code = Some("client_closed");
                    break;
                }
            }
            if code.is_none()
                && let Some((pool, sender)) = keep
            {
                pool.put(&route, sender);
            }
            if let Some(c) = code.filter(|c| *c != "client_closed") {
                // The client sees the stream cut, not a clean end.
                let _ = tx.send(Err(std::io::Error::other(c))).await;
            }
            let usage = scanner.finish();
            if let Some(u) = usage {
                let over = binding
                    .spent
                    .lock()
                    .map(|mut s| {
                        s.tokens = s.tokens.saturating_add(u.total());
                        budget.tokens.is_some_and(|l| s.tokens > l)
                    })
                    .unwrap_or(true);
                if over {
                    binding.emit(EgressEvent::BudgetExceeded { budget: "tokens" });
                }
            }
            let outcome = Outcome {
                status: Some(status),
                code: code.map(str::to_owned),
                request_bytes,
                response_bytes,
                usage,
            };
            finish(&binding, &route, outcome, started).await;
        }
    }
}

pub(super) fn take(binding: &TurnBinding, budget: &super::policy::EgressBudget, n: u64) -> bool {
    let Ok(mut spent) = binding.spent.lock() else {
        return false;
    };
    spent.bytes = spent.bytes.saturating_add(n);
    budget.bytes.is_none_or(|l| spent.bytes <= l)
}

async fn finish(binding: &TurnBinding, route: &str, o: Outcome, started: Instant) {
    let ok = o.code.is_none() && o.status.is_some_and(|s| s < 400);
    let event = EgressEvent::Request {
        route: route.to_owned(),
        status: o.status,
        code: o.code,
        request_bytes: o.request_bytes,
        response_bytes: o.response_bytes,
        duration_ms: started.elapsed().as_millis() as u64,
        usage: o.usage,
    };
    let meta = meta_of(&event);
    binding.emit(event);
    binding
        .record(&[route.to_owned()], "request", ok, meta)
        .await;
}

/// The audit metadata of an event: counts and codes only.
pub(super) fn meta_of(event: &EgressEvent) -> JsonObject {
    let value = match event {
        EgressEvent::Request {
            status,
            code,
            request_bytes,
            response_bytes,
            duration_ms,
            usage,
            ..
        } => json!({
            "status": status,
            "code": code,
            "requestBytes": request_bytes,
            "responseBytes": response_bytes,
            "durationMs": duration_ms,
            "inputTokens": usage.map(|u| u.input),
            "outputTokens": usage.map(|u| u.output),
        }),
        EgressEvent::Connection {
            code,
            bytes_up,
            bytes_down,
            duration_ms,
            ..
        } => json!({
            "code": code,
            "bytesUp": bytes_up,
            "bytesDown": bytes_down,
            "durationMs": duration_ms,
        }),
        EgressEvent::BudgetExceeded { budget } => json!({"budget": budget}),
    };
    match value {
        Value::Object(m) => m.into_iter().filter(|(_, v)| !v.is_null()).collect(),
        _ => JsonObject::new(),
    }
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in DROPPED.iter().take(9) {
        headers.remove(*name);
    }
}

fn upstream_request(
    head: &hyper::http::request::Parts,
    route: &Route,
    target: &str,
    body: Bytes,
) -> Result<Request<Full<Bytes>>, hyper::http::Error> {
    let mut builder = Request::builder().method(head.method.clone()).uri(target);
    for (name, value) in &head.headers {
        if !DROPPED.contains(&name.as_str()) {
            builder = builder.header(name, value);
        }
    }
    let authority =
        if (route.url.tls && route.url.port == 443) || (!route.url.tls && route.url.port == 80) {
            route.url.host.clone()
        } else {
            format!("{}:{}", route.url.host, route.url.port)
        };
    let key = route.secret.expose();
    let (name, value) = match route.api {
        ApiShape::Openai => (header::AUTHORIZATION, format!("Bearer {key}")),
        ApiShape::Anthropic => (HeaderName::from_static("x-api-key"), key.to_owned()),
        ApiShape::Gemini => (HeaderName::from_static("x-goog-api-key"), key.to_owned()),
    };
    let mut value = HeaderValue::from_str(&value)?;
    value.set_sensitive(true);
    builder
        .header(header::HOST, authority)
        // Identity so usage can be read from the bytes as they pass.
        .header(header::ACCEPT_ENCODING, "identity")
        .header(name, value)
        .body(Full::new(body))
}

impl Gateway {
    /// Sends the request on a kept connection of the route, or on a fresh
    /// one; a kept connection the upstream closed before taking the
    /// request is replaced by a fresh one once.
    async fn exchange(
        &self,
        head: &hyper::http::request::Parts,
        route: &Route,
        target: &str,
        body: Bytes,
    ) -> Result<(Sender, Response<Incoming>), &'static str> {
        let timeout = self.limits.upstream_timeout;
        let request = || upstream_request(head, route, target, body.clone());
        if let Some(mut sender) = self.pool.take(&route.name).await {
            let req = request().map_err(|_| "egress_bad_request")?;
            match tokio::time::timeout(timeout, sender.send_request(req)).await {
                Err(_) => return Err("upstream_timeout"),
                Ok(Ok(resp)) => return Ok((sender, resp)),
                Ok(Err(e)) if e.is_canceled() || e.is_closed() => {}
                Ok(Err(_)) => return Err("upstream_failed"),
            }
        }
        let url = &route.url;
        let tcp = connect_tcp(&url.host, url.port, &route.allow, timeout)
            .await
            .map_err(|e| e.code())?;
        let mut sender = if url.tls {
            let tls = connect_tls(tcp, &url.host, self.tls.clone(), timeout)
                .await
                .map_err(|e| e.code())?;
            handshake(tls, timeout).await?
        } else {
            handshake(tcp, timeout).await?
        };
        let req = request().map_err(|_| "egress_bad_request")?;
        let resp = tokio::time::timeout(timeout, sender.send_request(req))
            .await
            .map_err(|_| "upstream_timeout")?
            .map_err(|_| "upstream_failed")?;
        Ok((sender, resp))
    }
}
