//! Model routes: `/<route>/<rest>` forwarded to the route's upstream with
//! the real key put in and the plugin's placeholder taken out; the answer
//! streamed back chunk by chunk (server-sent events are never buffered)
//! while bytes and token usage are counted.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header;
use hyper::{Request, Response, StatusCode, Uri};

use super::binding::{EffectId, EgressEvent, MODEL_UNAVAILABLE, Outcome, TurnBinding, meta_of};
use super::body::{GatewayBody, MeteredBody, Metering, refusal};
use super::exposure::{Exposure, allowed, split_path};
use super::gateway::Gateway;
use super::pool::{SendError, UpstreamConn, UpstreamIo};
use super::redact::redact_headers;
use super::route::{Route, strip_hop_by_hop};
use super::upstream::{connect_tcp, connect_tls};

impl Gateway {
    pub(super) async fn model_request(
        &self,
        req: Request<Incoming>,
        binding: Arc<TurnBinding>,
    ) -> Response<GatewayBody> {
        let started = Instant::now();
        let (name, rest) = match split_path(req.uri().path()) {
            Ok(split) => split,
            Err(e) => {
                let first = req.uri().path().trim_start_matches('/');
                let first = first.split('/').next().unwrap_or_default();
                let name = if self.routes.contains_key(first) {
                    first
                } else {
                    "invalid"
                };
                return refuse_unsent(&binding, name, e.code(), e.message(), started).await;
            }
        };
        let Some(route) = self.routes.get(name).cloned() else {
            let message = "no such model route in this runtime's network policy";
            return refuse_unsent(&binding, name, "egress_route_unknown", message, started).await;
        };
        if !allowed(route.api, req.method(), rest) {
            let e = Exposure::EndpointRefused;
            return refuse_unsent(&binding, name, e.code(), e.message(), started).await;
        }
        let target = route.target(rest, req.uri().query());
        if binding.gave_up(&route.name, route.max_failures) {
            let message =
                "the model failed this route's maxFailures answers in a row; the turn is ending";
            return refuse_unsent(&binding, name, MODEL_UNAVAILABLE, message, started).await;
        }
        if let Err(budget) = self.take_request(&binding) {
            binding.emit(EgressEvent::BudgetExceeded { budget });
            binding.emit(refused(&route.name, "egress_budget_exceeded", started));
            return refusal(
                StatusCode::TOO_MANY_REQUESTS,
                "egress_budget_exceeded",
                &format!("the turn's egress {budget} budget is spent"),
            );
        }
        if let Err(code) = binding.authorize(&route.path, "request").await {
            // The kernel wrote the refusal (`effect.authorized`, denied).
            binding.note_refused(&route.path, "request", &code);
            binding.emit(refused(&route.name, &code, started));
            return refusal(StatusCode::FORBIDDEN, &code, "refused by the kernel");
        }
        let effect = binding.open_effect(&route.path, "request", started);
        let outcome = match target {
            Err(()) => failed("egress_bad_request", 0),
            Ok(target) => {
                let sent = self.forward(req, &route, target, (&binding, effect), started);
                match sent.await {
                    Ok(resp) => return resp,
                    Err(outcome) => outcome,
                }
            }
        };
        let code = outcome.code.clone().unwrap_or_default();
        let status = match code.as_str() {
            "egress_body_too_large" => StatusCode::PAYLOAD_TOO_LARGE,
            "egress_bad_request" => StatusCode::BAD_REQUEST,
            "egress_budget_exceeded" => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::BAD_GATEWAY,
        };
        binding
            .finish_request((&route.path, effect), route.max_failures, outcome, started)
            .await;
        refusal(status, &code, "the request did not reach the model")
    }

    /// Sends the request upstream; the answer streams back as a
    /// [`MeteredBody`], which records the outcome when it ends.
    async fn forward(
        &self,
        req: Request<Incoming>,
        route: &Arc<Route>,
        target: Uri,
        (binding, effect): (&Arc<TurnBinding>, EffectId),
        started: Instant,
    ) -> Result<Response<GatewayBody>, Outcome> {
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
        let body_len = body.len() as u64;
        let upstream_req = route.upstream_request(head, target, body);
        // Every byte the upstream is sent counts: the request line with
        // its query, the headers (the key's too) and the body.
        let request_bytes = request_head_bytes(&upstream_req, body_len) + body_len;
        if !binding.take_bytes(&self.budget, request_bytes) {
            binding.emit(EgressEvent::BudgetExceeded { budget: "bytes" });
            return Err(failed("egress_budget_exceeded", request_bytes));
        }
        let (conn, response) = self
            .exchange(route, upstream_req)
            .await
            .map_err(|code| failed(code, request_bytes))?;
        let (mut parts, body) = response.into_parts();
        let response_head = response_head_bytes(&parts);
        if !binding.take_bytes(&self.budget, response_head) {
            binding.emit(EgressEvent::BudgetExceeded { budget: "bytes" });
            return Err(failed("egress_budget_exceeded", request_bytes));
        }
        strip_hop_by_hop(&mut parts.headers);
        redact_headers(&mut parts.headers, &route.key_bytes);
        let metering = Metering {
            binding: Arc::clone(binding),
            effect,
            route: Arc::clone(route),
            pool: Arc::clone(&self.pool),
            budget: self.budget,
            status: parts.status.as_u16(),
            request_bytes,
            response_head,
            started,
            timeout: self.limits.upstream_timeout,
        };
        let body = MeteredBody::new(body, conn, metering);
        Ok(Response::from_parts(
            parts,
            GatewayBody::Metered(Box::new(body)),
        ))
    }

