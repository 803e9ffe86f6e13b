//! The peer's reader ([`Inbox`]): classifies every line the other end
//! writes and hands what it accepts to its one consumer strictly in wire
//! order, with the framing, envelope and budget checks of protocol.md B
//! and D. It runs in the consumer's own task, pulled by [`Inbox::recv`]: a
//! line is read when the consumer asks for the next message, so a tool
//! call costs no hop from a reader task to the turn driver. Answers to
//! [`crate::Peer::call`] go straight to their caller instead.
//!
//! Budgets: every line that is not an answer (notifications, requests of
//! any method, taken or refused, and empty lines) takes from one count,
//! byte and rate budget ([`crate::budget`]), so no kind of message passes
//! uncounted. Handshake: with `handshake_first`, nothing but the answer to
//! a pending request (`initialize`) may come first; anything else is fatal.

use std::sync::Arc;

use serde_json::value::RawValue;
use sharedos_protocol::jsonrpc::{self, Incoming, Params, RequestId, WireError};
use sharedos_protocol::method::{Received, Side, to_host, to_plugin};
use sharedos_protocol::text::escape_text;
use sharedos_protocol::{ErrorKind, FrameError, InvokeToolParams};
use tokio::sync::{Semaphore, mpsc};

use crate::budget::Budget;
use crate::config::PeerConfig;
use crate::frame::{BoxRead, Lines};
use crate::line;
use crate::reply::Replier;
use crate::shared::{Line, Shared, Waiter, lock};
use crate::violation::*;

/// One accepted incoming message, in wire order, for side `S` (the host's
/// end, [`to_host::Host`], or the plugin's, [`to_plugin::Plugin`]).
#[derive(Debug)]
pub enum Inbound<S: Side> {
    /// A request to serve. Answer through `reply`; dropping it unanswered
    /// frees the id and the in-flight slot.
    Request {
        /// A request of the method table this end receives.
        method: S::Request,
        params: Option<RequestParams>,
        reply: Replier,
    },
    Notification {
        /// A notification of the method table this end receives.
        method: S::Notification,
        params: Option<Box<RawValue>>,
    },
    /// The answer to one of this end's [`crate::Peer::request`]s.
    Response {
        id: u64,
        result: Result<Box<RawValue>, WireError>,
    },
    /// The last item: the reader stopped (a fatal violation or EOF).
    Closed(Violation),
}

/// A request's params: as sent, or (a `host/invokeTool` written in the
/// usual member order) already parsed in the pass that classified the
/// line ([`jsonrpc::classify_call`]).
#[derive(Debug)]
pub enum RequestParams {
    Raw(Box<RawValue>),
    InvokeTool(Box<InvokeToolParams>),
}

impl RequestParams {
    /// The params as sent, when they were not parsed yet.
    pub fn raw(&self) -> Option<&RawValue> {
        match self {
            RequestParams::Raw(raw) => Some(raw),
            RequestParams::InvokeTool(_) => None,
        }
    }
}

/// The other end's messages, read on demand in the consumer's task (the
/// turn driver's). The last item is [`Inbound::Closed`]; `None` after it.
/// `S` is the side this end is: it takes the methods of the protocol's
/// table sent its way ([`Side`]).
pub struct Inbox<S: Side> {
    lines: Lines,
    intake: Intake<S>,
    closed: bool,
}

/// The host's end of a plugin connection.
pub type HostInbox = Inbox<to_host::Host>;
/// What the host's end hands out.
pub type HostInbound = Inbound<to_host::Host>;
/// The plugin's end of the host connection.
pub type PluginInbox = Inbox<to_plugin::Plugin>;
/// What the plugin's end hands out.
pub type PluginInbound = Inbound<to_plugin::Plugin>;

/// What the reader decides about each line, apart from the framing.
struct Intake<S> {
    side: std::marker::PhantomData<fn() -> S>,
    shared: Arc<Shared>,
    out: mpsc::Sender<Line>,
    config: PeerConfig,
    permits: Arc<Semaphore>,
    budget: Budget,
    answered_first: bool,
    /// An answer the reader owes the plugin (`-32601`, `-32055`), sent
    /// before the next line is read: the plugin is answered in order and a
    /// full write queue holds the reader back (backpressure).
    owed: Option<Line>,
}

/// One line's effect.
enum Step<S: Side> {
    Deliver(Inbound<S>),
    /// Dropped, counted or answered by the reader itself.
    Next,
    Fatal(Violation),
}

impl<S: Side> std::fmt::Debug for Inbox<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("closed", &self.closed)
            .finish()
    }
}

impl<S: Side> Inbox<S> {
    pub(crate) fn new(
        reader: BoxRead,
        out: mpsc::Sender<Line>,
        shared: Arc<Shared>,
        config: PeerConfig,
    ) -> Self {
        Self {
            lines: Lines::new(reader, config.max_message_bytes),
            intake: Intake {
                side: std::marker::PhantomData,
                shared,
                out,
                permits: Arc::new(Semaphore::new(config.max_inflight_requests)),
                budget: Budget::new(&config),
                answered_first: !config.handshake_first,
                config,
                owed: None,
            },
            closed: false,
        }
    }

