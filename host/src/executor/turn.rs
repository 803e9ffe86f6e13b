//! One turn, in owned parts: the event ledger (the only writer of
//! events), the call gate (admits and settles mediated calls), the
//! authority (the kernel's side of the turn, its context, an audit
//! outage), the annotation store, and the two signals with the one timer
//! that raises them. `Turn` composes them and is shared by the executor and
//! the host it hands the seat; every part changes only through its own API.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use serde_json::Value;
use sharedos_protocol::{
    AccessContext, EventData, EventKind, Identifier, RuntimeLimits, Timestamp,
};

use super::annotations::{AnnotationBounds, Annotations};
use super::authority::Authority;
use super::deadline::Deadline;
use super::events::{EventLedger, EventStamp};
use super::gate::CallGate;
use super::signals::TurnSignals;
use super::{Clock, IdSource, OnEvent};

/// The per-turn bounds on what a plugin can make the envelope hold
/// (docs/ENVELOPE.md, "Bounded memory").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TurnBudget {
    pub max_events: usize,
    /// The byte ledger's limit (`ExecutorOptions::max_turn_bytes`).
    pub max_turn_bytes: usize,
    pub annotations: AnnotationBounds,
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

/// Everything one turn shares between the executor and its host.
pub(crate) struct Turn {
    execution_id: Identifier,
    trace_id: Identifier,
    limits: RuntimeLimits,
    drain_grace_ms: u64,
    /// `{id, version, protocolVersion}`, as `turn.started` and
    /// `runtime.event` carry it.
    runtime_ref: Value,
    clock: Clock,
    open: AtomicBool,
    signals: Arc<TurnSignals>,
    deadline: OnceLock<Deadline>,
    events: EventLedger,
    gate: CallGate,
    authority: Authority,
    annotations: Annotations,
    violation: OnceLock<&'static str>,
    /// The gateway's account of the turn (`metadata.runtime.egress`).
    egress: OnceLock<Value>,
}

impl Turn {
    pub fn new(p: TurnParams) -> Arc<Self> {
        let stamp = EventStamp {
            execution_id: p.execution_id.clone(),
            trace_id: p.context.trace_id.clone(),
            clock: p.clock.clone(),
            ids: p.ids,
        };
        Arc::new(Self {
            execution_id: p.execution_id,
            trace_id: p.context.trace_id.clone(),
            limits: p.limits,
            drain_grace_ms: p.drain_grace_ms,
            runtime_ref: p.runtime_ref,
            clock: p.clock,
            open: AtomicBool::new(true),
            signals: Arc::new(TurnSignals::default()),
            deadline: OnceLock::new(),
            events: EventLedger::new(
                stamp,
                p.budget.max_events,
                p.budget.max_turn_bytes,
                p.on_event,
            ),
            gate: CallGate::default(),
            authority: Authority::new(p.context),
            annotations: Annotations::new(p.budget.annotations),
            violation: OnceLock::new(),
            egress: OnceLock::new(),
        })
    }

    pub fn execution_id(&self) -> &Identifier {
        &self.execution_id
    }
    pub fn trace_id(&self) -> &Identifier {
        &self.trace_id
    }
    pub fn limits(&self) -> RuntimeLimits {
        self.limits
    }
    /// The `runtime` reference carried in `turn.started` and
    /// `runtime.event`.
    pub fn runtime_ref(&self) -> &Value {
        &self.runtime_ref
    }
    pub fn signals(&self) -> &TurnSignals {
        &self.signals
    }
    pub fn events(&self) -> &EventLedger {
        &self.events
    }
    pub fn gate(&self) -> &CallGate {
        &self.gate
    }
    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    pub fn now(&self) -> Timestamp {
        (self.clock)()
    }

    /// The context with `now` set to the clock, as every kernel call gets
    /// it.
    pub fn context_now(&self) -> Arc<AccessContext> {
        self.authority.context_at(self.now())
    }

    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }

    /// Arms the turn's one timer (B.5); a second call does nothing.
    pub fn arm_deadline(&self) {
        self.deadline.get_or_init(|| {
            Deadline::arm(
                &self.signals,
                self.execution_id.clone(),
                self.limits.timeout_ms,
                self.drain_grace_ms,
            )
        });
    }

    /// Appends an event a plugin's action causes (the event ledger's
    /// `push_plugin`). Over the count budget or the byte ledger the turn is
    /// stopped for the violation and `false` returned, as for a sealed log.
    pub fn push_plugin_event(
        &self,
        kind: EventKind,
        data: EventData,
        prepaid_events: usize,
        prepaid_bytes: usize,
    ) -> bool {
        match self
            .events
            .push_plugin(kind, data, prepaid_events, prepaid_bytes)
        {
            Ok(written) => written,
            Err(reason) => {
                self.violate(reason);
                false
            }
        }
    }

    /// A host-side violation: noted once, and the seat is stopped as at an
    /// abort. The turn then ends `failed runtime_failed`; the reason goes
    /// to the logs and `on_turn_error`, never to the result.
    pub fn violate(&self, reason: &'static str) {
        if self.violation.set(reason).is_err() {
            return;
        }
        tracing::warn!(execution_id = %self.execution_id, reason, "the runtime broke a limit of the envelope; stopping the seat");
        self.signals.raise_hard();
    }

    /// Notes the gateway's account of the turn, once.
    pub fn set_egress(&self, account: Value) {
        let _ = self.egress.set(account);
    }

    pub fn egress(&self) -> Option<&Value> {
        self.egress.get()
    }

    pub fn violation(&self) -> Option<&'static str> {
        self.violation.get().copied()
    }

    /// Stores an annotation: kept while the turn is open (even aborted),
    /// dropped silently after close (the store's own bounds:
    /// [`Annotations::write`]).
    pub fn annotate(&self, key: &str, value: Value) {
        if self.is_open() {
            self.annotations
                .write(key, value, self.events.bytes(), &self.execution_id);
        }
    }

    pub fn annotations(&self) -> Vec<(String, Value)> {
        self.annotations.entries()
    }

    /// Notes an audit outage a kernel call answered (the first one).
    pub fn note_audit_outage(&self, err: &sharedos_kernel::KernelError) {
        self.authority.note_outage(err);
    }

    /// `drain(reason)` for an audit outage (B.5): raise the soft signal at
    /// once; the hard one after the grace, or at once with no grace (or no
    /// timer). The deadline still holds, so the stop comes at min(grace,
    /// time left).
    pub fn drain_for_outage(&self) {
        if self.signals.hard_raised() {
            return;
        }
        self.signals.raise_soft();
        match self.deadline.get() {
            Some(deadline) if self.drain_grace_ms > 0 => deadline.stop_after_grace(),
            _ => self.signals.raise_hard(),
        }
    }

    /// Closes the host: after this `invoke_tool` and `emit` are refused and
    /// `annotate` is a silent no-op. Aborts every still-running handler,
    /// disarms the timer and releases the kernel's side of the turn.
    pub fn close(&self) {
        let was_open = self.open.swap(false, Ordering::SeqCst);
        let dropped = self.annotations.dropped();
        if was_open && dropped > 1 {
            tracing::warn!(execution_id = %self.execution_id, dropped, "annotation writes dropped by the store's bounds");
        }
        self.signals.raise_hard();
        if let Some(deadline) = self.deadline.get() {
            deadline.disarm();
        }
        self.authority.release();
    }
}
