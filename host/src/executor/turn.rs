//! Per-turn state shared by the executor and the host it hands the seat:
//! the event log, the annotation store, the two signals, the retry
//! bookkeeping and the in-flight calls.

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};
use sharedos_kernel::{KernelError, KernelTurn};
use sharedos_plugin_sdk::{Signal, SignalSource};
use sharedos_protocol::{
    AccessContext, ExecutionEvent, Identifier, RuntimeLimits, ShortName, Timestamp, ToolDefinition,
    Version,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::ledger::{
    ByteLedger, STDERR_TAIL_RESERVE_BYTES, event_held_bytes, serialized_len, value_held_bytes,
};
use super::{Clock, IdSource, OnEvent};

/// Locks a mutex, recovering the data if a panicking holder poisoned it:
/// every critical section here leaves the state consistent.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The two signals of a turn (envelope.md B.5). `soft` is `draining`;
/// `hard` aborts handlers. Raising hard always raises soft first, so no one
/// ever sees hard raised while soft is not.
pub(crate) struct TurnSignals {
    pub soft: SignalSource,
    pub hard: SignalSource,
    /// The hard signal in the form the kernel takes.
    pub hard_token: CancellationToken,
}

impl TurnSignals {
    pub fn new() -> Self {
        Self {
            soft: SignalSource::new(),
            hard: SignalSource::new(),
            hard_token: CancellationToken::new(),
        }
    }
    pub fn raise_soft(&self) {
        self.soft.raise();
    }
    pub fn raise_hard(&self) {
        self.soft.raise();
        self.hard.raise();
        self.hard_token.cancel();
    }
    pub fn soft_raised(&self) -> bool {
        self.soft.is_raised()
    }
    pub fn hard_raised(&self) -> bool {
        self.hard.is_raised()
    }
    pub fn hard_signal(&self) -> Signal {
        self.hard.signal()
    }
}

/// The retry bookkeeping of B.7.
#[derive(Debug, Default)]
pub(crate) struct RetryBook {
    pub effect_possible: bool,
    pub writes_with_kernel: u32,
}

impl RetryBook {
    pub fn safe_to_retry(&self) -> bool {
        !self.effect_possible && self.writes_with_kernel == 0
    }
}

/// The mediated calls still in flight; the catch path waits on them during
/// a drain.
#[derive(Default)]
pub(crate) struct InFlight {
    count: AtomicU32,
    idle: Notify,
}

impl InFlight {
    pub fn enter(self: &Arc<Self>) -> InFlightGuard {
        self.count.fetch_add(1, Ordering::SeqCst);
        InFlightGuard(self.clone())
    }
    pub fn is_empty(&self) -> bool {
        self.count.load(Ordering::SeqCst) == 0
    }
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.is_empty() {
                return;
            }
            notified.await;
        }
    }
}

pub(crate) struct InFlightGuard(Arc<InFlight>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// The violation a plugin commits by going over the turn's event budget
/// (protocol.md B.4, "Emit budget").
pub(crate) const RATE_LIMIT_EXCEEDED: &str = "rate_limit_exceeded";
/// The violation a plugin commits by making the host hold more than the
/// turn's byte ledger allows (docs/PROTOCOL.md section 5).
pub(crate) const TURN_MEMORY_EXCEEDED: &str = "turn_memory_exceeded";

/// Events kept back for the envelope's own ending: whatever a plugin does,
/// the final `turn.completed | turn.failed | turn.escalated |
/// turn.cancelled` always fits.
pub(crate) const RESERVED_EVENTS: usize = 1;
/// Ledger bytes kept back for that final event (`turn.escalated` carries a
/// reason of at most 512 characters and the reviewer's address).
pub(crate) const RESERVED_EVENT_BYTES: usize = 8 * 1024;
/// What a `tool.completed` may weigh over its `tool.requested` in the
/// ledger: the status and a code of at most 256 characters, and their
/// parsed values. A call pays for its completion when it is requested, so
/// a completion is never refused.
pub(crate) const COMPLETION_EXTRA_BYTES: usize = 1_100;

/// The per-turn bounds on what a plugin can make the envelope hold
/// (docs/ENVELOPE.md, "Bounded memory").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TurnBudget {
    pub max_events: usize,
    /// The byte ledger's limit (`ExecutorOptions::max_turn_bytes`).
    pub max_turn_bytes: usize,
    pub max_annotation_keys: usize,
    pub max_annotation_bytes: usize,
}

