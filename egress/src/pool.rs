//! Keep-alive upstream connections, per route: a connection whose answer
//! was read to its end goes back to its route's idle list and carries the
//! next request, so a model request pays the connect (and TLS) once, not
//! every time. Bounded: a few idle connections per route, each dropped
//! after a minute unused or once the upstream closed it.
//!
//! A connection has no task of its own: the task serving the plugin's
//! request drives it (the request, the answer's head and body) and hands
//! it back with both halves, so a request crosses no task on its way up
//! and back.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::io;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use hyper::body::Incoming;
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// Idle connections kept per route.
const MAX_IDLE_PER_ROUTE: usize = 16;
/// How long an idle connection is kept.
const IDLE_FOR: Duration = Duration::from_secs(60);
/// How long a kept connection may take to say it is ready again.
const READY_WITHIN: Duration = Duration::from_millis(100);

/// The byte stream of an upstream connection: plain TCP, or TLS over it.
pub(super) enum UpstreamIo {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_write(cx, b),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, b),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_flush(cx),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpstreamIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

type Driver = Connection<TokioIo<UpstreamIo>, Full<Bytes>>;

/// Why a request on a connection failed.
pub(super) enum SendError {
    /// The connection was closed before it took the request; the request
    /// is handed back, never sent.
    NotSent(Box<Request<Full<Bytes>>>),
    /// Anything else: the request may have reached the upstream.
    Failed,
}

/// One upstream HTTP/1.1 connection: the half that sends requests and the
/// half that moves the bytes, polled by whichever task uses it.
pub(super) struct UpstreamConn {
    sender: SendRequest<Full<Bytes>>,
    /// `None` once the connection ended.
    driver: Option<Driver>,
}

impl UpstreamConn {
    /// The HTTP/1.1 handshake over a fresh connection.
    pub(super) async fn handshake(io: UpstreamIo, timeout: Duration) -> Result<Self, &'static str> {
        let (sender, driver) = tokio::time::timeout(
            timeout,
            hyper::client::conn::http1::handshake(TokioIo::new(io)),
        )
        .await
        .map_err(|_| "upstream_timeout")?
        .map_err(|_| "upstream_unreachable")?;
        Ok(Self {
            sender,
            driver: Some(driver),
        })
    }

    /// Moves the connection's bytes; call before polling its answer.
    pub(super) fn drive(&mut self, cx: &mut Context<'_>) {
        if let Some(driver) = &mut self.driver
            && Pin::new(driver).poll(cx).is_ready()
        {
            // Ended (the upstream closed it, or it failed): dropping the
            // driver ends whatever still waits on it.
            self.driver = None;
        }
    }

    /// Whether it can carry another request.
    fn open(&self) -> bool {
        self.driver.is_some() && !self.sender.is_closed()
    }

    /// Ready for a request, driving it meanwhile; `false` once it ended.
    async fn ready(&mut self) -> bool {
        poll_fn(|cx| {
            self.drive(cx);
            if self.driver.is_none() {
                return Poll::Ready(false);
            }
            self.sender.poll_ready(cx).map(|r| r.is_ok())
        })
        .await
    }

    /// Sends `req` and waits for the answer's head, driving the
    /// connection meanwhile.
    pub(super) async fn send(
        &mut self,
        req: Request<Full<Bytes>>,
    ) -> Result<hyper::Response<Incoming>, SendError> {
        let mut answer = std::pin::pin!(self.sender.try_send_request(req));
        let driver = &mut self.driver;
        let result = poll_fn(|cx| {
            if let Some(d) = driver
                && Pin::new(d).poll(cx).is_ready()
            {
                *driver = None;
            }
            answer.as_mut().poll(cx)
        })
        .await;
        result.map_err(|mut e| match e.take_message() {
            Some(req) if e.error().is_canceled() || e.error().is_closed() => {
                SendError::NotSent(Box::new(req))
            }
            _ => SendError::Failed,
        })
    }
}

#[derive(Default)]
pub(super) struct UpstreamPool {
    idle: Mutex<HashMap<String, Vec<(UpstreamConn, Instant)>>>,
}

impl UpstreamPool {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<(UpstreamConn, Instant)>>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A kept connection of `route` that is open and ready, if any.
    pub(super) async fn take(&self, route: &str) -> Option<UpstreamConn> {
        loop {
            let (mut conn, since) = self.lock().get_mut(route)?.pop()?;
            if !conn.open() || since.elapsed() > IDLE_FOR {
                continue;
            }
            if let Ok(true) = tokio::time::timeout(READY_WITHIN, conn.ready()).await {
                return Some(conn);
            }
        }
    }

    /// Keeps a connection whose last answer was read to its end.
    pub(super) fn put(&self, route: &str, conn: UpstreamConn) {
        if !conn.open() {
            return;
        }
        let mut idle = self.lock();
        if let Some(list) = idle.get_mut(route) {
            list.retain(|(c, since)| c.open() && since.elapsed() <= IDLE_FOR);
            if list.len() < MAX_IDLE_PER_ROUTE {
                list.push((conn, Instant::now()));
            }
        } else {
            idle.insert(route.to_owned(), vec![(conn, Instant::now())]);
        }
    }
}
