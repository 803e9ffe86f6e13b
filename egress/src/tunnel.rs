//! Destinations: `CONNECT host:port` to an entry of the policy, resolved
//! by the host, authorized by the kernel (`egress` / `[host:port]` /
//! `connect`), bytes copied both ways (TLS stays end to end) and held
//! against the turn's byte budget as they pass, one event and audit record
//! per connection.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::binding::{EffectId, EgressEvent, TurnBinding, meta_of};
use super::body::{GatewayBody, refusal};
use super::gateway::{ConnCtx, Gateway};
use super::policy::{AddressClass, EgressBudget, split_host_port};
use super::upstream::connect_tcp;

/// A CONNECT target the policy lists: its key, host, port and classes.
struct Listed {
    key: String,
    host: String,
    port: u16,
    allow: Vec<AddressClass>,
}

impl Gateway {
    /// The audit path of a CONNECT target and, when the policy lists it,
    /// the destination.
    fn destination(&self, req: &Request<Incoming>) -> (Vec<String>, Option<Listed>) {
        let asked = req
            .uri()
            .authority()
            .map(|a| a.as_str())
            .unwrap_or_default();
        let Ok((host, port)) = split_host_port(asked, 0) else {
            return (vec!["invalid".into()], None);
        };
        let key = format!("{host}:{port}");
        let listed = self.destinations.get(&key).map(|allow| Listed {
            key: key.clone(),
            host,
            port,
            allow: allow.clone(),
        });
        (vec![key], listed)
    }

    pub(super) async fn tunnel(
        &self,
        mut req: Request<Incoming>,
        binding: Arc<TurnBinding>,
        ctx: ConnCtx,
    ) -> Response<GatewayBody> {
        let started = Instant::now();
        let (path, listed) = self.destination(&req);
        let Some(dest) = listed else {
            let message = "no such destination in this runtime's network policy";
            let why = ("egress_destination_unknown", StatusCode::FORBIDDEN, message);
            return refuse_tunnel(&binding, &path, started, why).await;
        };
        let spent = self.charge_tunnel(&binding, &req);
        if let Err(budget) = spent {
            binding.emit(EgressEvent::BudgetExceeded { budget });
            let message = format!("the turn's egress {budget} budget is spent");
            let status = StatusCode::TOO_MANY_REQUESTS;
            let why = ("egress_budget_exceeded", status, message.as_str());
            return refuse_tunnel(&binding, &path, started, why).await;
        }
        if let Err(code) = binding.authorize(&path, "connect").await {
            binding.note_refused(&path, "connect", &code);
            binding.emit(connection_event(&path[0], Some(&code), started));
            return refusal(StatusCode::FORBIDDEN, &code, "refused by the kernel");
        }
        let effect = binding.open_effect(&path, "connect", started);
        let timeout = self.limits.upstream_timeout;
        let tcp = match connect_tcp(&dest.host, dest.port, &dest.allow, timeout).await {
            Ok(tcp) => tcp,
            Err(e) => {
                let message = "the destination is not reachable";
                let why = (e.code(), StatusCode::BAD_GATEWAY, message);
                return refuse_authorized(&binding, (&path, effect), started, why).await;
            }
        };
        // The connection's slot goes to the tunnel only once it opens: a
        // refused CONNECT leaves the connection holding it.
        let Some(slot) = ctx.take_slot() else {
            let message = "one tunnel per connection";
            let why = ("egress_bad_request", StatusCode::BAD_REQUEST, message);
            return refuse_authorized(&binding, (&path, effect), started, why).await;
        };
        let upgrade = hyper::upgrade::on(&mut req);
        let tunnel = Tunnel {
            binding: Arc::clone(&binding),
            budget: self.budget,
            destination: dest.key,
            path,
            effect,
            started,
            stop: ctx.stop,
            _slot: slot,
        };
        tokio::spawn(tunnel.run(upgrade, tcp));
        Response::new(GatewayBody::empty())
    }
}

impl Gateway {
    /// A tunnel is a request of the turn, and its CONNECT head counts
    /// against the byte budget like every byte through it; `Err` names
    /// the budget spent.
    fn charge_tunnel(
        &self,
        binding: &TurnBinding,
        req: &Request<Incoming>,
    ) -> Result<(), &'static str> {
        self.take_request(binding)?;
        match binding.take_bytes(&self.budget, connect_head_bytes(req)) {
            true => Ok(()),
            false => Err("bytes"),
        }
    }
}

/// The bytes of a CONNECT request's head as the plugin sent it.
fn connect_head_bytes(req: &Request<Incoming>) -> u64 {
    let target = req.uri().to_string().len();
    let headers: usize = req
        .headers()
        .iter()
        .map(|(n, v)| n.as_str().len() + 2 + v.len() + 2)
        .sum();
    ("CONNECT  HTTP/1.1\r\n".len() + target + headers + 2) as u64
}