/// The ordered event log. Only the envelope writes events. `charged_events`
/// is what the count budget has counted: every event written, plus the
/// completions paid for in advance by calls still waiting for theirs (their
/// bytes are in the turn's ledger).
pub(crate) struct EventLog {
    events: Vec<ExecutionEvent>,
    charged_events: usize,
    /// Set when the envelope wrote the turn's ending: nothing the seat
    /// causes is written after it.
    sealed: bool,
    /// Set when the result took the events: nothing is written after it.
    taken: bool,
}

/// The annotation store: insertion order, last write wins, bounded in keys
/// and bytes (a key's bytes are its length plus its value's serialized
/// length), and charged to the turn's ledger.
#[derive(Default)]
struct AnnotationStore {
    entries: Vec<Annotation>,
    bytes: usize,
    dropped: u64,
}

struct Annotation {
    key: String,
    value: Value,
    /// Its bytes in the store's own bound.
    size: usize,
    /// Its bytes in the turn's ledger.
    held: usize,
}

/// Everything one turn shares between the executor and its host.
pub(crate) struct Turn {
    pub execution_id: Identifier,
    pub trace_id: Identifier,
    pub context: AccessContext,
    pub limits: RuntimeLimits,
    pub signals: TurnSignals,
    pub drain_grace_ms: u64,
    pub open: AtomicBool,
    pub retry: Mutex<RetryBook>,
    pub in_flight: Arc<InFlight>,
    pub audit_outage: Mutex<Option<KernelError>>,
    /// The kernel's side of this turn, from `open_turn` until the turn
    /// closes (dropping it releases the turn's authority).
    pub kernel_turn: Mutex<Option<Arc<dyn KernelTurn>>>,
    /// The context as of the last kernel call: shared by every call that
    /// reads the same `now`, so a call copies no context.
    context_at: Mutex<Arc<AccessContext>>,
    pub catalogue: Mutex<Vec<ToolDefinition>>,
    pub repeatable: Mutex<HashSet<String>>,
    pub calls: Mutex<CallBudget>,
    pub runtime_ref: Value,
    events: Mutex<EventLog>,
    /// How many events the observer has been handed; held by the one
    /// caller delivering.
    delivered: Mutex<usize>,
    delivered_count: std::sync::atomic::AtomicUsize,
    annotations: Mutex<AnnotationStore>,
    budget: TurnBudget,
    ledger: ByteLedger,
    violation: Mutex<Option<&'static str>>,
    clock: Clock,
    ids: IdSource,
    on_event: Option<OnEvent>,
    hard_timer: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// The envelope's terminal events: the last of a turn.
const TERMINAL_EVENTS: &[&str] = &[
    "turn.completed",
    "turn.failed",
    "turn.cancelled",
    "turn.escalated",
    "turn.denied",
];

/// The per-turn call counters of B.2 steps 6–8.
#[derive(Debug, Default)]
pub(crate) struct CallBudget {
    pub tool_calls: u32,
    pub seen_steps: HashSet<u64>,
}

pub(crate) struct TurnParams {
    pub execution_id: Identifier,
    pub context: AccessContext,
    pub limits: RuntimeLimits,
    pub drain_grace_ms: u64,
    pub runtime_ref: Value,
    pub clock: Clock,
    pub ids: IdSource,
    pub on_event: Option<OnEvent>,
    pub budget: TurnBudget,
}

impl Turn {
    pub fn new(p: TurnParams) -> Arc<Self> {
        let context_at = Mutex::new(Arc::new(p.context.clone()));
        Arc::new(Self {
            execution_id: p.execution_id,
            trace_id: p.context.trace_id.clone(),
            context: p.context,
            limits: p.limits,
            signals: TurnSignals::new(),
            drain_grace_ms: p.drain_grace_ms,
            open: AtomicBool::new(true),
            retry: Mutex::new(RetryBook::default()),
            in_flight: Arc::new(InFlight::default()),
            audit_outage: Mutex::new(None),
            kernel_turn: Mutex::new(None),
            context_at,
            catalogue: Mutex::new(Vec::new()),
            repeatable: Mutex::new(HashSet::new()),
            calls: Mutex::new(CallBudget::default()),
            runtime_ref: p.runtime_ref,
            events: Mutex::new(EventLog {
                events: Vec::new(),
                charged_events: 0,
                sealed: false,
                taken: false,
            }),
            delivered: Mutex::new(0),
            delivered_count: std::sync::atomic::AtomicUsize::new(0),
            annotations: Mutex::new(AnnotationStore::default()),
            budget: p.budget,
            ledger: Self::opening_ledger(p.budget.max_turn_bytes),
            violation: Mutex::new(None),
            clock: p.clock,
            ids: p.ids,
            on_event: p.on_event,
            hard_timer: Mutex::new(None),
        })
    }

