//! The peer's reader: one task that classifies every line the plugin
//! writes and applies it strictly in wire order, with the framing,
//! envelope and budget checks of protocol.md B and D.
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
use tokio::io::AsyncRead;
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

pub(super) async fn read_loop<R: AsyncRead + Unpin>(
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
    let mut answered_first = !config.handshake_first;
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
        if !answered_first && !answers_pending(&line, shared) {
            return Violation::new(
                ViolationReason::StdoutBeforeHandshake,
                "the plugin wrote before answering initialize",
            )
            .with_sample(line.as_bytes());
        }
        answered_first = true;
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
                if let Err(why) = budget.take(line.len(), config) {
                    return Violation::new(ViolationReason::RateLimitExceeded, why);
                }
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
                if config.request_methods.contains(&method.as_ref()) {
                    // Never served (there is no id to answer), but never
                    // silent either: logged, and counted like any dropped
                    // message.
                    tracing::warn!(
                        violation = REQUEST_WITHOUT_ID,
                        "the plugin sent {} without an id (as a notification); it is not served",
                        escape_text(&method)
                    );
                    if let Err(v) = shared.count(REQUEST_WITHOUT_ID) {
                        return v;
                    }
                    continue;
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
