//! The gateway's server: accepts on a listener it is given (the loopback
//! of the sandbox's network namespace in production, any listener in
//! tests), bounds connections, and sends each request to a model route or
//! a CONNECT destination, authorized by the kernel as an effect.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use sharedos_kernel::{EffectDecision, KernelTurn};
use sharedos_protocol::{AccessContext, JsonObject};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::policy::{AddressClass, EgressBudget, NetworkRoutes, UpstreamUrl, split_host_port};
use super::secret::Secret;
use super::usage::TokenUsage;

/// The body type of every answer the gateway gives.
pub type GatewayBody = BoxBody<Bytes, std::io::Error>;

/// Bounds on what one gateway holds; over a bound is refused, not queued.
#[derive(Debug, Clone)]
pub struct GatewayLimits {
    /// Open client connections; more are closed on accept.
    pub max_connections: usize,
    /// A request body above this is refused `413 egress_body_too_large`.
    pub max_body_bytes: u64,
    /// Time to read a request's headers.
    pub header_timeout: Duration,
    /// Time to connect upstream and for each upstream step (headers, each
    /// body chunk).
    pub upstream_timeout: Duration,
}

impl Default for GatewayLimits {
    fn default() -> Self {
        Self {
            max_connections: 64,
            max_body_bytes: 8 * 1024 * 1024,
            header_timeout: Duration::from_secs(10),
            upstream_timeout: Duration::from_secs(120),
        }
    }
}

/// What the gateway reports to the turn; the envelope turns these into
/// events. None holds a payload or a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EgressEvent {
    /// One model request, ended.
    Request {
        route: String,
        /// The upstream's status, when it answered.
        status: Option<u16>,
        /// Why the gateway refused or cut it.
        code: Option<String>,
        request_bytes: u64,
        response_bytes: u64,
        duration_ms: u64,
        usage: Option<TokenUsage>,
    },
    /// One CONNECT tunnel, ended (or refused).
    Connection {
        destination: String,
        code: Option<String>,
        bytes_up: u64,
        bytes_down: u64,
        duration_ms: u64,
    },
    /// A per-turn budget ran out: the turn ends `egress_budget_exceeded`.
    BudgetExceeded { budget: &'static str },
}

/// A model route with its secret resolved.
#[derive(Debug)]
pub(super) struct Route {
    pub(super) name: String,
    pub(super) url: UpstreamUrl,
    pub(super) secret: Secret,
    pub(super) api: super::policy::ApiShape,
    pub(super) allow: Vec<AddressClass>,
}

/// What was spent in the turn.
#[derive(Debug, Default)]
pub(super) struct Spent {
    pub(super) requests: u64,
    pub(super) bytes: u64,
    pub(super) tokens: u64,
}

/// The turn a listener's traffic belongs to: whose grants decide, where
/// events go, what is left of the budget.
pub struct TurnBinding {
    pub(super) kernel: Arc<dyn KernelTurn>,
    pub(super) context: AccessContext,
    pub(super) events: mpsc::UnboundedSender<EgressEvent>,
    pub(super) spent: Mutex<Spent>,
}

impl TurnBinding {
    pub fn new(
        kernel: Arc<dyn KernelTurn>,
        context: AccessContext,
        events: mpsc::UnboundedSender<EgressEvent>,
    ) -> Self {
        Self {
            kernel,
            context,
            events,
            spent: Mutex::new(Spent::default()),
        }
    }

    pub(super) fn emit(&self, event: EgressEvent) {
        // A turn that stopped listening has ended; its audit still holds
        // the outcome.
        let _ = self.events.send(event);
    }

    /// Asks the kernel; `Err` is the refusal code.
    pub(super) async fn authorize(&self, path: &[String], action: &str) -> Result<(), String> {
        match self
            .kernel
            .authorize_effect(&self.context, "egress", path, action)
            .await
        {
            Ok(EffectDecision::Allowed { .. }) => Ok(()),
            Ok(EffectDecision::Denied { reason_code }) => Err(reason_code),
            Err(_) => Err("audit_unavailable".into()),
        }
    }

    pub(super) async fn record(&self, path: &[String], action: &str, ok: bool, meta: JsonObject) {
        self.kernel
            .record_effect_outcome(&self.context, "egress", path, action, ok, meta)
            .await;
    }
}