    /// The ledger with its fixed reserve charged: the plugin's stderr tail.
    fn opening_ledger(limit: usize) -> ByteLedger {
        let ledger = ByteLedger::new(limit);
        ledger.charge(STDERR_TAIL_RESERVE_BYTES);
        ledger
    }

    pub fn now(&self) -> Timestamp {
        (self.clock)()
    }

    /// The context with `now` set to the clock, as every kernel call gets
    /// it. A new copy only when the clock moved since the last call.
    pub fn context_now(&self) -> Arc<AccessContext> {
        let now = self.now();
        let mut at = lock(&self.context_at);
        if at.now != now {
            let mut c = self.context.clone();
            c.now = now;
            *at = Arc::new(c);
        }
        Arc::clone(&at)
    }

    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }

    pub fn kernel_turn(&self) -> Option<Arc<dyn KernelTurn>> {
        lock(&self.kernel_turn).clone()
    }

    /// The next event of the log, not yet appended.
    fn event(&self, log: &EventLog, kind: &str, data: Value) -> ExecutionEvent {
        ExecutionEvent {
            version: Version::V1,
            event_id: self.ids.next(),
            execution_id: self.execution_id.clone(),
            trace_id: self.trace_id.clone(),
            sequence: log.events.len() as u64,
            kind: ShortName::new(kind)
                .unwrap_or_else(|_| ShortName::new("event").unwrap_or_else(|_| unreachable!())),
            data,
            occurred_at: self.now(),
        }
    }

    /// Appends one of the envelope's own events (`turn.*`) and hands an
    /// immutable copy to the observer. Never refused: the budget keeps room
    /// for the ending (`RESERVED_EVENTS`), and what comes before the seat
    /// runs is the envelope's, not the plugin's. A panicking observer
    /// changes nothing.
    pub fn push_event(&self, kind: &str, data: Value) {
        {
            let mut log = lock(&self.events);
            if log.taken {
                return;
            }
            if TERMINAL_EVENTS.contains(&kind) {
                // The ending is the last event: a call still in mediation
                // or with the kernel writes nothing after it.
                log.sealed = true;
            }
            log.charged_events += 1;
            let event = self.event(&log, kind, data);
            self.ledger.charge(event_held_bytes(&event));
            log.events.push(event);
        }
        self.deliver();
    }

    /// Appends a `tool.completed` whose call paid for it when it was
    /// requested.
    pub fn push_prepaid(&self, kind: &str, data: Value) {
        {
            let mut log = lock(&self.events);
            if log.sealed {
                return;
            }
            let event = self.event(&log, kind, data);
            log.events.push(event);
        }
        self.deliver();
    }

    /// Appends an event a plugin's action causes (`runtime.event`,
    /// `tool.requested`), paying in advance for `prepaid_events` more
    /// events of its own size plus `prepaid_bytes` (a call's completion).
    /// Over the count budget or the byte ledger, with the reserve for the
    /// ending kept back, nothing is written: the turn is stopped
    /// (`rate_limit_exceeded` for the count, `turn_memory_exceeded` for
    /// the bytes) and `false` returned.
    pub fn push_plugin_event(
        &self,
        kind: &str,
        data: Value,
        prepaid_events: usize,
        prepaid_bytes: usize,
    ) -> bool {
        {
            let mut log = lock(&self.events);
            if log.sealed {
                return false;
            }
            let events = log
                .charged_events
                .saturating_add(1 + prepaid_events + RESERVED_EVENTS);
            if events > self.budget.max_events {
                drop(log);
                self.violate(RATE_LIMIT_EXCEEDED);
                return false;
            }
            let event = self.event(&log, kind, data);
            let bytes = event_held_bytes(&event)
                .saturating_mul(1 + prepaid_events)
                .saturating_add(prepaid_bytes);
            if !self.ledger.try_charge(bytes, RESERVED_EVENT_BYTES) {
                drop(log);
                self.violate(TURN_MEMORY_EXCEEDED);
                return false;
            }
            log.charged_events += 1 + prepaid_events;
            log.events.push(event);
        }
        self.deliver();
        true
    }

