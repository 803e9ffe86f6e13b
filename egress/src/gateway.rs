//! The gateway's server: accepts on a listener it is given (the loopback
//! of the sandbox's network namespace, a unix socket a gVisor container
//! reaches through its relay, any listener in tests), bounds connections, and sends each request to a model route or
//! a CONNECT destination, authorized by the kernel as an effect.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

pub use super::binding::{EgressEvent, TurnBinding};
use super::body::GatewayBody;
use super::policy::{AddressClass, EgressBudget, NetworkRoutes, UpstreamUrl, split_host_port};
use super::route::Route;
use super::timer::HeadTimer;

/// What a gateway accepts on: a TCP listener (the loopback of the
/// namespace sandbox's own network namespace), or a unix socket (the one a
/// gVisor container reaches through its loopback relay).
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl From<TcpListener> for Listener {
    fn from(l: TcpListener) -> Self {
        Listener::Tcp(l)
    }
}

impl From<UnixListener> for Listener {
    fn from(l: UnixListener) -> Self {
        Listener::Unix(l)
    }
}

enum Accepted {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

impl Listener {
    async fn accept(&self) -> std::io::Result<Accepted> {
        match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept().await?;
                let _ = s.set_nodelay(true);
                Ok(Accepted::Tcp(s))
            }
            Listener::Unix(l) => Ok(Accepted::Unix(l.accept().await?.0)),
        }
    }
}

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

/// What the requests of one client connection share: the serve's stop
/// (the turn's end), and the connection's slot under the connection cap,
/// which a CONNECT tunnel takes over, so a tunnel counts as the
/// connection it came from for as long as it lives.
#[derive(Clone)]
pub(super) struct ConnCtx {
    pub(super) stop: CancellationToken,
    slot: Arc<Mutex<Option<OwnedSemaphorePermit>>>,
}

impl ConnCtx {
    /// The connection's slot, once: a tunnel holds it until it ends.
    pub(super) fn take_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner()).take()
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
            let mut route = Route::new(&r.name, url, &secret, r.api, r.allow.clone(), &r.headers)?;
            route.max_failures = r.max_failures;
            routes.insert(r.name.clone(), Arc::new(route));
        }
        let mut destinations = HashMap::new();
        for d in &policy.destinations {
            let (host, port) = split_host_port(&d.address, 0)?;
            destinations.insert(format!("{host}:{port}"), d.allow.clone());
        }
        Ok(Self {
            routes,
            destinations,
            budget: policy.budget.unwrap_or(EgressBudget {
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
        listener: impl Into<Listener>,
        binding: Arc<TurnBinding>,
    ) -> ServeHandle {
        let listener = listener.into();
        let stop = CancellationToken::new();
        let gateway = Arc::clone(self);
        let token = stop.clone();
        tokio::spawn(async move {
            let slots = Arc::new(Semaphore::new(gateway.limits.max_connections));
            let timer = HeadTimer::new(gateway.limits.max_connections);
            loop {
                let accepted = tokio::select! {
                    _ = token.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok(stream) = accepted else {
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
                let ctx = ConnCtx {
                    stop: token.clone(),
                    slot: Arc::new(Mutex::new(Some(slot))),
                };
                let (gateway, binding, timer) =
                    (Arc::clone(&gateway), Arc::clone(&binding), timer.clone());
                // The slot is freed when the connection ends, unless a
                // tunnel took it over.
                match stream {
                    Accepted::Tcp(s) => {
                        let _ = s.set_nodelay(true);
                        tokio::spawn(gateway.connection(s, binding, ctx, timer));
                    }
                    Accepted::Unix(s) => {
                        tokio::spawn(gateway.connection(s, binding, ctx, timer));
                    }
                }
            }
        });
        ServeHandle { stop }
    }

    async fn connection<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
        self: Arc<Self>,
        stream: S,
        binding: Arc<TurnBinding>,
        ctx: ConnCtx,
        timer: HeadTimer,
    ) {
        let gateway = Arc::clone(&self);
        let stop = ctx.stop.clone();
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let (gateway, binding, ctx) = (Arc::clone(&gateway), Arc::clone(&binding), ctx.clone());
            async move { Ok::<_, Infallible>(gateway.dispatch(req, binding, ctx).await) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(timer)
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
        ctx: ConnCtx,
    ) -> Response<GatewayBody> {
        if req.method() == hyper::Method::CONNECT {
            return self.tunnel(req, binding, ctx).await;
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
