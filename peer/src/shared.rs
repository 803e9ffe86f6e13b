//! The state the peer's three parts share: the reader (pulled by its
//! consumer), the writer task, and the senders ([`crate::Peer`],
//! [`crate::Replier`]). One lock each, never two held at once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
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
    pub(crate) inflight: Mutex<InflightIds>,
    pub(crate) counted: AtomicU32,
    /// The counted violations by name (the names are the host's and the
    /// peer's own constants, so the map stays a handful of entries).
    pub(crate) counted_by_name: Mutex<BTreeMap<String, u32>>,
    pub(crate) budget: u32,
    /// The line limit for what this end writes (the SDK learns the host's
    /// in `initialize`).
    pub(crate) max_message_bytes: AtomicUsize,
    /// Asks the writer to end once its queue is empty.
    pub(crate) closing: CancellationToken,
    /// Cancelled when the writer task has ended.
    pub(crate) written: CancellationToken,
}

/// The ids of incoming requests not answered yet, kept apart by kind.
///
/// The ids are the other end's to choose, so a plugin can make them all
/// collide under an unkeyed hash. That costs little for numbers: the set
/// never holds more than the in-flight cap plus the one request being
/// checked (an id is taken before the permit and given back at once when
/// no permit is left), so a fully colliding lookup compares at most that
/// many `u64`s, eight bytes each, whatever the line length. Numbers, the
/// ids every SDK sends, are therefore hashed with one multiply
/// ([`NumberHash`]) instead of SipHash. String ids keep std's keyed
/// SipHash: colliding strings would make each lookup compare up to the
/// cap's worth of ids as long as a line. (The plugin's own end has no
/// useful cap, but its ids come from the host.)
#[derive(Default)]
pub(crate) struct InflightIds {
    numbers: HashSet<u64, BuildHasherDefault<NumberHash>>,
    strings: HashSet<String>,
}

impl InflightIds {
    /// Takes `id`; `false` if it is already in flight.
    pub(crate) fn insert(&mut self, id: &RequestId) -> bool {
        match id {
            RequestId::Number(n) => self.numbers.insert(*n),
            RequestId::String(s) => self.strings.insert(s.clone()),
        }
    }

    /// Gives `id` back.
    pub(crate) fn remove(&mut self, id: &RequestId) {
        match id {
            RequestId::Number(n) => self.numbers.remove(n),
            RequestId::String(s) => self.strings.remove(s.as_str()),
        };
    }
}

/// The hash of a number id: a Fibonacci multiply, its high half folded
/// into the low one so both the bucket index (low bits) and the control
/// tag (top bits) depend on every bit of the id. Not keyed; see
/// [`InflightIds`] for why that is safe here.
#[derive(Default)]
pub(crate) struct NumberHash(u64);

impl Hasher for NumberHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed with it; this keeps any other use
        // correct (equal input, equal hash), if not fast.
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        let h = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }
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
            inflight: Mutex::new(InflightIds::default()),
            counted: AtomicU32::new(0),
            counted_by_name: Mutex::new(BTreeMap::new()),
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
        {
            let mut by_name = lock(&self.counted_by_name);
            match by_name.get_mut(what) {
                Some(c) => *c = c.saturating_add(1),
                None => {
                    by_name.insert(what.to_owned(), 1);
                }
            }
        }
        if n > self.budget {
            return Err(self.fail(Violation::new(
                ViolationReason::ViolationBudgetExceeded,
                format!("more than {} dropped messages (last: {what})", self.budget),
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use sharedos_protocol::jsonrpc::RequestId;

    use super::InflightIds;

    /// A small deterministic generator (xorshift64*), so a failure repeats.
    struct Gen(u64);

    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
    }

    /// The ids a plugin might send: small and huge numbers, numbers that
    /// differ only in their high bits, strings that spell those numbers,
    /// empty, escaped-looking and non-ASCII strings.
    fn pool(g: &mut Gen) -> Vec<RequestId> {
        let mut ids = Vec::new();
        for n in [0, 1, 2, 63, 64, u64::from(u32::MAX), u64::MAX, u64::MAX - 1] {
            ids.push(RequestId::Number(n));
            ids.push(RequestId::String(n.to_string()));
        }
        for shift in 32..64 {
            ids.push(RequestId::Number(1u64 << shift));
            ids.push(RequestId::Number((1u64 << shift) | 1));
        }
        for s in ["", " ", "\"", "\\u0041", "A", "é", "e\u{301}", "🦀", "\0"] {
            ids.push(RequestId::String(s.to_string()));
        }
        for _ in 0..64 {
            ids.push(RequestId::Number(g.next() % 200));
            ids.push(RequestId::Number(g.next()));
            ids.push(RequestId::String(format!("id-{}", g.next() % 100)));
        }
        ids
    }

    /// The set split by kind answers every insert exactly as one
    /// `HashSet<RequestId>` does, through inserts and removals in any
    /// order, duplicates and same-text number/string pairs included.
    #[test]
    fn inflight_ids_match_a_plain_set_of_request_ids() {
        let mut g = Gen(0x5EED_1234_ABCD_0001);
        for _round in 0..20 {
            let ids = pool(&mut g);
            let mut ours = InflightIds::default();
            let mut reference: HashSet<RequestId> = HashSet::new();
            for _ in 0..5_000 {
                let idx = usize::try_from(g.next() % ids.len() as u64).unwrap_or(0);
                let id = &ids[idx];
                if g.next().is_multiple_of(3) {
                    ours.remove(id);
                    reference.remove(id);
                } else {
                    assert_eq!(ours.insert(id), reference.insert(id.clone()), "{id:?}");
                }
            }
            // What is left in flight is the same: taking an id again fails
            // exactly for the ids the reference still holds.
            for id in &ids {
                assert_eq!(ours.insert(id), reference.insert(id.clone()), "{id:?}");
            }
        }
    }

    /// Numbers chosen to share their low bits, or all of them but one,
    /// stay distinct ids (a collision costs time, never a wrong answer).
    #[test]
    fn colliding_number_ids_stay_distinct() {
        let mut ours = InflightIds::default();
        let ids: Vec<u64> = (0..4_096u64).map(|i| i << 20).collect();
        for &n in &ids {
            assert!(ours.insert(&RequestId::Number(n)));
        }
        for &n in &ids {
            assert!(!ours.insert(&RequestId::Number(n)));
            assert!(ours.insert(&RequestId::Number(n | 1)));
        }
        for &n in &ids {
            ours.remove(&RequestId::Number(n));
            assert!(ours.insert(&RequestId::Number(n)));
        }
    }
}
