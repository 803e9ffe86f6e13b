//! The bodies of the gateway's answers: a fixed one (refusals, tunnels)
//! or the upstream's answer passed through frame by frame as it arrives
//! (server-sent events are never buffered), metered on the way: bytes
//! against the turn's budget, token usage read as it passes, a deadline
//! per chunk. The upstream connection is driven from here, in the task
//! that writes the answer to the plugin, and goes back to its route's
//! pool once its answer was read to the end. The outcome (event and
//! audit record) is written before the plugin sees the answer end.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::{Response, StatusCode};
use serde_json::json;

use super::binding::{EffectId, EgressEvent, Outcome, TurnBinding};
use super::policy::EgressBudget;
use super::pool::{UpstreamConn, UpstreamPool};
use super::redact::{Redactor, redact_headers};
use super::route::Route;
use super::usage::UsageScanner;

/// The body of every answer the gateway gives.
pub enum GatewayBody {
    /// Known in full: a refusal, or the empty answer to a CONNECT.
    Fixed(Full<Bytes>),
    /// The upstream's answer, streaming.
    Metered(Box<MeteredBody>),
}

impl GatewayBody {
    pub(super) fn empty() -> Self {
        GatewayBody::Fixed(Full::new(Bytes::new()))
    }
}

impl Body for GatewayBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.get_mut() {
            GatewayBody::Fixed(full) => Pin::new(full)
                .poll_frame(cx)
                .map_err(|never| match never {}),
            GatewayBody::Metered(metered) => Pin::new(metered.as_mut()).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            GatewayBody::Fixed(full) => full.is_end_stream(),
            GatewayBody::Metered(metered) => metered.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            GatewayBody::Fixed(full) => full.size_hint(),
            GatewayBody::Metered(_) => SizeHint::default(),
        }
    }
}

