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

use super::binding::{EgressEvent, Outcome, TurnBinding, meta_of};
use super::body::{GatewayBody, MeteredBody, Metering, refusal};
use super::gateway::Gateway;
use super::pool::{SendError, UpstreamConn, UpstreamIo};
use super::route::{Route, strip_hop_by_hop};
use super::upstream::{connect_tcp, connect_tls};

impl Gateway {
    pub(super) async fn model_request(
        &self,
        req: Request<Incoming>,
        binding: Arc<TurnBinding>,
    ) -> Response<GatewayBody> {
        let started = Instant::now();
        let path = req.uri().path().trim_start_matches('/');
        let (name, rest) = path.split_once('/').unwrap_or((path, ""));
        let Some(route) = self.routes.get(name).cloned() else {
            let name = name.to_owned();
            let event = refused(&name, "egress_route_unknown", started);
            let meta = meta_of(&event);
            binding.emit(event);
            binding
                .record(std::slice::from_ref(&name), "request", false, meta)
                .await;
            return refusal(
                StatusCode::NOT_FOUND,
                "egress_route_unknown",
                "no such model route in this runtime's network policy",
            );
        };
        let target = route.target(rest, req.uri().query());
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
            binding.emit(refused(&route.name, &code, started));
            return refusal(StatusCode::FORBIDDEN, &code, "refused by the kernel");
        }
        let outcome = match target {
            Err(()) => failed("egress_bad_request", 0),
            Ok(target) => match self.forward(req, &route, target, &binding, started).await {
                Ok(resp) => return resp,
                Err(outcome) => outcome,
            },
        };
        let code = outcome.code.clone().unwrap_or_default();
        let status = match code.as_str() {
            "egress_body_too_large" => StatusCode::PAYLOAD_TOO_LARGE,
            "egress_bad_request" => StatusCode::BAD_REQUEST,
            _ => StatusCode::BAD_GATEWAY,
        };
        binding.finish_request(&route.path, outcome, started).await;
        refusal(status, &code, "the request did not reach the model")
    }

    /// Sends the request upstream; the answer streams back as a
    /// [`MeteredBody`], which records the outcome when it ends.
    async fn forward(
        &self,
        req: Request<Incoming>,
        route: &Arc<Route>,
        target: Uri,
        binding: &Arc<TurnBinding>,
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
        let request_bytes = body.len() as u64;
        if !binding.take_bytes(&self.budget, request_bytes) {
            binding.emit(EgressEvent::BudgetExceeded { budget: "bytes" });
            return Err(failed("egress_budget_exceeded", request_bytes));
        }
        let upstream_req = route.upstream_request(head, target, body);
        let (conn, response) = self
            .exchange(route, upstream_req)
            .await
            .map_err(|code| failed(code, request_bytes))?;
        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        let metering = Metering {
            binding: Arc::clone(binding),
            route: Arc::clone(route),
            pool: Arc::clone(&self.pool),
            budget: self.budget,
            status: parts.status.as_u16(),
            request_bytes,
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

/// A request that ended before an upstream answered.
fn failed(code: &str, request_bytes: u64) -> Outcome {
    Outcome {
        status: None,
        code: Some(code.to_owned()),
        request_bytes,
        response_bytes: 0,
        usage: None,
    }
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
    }
}