fn connection_event(destination: &str, code: Option<&str>, started: Instant) -> EgressEvent {
    EgressEvent::Connection {
        destination: destination.to_owned(),
        code: code.map(str::to_owned),
        bytes_up: 0,
        bytes_down: 0,
        duration_ms: started.elapsed().as_millis() as u64,
    }
}

/// A tunnel refused before the kernel's decision (or after it, when the
/// destination is unreachable): its event, its record, the answer.
async fn refuse_tunnel(
    binding: &TurnBinding,
    path: &[String],
    started: Instant,
    (code, status, message): (&str, StatusCode, &str),
) -> Response<GatewayBody> {
    let event = connection_event(&path[0], Some(code), started);
    let meta = meta_of(&event);
    binding.emit(event);
    binding.record(path, "connect", false, meta).await;
    refusal(status, code, message)
}

/// [`refuse_tunnel`] for a tunnel the kernel authorized: its open effect
/// ends here, unless the turn's end already wrote it.
async fn refuse_authorized(
    binding: &TurnBinding,
    (path, effect): (&[String], EffectId),
    started: Instant,
    why: (&str, StatusCode, &str),
) -> Response<GatewayBody> {
    if !binding.end_effect(effect) {
        return refusal(why.1, why.0, why.2);
    }
    refuse_tunnel(binding, path, started, why).await
}

/// One CONNECT tunnel once the gateway answered 200: it lives as long as
/// both ends do and the turn lasts, on a task of its own, holding its
/// connection's slot under the gateway's connection cap.
struct Tunnel {
    binding: Arc<TurnBinding>,
    budget: EgressBudget,
    destination: String,
    path: Vec<String>,
    /// Its open effect, ended with the tunnel.
    effect: EffectId,
    started: Instant,
    /// The turn's end (the serve's stop) closes the tunnel.
    stop: CancellationToken,
    _slot: OwnedSemaphorePermit,
}

impl Tunnel {
    /// Copies both ways until either end closes or the turn ends, then
    /// reports.
    async fn run(self, upgrade: hyper::upgrade::OnUpgrade, mut tcp: tokio::net::TcpStream) {
        let upgraded = tokio::select! {
            u = upgrade => u.map_err(|_| "upgrade_failed"),
            _ = self.stop.cancelled() => Err("turn_ended"),
        };
        let (code, up, down) = match upgraded {
            Ok(upgraded) => {
                let mut client = Metered {
                    inner: TokioIo::new(upgraded),
                    binding: Arc::clone(&self.binding),
                    budget: self.budget,
                    up: 0,
                    down: 0,
                    over: false,
                };
                let copied = tokio::select! {
                    c = tokio::io::copy_bidirectional(&mut client, &mut tcp) => Some(c),
                    _ = self.stop.cancelled() => None,
                };
                let code = match copied {
                    Some(Ok(_)) => None,
                    None => Some("turn_ended"),
                    Some(Err(_)) if client.over => Some("egress_budget_exceeded"),
                    Some(Err(_)) => Some("connection_reset"),
                };
                (code, client.up, client.down)
            }
            Err(code) => (Some(code), 0, 0),
        };
        let ok = code.is_none();
        let event = EgressEvent::Connection {
            destination: self.destination,
            code: code.map(str::to_owned),
            bytes_up: up,
            bytes_down: down,
            duration_ms: self.started.elapsed().as_millis() as u64,
        };
        // Ended with its turn already: its outcome is on the audit.
        if !self.binding.end_effect(self.effect) {
            return;
        }
        let meta = meta_of(&event);
        self.binding.emit(event);
        self.binding.record(&self.path, "connect", ok, meta).await;
    }
}

/// The client's side of a tunnel, counting the bytes both ways against the
/// turn's byte budget as they pass: over it, the tunnel is cut (the
/// copy fails) and the budget is reported spent, once.
struct Metered<S> {
    inner: S,
    binding: Arc<TurnBinding>,
    budget: EgressBudget,
    up: u64,
    down: u64,
    over: bool,
}

impl<S> Metered<S> {
    fn charge(&mut self, n: usize) -> std::io::Result<()> {
        if self.over || !self.binding.take_bytes(&self.budget, n as u64) {
            if !self.over {
                self.over = true;
                self.binding
                    .emit(EgressEvent::BudgetExceeded { budget: "bytes" });
            }
            return Err(std::io::Error::other("egress_budget_exceeded"));
        }
        Ok(())
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let n = buf.filled().len() - before;
            self.up += n as u64;
            self.charge(n)?;
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.over {
            return Poll::Ready(Err(std::io::Error::other("egress_budget_exceeded")));
        }
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = polled {
            self.down += n as u64;
            self.charge(n)?;
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