/// A JSON error answer `{"error":{"code":..,"message":..}}`.
pub(super) fn refusal(status: StatusCode, code: &str, message: &str) -> Response<GatewayBody> {
    let body = json!({"error": {"code": code, "message": message, "type": "sharedos_egress"}});
    let mut resp = Response::new(GatewayBody::Fixed(Full::new(Bytes::from(body.to_string()))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

type Recording = Pin<Box<dyn Future<Output = ()> + Send>>;

enum Stage {
    Streaming,
    /// The outcome is being written; then `last` goes to the plugin (the
    /// final frame, the error that cuts the stream, or the end).
    Recording {
        /// `None` once written.
        record: Option<Recording>,
        last: Option<Result<Frame<Bytes>, std::io::Error>>,
        /// Whether hyper was given a turn to flush what it holds.
        flushed: bool,
    },
    Done,
}

/// What one request carries while its answer streams.
pub(super) struct Metering {
    pub(super) binding: Arc<TurnBinding>,
    /// The request's open effect, ended with the answer.
    pub(super) effect: EffectId,
    pub(super) route: Arc<Route>,
    pub(super) pool: Arc<UpstreamPool>,
    pub(super) budget: EgressBudget,
    pub(super) status: u16,
    pub(super) request_bytes: u64,
    /// The answer's head, already charged.
    pub(super) response_head: u64,
    pub(super) started: Instant,
    /// Each chunk must come within this.
    pub(super) timeout: Duration,
}

/// The upstream's answer on its way to the plugin.
pub struct MeteredBody {
    /// `None` once the answer ended.
    upstream: Option<Incoming>,
    /// Driven while the answer is read; `None` once given back or dropped.
    conn: Option<UpstreamConn>,
    m: Metering,
    scanner: UsageScanner,
    /// The route's key masked out of the answer.
    redactor: Redactor,
    response_bytes: u64,
    /// The first bytes of a failed answer as the plugin gets them
    /// (`Outcome::error_head`); `None` for a status below 400.
    error_head: Option<Vec<u8>>,
    /// The deadline of the chunk awaited; armed only while waiting.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    waiting: bool,
    stage: Stage,
}

impl MeteredBody {
    pub(super) fn new(upstream: Incoming, conn: UpstreamConn, m: Metering) -> Self {
        Self {
            upstream: Some(upstream),
            conn: Some(conn),
            redactor: Redactor::new(m.route.key_bytes.clone()),
            response_bytes: m.response_head,
            error_head: (m.status >= 400).then(Vec::new),
            m,
            scanner: UsageScanner::default(),
            deadline: None,
            waiting: false,
            stage: Stage::Streaming,
        }
    }

    /// Keeps the beginning of a failed answer, as the plugin gets it.
    fn keep_error_head(&mut self, shown: &[u8]) {
        if let Some(head) = &mut self.error_head {
            let room = super::binding::ERROR_HEAD_BYTES.saturating_sub(head.len());
            head.extend_from_slice(&shown[..room.min(shown.len())]);
        }
    }

    /// Whether the chunk awaited is overdue; arms its deadline when the
    /// wait begins.
    fn overdue(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.waiting {
            self.waiting = true;
            let at = tokio::time::Instant::now() + self.m.timeout;
            match &mut self.deadline {
                Some(sleep) => sleep.as_mut().reset(at),
                None => self.deadline = Some(Box::pin(tokio::time::sleep_until(at))),
            }
        }
        self.deadline
            .as_mut()
            .is_some_and(|sleep| sleep.as_mut().poll(cx).is_ready())
    }

    /// Ends the answer with `code` (`None`: read to its end) and starts
    /// writing its outcome; `last` follows once it is written.
    fn end(
        &mut self,
        code: Option<&'static str>,
        last: Option<Result<Frame<Bytes>, std::io::Error>>,
    ) {
        self.upstream = None;
        if let Some(conn) = self.conn.take()
            && code.is_none()
        {
            self.m.pool.put(&self.m.route.name, conn);
        }
        let usage = std::mem::take(&mut self.scanner).finish();
        // An answer that reports no usage is charged an estimate: one
        // token per four bytes both ways (docs/EGRESS.md, "Accounting").
        let estimated = match usage {
            Some(_) => None,
            None => Some((self.m.request_bytes + self.response_bytes).div_ceil(4)),
        };
        let tokens = usage.map_or(estimated.unwrap_or(0), |u| u.total());
        if self.m.binding.take_tokens(&self.m.budget, tokens) {
            self.m
                .binding
                .emit(EgressEvent::BudgetExceeded { budget: "tokens" });
        }
        let outcome = Outcome {
            status: Some(self.m.status),
            code: code.map(str::to_owned),
            request_bytes: self.m.request_bytes,
            response_bytes: self.response_bytes,
            usage,
            estimated_tokens: estimated,
            error_head: self.error_head.take(),
        };
        let record = self.m.binding.finish_request(
            (&self.m.route.path, self.m.effect),
            self.m.route.max_failures,
            outcome,
            self.m.started,
        );
        self.stage = Stage::Recording {
            record: Some(Box::pin(record)),
            last,
            flushed: false,
        };
    }

    /// One step of the upstream's answer: `None` when nothing came yet.
    fn pull(&mut self, cx: &mut Context<'_>) -> Option<Result<Frame<Bytes>, std::io::Error>> {
        if let Some(conn) = &mut self.conn {
            conn.drive(cx);
        }
        let polled = Pin::new(self.upstream.as_mut()?).poll_frame(cx);
        let frame = match polled {
            Poll::Pending => {
                if self.overdue(cx) {
                    self.end(Some("upstream_timeout"), Some(Err(cut("upstream_timeout"))));
                }
                return None;
            }
            Poll::Ready(None) => {
                // What was held as a possible beginning of the key was not.
                let held = self.redactor.finish();
                self.keep_error_head(&held);
                let last = (!held.is_empty()).then(|| Ok(Frame::data(held)));
                self.end(None, last);
                return None;
            }
            Poll::Ready(Some(Err(_))) => {
                self.end(
                    Some("upstream_stream_cut"),
                    Some(Err(cut("upstream_stream_cut"))),
                );
                return None;
            }
            Poll::Ready(Some(Ok(frame))) => frame,
        };
        self.waiting = false;
        let at_end = self.upstream.as_ref().is_none_or(|u| u.is_end_stream());
        let frame = match frame.into_data() {
            Ok(data) => {
                self.response_bytes += data.len() as u64;
                self.scanner.feed(&data);
                if !self.m.binding.take_bytes(&self.m.budget, data.len() as u64) {
                    self.m
                        .binding
                        .emit(EgressEvent::BudgetExceeded { budget: "bytes" });
                    let code = "egress_budget_exceeded";
                    self.end(Some(code), Some(Err(cut(code))));
                    return None;
                }
                let mut shown = self.redactor.feed(data);
                if at_end {
                    shown = [shown, self.redactor.finish()].concat().into();
                }
                self.keep_error_head(&shown);
                Frame::data(shown)
            }
            Err(mut other) => {
                if let Some(trailers) = other.trailers_mut() {
                    redact_headers(trailers, &self.m.route.key_bytes);
                }
                other
            }
        };
        if at_end {
            // The last frame of a sized answer: the plugin gets it once
            // the outcome is written (hyper may not ask for the end).
            self.end(None, Some(Ok(frame)));
            return None;
        }
        if frame.data_ref().is_some_and(|d| d.is_empty()) {
            // All of it may begin the key: held, and nothing to send (an
            // empty chunk would end a chunked answer); pull the next one.
            cx.waker().wake_by_ref();
            return None;
        }
        Some(Ok(frame))
    }
}

/// The error that cuts the plugin's stream: it sees no clean end.
fn cut(code: &'static str) -> std::io::Error {
    std::io::Error::other(code)
}

impl Body for MeteredBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = self.get_mut();
        loop {
            match &mut this.stage {
                Stage::Done => return Poll::Ready(None),
                Stage::Recording {
                    record,
                    last,
                    flushed,
                } => {
                    if let Some(writing) = record {
                        ready!(writing.as_mut().poll(cx));
                        *record = None;
                    }
                    if matches!(last, Some(Err(_))) && !*flushed {
                        // An error makes hyper drop the connection at once,
                        // with what it holds unsent: the head and the
                        // frames already passed go out first, so the plugin
                        // sees its stream cut, not a request unanswered.
                        *flushed = true;
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    let last = last.take();
                    this.stage = Stage::Done;
                    return Poll::Ready(last);
                }
                Stage::Streaming => match this.pull(cx) {
                    Some(frame) => return Poll::Ready(Some(frame)),
                    None if matches!(this.stage, Stage::Streaming) => return Poll::Pending,
                    None => continue,
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.stage, Stage::Done)
    }
}

impl Drop for MeteredBody {
    /// The plugin went away (or hyper needed no more of the answer): the
    /// outcome is still written, on a task of its own.
    fn drop(&mut self) {
        if matches!(self.stage, Stage::Streaming) {
            let read_all = self.upstream.as_ref().is_none_or(|u| u.is_end_stream());
            let code = if read_all {
                None
            } else {
                Some("client_closed")
            };
            self.end(code, None);
        }
        if let Stage::Recording {
            record: Some(record),
            ..
        } = std::mem::replace(&mut self.stage, Stage::Done)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(record);
        }
    }
}

#[cfg(test)]
#[path = "body_tests.rs"]
mod tests;
