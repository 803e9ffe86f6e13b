//! The bidirectional JSON-RPC peer over any `AsyncRead` + `AsyncWrite`
//! pair (protocol.md C.2). It never touches a file descriptor: the process
//! code hands it pipes, the tests hand it `tokio::io::duplex`.
//!
//! The reader ([`Inbox`]) classifies every line and hands what it accepts
//! to its consumer as **one ordered sequence** ([`Inbound`]):
//! notifications, requests and the responses to the host's own requests,
//! in wire order. It runs in the consumer's task (the turn driver's), so a
//! message reaches the driver without a hop between tasks; the driver
//! therefore applies an emit written before the `turn/run` response before
//! that response. One writer task drains a bounded queue with a
//! write-stall timeout, writing everything queued in one go.
//!
//! Policy (protocol.md B.6, D): framing, UTF-8 and envelope violations are
//! fatal; the peer records a typed [`Violation`] with an escaped, truncated
//! sample and stops. Unknown notification methods and responses to ids not
//! pending are dropped and counted against a budget. Unknown request
//! methods get `-32601`; requests over the in-flight cap get `-32055`
//! without being delivered; a request id reused while in flight is fatal.
//!
//! jsonrpsee: the error objects we send are built as
//! `jsonrpsee_types::ErrorObjectOwned` (see [`rpc_error`]). Incoming
//! requests are *not* dispatched through `RpcModule`/`raw_json_request`:
//! that re-parses the line with a second, laxer parser (it accepts
//! `id:null` and lets the envelope check and the dispatch disagree, the
//! differential-parsing hazard of protocol.md D #16), it cannot see our
//! in-flight accounting, and the only P→H request (`host/invokeTool`) needs
//! the per-turn `RuntimeHost`, which the turn driver owns. The typed parse
//! of params is the same `serde_json` parse `Params::parse` would run.

use std::collections::HashSet;
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::SinkExt;
use serde::Serialize;
use serde_json::value::RawValue;
use sharedos_protocol::codec::escaped_sample;
use sharedos_protocol::jsonrpc::{self, RequestId, WireError};
use sharedos_protocol::text::escape_text;
use sharedos_protocol::{ErrorKind, FrameError, NdjsonCodec};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_util::codec::FramedWrite;
use tokio_util::sync::CancellationToken;

pub use super::read::Inbox;

/// Bytes of a hostile line kept (escaped) in a violation.
pub const SAMPLE_BYTES: usize = 200;

/// Limits of one peer. One peer serves one process, which serves one turn,
/// so every budget here is per turn.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// One line, either direction.
    pub max_message_bytes: usize,
    /// Incoming requests in flight at once; more get `-32055`.
    pub max_inflight_requests: usize,
    /// Lines queued for the writer.
    pub write_queue: usize,
    /// A write that makes no progress for this long is fatal.
    pub write_stall_timeout: Duration,
    /// Semantic violations (dropped and counted) before the peer is killed.
    pub violation_budget: u32,
    /// Notifications, requests and empty lines allowed in total.
    pub notification_budget: u64,
    /// Bytes of notifications, requests and empty lines allowed in total.
    pub notification_bytes_budget: u64,
    /// Token bucket on notifications, requests and empty lines: refill
    /// rate per second and burst.
    pub notification_rate: (u32, u32),
    /// Request methods the consumer serves; others get `-32601`.
    pub request_methods: &'static [&'static str],
    /// Notification methods the consumer takes; others are dropped.
    pub notification_methods: &'static [&'static str],
    /// The plugin speaks only after answering the host's first request
    /// (`initialize`): until a response to a pending host request is
    /// read, any other line is fatal (`stdout_before_handshake`).
    pub handshake_first: bool,
}

impl Default for PeerConfig {
    fn default() -> Self {
        Self {
            max_message_bytes: sharedos_protocol::DEFAULT_MAX_MESSAGE_BYTES,
            max_inflight_requests: 8,
            write_queue: 64,
            write_stall_timeout: Duration::from_secs(10),
            violation_budget: 100,
            notification_budget: 100_000,
            notification_bytes_budget: 64 << 20,
            notification_rate: (2_000, 10_000),
            request_methods: &[],
            notification_methods: &[],
            handshake_first: false,
        }
    }
}

