//! `serve`'s connections: how many, for how long, and accepting them
//! without spinning.
//!
//! Each connection is in one [`Phase`]: idle (no request under way, nothing
//! received since the last one ended), reading a head (bytes of the next
//! request arrived), or busy (a request is being answered, its response
//! streamed). A watchdog closes a connection idle past `idleTimeoutMs`, or
//! whose head is not whole `headerReadTimeoutMs` after its first byte; a
//! busy one (a run's event stream) is never timed out. At `maxConnections`,
//! the connection idle (or reading a head) the longest is closed to make
//! room; when every one is busy the new connection is answered
//! `503 too_many_connections`. Accepting that fails for want of
//! descriptors or memory pauses (10 ms doubling to 1 s) instead of
//! spinning, and is reported at most once per 5 s (docs/SERVE.md).

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::limits::{ACCEPT_BACKOFF, ACCEPT_WARNING_INTERVAL};

/// The bounds of `[serve]` a connection is held to.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub header_read: Duration,
    pub idle: Duration,
    pub max_connections: usize,
}

/// Where one connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle(Instant),
    Head(Instant),
    Busy(usize),
    /// Closed to make room for a newer connection.
    Evicted,
}

/// One connection's phase, shared by its reader, its requests and its
/// watchdog.
pub struct Activity {
    phase: Mutex<Phase>,
    changed: Notify,
}

impl Activity {
    fn new() -> Self {
        Self {
            phase: Mutex::new(Phase::Idle(Instant::now())),
            changed: Notify::new(),
        }
    }

    fn update(&self, f: impl FnOnce(&mut Phase) -> bool) {
        let changed = f(&mut self.phase.lock().unwrap_or_else(|p| p.into_inner()));
        if changed {
            self.changed.notify_waiters();
        }
    }

    fn phase(&self) -> Phase {
        *self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes arrived: an idle connection starts reading a head.
    fn received(&self) {
        self.update(|p| match p {
            Phase::Idle(_) => {
                *p = Phase::Head(Instant::now());
                true
            }
            _ => false,
        });
    }

    /// A request begins; the connection is busy until the returned guard
    /// (held by the response's body) is dropped.
    pub fn begin(self: &Arc<Self>) -> RequestGuard {
        self.update(|p| {
            *p = match *p {
                Phase::Busy(n) => Phase::Busy(n + 1),
                Phase::Evicted => Phase::Evicted,
                _ => Phase::Busy(1),
            };
            true
        });
        RequestGuard(Arc::clone(self))
    }

    /// Waits until the connection must be closed: evicted, idle past
    /// `idle`, or a head not whole `header_read` after its first byte.
    pub async fn expired(&self, limits: &ConnLimits) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let deadline = match self.phase() {
                Phase::Evicted => return,
                Phase::Idle(since) => Some(since + limits.idle),
                Phase::Head(since) => Some(since + limits.header_read),
                Phase::Busy(_) => None,
            };
            match deadline {
                Some(at) if Instant::now() >= at => return,
                Some(at) => {
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }
}

/// Held while a request is under way (by its response's body).
pub struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.update(|p| {
            *p = match *p {
                Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
                Phase::Evicted => Phase::Evicted,
                _ => Phase::Idle(Instant::now()),
            };
            true
        });
    }
}

/// The open connections, at most `max`.
pub struct Connections {
    max: usize,
    next: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Activity>>>,
}

/// A connection's place among the open ones; it leaves them when dropped.
pub struct Slot {
    id: u64,
    pub activity: Arc<Activity>,
    connections: Arc<Connections>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.connections.lock().remove(&self.id);
    }
}

impl Connections {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            next: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Activity>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a new connection: free, or made by evicting the
    /// connection idle (or reading a head) the longest; `None` when every
    /// open connection is busy.
    pub fn admit(self: &Arc<Self>) -> Option<Slot> {
        let mut open = self.lock();
        if open.len() >= self.max {
            let oldest = open
                .iter()
                .filter_map(|(id, a)| match a.phase() {
                    Phase::Idle(since) | Phase::Head(since) => Some((since, *id)),
                    _ => None,
                })
                .min()?;
            if let Some(evicted) = open.remove(&oldest.1) {
                evicted.update(|p| {
                    *p = Phase::Evicted;
                    true
                });
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let activity = Arc::new(Activity::new());
        open.insert(id, Arc::clone(&activity));
        Some(Slot {
            id,
            activity,
            connections: Arc::clone(self),
        })
    }
}

/// A connection's stream that tells its [`Activity`] when bytes arrive.
pub struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Watched<S> {
    pub fn new(inner: S, activity: Arc<Activity>) -> Self {
        Self { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.received();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Whether a failed accept means the process (or system) ran out of
/// descriptors or memory: then accepting again at once would fail again.
fn exhausted(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// What the accept loop does after failures: pauses that double while
/// resources stay exhausted, warnings at a bounded rate.
pub struct AcceptBackoff {
    pause: Duration,
    last_warning: Option<Instant>,
    unreported: u64,
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        Self {
            pause: ACCEPT_BACKOFF.0,
            last_warning: None,
            unreported: 0,
        }
    }
}

impl AcceptBackoff {
    /// A connection was accepted: the next exhaustion pauses briefly again.
    pub fn accepted(&mut self) {
        self.pause = ACCEPT_BACKOFF.0;
    }

    /// Reports `e` (at most once per interval) and returns how long to
    /// pause before accepting again: nothing for a failure of one
    /// connection, a growing pause while descriptors or memory lack.
    pub fn failed(&mut self, e: &io::Error) -> Option<Duration> {
        self.unreported += 1;
        let now = Instant::now();
        if self
            .last_warning
            .is_none_or(|at| now.duration_since(at) >= ACCEPT_WARNING_INTERVAL)
        {
            eprintln!(
                "sharedos serve: accepting a connection failed: {e} ({} failures since the last report)",
                self.unreported
            );
            self.last_warning = Some(now);
            self.unreported = 0;
        }
        if !exhausted(e) {
            return None;
        }
        let pause = self.pause;
        self.pause = (self.pause * 2).min(ACCEPT_BACKOFF.1);
        Some(pause)
    }
}

/// The effective connection cap: `wanted`, unless the descriptor limit
/// (raised to its hard limit if need be) cannot hold it besides the
/// reserve; then the lower cap, reported on stderr.
pub fn connection_cap(wanted: usize) -> usize {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let reserve = crate::limits::RESERVED_DESCRIPTORS;
    let needed = wanted as u64 + reserve;
    let limit = getrlimit(Resource::Nofile);
    let Some(current) = limit.current else {
        return wanted;
    };
    if current >= needed {
        return wanted;
    }
    let raised = limit.maximum.map_or(needed, |max| max.min(needed));
    let raise = Rlimit {
        current: Some(raised),
        maximum: limit.maximum,
    };
    let now = match setrlimit(Resource::Nofile, raise) {
        Ok(()) => raised,
        Err(_) => current,
    };
    if now >= needed {
        return wanted;
    }
    let cap = usize::try_from(now.saturating_sub(reserve))
        .unwrap_or(wanted)
        .clamp(1, wanted);
    eprintln!(
        "sharedos serve: [serve] maxConnections = {wanted} does not fit the descriptor limit ({now}, {reserve} kept for runs and the store): at most {cap} connections are held open; raise `ulimit -n` to hold {wanted}"
    );
    cap
}
