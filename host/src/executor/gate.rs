//! The turn's call gate: what a mediated call must pass before it reaches
//! the kernel (the step and call ceilings, the catalogue), the calls it
//! lets through while they are in flight, and the retry bookkeeping they
//! leave (envelope.md B.2 steps 6–10, B.7).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use sharedos_protocol::{RuntimeLimits, ToolDefinition};
use tokio::sync::Notify;

use super::lock;

pub(crate) const STEP_LIMIT: &str = "step_limit_exceeded";
pub(crate) const CALL_LIMIT: &str = "tool_call_limit_exceeded";

/// The effective catalogue, fixed once the kernel listed it.
struct Catalogue {
    tools: Vec<ToolDefinition>,
    /// By position in `tools`: whether a call of that name is repeatable
    /// (some definition of the name is), so a call's step 9 finds the
    /// answer of step 10 with its tool, without hashing the name.
    repeatable: Vec<bool>,
}

/// A tool the turn's catalogue offers (step 9), as step 10 admits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Offered {
    repeatable: bool,
}

/// The per-turn counters of B.2 steps 6–8 and the retry book of B.7.
#[derive(Default)]
struct Counters {
    tool_calls: u32,
    seen_steps: HashSet<u64>,
    /// A call may have had an effect (a non-repeatable tool answered other
    /// than `denied`).
    effect_possible: bool,
    /// Non-repeatable calls with the kernel now.
    writes_with_kernel: u32,
}

/// Admits and settles the turn's mediated calls.
#[derive(Default)]
pub(crate) struct CallGate {
    catalogue: OnceLock<Catalogue>,
    counters: Mutex<Counters>,
    in_flight: Arc<InFlight>,
}

/// A call let through to the kernel: in flight until dropped.
pub(crate) struct Admitted {
    pub repeatable: bool,
    _in_flight: InFlightGuard,
}

impl CallGate {
    /// Fixes the effective catalogue (kernel listing ∩ requested names).
    pub fn offer(&self, tools: Vec<ToolDefinition>) {
        let names: HashSet<&str> = tools
            .iter()
            .filter(|d| d.repeatable())
            .map(|d| d.name.as_str())
            .collect();
        let repeatable = tools
            .iter()
            .map(|d| names.contains(d.name.as_str()))
            .collect();
        let _ = self.catalogue.set(Catalogue { tools, repeatable });
    }

    /// Step 9: whether the turn's catalogue offers `tool`.
    pub fn offers(&self, tool: &str) -> bool {
        self.offered(tool).is_some()
    }

    /// Step 9: the turn's catalogue entry for `tool`, if it offers it.
    pub fn offered(&self, tool: &str) -> Option<Offered> {
        let c = self.catalogue.get()?;
        let mut entries = c.tools.iter().zip(&c.repeatable);
        let (_, &repeatable) = entries.find(|(d, _)| d.name.as_str() == tool)?;
        Some(Offered { repeatable })
    }

    /// Steps 6–8: the step ceiling (only for a declared step), then the
    /// call ceiling; a call that passes both is counted, before the
    /// catalogue check, so a guessed name uses budget.
    pub fn count(&self, step: Option<u64>, limits: &RuntimeLimits) -> Result<(), &'static str> {
        let max_steps = u64::from(limits.max_steps);
        let mut c = lock(&self.counters);
        if let Some(s) = step {
            // A step is new or seen; while there is room for a new one it
            // is just noted (one lookup), at the ceiling it must be seen.
            let room = (c.seen_steps.len() as u64) < max_steps;
            let ok = s < max_steps && (room || c.seen_steps.contains(&s));
            if !ok {
                return Err(STEP_LIMIT);
            }
            if room {
                c.seen_steps.insert(s);
            }
        }
        if c.tool_calls >= limits.max_tool_calls {
            return Err(CALL_LIMIT);
        }
        c.tool_calls += 1;
        Ok(())
    }

    /// Step 10: the call goes to the kernel. A non-repeatable one is
    /// outstanding (a retry is not safe) until it settles.
    #[cfg(test)]
    pub fn admit(&self, tool: &str) -> Admitted {
        let offered = self.offered(tool).unwrap_or(Offered { repeatable: false });
        self.admit_offered(offered)
    }

    /// [`CallGate::admit`] for the entry step 9 found.
    pub fn admit_offered(&self, offered: Offered) -> Admitted {
        let repeatable = offered.repeatable;
        if !repeatable {
            lock(&self.counters).writes_with_kernel += 1;
        }
        Admitted {
            repeatable,
            _in_flight: self.in_flight.enter(),
        }
    }

    /// The kernel answered a call admitted with `repeatable`;
    /// `effect_possible`: its answer may have had an effect.
    pub fn settle(&self, repeatable: bool, effect_possible: bool) {
        let mut c = lock(&self.counters);
        if !repeatable {
            c.writes_with_kernel = c.writes_with_kernel.saturating_sub(1);
        }
        c.effect_possible |= !repeatable && effect_possible;
    }

    /// B.7: no call may have had an effect and none is outstanding.
    pub fn safe_to_retry(&self) -> bool {
        let c = lock(&self.counters);
        !c.effect_possible && c.writes_with_kernel == 0
    }

    pub fn idle(&self) -> bool {
        self.in_flight.is_empty()
    }

    /// Resolves once no admitted call is in flight.
    pub async fn wait_idle(&self) {
        self.in_flight.wait_idle().await
    }
}