    /// A host-side violation: noted once, and the seat is stopped as at an
    /// abort. The turn then ends `failed runtime_failed`; the reason goes
    /// to the logs and `on_turn_error`, never to the result.
    pub fn violate(&self, reason: &'static str) {
        {
            let mut v = lock(&self.violation);
            if v.is_some() {
                return;
            }
            *v = Some(reason);
        }
        tracing::warn!(execution_id = %self.execution_id, reason, "the runtime broke a limit of the envelope; stopping the seat");
        self.signals.raise_hard();
    }

    pub fn violation(&self) -> Option<&'static str> {
        *lock(&self.violation)
    }

    /// Hands the observer every event it has not seen, in `sequence` order,
    /// whichever thread pushed them. One caller delivers at a time; a
    /// pusher that finds delivery busy leaves its event to the deliverer,
    /// which checks again after letting go, so no event is skipped. (A
    /// callback that pushes an event itself, which none does, would have
    /// it delivered by the same loop rather than deadlock.)
    fn deliver(&self) {
        let Some(cb) = &self.on_event else { return };
        loop {
            let mut delivered = match self.delivered.try_lock() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return,
            };
            loop {
                let next = lock(&self.events).events.get(*delivered).cloned();
                let Some(event) = next else { break };
                *delivered += 1;
                let _ = std::panic::catch_unwind(AssertUnwindSafe(|| cb(&event)));
            }
            self.delivered_count.store(*delivered, Ordering::SeqCst);
            drop(delivered);
            if self.delivered_count.load(Ordering::SeqCst) >= lock(&self.events).events.len() {
                return;
            }
        }
    }

    /// Waits until the observer has seen every event, whichever thread is
    /// delivering them, so `execute` never returns before its observer saw
    /// the ending.
    pub async fn flush_delivery(&self) {
        if self.on_event.is_none() {
            return;
        }
        loop {
            self.deliver();
            if self.delivered_count.load(Ordering::SeqCst) >= lock(&self.events).events.len() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// Seals the log and takes its events out: the last read of a turn's
    /// log (its result), after the observer has been served. Nothing is
    /// written after it (a late call's completion is refused by the seal,
    /// an envelope event by `taken`).
    pub fn take_events(&self) -> Vec<ExecutionEvent> {
        let mut log = lock(&self.events);
        log.sealed = true;
        log.taken = true;
        std::mem::take(&mut log.events)
    }

    /// Stores an annotation: kept while the turn is open (even aborted),
    /// dropped silently after close; the last write to a key wins and the
    /// first write fixes its position.
    ///
    /// The store is bounded (`max_annotation_keys`, `max_annotation_bytes`)
    /// and charged to the turn's byte ledger. A new key past any of these,
    /// or a new value for a key that would take the store or the ledger
    /// past its bytes, is dropped and counted, with a
    /// warning in the log. It is never an error to the plugin: `annotate`
    /// never refuses on the state of the host (ADR 0007), so a call site
    /// needs no guard and stating a fact cannot become a failed turn. The
    /// keys the envelope defines (`promptHash`, `escalationAsked`) are small
    /// and stated early, so in practice only a plugin that floods the store
    /// loses anything, and what it loses is its own later writes.
    pub fn annotate(&self, key: &str, value: Value) {
        if !self.is_open() {
            return;
        }
        let size = key.len().saturating_add(serialized_len(&value));
        let held = key.len().saturating_add(value_held_bytes(&value));
        let mut ann = lock(&self.annotations);
        let budget = self.budget;
        let kept = if let Some(i) = ann.entries.iter().position(|a| a.key == key) {
            let total = ann.bytes - ann.entries[i].size + size;
            let was = ann.entries[i].held;
            // Only growth is charged; the ledger gets back what shrinks.
            let fits = total <= budget.max_annotation_bytes
                && (held <= was || self.ledger.try_charge(held - was, RESERVED_EVENT_BYTES));
            if fits {
                self.ledger.release(was.saturating_sub(held));
                let entry = &mut ann.entries[i];
                entry.value = value;
                entry.size = size;
                entry.held = held;
                ann.bytes = total;
            }
            fits
        } else if ann.entries.len() < budget.max_annotation_keys
            && ann.bytes.saturating_add(size) <= budget.max_annotation_bytes
            && self.ledger.try_charge(held, RESERVED_EVENT_BYTES)
        {
            ann.entries.push(Annotation {
                key: key.to_owned(),
                value,
                size,
                held,
            });
            ann.bytes += size;
            true
        } else {
            false
        };
        if !kept {
            ann.dropped += 1;
            if ann.dropped == 1 {
                tracing::warn!(
                    execution_id = %self.execution_id,
                    key,
                    keys = ann.entries.len(),
                    bytes = ann.bytes,
                    "the annotation store of the turn is full; dropping the write"
                );
            }
        }
    }

    pub fn annotations(&self) -> Vec<(String, Value)> {
        lock(&self.annotations)
            .entries
            .iter()
            .map(|a| (a.key.clone(), a.value.clone()))
            .collect()
    }

    /// How many annotation writes the store dropped for its bounds.
    pub fn dropped_annotations(&self) -> u64 {
        lock(&self.annotations).dropped
    }

    pub fn note_audit_outage(&self, err: &KernelError) {
        if matches!(err, KernelError::AuditUnavailable { .. }) {
            let mut slot = lock(&self.audit_outage);
            if slot.is_none() {
                *slot = Some(err.clone());
            }
        }
    }

    pub fn audit_outage(&self) -> Option<KernelError> {
        lock(&self.audit_outage).clone()
    }

    pub fn safe_to_retry(&self) -> bool {
        lock(&self.retry).safe_to_retry()
    }

    /// `drain(reason)` for an audit outage (B.5): raise the soft signal at
    /// once; the hard one after the grace, or at once with no grace. The
    /// deadline timer still runs, so the stop comes at min(grace, time left).
    pub fn drain_for_outage(self: &Arc<Self>) {
        if self.signals.hard_raised() {
            return;
        }
        self.signals.raise_soft();
        if self.drain_grace_ms == 0 {
            self.signals.raise_hard();
            return;
        }
        let mut timer = lock(&self.hard_timer);
        if timer.is_none() {
            let turn = Arc::downgrade(self);
            let grace = std::time::Duration::from_millis(self.drain_grace_ms);
            *timer = Some(tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                if let Some(turn) = turn.upgrade() {
                    turn.signals.raise_hard();
                }
            }));
        }
    }

    /// Closes the host: after this `invoke_tool` and `emit` are refused and
    /// `annotate` is a silent no-op. Aborts every still-running handler and
    /// disposes the timers.
    pub fn close(&self) {
        let was_open = self.open.swap(false, Ordering::SeqCst);
        let dropped = self.dropped_annotations();
        if was_open && dropped > 1 {
            tracing::warn!(execution_id = %self.execution_id, dropped, "annotation writes dropped by the store's bounds");
        }
        self.signals.raise_hard();
        if let Some(t) = lock(&self.hard_timer).take() {
            t.abort();
        }
        lock(&self.kernel_turn).take();
    }

    /// The `runtime` reference carried in `turn.started` and
    /// `runtime.event`: `{id, version, protocolVersion}`.
    pub fn runtime_ref(&self) -> Value {
        self.runtime_ref.clone()
    }
}

/// `{callId, tool, step?}` and friends.
pub(crate) fn call_event(
    call_id: &str,
    tool: &str,
    step: Option<u64>,
) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("callId".into(), json!(call_id));
    m.insert("tool".into(), json!(tool));
    if let Some(s) = step {
        m.insert("step".into(), json!(s));
    }
    m
}
