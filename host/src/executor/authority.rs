//! The turn's authority: the kernel's side of the turn from `open_turn`
//! until the turn closes, the context every kernel call is given, and the
//! first audit outage the turn met (B.10).

use std::sync::{Arc, Mutex};

use sharedos_kernel::{KernelError, KernelTurn};
use sharedos_protocol::{AccessContext, Timestamp};

use super::lock;

pub(crate) struct Authority {
    /// The request's context, as checked.
    context: AccessContext,
    /// Dropping it releases the turn's authority.
    kernel_turn: Mutex<Option<Arc<dyn KernelTurn>>>,
    /// The context as of the last kernel call: shared by every call that
    /// reads the same `now`, so a call copies no context.
    context_at: Mutex<Arc<AccessContext>>,
    outage: Mutex<Option<KernelError>>,
}

impl Authority {
    pub fn new(context: AccessContext) -> Self {
        Self {
            context_at: Mutex::new(Arc::new(context.clone())),
            context,
            kernel_turn: Mutex::new(None),
            outage: Mutex::new(None),
        }
    }

    /// The request's context (its `now` as the caller set it).
    pub fn context(&self) -> &AccessContext {
        &self.context
    }

    /// The context with `now` set, as every kernel call gets it. When the
    /// clock moved since the last call, the last context is set to the new
    /// time in place if no call still holds it (a call holds it only while
    /// it is with the kernel), and copied otherwise.
    pub fn context_at(&self, now: Timestamp) -> Arc<AccessContext> {
        let mut at = lock(&self.context_at);
        if at.now != now {
            match Arc::get_mut(&mut at) {
                Some(unshared) => unshared.now = now,
                None => {
                    let mut c = self.context.clone();
                    c.now = now;
                    *at = Arc::new(c);
                }
            }
        }
        Arc::clone(&at)
    }

    /// Holds the kernel's side of the turn until [`Authority::release`].
    pub fn hold(&self, kernel_turn: Arc<dyn KernelTurn>) {
        *lock(&self.kernel_turn) = Some(kernel_turn);
    }

    /// The kernel's side of the turn; `None` before it opened or once the
    /// turn closed.
    pub fn kernel_turn(&self) -> Option<Arc<dyn KernelTurn>> {
        lock(&self.kernel_turn).clone()
    }

    pub fn release(&self) {
        lock(&self.kernel_turn).take();
    }

    /// Notes `err` when it is the turn's first audit outage.
    pub fn note_outage(&self, err: &KernelError) {
        if matches!(err, KernelError::AuditUnavailable { .. }) {
            let mut slot = lock(&self.outage);
            if slot.is_none() {
                *slot = Some(err.clone());
            }
        }
    }

    pub fn outage(&self) -> Option<KernelError> {
        lock(&self.outage).clone()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn context() -> AccessContext {
        serde_json::from_value(json!({
            "namespaceId": "n", "actor": {"kind": "agent", "agentId": "a"},
            "authority": {"kind": "service", "serviceId": "h"},
            "owner": {"kind": "human", "userId": "u"}, "purpose": "p",
            "traceId": "t", "enabledToolNamespaces": ["files"],
            "now": "2026-01-01T00:00:00Z"
        }))
        .unwrap()
    }

    fn at(text: &str) -> Timestamp {
        Timestamp::parse(text).unwrap()
    }

    #[test]
    fn a_context_a_call_holds_keeps_its_time_when_the_clock_moves() {
        let authority = Authority::new(context());
        let held = authority.context_at(at("2026-01-01T00:00:01Z"));
        let later = authority.context_at(at("2026-01-01T00:00:02Z"));
        assert_eq!(
            held.now,
            at("2026-01-01T00:00:01Z"),
            "changed under its call"
        );
        assert_eq!(later.now, at("2026-01-01T00:00:02Z"));
        let mut expected = context();
        expected.now = at("2026-01-01T00:00:02Z");
        assert_eq!(*later, expected, "only the time differs from the request's");
    }

    #[test]
    fn a_context_no_call_holds_is_set_to_the_new_time() {
        let authority = Authority::new(context());
        drop(authority.context_at(at("2026-01-01T00:00:01Z")));
        let later = authority.context_at(at("2026-01-01T00:00:02Z"));
        let mut expected = context();
        expected.now = at("2026-01-01T00:00:02Z");
        assert_eq!(*later, expected);
        let same = authority.context_at(at("2026-01-01T00:00:02Z"));
        assert!(
            Arc::ptr_eq(&later, &same),
            "the same time shares one context"
        );
    }
}