/// Host-side violation reasons (protocol.md B.6). Never sent on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViolationReason {
    FrameTooLarge,
    InvalidUtf8,
    InvalidJson,
    InvalidEnvelope,
    BatchNotSupported,
    DuplicateInflightId,
    RateLimitExceeded,
    WriteStall,
    ViolationBudgetExceeded,
    /// A line before the answer to `initialize`.
    StdoutBeforeHandshake,
    /// EOF on the plugin's stdout, or the process exited.
    PluginExited,
    Io,
}

impl ViolationReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ViolationReason::FrameTooLarge => "frame_too_large",
            ViolationReason::InvalidUtf8 => "invalid_utf8",
            ViolationReason::InvalidJson => "invalid_json",
            ViolationReason::InvalidEnvelope => "invalid_envelope",
            ViolationReason::BatchNotSupported => "batch_not_supported",
            ViolationReason::DuplicateInflightId => "duplicate_inflight_id",
            ViolationReason::RateLimitExceeded => "rate_limit_exceeded",
            ViolationReason::WriteStall => "write_stall",
            ViolationReason::ViolationBudgetExceeded => "violation_budget_exceeded",
            ViolationReason::StdoutBeforeHandshake => "stdout_before_handshake",
            ViolationReason::PluginExited => "plugin_exited",
            ViolationReason::Io => "io",
        }
    }
}

/// A fatal violation: the reason, what happened, and an escaped sample of
/// the offending bytes (at most [`SAMPLE_BYTES`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub reason: ViolationReason,
    pub detail: String,
    pub sample: String,
}

impl Violation {
    pub fn new(reason: ViolationReason, detail: impl Into<String>) -> Self {
        Self {
            reason,
            detail: detail.into(),
            sample: String::new(),
        }
    }
    pub(super) fn with_sample(mut self, bytes: &[u8]) -> Self {
        self.sample = escaped_sample(bytes, SAMPLE_BYTES);
        self
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason.as_str(), self.detail)?;
        if !self.sample.is_empty() {
            write!(f, " (sample: {})", self.sample)?;
        }
        Ok(())
    }
}

/// Counted (non-fatal) semantic violations, by reason.
pub const UNKNOWN_RESPONSE_ID: &str = "unknown_response_id";
pub const UNKNOWN_NOTIFICATION: &str = "unknown_notification";
pub const UNKNOWN_METHOD: &str = "method_not_found";
pub const EMPTY_LINE: &str = "empty_line";
/// A request method sent without an id (as a notification): never served.
pub const REQUEST_WITHOUT_ID: &str = "request_without_id";

/// One accepted incoming message, in wire order.
#[derive(Debug)]
pub enum Inbound {
    /// A request to serve. Answer through `reply`; dropping it unanswered
    /// frees the id and the in-flight slot.
    Request {
        /// One of the configured `request_methods`.
        method: &'static str,
        params: Option<Box<RawValue>>,
        reply: Replier,
    },
    Notification {
        /// One of the configured `notification_methods`.
        method: &'static str,
        params: Option<Box<RawValue>>,
    },
    /// The answer to one of the host's own requests.
    Response {
        id: u64,
        result: Result<Box<RawValue>, WireError>,
    },
    /// The last item: the reader stopped (a fatal violation or EOF).
    Closed(Violation),
}

pub(super) struct Shared {
    pub(super) dead: CancellationToken,
    pub(super) violation: Mutex<Option<Violation>>,
    pub(super) outstanding: Mutex<HashSet<u64>>,
    pub(super) inflight: Mutex<HashSet<RequestId>>,
    pub(super) counted: AtomicU32,
    pub(super) budget: u32,
    pub(super) max_message_bytes: usize,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// Records the first fatal violation and marks the peer dead.
    pub(super) fn fail(&self, v: Violation) -> Violation {
        let mut slot = lock(&self.violation);
        if slot.is_none() {
            tracing::warn!(reason = v.reason.as_str(), sample = %v.sample, "plugin protocol violation: {}", escape_text(&v.detail));
            *slot = Some(v.clone());
        }
        self.dead.cancel();
        slot.clone().unwrap_or(v)
    }
    /// Counts a dropped message; `Err` once the budget is spent.
    pub(super) fn count(&self, what: &str) -> Result<(), Violation> {
        let n = self.counted.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::debug!(violation = what, count = n, "plugin message dropped");
        if n > self.budget {
            return Err(self.fail(Violation::new(
                ViolationReason::ViolationBudgetExceeded,
                format!("more than {} dropped messages (last: {what})", self.budget),
            )));
        }
        Ok(())
    }
}

