//! Per-turn state shared by the executor and the host it hands the seat:
//! the event log, the annotation store, the two signals, the retry
//! bookkeeping and the in-flight calls.

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};
use sharedos_kernel::{KernelError, TurnKernel, TurnLease};
use sharedos_plugin_sdk::{Signal, SignalSource};
use sharedos_protocol::{
    AccessContext, ExecutionEvent, Identifier, RuntimeLimits, ShortName, Timestamp, ToolDefinition,
    Version,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

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

/// The ordered event log. Only the envelope writes events.
pub(crate) struct EventLog {
    events: Vec<ExecutionEvent>,
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
    pub kernel: Arc<dyn TurnKernel>,
    pub lease: Mutex<Option<TurnLease>>,
    pub catalogue: Mutex<Vec<ToolDefinition>>,
    pub repeatable: Mutex<HashSet<String>>,
    pub calls: Mutex<CallBudget>,
    pub runtime_ref: Value,
    events: Mutex<EventLog>,
    /// How many events the observer has been handed; held by the one
    /// caller delivering.
    delivered: Mutex<usize>,
    delivered_count: std::sync::atomic::AtomicUsize,
    annotations: Mutex<Vec<(String, Value)>>,
    clock: Clock,
    ids: IdSource,
    on_event: Option<OnEvent>,
    hard_timer: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

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
    pub kernel: Arc<dyn TurnKernel>,
    pub runtime_ref: Value,
    pub clock: Clock,
    pub ids: IdSource,
    pub on_event: Option<OnEvent>,
}

impl Turn {
    pub fn new(p: TurnParams) -> Arc<Self> {
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
            kernel: p.kernel,
            lease: Mutex::new(None),
            catalogue: Mutex::new(Vec::new()),
            repeatable: Mutex::new(HashSet::new()),
            calls: Mutex::new(CallBudget::default()),
            runtime_ref: p.runtime_ref,
            events: Mutex::new(EventLog { events: Vec::new() }),
            delivered: Mutex::new(0),
            delivered_count: std::sync::atomic::AtomicUsize::new(0),
            annotations: Mutex::new(Vec::new()),
            clock: p.clock,
            ids: p.ids,
            on_event: p.on_event,
            hard_timer: Mutex::new(None),
        })
    }

    pub fn now(&self) -> Timestamp {
        (self.clock)()
    }

    /// The context with `now` set to the clock, as every kernel call gets it.
    pub fn context_now(&self) -> AccessContext {
        let mut c = self.context.clone();
        c.now = self.now();
        c
    }

    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }

    pub fn lease(&self) -> Option<TurnLease> {
        lock(&self.lease).clone()
    }

    /// Appends an authoritative event and hands an immutable copy to the
    /// observer. A panicking observer changes nothing.
    pub fn push_event(&self, kind: &str, data: Value) {
        {
            let mut log = lock(&self.events);
            let event = ExecutionEvent {
                version: Version::V1,
                event_id: self.ids.next(),
                execution_id: self.execution_id.clone(),
                trace_id: self.trace_id.clone(),
                sequence: log.events.len() as u64,
                kind: ShortName::new(kind)
                    .unwrap_or_else(|_| ShortName::new("event").unwrap_or_else(|_| unreachable!())),
                data,
                occurred_at: self.now(),
            };
            log.events.push(event);
        }
        self.deliver();
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

    pub fn events(&self) -> Vec<ExecutionEvent> {
        lock(&self.events).events.clone()
    }

    /// Stores an annotation: kept while the turn is open (even aborted),
    /// dropped silently after close; the last write to a key wins and the
    /// first write fixes its position.
    pub fn annotate(&self, key: &str, value: Value) {
        if !self.is_open() {
            return;
        }
        let mut ann = lock(&self.annotations);
        if let Some(slot) = ann.iter_mut().find(|(k, _)| k == key) {
            slot.1 = value;
        } else {
            ann.push((key.to_owned(), value));
        }
    }

    pub fn annotations(&self) -> Vec<(String, Value)> {
        lock(&self.annotations).clone()
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
        self.open.store(false, Ordering::SeqCst);
        self.signals.raise_hard();
        if let Some(t) = lock(&self.hard_timer).take() {
            t.abort();
        }
        lock(&self.lease).take();
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
