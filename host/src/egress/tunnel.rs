//! Destinations: `CONNECT host:port` to an entry of the policy, resolved
//! by the host, authorized by the kernel (`egress` / `[host:port]` /
//! `connect`), bytes copied both ways (TLS stays end to end), one event
//! and audit record per connection.

use std::sync::Arc;
use std::time::Instant;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use super::gateway::{EgressEvent, Gateway, GatewayBody, TurnBinding, refusal};
use super::policy::split_host_port;
use super::proxy::meta_of;
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
        tokio::spawn(async move {
            let (code, up, down) = match upgrade.await {
                Ok(upgraded) => {
                    let mut client = TokioIo::new(upgraded);
                    let mut tcp = tcp;
                    match tokio::io::copy_bidirectional(&mut client, &mut tcp).await {
                        Ok((up, down)) => (None, up, down),
                        Err(_) => (Some("connection_reset".to_owned()), 0, 0),
                    }
                }
                Err(_) => (Some("upgrade_failed".to_owned()), 0, 0),
            };
            let ok = code.is_none();
            let event = EgressEvent::Connection {
                destination: key,
                code,
                bytes_up: up,
                bytes_down: down,
                duration_ms: started.elapsed().as_millis() as u64,
            };
            let meta = meta_of(&event);
            binding.emit(event);
            binding.record(&path, "connect", ok, meta).await;
        });
        Response::new(
            http_body_util::Empty::<bytes::Bytes>::new()
                .map_err(|never| match never {})
                .boxed(),
        )
    }
}
