//! The peer's reader ([`Inbox`]): classifies every line the plugin writes
//! and hands what it accepts to its one consumer strictly in wire order,
//! with the framing, envelope and budget checks of protocol.md B and D.
//! It runs in the consumer's own task, pulled by [`Inbox::recv`]: a line
//! is read when the consumer asks for the next message, so a tool call
//! costs no hop from a reader task to the turn driver.
//!
//! Budgets: every line the plugin writes that is not an answer to the
//! host (notifications, requests of any method, taken or refused, and
//! empty lines) takes from one per-turn count, byte and rate budget, so no
//! kind of message passes uncounted. Handshake: with
//! `handshake_first`, nothing but the answer to a pending host request
//! (`initialize`) may come first; anything else is fatal.

use std::sync::Arc;
use std::time::Instant;

use futures_util::StreamExt;
use serde_json::value::RawValue;
use sharedos_protocol::jsonrpc::{self, Incoming, RequestId, WireError};
use sharedos_protocol::text::escape_text;
use sharedos_protocol::{ErrorKind, FrameError, NdjsonCodec};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::bytes::BytesMut;
use tokio_util::codec::{Decoder, FramedRead};

use super::peer::*;

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

/// A token bucket plus absolute count and byte budgets on the plugin's
/// notifications, requests and empty lines.
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
                "more than {} notifications and requests in one turn",
                c.notification_budget
            ));
        }
        if self.bytes > c.notification_bytes_budget {
            return Err(format!(
                "more than {} bytes of notifications and requests in one turn",
                c.notification_bytes_budget
            ));
        }
        if self.tokens < 1.0 {
            return Err(format!(
                "notifications and requests faster than {}/s (burst {})",
                c.notification_rate.0, c.notification_rate.1
            ));
        }
        self.tokens -= 1.0;
        Ok(())
    }
}

/// The plugin's messages, read on demand in the consumer's task (the turn
/// driver's). The last item is [`Inbound::Closed`]; `None` after it.
pub struct Inbox {
    framed: FramedRead<BoxRead, Sampling>,
    shared: Arc<Shared>,
    out: mpsc::Sender<String>,
    config: PeerConfig,
    permits: Arc<Semaphore>,
    budget: Budget,
    answered_first: bool,
    /// An answer the reader owes the plugin (`-32601`, `-32055`), sent
    /// before the next line is read: the plugin is answered in order and a
    /// full write queue holds the reader back (backpressure).
    owed: Option<String>,
    closed: bool,
}

/// One line's effect.
enum Step {
    Deliver(Inbound),
    /// Dropped, counted or answered by the reader itself.
    Next,
    Fatal(Violation),
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("closed", &self.closed)
            .finish()
    }
}

impl Inbox {
    pub(super) fn new(
        reader: BoxRead,
        out: mpsc::Sender<String>,
        shared: Arc<Shared>,
        config: PeerConfig,
    ) -> Self {
        Self {
            framed: FramedRead::new(reader, Sampling::new(config.max_message_bytes)),
            shared,
            out,
            permits: Arc::new(Semaphore::new(config.max_inflight_requests)),
            budget: Budget::new(&config),
            answered_first: !config.handshake_first,
            config,
            owed: None,
            closed: false,
        }
    }

    /// The next accepted message, in wire order. Cancel-safe: a message
    /// is taken from the pipe and handed out in one step, and an answer
    /// owed to the plugin is kept until it is queued.
    pub async fn recv(&mut self) -> Option<Inbound> {
        if self.closed {
            return None;
        }
        loop {
            if self.owed.is_some() {
                let Ok(slot) = self.out.reserve().await else {
                    let gone = Violation::new(ViolationReason::Io, "the writer has stopped");
                    return Some(self.close(gone));
                };
                if let Some(line) = self.owed.take() {
                    slot.send(line);
                }
            }
            let step = match self.framed.next().await {
                None => Step::Fatal(Violation::new(
                    ViolationReason::PluginExited,
                    "EOF on the plugin's stdout",
                )),
                Some(Err(e)) => Step::Fatal(self.frame_violation(e)),
                Some(Ok(line)) => self.take(&line),
            };
            match step {
                Step::Deliver(item) => return Some(item),
                Step::Next => {}
                Step::Fatal(v) => return Some(self.close(v)),
            }
        }
    }

    fn close(&mut self, v: Violation) -> Inbound {
        self.closed = true;
        Inbound::Closed(self.shared.fail(v))
    }

    fn frame_violation(&self, e: FrameError) -> Violation {
        let sample = &self.framed.decoder().sample;
        match e {
            FrameError::TooLarge { limit } => Violation::new(
                ViolationReason::FrameTooLarge,
                format!("a line exceeded {limit} bytes"),
            )
            .with_sample(sample),
            FrameError::InvalidUtf8 => {
                Violation::new(ViolationReason::InvalidUtf8, "a line is not valid UTF-8")
                    .with_sample(sample)
            }
            FrameError::Io(e) => Violation::new(
                ViolationReason::Io,
                format!("reading the plugin's stdout failed: {e}"),
            ),
        }
    }

