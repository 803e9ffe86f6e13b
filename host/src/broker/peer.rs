//! The bidirectional JSON-RPC peer over any `AsyncRead` + `AsyncWrite`
//! pair (protocol.md C.2). It never touches a file descriptor: the process
//! code hands it pipes, the tests hand it `tokio::io::duplex`.
//!
//! One reader task classifies every line and delivers what it accepts into
//! **one ordered queue** ([`Inbound`]): notifications, requests and the
//! responses to the host's own requests, in wire order. The consumer (the
//! turn driver) therefore applies an emit written before the `turn/run`
//! response before that response. One writer task drains a bounded queue
//! with a write-stall timeout.
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
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use serde_json::value::RawValue;
use sharedos_protocol::codec::escaped_sample;
use sharedos_protocol::jsonrpc::{self, Incoming, RequestId, WireError};
use sharedos_protocol::{ErrorKind, FrameError, NdjsonCodec};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_util::bytes::BytesMut;
use tokio_util::codec::{Decoder, FramedRead, FramedWrite};
use tokio_util::sync::CancellationToken;

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
    /// The ordered inbound queue. When full the reader waits, the pipe
    /// fills and the plugin blocks: natural backpressure.
    pub inbound_queue: usize,
    /// Semantic violations (dropped and counted) before the peer is killed.
    pub violation_budget: u32,
    /// Notifications (and empty lines) allowed in total.
    pub notification_budget: u64,
    /// Bytes of notifications allowed in total.
    pub notification_bytes_budget: u64,
    /// Token bucket on notifications: refill rate per second and burst.
    pub notification_rate: (u32, u32),
    /// Request methods the consumer serves; others get `-32601`.
    pub request_methods: &'static [&'static str],
    /// Notification methods the consumer takes; others are dropped.
    pub notification_methods: &'static [&'static str],
}