/// The mediated calls still in flight; the catch path waits on them during
/// a drain.
#[derive(Default)]
struct InFlight {
    count: AtomicU32,
    /// The callers of `wait_idle` now. The last call out wakes them only
    /// if there are any: `notify_waiters` takes a lock, and nearly every
    /// call is the last one out for a moment.
    waiting: AtomicU32,
    idle: Notify,
}

impl InFlight {
    fn enter(self: &Arc<Self>) -> InFlightGuard {
        self.count.fetch_add(1, Ordering::SeqCst);
        InFlightGuard(self.clone())
    }
    fn is_empty(&self) -> bool {
        self.count.load(Ordering::SeqCst) == 0
    }
    async fn wait_idle(&self) {
        // Counted before the wait is made and the count read (all SeqCst):
        // a last call out that does not see this waiter left the count at
        // zero before it is read here.
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.waiting);
        loop {
            let notified = self.idle.notified();
            if self.is_empty() {
                return;
            }
            notified.await;
        }
    }
}

/// One caller of `wait_idle`, counted while it waits (or is dropped).
struct Waiting<'a>(&'a AtomicU32);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

struct InFlightGuard(Arc<InFlight>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let last = self.0.count.fetch_sub(1, Ordering::SeqCst) == 1;
        if last && self.0.waiting.load(Ordering::SeqCst) > 0 {
            self.0.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_steps: u32, max_tool_calls: u32) -> RuntimeLimits {
        RuntimeLimits {
            max_steps,
            max_tool_calls,
            timeout_ms: 1_000,
            drain_grace_ms: None,
            drain_at_ms: None,
        }
    }

    #[test]
    fn a_refused_step_is_not_counted_and_a_repeated_step_is_free() {
        let gate = CallGate::default();
        let l = limits(2, 10);
        assert_eq!(gate.count(Some(0), &l), Ok(()));
        assert_eq!(gate.count(Some(0), &l), Ok(()));
        assert_eq!(gate.count(Some(2), &l), Err(STEP_LIMIT));
        assert_eq!(gate.count(Some(1), &l), Ok(()));
        assert_eq!(gate.count(Some(3), &l), Err(STEP_LIMIT));
        assert_eq!(gate.count(None, &limits(2, 3)), Err(CALL_LIMIT));
    }

    #[tokio::test]
    async fn the_wait_for_idle_ends_when_the_last_call_is_out() {
        let gate = Arc::new(CallGate::default());
        gate.wait_idle().await;
        for _ in 0..100 {
            let (a, b) = (gate.admit("files.write"), gate.admit("files.read"));
            let waiter = tokio::spawn({
                let gate = gate.clone();
                async move { gate.wait_idle().await }
            });
            tokio::task::yield_now().await;
            drop(a);
            tokio::task::yield_now().await;
            assert!(!waiter.is_finished(), "a call is still in flight");
            drop(b);
            assert!(waiter.await.is_ok());
            assert_eq!(gate.in_flight.waiting.load(Ordering::SeqCst), 0);
        }
    }

    #[test]
    fn the_catalogue_entry_says_whether_a_call_is_repeatable() {
        let gate = CallGate::default();
        assert_eq!(gate.offered("files.read"), None);
        let read = tool("files.read", sharedos_protocol::ReadWrite::Read);
        let write = tool("files.write", sharedos_protocol::ReadWrite::Write);
        gate.offer(vec![read, write]);
        assert_eq!(
            gate.offered("files.read"),
            Some(Offered { repeatable: true })
        );
        assert_eq!(
            gate.offered("files.write"),
            Some(Offered { repeatable: false })
        );
        assert_eq!(gate.offered("files.delete"), None);
        assert!(gate.offers("files.write") && !gate.offers("files.delete"));
    }

    fn tool(name: &str, read_write: sharedos_protocol::ReadWrite) -> ToolDefinition {
        let mut def: ToolDefinition = serde_json::from_value(serde_json::json!({
            "name": name,
            "namespace": "files",
            "source": "kernel",
            "description": "a tool",
            "inputSchema": {"type": "object"},
            "requiredCapability": {
                "resource": {"namespace": "files", "path": []},
                "action": "read"
            },
            "readWrite": "read"
        }))
        .expect("a tool definition");
        def.read_write = read_write;
        def
    }

    #[test]
    fn an_outstanding_write_makes_a_retry_unsafe_until_it_settles() {
        let gate = CallGate::default();
        let call = gate.admit("files.write");
        assert!(!call.repeatable);
        assert!(!gate.safe_to_retry());
        assert!(!gate.idle());
        gate.settle(call.repeatable, false);
        drop(call);
        assert!(gate.safe_to_retry() && gate.idle());
        gate.settle(false, true);
        assert!(!gate.safe_to_retry(), "an effect stays on the book");
    }
}