/// The answer slot of one incoming request.
pub struct Replier {
    pub(super) id: RequestId,
    pub(super) shared: Arc<Shared>,
    pub(super) out: mpsc::Sender<String>,
    pub(super) _permit: Option<OwnedSemaphorePermit>,
    pub(super) answered: bool,
}

impl fmt::Debug for Replier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replier").field("id", &self.id).finish()
    }
}

impl Replier {
    pub fn id(&self) -> &RequestId {
        &self.id
    }
    /// Sends a result, or `-32057` if it would exceed the line limit.
    pub async fn result(mut self, value: &impl Serialize) -> Result<(), Violation> {
        let line = match jsonrpc::response(&self.id, value) {
            Ok(l) if l.len() <= self.shared.max_message_bytes => l,
            Ok(_) => jsonrpc::error_response(
                &self.id,
                &WireError::new(
                    ErrorKind::MessageTooLarge,
                    "the response exceeds maxMessageBytes",
                )
                .with("limit", self.shared.max_message_bytes.into()),
            ),
            Err(_) => jsonrpc::error_response(
                &self.id,
                &WireError::new(ErrorKind::Internal, "unserializable result"),
            ),
        };
        self.finish(line).await
    }
    pub async fn error(mut self, error: &WireError) -> Result<(), Violation> {
        let line = jsonrpc::error_response(&self.id, error);
        self.finish(line).await
    }
    /// Sends an error without waiting for queue space (used right before
    /// a kill); `false` if it could not be queued.
    pub fn try_error(mut self, error: &WireError) -> bool {
        self.release();
        self.out
            .try_send(jsonrpc::error_response(&self.id, error))
            .is_ok()
    }
    async fn finish(&mut self, line: String) -> Result<(), Violation> {
        self.release();
        self.out
            .send(line)
            .await
            .map_err(|_| Violation::new(ViolationReason::Io, "the writer has stopped"))
    }
    fn release(&mut self) {
        if !self.answered {
            self.answered = true;
            lock(&self.shared.inflight).remove(&self.id);
        }
    }
}

impl Drop for Replier {
    fn drop(&mut self) {
        self.release();
    }
}

/// The host end of one connection; its messages come from the [`Inbox`]
/// it was spawned with. Dropping the inbox stops the reading. The writer is
/// left to write what is already queued (a `turn/abort` queued just before
/// the end, above all): it ends when the queue is empty and every sender
/// is gone, when the plugin's stdin closes (the tree is killed), or at the
/// write stall timeout.
pub struct Peer {
    shared: Arc<Shared>,
    out: mpsc::Sender<String>,
    next_id: u64,
}

/// The plugin's stdout, as the reader holds it.
pub(super) type BoxRead = Pin<Box<dyn AsyncRead + Send>>;

