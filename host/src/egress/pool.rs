//! Keep-alive upstream connections, per route: a connection whose answer
//! was read to its end goes back to its route's idle list and carries the
//! next request, so a model request pays the connect (and TLS) once, not
//! every time. Bounded: a few idle connections per route, each dropped
//! after a minute unused or once the upstream closed it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

/// The sending half of one upstream HTTP/1.1 connection.
pub(super) type Sender = SendRequest<Full<Bytes>>;

/// Idle connections kept per route.
const MAX_IDLE_PER_ROUTE: usize = 16;
/// How long an idle connection is kept.
const IDLE_FOR: Duration = Duration::from_secs(60);
/// How long a kept connection may take to say it is ready again.
const READY_WITHIN: Duration = Duration::from_millis(100);

#[derive(Default)]
pub(super) struct UpstreamPool {
    idle: Mutex<HashMap<String, Vec<(Sender, Instant)>>>,
}

impl UpstreamPool {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<(Sender, Instant)>>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A kept connection of `route` that is open and ready, if any.
    pub(super) async fn take(&self, route: &str) -> Option<Sender> {
        loop {
            let (mut sender, since) = self.lock().get_mut(route)?.pop()?;
            if sender.is_closed() || since.elapsed() > IDLE_FOR {
                continue;
            }
            if let Ok(Ok(())) = tokio::time::timeout(READY_WITHIN, sender.ready()).await {
                return Some(sender);
            }
        }
    }

    /// Keeps a connection whose last answer was read to its end.
    pub(super) fn put(&self, route: &str, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.lock();
        let list = idle.entry(route.to_owned()).or_default();
        list.retain(|(s, since)| !s.is_closed() && since.elapsed() <= IDLE_FOR);
        if list.len() < MAX_IDLE_PER_ROUTE {
            list.push((sender, Instant::now()));
        }
    }
}

/// The HTTP/1.1 handshake over a fresh connection; the connection runs on
/// a task of its own until both halves are dropped or the peer closes.
pub(super) async fn handshake<IO>(io: IO, timeout: Duration) -> Result<Sender, &'static str>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = tokio::time::timeout(
        timeout,
        hyper::client::conn::http1::handshake(TokioIo::new(io)),
    )
    .await
    .map_err(|_| "upstream_timeout")?
    .map_err(|_| "upstream_unreachable")?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}