    /// Sends the request on a kept connection of the route, or on a fresh
    /// one; a kept connection the upstream closed before it took the
    /// request is replaced by a fresh one once. A request that may have
    /// reached the upstream is never sent again.
    async fn exchange(
        &self,
        route: &Route,
        mut req: Request<Full<Bytes>>,
    ) -> Result<(UpstreamConn, Response<Incoming>), &'static str> {
        let timeout = self.limits.upstream_timeout;
        if let Some(mut conn) = self.pool.take(&route.name).await {
            match tokio::time::timeout(timeout, conn.send(req)).await {
                Err(_) => return Err("upstream_timeout"),
                Ok(Ok(resp)) => return Ok((conn, resp)),
                Ok(Err(SendError::NotSent(back))) => req = *back,
                Ok(Err(SendError::Failed)) => return Err("upstream_failed"),
            }
        }
        let url = &route.url;
        let tcp = connect_tcp(&url.host, url.port, &route.allow, timeout)
            .await
            .map_err(|e| e.code())?;
        let io = if url.tls {
            let tls = connect_tls(tcp, &url.host, self.tls.clone(), timeout)
                .await
                .map_err(|e| e.code())?;
            UpstreamIo::Tls(Box::new(tls))
        } else {
            UpstreamIo::Plain(tcp)
        };
        let mut conn = UpstreamConn::handshake(io, timeout).await?;
        let resp = tokio::time::timeout(timeout, conn.send(req))
            .await
            .map_err(|_| "upstream_timeout")?
            .map_err(|_| "upstream_failed")?;
        Ok((conn, resp))
    }
}

/// The bytes of a request's head as HTTP/1.1 writes it: the request
/// line, each header, the `content-length` hyper adds, the blank line.
fn request_head_bytes(req: &Request<Full<Bytes>>, body_len: u64) -> u64 {
    let target = req.uri().path_and_query().map_or(1, |p| p.as_str().len());
    let line = req.method().as_str().len() + 1 + target + " HTTP/1.1\r\n".len();
    let length = "content-length: \r\n".len() + body_len.to_string().len();
    (line + headers_bytes(req.headers()) + length + 2) as u64
}

/// The bytes of an answer's head: the status line, each header, the
/// blank line.
fn response_head_bytes(parts: &hyper::http::response::Parts) -> u64 {
    let reason = parts.status.canonical_reason().map_or(0, str::len);
    ("HTTP/1.1 200 \r\n".len() + reason + headers_bytes(&parts.headers) + 2) as u64
}

fn headers_bytes(headers: &hyper::HeaderMap) -> usize {
    headers
        .iter()
        .map(|(n, v)| n.as_str().len() + 2 + v.len() + 2)
        .sum()
}

/// A request that ended before an upstream answered.
fn failed(code: &str, request_bytes: u64) -> Outcome {
    Outcome {
        status: None,
        code: Some(code.to_owned()),
        request_bytes,
        response_bytes: 0,
        usage: None,
        estimated_tokens: None,
        error_head: None,
    }
}

/// Refuses a request that names nothing the kernel could grant (an
/// unknown route, a path or an endpoint the route does not expose): its
/// event, and its record (`effect.completed`, failed, with the code).
async fn refuse_unsent(
    binding: &TurnBinding,
    name: &str,
    code: &str,
    message: &str,
    started: Instant,
) -> Response<GatewayBody> {
    let event = refused(name, code, started);
    let meta = meta_of(&event);
    binding.emit(event);
    binding
        .record(&[name.to_owned()], "request", false, meta)
        .await;
    let status = match code {
        "egress_route_unknown" => StatusCode::NOT_FOUND,
        "egress_path_invalid" => StatusCode::BAD_REQUEST,
        MODEL_UNAVAILABLE => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::FORBIDDEN,
    };
    refusal(status, code, message)
}

/// The event of a request refused before it was sent.
fn refused(route: &str, code: &str, started: Instant) -> EgressEvent {
    EgressEvent::Request {
        route: route.to_owned(),
        status: None,
        code: Some(code.to_owned()),
        request_bytes: 0,
        response_bytes: 0,
        duration_ms: started.elapsed().as_millis() as u64,
        usage: None,
        estimated_tokens: None,
    }
}
