//! The turn's event ledger: the ordered event log, the count budget and
//! the byte ledger it charges, the observer it serves, and the seal that
//! makes the ending the last event. It is the only writer of a turn's
//! events.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, TryLockError};

use serde_json::Value;
use sharedos_protocol::json::str_len;
use sharedos_protocol::{
    CallEventData, EventData, EventKind, ExecutionEvent, Identifier, MAX_EXECUTION_TOOL_CALLS,
    ShortName, Version,
};

use super::ledger::{ByteLedger, data_held_bytes, frame_held_bytes, time_len, turn_fixed_len};
use super::{Clock, IdSource, OnEvent, lock};
use crate::limits::{RESERVED_EVENT_BYTES, RESERVED_EVENTS, STDERR_TAIL_RESERVE_BYTES};

/// The violation a plugin commits by going over the turn's event budget
/// (protocol.md B.4, "Emit budget").
pub(crate) const RATE_LIMIT_EXCEEDED: &str = "rate_limit_exceeded";
/// The violation a plugin commits by making the host hold more than the
/// turn's byte ledger allows (docs/PROTOCOL.md section 5).
pub(crate) const TURN_MEMORY_EXCEEDED: &str = "turn_memory_exceeded";

/// The types of a call's two events.
pub(crate) const CALL_REQUESTED: EventKind = EventKind::ToolRequested;
pub(crate) const CALL_COMPLETED: EventKind = EventKind::ToolCompleted;

/// What stamps each event with the turn's ids and time.
pub(crate) struct EventStamp {
    pub execution_id: Identifier,
    pub trace_id: Identifier,
    pub clock: Clock,
    pub ids: IdSource,
}

/// A log this long is a busy turn's: it is given the room its call budget
/// plans for ([`EventLedger::plan_calls`]) when it next grows. Below it
/// the log grows as a `Vec` does, so a turn with few events holds little.
const PLAN_AFTER_EVENTS: usize = 256;

/// The events of a turn beyond its calls' two each: its start, its ending
/// and a few of the envelope's own.
const PLANNED_ENVELOPE_EVENTS: usize = 8;

/// The log itself. `charged_events` is what the count budget has counted:
/// every event written, plus the completions paid for in advance by calls
/// still waiting for theirs (their bytes are in the ledger).
struct EventLog {
    events: Vec<ExecutionEvent>,
    /// The length the log is expected to reach, given to it once it is
    /// [`PLAN_AFTER_EVENTS`] long; 0 once given (or never planned).
    planned: usize,
    charged_events: usize,
    /// Set when the envelope wrote the turn's ending: nothing the seat
    /// causes is written after it.
    sealed: bool,
    /// Set when the result took the events: nothing is written after it.
    taken: bool,
}

impl EventLog {
    /// Appends `event`. A busy turn's log does not grow by doubling all
    /// the way: each doubling of a log of thousands of events copied all of
    /// them into fresh memory, which the kernel zeroed page by page. It is
    /// given, once, the room its plan needs; a log that outgrows even that
    /// (a plugin's own events) grows as a `Vec` does from there.
    #[inline]
    fn push(&mut self, event: ExecutionEvent) {
        let len = self.events.len();
        if len == self.events.capacity() && len >= PLAN_AFTER_EVENTS {
            self.give_plan();
        }
        self.events.push(event);
    }

    /// Reserves the planned room (once; then there is no plan left).
    #[cold]
    fn give_plan(&mut self) {
        let planned = std::mem::take(&mut self.planned);
        self.events
            .reserve_exact(planned.saturating_sub(self.events.len()));
    }

    /// The events, out of the log. A turn that used a small part of the
    /// room it planned gives the rest back (one copy of a few events) so a
    /// kept result does not hold it.
    fn take(&mut self) -> Vec<ExecutionEvent> {
        let mut events = std::mem::take(&mut self.events);
        if events.capacity() / 4 > events.len() {
            events.shrink_to_fit();
        }
        events
    }
}

/// The turn's events and what they cost.
pub(crate) struct EventLedger {
    log: Mutex<EventLog>,
    /// How many events the observer has been handed; held by the one
    /// caller delivering.
    delivered: Mutex<usize>,
    delivered_count: AtomicUsize,
    bytes: ByteLedger,
    max_events: usize,
    on_event: Option<OnEvent>,
    stamp: EventStamp,
    /// `tool.requested` and `tool.completed`, written for every call, with
    /// their serialized lengths.
    call_kinds: [(EventKind, ShortName, usize); 2],
    /// What every event's frame and turn ids add to its size.
    fixed_len: usize,
}

impl EventLedger {
    /// An empty log whose byte ledger has its fixed reserve charged: the
    /// plugin's stderr tail.
    pub fn new(
        stamp: EventStamp,
        max_events: usize,
        max_bytes: usize,
        on_event: Option<OnEvent>,
    ) -> Self {
        let bytes = ByteLedger::new(max_bytes);
        bytes.charge(STDERR_TAIL_RESERVE_BYTES);
        Self {
            log: Mutex::new(EventLog {
                events: Vec::new(),
                planned: 0,
                charged_events: 0,
                sealed: false,
                taken: false,
            }),
            delivered: Mutex::new(0),
            delivered_count: AtomicUsize::new(0),
            bytes,
            max_events,
            on_event,
            fixed_len: turn_fixed_len(&stamp.execution_id, &stamp.trace_id),
            stamp,
            call_kinds: [CALL_REQUESTED, CALL_COMPLETED]
                .map(|k| (k, k.short_name(), str_len(k.as_str()))),
        }
    }