    /// Applies one line: the handshake rule, the budgets, the envelope.
    fn take(&mut self, line: &str) -> Step {
        if !self.answered_first && !answers_pending(line, &self.shared) {
            return Step::Fatal(
                Violation::new(
                    ViolationReason::StdoutBeforeHandshake,
                    "the plugin wrote before answering initialize",
                )
                .with_sample(line.as_bytes()),
            );
        }
        self.answered_first = true;
        if line.trim().is_empty() {
            if let Err(why) = self.budget.take(line.len(), &self.config) {
                return Step::Fatal(Violation::new(ViolationReason::RateLimitExceeded, why));
            }
            return self.counted(EMPTY_LINE);
        }
        let msg = match jsonrpc::classify(line) {
            Ok(m) => m,
            Err(e) => {
                let reason = match e {
                    jsonrpc::EnvelopeError::InvalidJson => ViolationReason::InvalidJson,
                    jsonrpc::EnvelopeError::Batch => ViolationReason::BatchNotSupported,
                    jsonrpc::EnvelopeError::InvalidEnvelope(_) => ViolationReason::InvalidEnvelope,
                };
                return Step::Fatal(
                    Violation::new(reason, e.to_string()).with_sample(line.as_bytes()),
                );
            }
        };
        match msg {
            Incoming::Request { id, method, params } => {
                if let Err(why) = self.budget.take(line.len(), &self.config) {
                    return Step::Fatal(Violation::new(ViolationReason::RateLimitExceeded, why));
                }
                self.request(id, &method, params)
            }
            Incoming::Notification { method, params } => {
                if let Err(why) = self.budget.take(line.len(), &self.config) {
                    return Step::Fatal(Violation::new(ViolationReason::RateLimitExceeded, why));
                }
                self.notification(&method, params)
            }
            Incoming::Response { id, result } => {
                let known = match id {
                    RequestId::Number(n) => lock(&self.shared.outstanding).remove(&n).then_some(n),
                    RequestId::String(_) => None,
                };
                let Some(n) = known else {
                    return self.counted(UNKNOWN_RESPONSE_ID);
                };
                Step::Deliver(Inbound::Response {
                    id: n,
                    result: result.map(RawValue::to_owned),
                })
            }
        }
    }

    fn counted(&self, what: &str) -> Step {
        match self.shared.count(what) {
            Ok(()) => Step::Next,
            Err(v) => Step::Fatal(v),
        }
    }

    fn request(&mut self, id: RequestId, method: &str, params: Option<&RawValue>) -> Step {
        if lock(&self.shared.inflight).contains(&id) {
            return Step::Fatal(Violation::new(
                ViolationReason::DuplicateInflightId,
                format!("request id {id} reused while still in flight"),
            ));
        }
        let Some(method) = known(self.config.request_methods, method) else {
            if let Err(v) = self.shared.count(UNKNOWN_METHOD) {
                return Step::Fatal(v);
            }
            let err = WireError::new(ErrorKind::MethodNotFound, "method not found");
            self.owed = Some(jsonrpc::error_response(&id, &err));
            return Step::Next;
        };
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            let err = WireError::new(
                ErrorKind::Overloaded,
                "too many requests in flight; retry later",
            )
            .with("retryAfterMs", 100.into());
            self.owed = Some(jsonrpc::error_response(&id, &err));
            return Step::Next;
        };
        lock(&self.shared.inflight).insert(id.clone());
        let reply = Replier {
            id,
            shared: self.shared.clone(),
            out: self.out.clone(),
            _permit: Some(permit),
            answered: false,
        };
        Step::Deliver(Inbound::Request {
            method,
            params: params.map(RawValue::to_owned),
            reply,
        })
    }

    fn notification(&mut self, method: &str, params: Option<&RawValue>) -> Step {
        if known(self.config.request_methods, method).is_some() {
            // Never served (there is no id to answer), but never silent
            // either: logged, and counted like any dropped message.
            tracing::warn!(
                violation = REQUEST_WITHOUT_ID,
                "the plugin sent {} without an id (as a notification); it is not served",
                escape_text(method)
            );
            return self.counted(REQUEST_WITHOUT_ID);
        }
        let Some(method) = known(self.config.notification_methods, method) else {
            return self.counted(UNKNOWN_NOTIFICATION);
        };
        Step::Deliver(Inbound::Notification {
            method,
            params: params.map(RawValue::to_owned),
        })
    }
}

/// The configured name equal to `method` (no copy of the plugin's).
fn known(names: &'static [&'static str], method: &str) -> Option<&'static str> {
    names.iter().copied().find(|m| *m == method)
}

/// Whether `line` is a response to a request the host is waiting for (the
/// only line allowed before the handshake is done). The full
/// classification runs again after this check; this one only decides
/// whether the line may come first.
fn answers_pending(line: &str, shared: &Shared) -> bool {
    match jsonrpc::classify(line) {
        Ok(Incoming::Response {
            id: RequestId::Number(n),
            ..
        }) => lock(&shared.outstanding).contains(&n),
        _ => false,
    }
}