impl Peer {
    /// Starts the writer task (inside a tokio runtime) and returns the
    /// reader, which its consumer pulls.
    pub fn spawn<R, W>(reader: R, writer: W, config: PeerConfig) -> (Peer, Inbox)
    where
        R: AsyncRead + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let shared = Arc::new(Shared {
            dead: CancellationToken::new(),
            violation: Mutex::new(None),
            outstanding: Mutex::new(HashSet::new()),
            inflight: Mutex::new(HashSet::new()),
            counted: AtomicU32::new(0),
            budget: config.violation_budget,
            max_message_bytes: config.max_message_bytes,
        });
        let (out_tx, out_rx) = mpsc::channel(config.write_queue.max(1));
        // Not joined: it ends on its own (see `Peer`).
        drop(tokio::spawn(write_loop(
            writer,
            out_rx,
            shared.clone(),
            config.clone(),
        )));
        let inbox = Inbox::new(Box::pin(reader), out_tx.clone(), shared.clone(), config);
        (
            Peer {
                shared,
                out: out_tx,
                next_id: 1,
            },
            inbox,
        )
    }

    /// Sends a request; its answer arrives as [`Inbound::Response`] in wire
    /// order. Returns the id, to be passed to [`Peer::forget`] on timeout.
    pub async fn request(
        &mut self,
        method: &str,
        params: &impl Serialize,
    ) -> Result<u64, Violation> {
        let id = self.next_id;
        self.next_id += 1;
        let line = jsonrpc::request(&RequestId::Number(id), method, params).map_err(|e| {
            Violation::new(ViolationReason::Io, format!("cannot encode {method}: {e}"))
        })?;
        lock(&self.shared.outstanding).insert(id);
        self.send_line(line).await?;
        Ok(id)
    }

    /// Stops waiting for a request: a late answer is an unknown id.
    pub fn forget(&self, id: u64) {
        lock(&self.shared.outstanding).remove(&id);
    }

    /// Sends a notification and waits for queue space.
    pub async fn notify(&self, method: &str, params: &impl Serialize) -> Result<(), Violation> {
        let line = jsonrpc::notification(method, params).map_err(|e| {
            Violation::new(ViolationReason::Io, format!("cannot encode {method}: {e}"))
        })?;
        self.send_line(line).await
    }

    /// Queues a notification if there is room; control messages sent just
    /// before a kill must never wait on a plugin that does not read.
    pub fn try_notify(&self, method: &str, params: &impl Serialize) -> bool {
        match jsonrpc::notification(method, params) {
            Ok(line) => self.out.try_send(line).is_ok(),
            Err(_) => false,
        }
    }

    async fn send_line(&self, line: String) -> Result<(), Violation> {
        if line.len() > self.shared.max_message_bytes {
            return Err(Violation::new(
                ViolationReason::FrameTooLarge,
                format!(
                    "an outgoing message of {} bytes exceeds maxMessageBytes",
                    line.len()
                ),
            ));
        }
        self.out.send(line).await.map_err(|_| self.stopped())
    }

    fn stopped(&self) -> Violation {
        self.violation()
            .unwrap_or_else(|| Violation::new(ViolationReason::Io, "the peer has stopped"))
    }

    /// Counts a semantic violation found by the consumer (a bad emit, a
    /// bad annotate); `Err` once the budget is spent (then fatal).
    pub fn count_violation(&self, what: &str) -> Result<(), Violation> {
        self.shared.count(what)
    }

    /// Dropped-and-counted messages so far.
    pub fn violations_counted(&self) -> u32 {
        self.shared.counted.load(Ordering::Relaxed)
    }

    /// Marks the peer dead with a violation found by the consumer.
    pub fn fail(&self, v: Violation) -> Violation {
        self.shared.fail(v)
    }

    /// The first fatal violation, if any.
    pub fn violation(&self) -> Option<Violation> {
        lock(&self.shared.violation).clone()
    }

    /// Resolves once the peer is dead (a fatal violation in either task).
    pub async fn dead(&self) -> Violation {
        self.shared.dead.cancelled().await;
        self.stopped()
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    writer: W,
    mut rx: mpsc::Receiver<String>,
    shared: Arc<Shared>,
    config: PeerConfig,
) {
    let mut framed = FramedWrite::new(writer, NdjsonCodec::new(config.max_message_bytes));
    while let Some(line) = rx.recv().await {
        let write = async {
            framed.feed(line).await?;
            // Batch whatever else is queued into one flush.
            while let Ok(more) = rx.try_recv() {
                framed.feed(more).await?;
            }
            SinkExt::<String>::flush(&mut framed).await
        };
        match tokio::time::timeout(config.write_stall_timeout, write).await {
            Ok(Ok(())) => {}
            Ok(Err(FrameError::Io(e))) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                shared.fail(Violation::new(
                    ViolationReason::PluginExited,
                    "the plugin closed its stdin (it exited or closed the pipe)",
                ));
                return;
            }
            Ok(Err(e)) => {
                shared.fail(Violation::new(
                    ViolationReason::Io,
                    format!("writing to the plugin failed: {e}"),
                ));
                return;
            }
            Err(_) => {
                shared.fail(Violation::new(
                    ViolationReason::WriteStall,
                    format!(
                        "the plugin did not read its stdin for {:?}",
                        config.write_stall_timeout
                    ),
                ));
                return;
            }
        }
    }
}

/// A `jsonrpsee` error object with `data.kind`, for callers that want the
/// jsonrpsee type; [`WireError`] is what goes on the wire.
pub fn rpc_error(kind: ErrorKind, message: &str) -> jsonrpsee_types::ErrorObjectOwned {
    jsonrpsee_types::ErrorObject::owned(
        kind.code().code(),
        message,
        Some(serde_json::json!({ "kind": kind.as_str() })),
    )
}

/// Converts a jsonrpsee error object into the wire form.
pub fn wire_error(e: &jsonrpsee_types::ErrorObjectOwned) -> WireError {
    WireError {
        code: i64::from(e.code()),
        message: e.message().to_owned(),
        data: e.data().and_then(|d| serde_json::from_str(d.get()).ok()),
    }
}