    /// Plans the log for a turn of at most `max_tool_calls` calls (two
    /// events each), within the count budget: the room it is given if it
    /// gets long ([`EventLog::push`]). Only a plan: a log may pass it.
    pub fn plan_calls(&self, max_tool_calls: u32) {
        let calls = (max_tool_calls as usize).min(MAX_EXECUTION_TOOL_CALLS as usize);
        let planned = (2 * calls + PLANNED_ENVELOPE_EVENTS).min(self.max_events);
        lock(&self.log).planned = planned;
    }

    /// The byte ledger, which the annotation store charges too.
    pub fn bytes(&self) -> &ByteLedger {
        &self.bytes
    }

    /// The next event of the log, not yet appended, and what holding it
    /// costs apart from its `data` ([`frame_held_bytes`]), measured from
    /// the lengths its parts come with.
    fn event(&self, log: &EventLog, kind: EventKind, data: EventData) -> (ExecutionEvent, usize) {
        let (event_id, id_len) = self.stamp.ids.next_measured();
        let (kind, kind_len) = self.kind(kind);
        let sequence = log.events.len() as u64;
        let occurred_at = (self.stamp.clock)();
        let frame = frame_held_bytes(
            self.fixed_len,
            id_len,
            sequence,
            kind_len,
            time_len(&occurred_at),
        );
        let event = ExecutionEvent {
            version: Version::V1,
            event_id,
            execution_id: self.stamp.execution_id.clone(),
            trace_id: self.stamp.trace_id.clone(),
            sequence,
            kind,
            data,
            occurred_at,
        };
        (event, frame)
    }

    /// `kind` as an event's type, and its serialized length: a call's,
    /// copied from the ones made once.
    fn kind(&self, kind: EventKind) -> (ShortName, usize) {
        if let Some((_, name, len)) = self.call_kinds.iter().find(|k| k.0 == kind) {
            return (name.clone(), *len);
        }
        (kind.short_name(), str_len(kind.as_str()))
    }

    /// Appends one of the envelope's own events (`turn.*`) and hands an
    /// immutable copy to the observer. Never refused: the budget keeps room
    /// for the ending (`RESERVED_EVENTS`), and what comes before the seat
    /// runs is the envelope's, not the plugin's. A terminal event seals the
    /// log. A panicking observer changes nothing.
    pub fn push_envelope(&self, kind: EventKind, data: Value) {
        {
            let mut log = lock(&self.log);
            if log.taken {
                return;
            }
            if kind.is_terminal() {
                // The ending is the last event: a call still in mediation
                // or with the kernel writes nothing after it.
                log.sealed = true;
            }
            log.charged_events += 1;
            let (event, frame) = self.event(&log, kind, data.into());
            self.bytes
                .charge(frame.saturating_add(data_held_bytes(&event.data)));
            log.push(event);
        }
        self.deliver();
    }

    /// Appends a `tool.completed` whose call paid for it when it was
    /// requested.
    pub fn push_prepaid(&self, kind: EventKind, data: CallEventData) {
        {
            let mut log = lock(&self.log);
            if log.sealed {
                return;
            }
            let (event, _) = self.event(&log, kind, EventData::Call(data));
            log.push(event);
        }
        self.deliver();
    }

    /// Appends an event a plugin's action causes (`runtime.event`,
    /// `tool.requested`), paying in advance for `prepaid_events` more
    /// events of its own size plus `prepaid_bytes` (a call's completion).
    /// Over the count budget or the byte ledger, with the reserve for the
    /// ending kept back, nothing is written and the violation is answered
    /// (`rate_limit_exceeded` for the count, `turn_memory_exceeded` for
    /// the bytes). `Ok(false)`: the log is sealed, nothing was written.
    pub fn push_plugin(
        &self,
        kind: EventKind,
        data: EventData,
        prepaid_events: usize,
        prepaid_bytes: usize,
    ) -> Result<bool, &'static str> {
        {
            let mut log = lock(&self.log);
            if log.sealed {
                return Ok(false);
            }
            let events = log
                .charged_events
                .saturating_add(1 + prepaid_events + RESERVED_EVENTS);
            if events > self.max_events {
                return Err(RATE_LIMIT_EXCEEDED);
            }
            let (event, frame) = self.event(&log, kind, data);
            let bytes = frame
                .saturating_add(data_held_bytes(&event.data))
                .saturating_mul(1 + prepaid_events)
                .saturating_add(prepaid_bytes);
            if !self.bytes.try_charge(bytes, RESERVED_EVENT_BYTES) {
                return Err(TURN_MEMORY_EXCEEDED);
            }
            log.charged_events += 1 + prepaid_events;
            log.push(event);
        }
        self.deliver();
        Ok(true)
    }

    fn len(&self) -> usize {
        lock(&self.log).events.len()
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
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => return,
            };
            loop {
                let next = lock(&self.log).events.get(*delivered).cloned();
                let Some(event) = next else { break };
                *delivered += 1;
                let _ = std::panic::catch_unwind(AssertUnwindSafe(|| cb(&event)));
            }
            self.delivered_count.store(*delivered, Ordering::SeqCst);
            drop(delivered);
            if self.delivered_count.load(Ordering::SeqCst) >= self.len() {
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
            if self.delivered_count.load(Ordering::SeqCst) >= self.len() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// Seals the log and takes its events out: the last read of a turn's
    /// log (its result), after the observer has been served. Nothing is
    /// written after it (a late call's completion is refused by the seal,
    /// an envelope event by `taken`).
    pub fn take(&self) -> Vec<ExecutionEvent> {
        let mut log = lock(&self.log);
        log.sealed = true;
        log.taken = true;
        log.take()
    }
}

#[cfg(test)]
mod tests;