/// One runtime's gateway: its routes, destinations, TLS and limits.
pub struct Gateway {
    pub(super) routes: HashMap<String, Arc<Route>>,
    pub(super) destinations: HashMap<String, Vec<AddressClass>>,
    pub(super) budget: EgressBudget,
    pub(super) tls: Arc<rustls::ClientConfig>,
    pub(super) limits: GatewayLimits,
    /// Keep-alive upstream connections, per route.
    pub(super) pool: Arc<super::pool::UpstreamPool>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("routes", &self.routes.keys().collect::<Vec<_>>())
            .field(
                "destinations",
                &self.destinations.keys().collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// Stops the gateway's accept loop and open connections when dropped.
#[derive(Debug)]
pub struct ServeHandle {
    stop: CancellationToken,
}

impl Drop for ServeHandle {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Gateway {
    /// Builds a checked policy's gateway, resolving its secrets in the
    /// host. An error names the entry, never a secret.
    pub fn from_policy(policy: &NetworkRoutes, limits: GatewayLimits) -> Result<Self, String> {
        policy.check("network")?;
        let mut routes = HashMap::new();
        for r in &policy.routes {
            let url = UpstreamUrl::parse(&r.upstream)?;
            let secret = r
                .secret
                .resolve()
                .map_err(|e| format!("route {}: {e}", r.name))?;
            routes.insert(
                r.name.clone(),
                Arc::new(Route {
                    name: r.name.clone(),
                    url,
                    secret,
                    api: r.api,
                    allow: r.allow.clone(),
                }),
            );
        }
        let mut destinations = HashMap::new();
        for d in &policy.destinations {
            let (host, port) = split_host_port(&d.address, 0)?;
            destinations.insert(format!("{host}:{port}"), d.allow.clone());
        }
        Ok(Self {
            routes,
            destinations,
            budget: policy.budget.clone().unwrap_or(EgressBudget {
                requests: None,
                bytes: None,
                tokens: None,
            }),
            tls: super::upstream::tls_config(policy.ca_file.as_deref())?,
            limits,
            pool: Arc::default(),
        })
    }

    /// Serves `listener` for `binding`'s turn until the handle is dropped.
    pub fn serve(
        self: &Arc<Self>,
        listener: TcpListener,
        binding: Arc<TurnBinding>,
    ) -> ServeHandle {
        let stop = CancellationToken::new();
        let gateway = Arc::clone(self);
        let token = stop.clone();
        tokio::spawn(async move {
            let slots = Arc::new(Semaphore::new(gateway.limits.max_connections));
            loop {
                let accepted = tokio::select! {
                    _ = token.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((stream, _)) = accepted else {
                    // EMFILE and the like: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                // Over the cap the connection is closed at once: nothing
                // is read from it and nothing is queued.
                let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                    drop(stream);
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let (gateway, binding, token) =
                    (Arc::clone(&gateway), Arc::clone(&binding), token.clone());
                tokio::spawn(async move {
                    gateway.connection(stream, binding, token).await;
                    drop(slot);
                });
            }
        });
        ServeHandle { stop }
    }

    async fn connection(
        self: Arc<Self>,
        stream: tokio::net::TcpStream,
        binding: Arc<TurnBinding>,
        stop: CancellationToken,
    ) {
        let gateway = Arc::clone(&self);
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let (gateway, binding) = (Arc::clone(&gateway), Arc::clone(&binding));
            async move { Ok::<_, Infallible>(gateway.dispatch(req, binding).await) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_timeout)
            .max_buf_size(64 * 1024)
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = conn => {}
        }
    }

    async fn dispatch(
        &self,
        req: Request<Incoming>,
        binding: Arc<TurnBinding>,
    ) -> Response<GatewayBody> {
        if req.method() == hyper::Method::CONNECT {
            return self.tunnel(req, binding).await;
        }
        self.model_request(req, binding).await
    }

    /// Takes one request from the budget; `Err` names the budget spent.
    pub(super) fn take_request(&self, binding: &TurnBinding) -> Result<(), &'static str> {
        let mut spent = binding.spent.lock().map_err(|_| "requests")?;
        let over = |limit: Option<u64>, used: u64| limit.is_some_and(|l| used >= l);
        if over(self.budget.tokens, spent.tokens) {
            return Err("tokens");
        }
        if over(self.budget.bytes, spent.bytes) {
            return Err("bytes");
        }
        if over(self.budget.requests, spent.requests) {
            return Err("requests");
        }
        spent.requests += 1;
        Ok(())
    }
}

/// A JSON error answer `{"error":{"code":..,"message":..}}`.
pub(super) fn refusal(status: StatusCode, code: &str, message: &str) -> Response<GatewayBody> {
    let body = json!({"error": {"code": code, "message": message, "type": "sharedos_egress"}});
    let mut resp = Response::new(
        Full::new(Bytes::from(body.to_string()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}