impl Default for PeerConfig {
    fn default() -> Self {
        Self {
            max_message_bytes: sharedos_protocol::DEFAULT_MAX_MESSAGE_BYTES,
            max_inflight_requests: 8,
            write_queue: 64,
            write_stall_timeout: Duration::from_secs(10),
            inbound_queue: 1024,
            violation_budget: 100,
            notification_budget: 100_000,
            notification_bytes_budget: 64 << 20,
            notification_rate: (2_000, 10_000),
            request_methods: &[],
            notification_methods: &[],
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
    fn with_sample(mut self, bytes: &[u8]) -> Self {
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

/// One accepted incoming message, in wire order.
#[derive(Debug)]
pub enum Inbound {
    /// A request to serve. Answer through `reply`; dropping it unanswered
    /// frees the id and the in-flight slot.
    Request {
        method: String,
        params: Option<Box<RawValue>>,
        reply: Replier,
    },
    Notification {
        method: String,
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

struct Shared {
    dead: CancellationToken,
    violation: Mutex<Option<Violation>>,
    outstanding: Mutex<HashSet<u64>>,
    inflight: Mutex<HashSet<RequestId>>,
    counted: AtomicU32,
    budget: u32,
    max_message_bytes: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// Records the first fatal violation and marks the peer dead.
    fn fail(&self, v: Violation) -> Violation {
        let mut slot = lock(&self.violation);
        if slot.is_none() {
            tracing::warn!(reason = v.reason.as_str(), sample = %v.sample, "plugin protocol violation: {}", v.detail);
            *slot = Some(v.clone());
        }
        self.dead.cancel();
        slot.clone().unwrap_or(v)
    }
    /// Counts a dropped message; `Err` once the budget is spent.
    fn count(&self, what: &str) -> Result<(), Violation> {
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
    id: RequestId,
    shared: Arc<Shared>,
    out: mpsc::Sender<String>,
    _permit: Option<OwnedSemaphorePermit>,
    answered: bool,
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

/// The host end of one connection. Dropping it stops both tasks.
pub struct Peer {
    shared: Arc<Shared>,
    out: mpsc::Sender<String>,
    next_id: u64,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Peer {
    /// Stops the reader at once. The writer is left to write what is
    /// already queued (a `turn/abort` queued just before the end, above
    /// all): it ends when the queue is empty and every sender is gone, when
    /// the plugin's stdin closes (the tree is killed), or at the write
    /// stall timeout.
    fn drop(&mut self) {
        for t in self.tasks.iter().skip(1) {
            t.abort();
        }
    }
}

impl Peer {
    /// Starts the reader and writer tasks (inside a tokio runtime).
    pub fn spawn<R, W>(reader: R, writer: W, config: PeerConfig) -> (Peer, mpsc::Receiver<Inbound>)
    where
        R: AsyncRead + Unpin + Send + 'static,
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
        let (in_tx, in_rx) = mpsc::channel(config.inbound_queue.max(1));
        let writer_task = tokio::spawn(write_loop(writer, out_rx, shared.clone(), config.clone()));
        let reader_task = tokio::spawn(read_loop(
            reader,
            in_tx,
            out_tx.clone(),
            shared.clone(),
            config,
        ));
        (
            Peer {
                shared,
                out: out_tx,
                next_id: 1,
                tasks: vec![writer_task, reader_task],
            },
            in_rx,
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

/// The NDJSON codec, keeping the first bytes of the line being decoded so
/// that a framing violation (too long, not UTF-8) can show what it saw.
/// A line always starts at the front of the buffer.
struct Sampling {
    inner: NdjsonCodec,
    sample: Vec<u8>,
}

impl Sampling {
    fn new(max: usize) -> Self {
        Self {
            inner: NdjsonCodec::new(max),
            sample: Vec::with_capacity(SAMPLE_BYTES + 1),
        }
    }
    fn keep(&mut self, src: &BytesMut) {
        let head = &src[..src.len().min(SAMPLE_BYTES + 1)];
        let line = head
            .iter()
            .position(|b| *b == b'\n')
            .map_or(head, |nl| &head[..nl]);
        self.sample.clear();
        self.sample.extend_from_slice(line);
    }
}

impl Decoder for Sampling {
    type Item = String;
    type Error = FrameError;
    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<String>, FrameError> {
        self.keep(src);
        self.inner.decode(src)
    }
    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<String>, FrameError> {
        self.keep(src);
        self.inner.decode_eof(src)
    }
}

/// A token bucket plus absolute count and byte budgets on notifications.
struct Budget {
    tokens: f64,
    rate: f64,
    burst: f64,
    last: Instant,
    count: u64,
    bytes: u64,
}

impl Budget {
    fn new(c: &PeerConfig) -> Self {
        let (rate, burst) = c.notification_rate;
        Self {
            tokens: f64::from(burst),
            rate: f64::from(rate),
            burst: f64::from(burst),
            last: Instant::now(),
            count: 0,
            bytes: 0,
        }
    }
    fn take(&mut self, len: usize, c: &PeerConfig) -> Result<(), String> {
        let now = Instant::now();
        self.tokens =
            (self.tokens + now.duration_since(self.last).as_secs_f64() * self.rate).min(self.burst);
        self.last = now;
        self.count += 1;
        self.bytes += len as u64;
        if self.count > c.notification_budget {
            return Err(format!(
                "more than {} notifications in one turn",
                c.notification_budget
            ));
        }
        if self.bytes > c.notification_bytes_budget {
            return Err(format!(
                "more than {} bytes of notifications in one turn",
                c.notification_bytes_budget
            ));
        }
        if self.tokens < 1.0 {
            return Err(format!(
                "notifications faster than {}/s (burst {})",
                c.notification_rate.0, c.notification_rate.1
            ));
        }
        self.tokens -= 1.0;
        Ok(())
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    reader: R,
    tx: mpsc::Sender<Inbound>,
    out: mpsc::Sender<String>,
    shared: Arc<Shared>,
    config: PeerConfig,
) {
    let violation = read_until_fatal(reader, &tx, &out, &shared, &config).await;
    let v = shared.fail(violation);
    // The consumer may be gone already; nothing else to do then.
    let _ = tx.send(Inbound::Closed(v)).await;
}

async fn read_until_fatal<R: AsyncRead + Unpin>(
    reader: R,
    tx: &mpsc::Sender<Inbound>,
    out: &mpsc::Sender<String>,
    shared: &Arc<Shared>,
    config: &PeerConfig,
) -> Violation {
    let mut framed = FramedRead::new(reader, Sampling::new(config.max_message_bytes));
    let permits = Arc::new(Semaphore::new(config.max_inflight_requests));
    let mut budget = Budget::new(config);
    let consumer_gone = || Violation::new(ViolationReason::Io, "the consumer has stopped");
    loop {
        let line = match framed.next().await {
            None => {
                return Violation::new(ViolationReason::PluginExited, "EOF on the plugin's stdout");
            }
            Some(Err(FrameError::TooLarge { limit })) => {
                return Violation::new(
                    ViolationReason::FrameTooLarge,
                    format!("a line exceeded {limit} bytes"),
                )
                .with_sample(&framed.decoder().sample);
            }
            Some(Err(FrameError::InvalidUtf8)) => {
                return Violation::new(ViolationReason::InvalidUtf8, "a line is not valid UTF-8")
                    .with_sample(&framed.decoder().sample);
            }
            Some(Err(FrameError::Io(e))) => {
                return Violation::new(
                    ViolationReason::Io,
                    format!("reading the plugin's stdout failed: {e}"),
                );
            }
            Some(Ok(line)) => line,
        };
        if line.trim().is_empty() {
            if let Err(why) = budget.take(line.len(), config) {
                return Violation::new(ViolationReason::RateLimitExceeded, why);
            }
            if let Err(v) = shared.count(EMPTY_LINE) {
                return v;
            }
            continue;
        }
        let msg = match jsonrpc::classify(&line) {
            Ok(m) => m,
            Err(e) => {
                let reason = match e {
                    jsonrpc::EnvelopeError::InvalidJson => ViolationReason::InvalidJson,
                    jsonrpc::EnvelopeError::Batch => ViolationReason::BatchNotSupported,
                    jsonrpc::EnvelopeError::InvalidEnvelope(_) => ViolationReason::InvalidEnvelope,
                };
                return Violation::new(reason, e.to_string()).with_sample(line.as_bytes());
            }
        };
        match msg {
            Incoming::Request { id, method, params } => {
                if lock(&shared.inflight).contains(&id) {
                    return Violation::new(
                        ViolationReason::DuplicateInflightId,
                        format!("request id {id} reused while still in flight"),
                    );
                }
                if !config.request_methods.contains(&method.as_ref()) {
                    if let Err(v) = shared.count(UNKNOWN_METHOD) {
                        return v;
                    }
                    let err = WireError::new(ErrorKind::MethodNotFound, "method not found");
                    if out.send(jsonrpc::error_response(&id, &err)).await.is_err() {
                        return consumer_gone();
                    }
                    continue;
                }
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    let err = WireError::new(
                        ErrorKind::Overloaded,
                        "too many requests in flight; retry later",
                    )
                    .with("retryAfterMs", 100.into());
                    if out.send(jsonrpc::error_response(&id, &err)).await.is_err() {
                        return consumer_gone();
                    }
                    continue;
                };
                lock(&shared.inflight).insert(id.clone());
                let reply = Replier {
                    id,
                    shared: shared.clone(),
                    out: out.clone(),
                    _permit: Some(permit),
                    answered: false,
                };
                let item = Inbound::Request {
                    method: method.into_owned(),
                    params: params.map(RawValue::to_owned),
                    reply,
                };
                if tx.send(item).await.is_err() {
                    return consumer_gone();
                }
            }
            Incoming::Notification { method, params } => {
                if let Err(why) = budget.take(line.len(), config) {
                    return Violation::new(ViolationReason::RateLimitExceeded, why);
                }
                if !config.notification_methods.contains(&method.as_ref()) {
                    if let Err(v) = shared.count(UNKNOWN_NOTIFICATION) {
                        return v;
                    }
                    continue;
                }
                let item = Inbound::Notification {
                    method: method.into_owned(),
                    params: params.map(RawValue::to_owned),
                };
                if tx.send(item).await.is_err() {
                    return consumer_gone();
                }
            }
            Incoming::Response { id, result } => {
                let known = match id {
                    RequestId::Number(n) => lock(&shared.outstanding).remove(&n).then_some(n),
                    RequestId::String(_) => None,
                };
                let Some(n) = known else {
                    if let Err(v) = shared.count(UNKNOWN_RESPONSE_ID) {
                        return v;
                    }
                    continue;
                };
                let item = Inbound::Response {
                    id: n,
                    result: result.map(RawValue::to_owned),
                };
                if tx.send(item).await.is_err() {
                    return consumer_gone();
                }
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