    /// The next accepted message, in wire order. Cancel-safe: a message
    /// is taken from the pipe and handed out in one step, and an answer
    /// owed to the plugin is kept until it is queued.
    pub async fn recv(&mut self) -> Option<Inbound<S>> {
        if self.closed {
            return None;
        }
        loop {
            if self.intake.owed.is_some() {
                let Ok(slot) = self.intake.out.reserve().await else {
                    let gone = Violation::new(ViolationReason::Io, "the writer has stopped");
                    return Some(self.close(gone));
                };
                if let Some(line) = self.intake.owed.take() {
                    slot.send(line);
                }
            }
            let step = match self.lines.next().await {
                None => Step::Fatal(Violation::new(
                    ViolationReason::PluginExited,
                    "EOF on the plugin's stdout",
                )),
                Some(Err(e)) => Step::Fatal(frame_violation(&self.lines.sample, e)),
                Some(Ok(line)) => self.intake.take(line),
            };
            match step {
                Step::Deliver(item) => return Some(item),
                Step::Next => {}
                Step::Fatal(v) => return Some(self.close(v)),
            }
        }
    }

    fn close(&mut self, v: Violation) -> Inbound<S> {
        self.closed = true;
        Inbound::Closed(self.intake.shared.fail(v))
    }
}

/// A framing violation, with the first bytes of the line that broke it.
fn frame_violation(sample: &[u8], e: FrameError) -> Violation {
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

impl<S: Side> Intake<S> {
    /// Applies one line: the handshake rule, the budgets, the envelope.
    fn take(&mut self, line: &str) -> Step<S> {
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
        let msg = match jsonrpc::classify_call(line) {
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
            Incoming::Response { id, result } => self.response(id, result),
        }
    }

    /// An answer: to the consumer in wire order, to a waiting caller, or
    /// dropped and counted when nothing waits for that id.
    fn response(&mut self, id: RequestId, result: Result<&RawValue, WireError>) -> Step<S> {
        let waiter = match id {
            RequestId::Number(n) => lock(&self.shared.pending).remove(&n).map(|w| (n, w)),
            RequestId::String(_) => None,
        };
        let result = result.map(RawValue::to_owned);
        match waiter {
            None => self.counted(UNKNOWN_RESPONSE_ID),
            Some((id, Waiter::Inbox)) => Step::Deliver(Inbound::Response { id, result }),
            Some((_, Waiter::Call(tx))) => {
                // The caller may have stopped waiting; that is its choice.
                let _ = tx.send(result);
                Step::Next
            }
        }
    }

    fn counted(&self, what: &str) -> Step<S> {
        match self.shared.count(what) {
            Ok(()) => Step::Next,
            Err(v) => Step::Fatal(v),
        }
    }

    fn request(&mut self, id: RequestId, method: &str, params: Option<Params<'_>>) -> Step<S> {
        // Taken in the set in the same lookup that checks it; a request
        // refused below gives its id back.
        if !lock(&self.shared.inflight).insert(&id) {
            return Step::Fatal(Violation::new(
                ViolationReason::DuplicateInflightId,
                format!("request id {id} reused while still in flight"),
            ));
        }
        let Some(method) = S::Request::from_name(method) else {
            lock(&self.shared.inflight).remove(&id);
            if let Err(v) = self.shared.count(UNKNOWN_METHOD) {
                return Step::Fatal(v);
            }
            let err = line::error(ErrorKind::MethodNotFound, "method not found");
            self.owed = Some(line::error_response(&id, &err).into_bytes());
            return Step::Next;
        };
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            lock(&self.shared.inflight).remove(&id);
            let mut data = serde_json::Map::new();
            data.insert("retryAfterMs".into(), 100.into());
            let err = line::error_with(
                ErrorKind::Overloaded,
                "too many requests in flight; retry later",
                data,
            );
            self.owed = Some(line::error_response(&id, &err).into_bytes());
            return Step::Next;
        };
        let reply = Replier {
            id,
            shared: self.shared.clone(),
            out: self.out.clone(),
            _permit: Some(permit),
            answered: false,
        };
        let params = params.map(|p| match p {
            Params::Raw(raw) => RequestParams::Raw(raw.to_owned()),
            Params::InvokeTool(call) => RequestParams::InvokeTool(call),
        });
        Step::Deliver(Inbound::Request {
            method,
            params,
            reply,
        })
    }

    fn notification(&mut self, method: &str, params: Option<Params<'_>>) -> Step<S> {
        if S::Request::from_name(method).is_some() {
            // Never served (there is no id to answer), but never silent
            // either: logged, and counted like any dropped message.
            tracing::warn!(
                violation = REQUEST_WITHOUT_ID,
                "the plugin sent {} without an id (as a notification); it is not served",
                escape_text(method)
            );
            return self.counted(REQUEST_WITHOUT_ID);
        }
        let Some(method) = S::Notification::from_name(method) else {
            return self.counted(UNKNOWN_NOTIFICATION);
        };
        // `classify_call` parses params only for a request (an `id` came
        // first): a notification's are always raw.
        let params = match params {
            None => None,
            Some(Params::Raw(raw)) => Some(raw.to_owned()),
            Some(Params::InvokeTool(_)) => return self.counted(REQUEST_WITHOUT_ID),
        };
        Step::Deliver(Inbound::Notification { method, params })
    }
}

/// Whether `line` is a response to a request this end is waiting for (the
/// only line allowed before the handshake is done). The full
/// classification runs again after this check; this one only decides
/// whether the line may come first.
fn answers_pending(line: &str, shared: &Shared) -> bool {
    match jsonrpc::classify(line) {
        Ok(Incoming::Response {
            id: RequestId::Number(n),
            ..
        }) => lock(&shared.pending).contains_key(&n),
        _ => false,
    }
}
