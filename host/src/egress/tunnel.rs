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

use super::binding::{EgressEvent, TurnBinding, meta_of};
use super::body::{GatewayBody, refusal};
use super::gateway::Gateway;
use super::policy::{EgressBudget, split_host_port};
use super::upstream::connect_tcp;

impl Gateway {
    pub(super) async fn tunnel(
        &self,
        mut req: Request<Incoming>,
        binding: Arc<TurnBinding>,
    ) -> Response<GatewayBody> {
        let started = Instant::now();
        let asked = req
            .uri()
            .authority()
            .map(|a| a.as_str().to_owned())
            .unwrap_or_default();
        let normal = split_host_port(&asked, 0).map(|(h, p)| (format!("{h}:{p}"), h, p));
        let allowed = normal.as_ref().ok().and_then(|(key, h, p)| {
            self.destinations
                .get(key)
                .map(|a| (key.clone(), h.clone(), *p, a.clone()))
        });
        let path = vec![
            normal
                .as_ref()
                .map(|n| n.0.clone())
                .unwrap_or_else(|_| "invalid".into()),
        ];
        let refused = |code: &str| EgressEvent::Connection {
            destination: path[0].clone(),
            code: Some(code.to_owned()),
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: started.elapsed().as_millis() as u64,
        };
        let Some((key, host, port, allow)) = allowed else {
            let event = refused("egress_destination_unknown");
            let meta = meta_of(&event);
            binding.emit(event);
            binding.record(&path, "connect", false, meta).await;
            return refusal(
                StatusCode::FORBIDDEN,
                "egress_destination_unknown",
                "no such destination in this runtime's network policy",
            );
        };
        if let Err(code) = binding.authorize(&path, "connect").await {
            binding.emit(refused(&code));
            return refusal(StatusCode::FORBIDDEN, &code, "refused by the kernel");
        }
        let tcp = match connect_tcp(&host, port, &allow, self.limits.upstream_timeout).await {
            Ok(tcp) => tcp,
            Err(e) => {
                let event = refused(e.code());
                let meta = meta_of(&event);
                binding.emit(event);
                binding.record(&path, "connect", false, meta).await;
                return refusal(
                    StatusCode::BAD_GATEWAY,
                    e.code(),
                    "the destination is not reachable",
                );
            }
        };
        let upgrade = hyper::upgrade::on(&mut req);
        let tunnel = Tunnel {
            binding,
            budget: self.budget,
            destination: key,
            path,
            started,
        };
        tokio::spawn(tunnel.run(upgrade, tcp));
        Response::new(GatewayBody::empty())
    }
}

/// One CONNECT tunnel once the gateway answered 200: it lives as long as
/// both ends do, on a task of its own.
struct Tunnel {
    binding: Arc<TurnBinding>,
    budget: EgressBudget,
    destination: String,
    path: Vec<String>,
    started: Instant,
}

impl Tunnel {
    /// Copies both ways until either end closes, then reports.
    async fn run(self, upgrade: hyper::upgrade::OnUpgrade, mut tcp: tokio::net::TcpStream) {
        let (code, up, down) = match upgrade.await {
            Ok(upgraded) => {
                let mut client = Metered {
                    inner: TokioIo::new(upgraded),
                    binding: Arc::clone(&self.binding),
                    budget: self.budget,
                    up: 0,
                    down: 0,
                    over: false,
                };
                let copied = tokio::io::copy_bidirectional(&mut client, &mut tcp).await;
                let code = match copied {
                    Ok(_) => None,
                    Err(_) if client.over => Some("egress_budget_exceeded".to_owned()),
                    Err(_) => Some("connection_reset".to_owned()),
                };
                (code, client.up, client.down)
            }
            Err(_) => (Some("upgrade_failed".to_owned()), 0, 0),
        };
        let ok = code.is_none();
        let event = EgressEvent::Connection {
            destination: self.destination,
            code,
            bytes_up: up,
            bytes_down: down,
            duration_ms: self.started.elapsed().as_millis() as u64,
        };
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
