//! The state the peer's three parts share: the reader (pulled by its
//! consumer), the writer task, and the senders ([`crate::Peer`],
//! [`crate::Replier`]). One lock each, never two held at once.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use serde_json::value::RawValue;
use sharedos_protocol::jsonrpc::{RequestId, WireError};
use sharedos_protocol::text::escape_text;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::violation::{Violation, ViolationReason};

/// One queued outgoing line: compact JSON text without its `\n`.
pub(crate) type Line = Vec<u8>;

/// The answer to one of this end's requests.
pub type Answer = Result<Box<RawValue>, WireError>;

/// Who waits for the answer to an outgoing request.
pub(crate) enum Waiter {
    /// The inbox's consumer, in wire order ([`crate::Inbound::Response`]).
    Inbox,
    /// A caller of [`crate::Peer::call`], wherever it runs.
    Call(oneshot::Sender<Answer>),
}

pub(crate) struct Shared {
    pub(crate) dead: CancellationToken,
    pub(crate) violation: Mutex<Option<Violation>>,
    /// Outgoing requests not answered yet, by id (the pending map).
    pub(crate) pending: Mutex<HashMap<u64, Waiter>>,
    /// Incoming requests not answered yet.
    /// The ids are the other end's to choose, so they are hashed with
    /// std's keyed SipHash: a fast unkeyed hash would let a plugin make
    /// every id collide, and each lookup compare up to the in-flight cap's
    /// worth of ids as long as a line.
    pub(crate) inflight: Mutex<HashSet<RequestId>>,
    pub(crate) counted: AtomicU32,
    pub(crate) budget: u32,
    /// The line limit for what this end writes (the SDK learns the host's
    /// in `initialize`).
    pub(crate) max_message_bytes: AtomicUsize,
    /// Asks the writer to end once its queue is empty.
    pub(crate) closing: CancellationToken,
    /// Cancelled when the writer task has ended.
    pub(crate) written: CancellationToken,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub(crate) fn new(budget: u32, max_message_bytes: usize) -> Self {
        Self {
            dead: CancellationToken::new(),
            violation: Mutex::new(None),
            pending: Mutex::new(HashMap::new()),
            inflight: Mutex::new(HashSet::default()),
            counted: AtomicU32::new(0),
            budget,
            max_message_bytes: AtomicUsize::new(max_message_bytes),
            closing: CancellationToken::new(),
            written: CancellationToken::new(),
        }
    }

    /// Records the first fatal violation and marks the peer dead. Callers
    /// waiting on [`crate::Peer::call`] get `cancelled`.
    pub(crate) fn fail(&self, v: Violation) -> Violation {
        let first = {
            let mut slot = lock(&self.violation);
            if slot.is_none() {
                tracing::warn!(reason = v.reason.as_str(), sample = %v.sample, "peer protocol violation: {}", escape_text(&v.detail));
                *slot = Some(v.clone());
            }
            slot.clone().unwrap_or(v)
        };
        self.dead.cancel();
        self.cancel_calls("the connection stopped");
        first
    }

    /// Answers every waiting [`crate::Peer::call`] with `cancelled`.
    pub(crate) fn cancel_calls(&self, why: &str) {
        let waiting: Vec<_> = {
            let mut pending = lock(&self.pending);
            let ids: Vec<u64> = pending
                .iter()
                .filter(|(_, w)| matches!(w, Waiter::Call(_)))
                .map(|(id, _)| *id)
                .collect();
            ids.into_iter()
                .filter_map(|id| pending.remove(&id))
                .collect()
        };
        for waiter in waiting {
            if let Waiter::Call(tx) = waiter {
                let _ = tx.send(Err(WireError::new(
                    sharedos_protocol::ErrorKind::Cancelled,
                    why,
                )));
            }
        }
    }

    pub(crate) fn max_message_bytes(&self) -> usize {
        self.max_message_bytes.load(Ordering::Relaxed)
    }

    /// Counts a dropped message; `Err` once the budget is spent.
    pub(crate) fn count(&self, what: &str) -> Result<(), Violation> {
        let n = self
            .counted
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        tracing::debug!(violation = what, count = n, "peer message dropped");
        if n > self.budget {
            return Err(self.fail(Violation::new(
                ViolationReason::ViolationBudgetExceeded,
                format!("more than {} dropped messages (last: {what})", self.budget),
            )));
        }
        Ok(())
    }
}
