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
    CallEventData, EventData, ExecutionEvent, Identifier, MAX_EXECUTION_TOOL_CALLS, ShortName,
    Version,
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
pub(crate) const CALL_REQUESTED: &str = "tool.requested";
pub(crate) const CALL_COMPLETED: &str = "tool.completed";

/// The envelope's terminal events: the last of a turn.
const TERMINAL_EVENTS: &[&str] = &[
    "turn.completed",
    "turn.failed",
    "turn.cancelled",
    "turn.escalated",
    "turn.denied",
];

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
    call_kinds: [(ShortName, usize); 2],
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
            call_kinds: [CALL_REQUESTED, CALL_COMPLETED].map(|k| {
                let kind = ShortName::new(k).unwrap_or_else(|_| unreachable!());
                let len = str_len(kind.as_str());
                (kind, len)
            }),
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
    fn event(&self, log: &EventLog, kind: &str, data: EventData) -> (ExecutionEvent, usize) {
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
    fn kind(&self, kind: &str) -> (ShortName, usize) {
        if let Some(known) = self.call_kinds.iter().find(|k| k.0.as_str() == kind) {
            return known.clone();
        }
        let kind = ShortName::new(kind)
            .unwrap_or_else(|_| ShortName::new("event").unwrap_or_else(|_| unreachable!()));
        let len = str_len(kind.as_str());
        (kind, len)
    }

    /// Appends one of the envelope's own events (`turn.*`) and hands an
    /// immutable copy to the observer. Never refused: the budget keeps room
    /// for the ending (`RESERVED_EVENTS`), and what comes before the seat
    /// runs is the envelope's, not the plugin's. A terminal event seals the
    /// log. A panicking observer changes nothing.
    pub fn push_envelope(&self, kind: &str, data: Value) {
        {
            let mut log = lock(&self.log);
            if log.taken {
                return;
            }
            if TERMINAL_EVENTS.contains(&kind) {
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
    pub fn push_prepaid(&self, kind: &str, data: CallEventData) {
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
        kind: &str,
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
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;

    use serde_json::json;
    use sharedos_protocol::{Timestamp, ToolStatus, ident};

    use super::super::ledger::tests::measured;
    use super::*;

    /// A small deterministic generator (xorshift), so a failure names its
    /// seed.
    struct Gen(u64);

    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn pick<T: Clone>(&mut self, from: &[T]) -> T {
            from[self.below(from.len() as u64) as usize].clone()
        }
        fn text(&mut self) -> String {
            const PIECES: &[&str] = &[
                "a", "call-7", "\"", "\\", "\n", "\u{1}", "é", "☃", "😀", " ",
            ];
            (0..1 + self.below(4)).map(|_| self.pick(PIECES)).collect()
        }
        fn identifier(&mut self) -> Identifier {
            Identifier::new(format!("{}x", self.text())).unwrap_or_else(|_| ident("fallback"))
        }
        fn value(&mut self) -> Value {
            match self.below(6) {
                0 => Value::Null,
                1 => json!(self.pick(&[0u64, 9, 10, u64::MAX])),
                2 => json!(self.text()),
                3 => {
                    json!({"message": self.text(), "n": self.below(1000), "nested": [1, {"a": null}]})
                }
                4 => Value::Array((0..self.below(40)).map(|i| json!(i)).collect()),
                _ => json!({"callId": self.text(), "tool": self.text(), "step": self.below(3)}),
            }
        }
        fn call(&mut self) -> CallEventData {
            let (call_id, tool) = (self.identifier(), self.identifier());
            let step = self.pick(&[None, Some(0), Some(u64::MAX)]);
            if self.below(2) == 0 {
                return CallEventData::requested(call_id, tool, step);
            }
            let status = self.pick(&[
                ToolStatus::Succeeded,
                ToolStatus::Denied,
                ToolStatus::Failed,
            ]);
            let code = (self.below(2) == 0).then(|| self.identifier());
            CallEventData::completed(call_id, tool, step, status, code)
        }
        fn data(&mut self) -> EventData {
            if self.below(3) == 0 {
                EventData::Value(self.value())
            } else {
                EventData::Call(self.call())
            }
        }
        fn kind(&mut self) -> &'static str {
            self.pick(&[
                CALL_REQUESTED,
                CALL_COMPLETED,
                "runtime.event",
                "turn.started",
                " spaced.kind ",
                "",
            ])
        }
    }

    fn at() -> Timestamp {
        Timestamp::parse("2026-01-02T03:04:05.678Z").unwrap()
    }

    fn stamp() -> EventStamp {
        let n = Arc::new(AtomicU64::new(0));
        EventStamp {
            execution_id: ident("exec-1"),
            trace_id: ident("trace \"q\" é"),
            clock: Arc::new(at),
            ids: IdSource::from_fn(move || format!("id-{}", n.fetch_add(1, Ordering::SeqCst))),
        }
    }

    /// The log as it should be: the same rules, applied to a plain `Vec`,
    /// each charge measured from the event's serialization.
    struct Model {
        events: Vec<ExecutionEvent>,
        all: Vec<String>,
        charged_events: usize,
        held: usize,
        sealed: bool,
        taken: bool,
        next_id: u64,
        max_events: usize,
        max_bytes: usize,
    }

    impl Model {
        fn new(max_events: usize, max_bytes: usize) -> Self {
            Self {
                events: Vec::new(),
                all: Vec::new(),
                charged_events: 0,
                held: STDERR_TAIL_RESERVE_BYTES,
                sealed: false,
                taken: false,
                next_id: 0,
                max_events,
                max_bytes,
            }
        }

        fn candidate(&mut self, kind: &str, data: EventData) -> ExecutionEvent {
            let id = self.next_id;
            self.next_id += 1;
            ExecutionEvent {
                version: Version::V1,
                event_id: ident(&format!("id-{id}")),
                execution_id: ident("exec-1"),
                trace_id: ident("trace \"q\" é"),
                sequence: self.events.len() as u64,
                kind: ShortName::new(kind).unwrap_or_else(|_| ShortName::new("event").unwrap()),
                data,
                occurred_at: at(),
            }
        }

        fn append(&mut self, e: ExecutionEvent) {
            self.all.push(serde_json::to_string(&e).unwrap());
            self.events.push(e);
        }

        fn envelope(&mut self, kind: &str, data: Value) {
            if self.taken {
                return;
            }
            self.sealed |= TERMINAL_EVENTS.contains(&kind);
            self.charged_events += 1;
            let e = self.candidate(kind, data.into());
            self.held += measured(&e);
            self.append(e);
        }

        fn prepaid(&mut self, kind: &str, data: CallEventData) {
            if !self.sealed {
                let e = self.candidate(kind, EventData::Call(data));
                self.append(e);
            }
        }

        fn plugin(
            &mut self,
            kind: &str,
            data: EventData,
            prepaid_events: usize,
            prepaid_bytes: usize,
        ) -> Result<bool, &'static str> {
            if self.sealed {
                return Ok(false);
            }
            if self.charged_events + 1 + prepaid_events + RESERVED_EVENTS > self.max_events {
                return Err(RATE_LIMIT_EXCEEDED);
            }
            let e = self.candidate(kind, data);
            let bytes = measured(&e) * (1 + prepaid_events) + prepaid_bytes;
            if self.held + bytes + RESERVED_EVENT_BYTES > self.max_bytes {
                return Err(TURN_MEMORY_EXCEEDED);
            }
            self.charged_events += 1 + prepaid_events;
            self.held += bytes;
            self.append(e);
            Ok(true)
        }

        fn take(&mut self) -> Vec<ExecutionEvent> {
            self.sealed = true;
            self.taken = true;
            std::mem::take(&mut self.events)
        }
    }

    fn serialized(events: &[ExecutionEvent]) -> Vec<String> {
        events
            .iter()
            .map(|e| serde_json::to_string(e).unwrap())
            .collect()
    }

    /// Generated sequences of plugin, prepaid and envelope events, plans,
    /// seals and takes, long enough to pass the point where a log is given
    /// its plan and to outgrow the plan: every event comes out once, in
    /// order, numbered, byte for byte as the model's; the observer sees the
    /// same; every refusal and every held-bytes figure is the model's.
    #[test]
    fn generated_pushes_seals_and_takes_come_out_as_a_plain_log_would() {
        for seed in 1..300u64 {
            let mut g = Gen(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let max_events = g.pick(&[16, 300, 900, 100_000]);
            let max_bytes = g.pick(&[256 * 1024, 1 << 20, 1 << 30]);
            let end_per_mille = g.pick(&[0, 1, 5]);
            let seen = Arc::new(Mutex::new(Vec::new()));
            let on_event: OnEvent = {
                let seen = seen.clone();
                Arc::new(move |e: &ExecutionEvent| {
                    lock(&seen).push(serde_json::to_string(e).unwrap());
                })
            };
            let ledger = EventLedger::new(stamp(), max_events, max_bytes, Some(on_event));
            let mut model = Model::new(max_events, max_bytes);
            let mut taken = Vec::new();
            for step in 0..g.below(1_500) {
                let what = g.below(1000);
                if what < end_per_mille {
                    let kind = g.pick(TERMINAL_EVENTS);
                    let data = g.value();
                    ledger.push_envelope(kind, data.clone());
                    model.envelope(kind, data);
                } else if what < 2 * end_per_mille {
                    let got = serialized(&ledger.take());
                    assert_eq!(got, serialized(&model.take()), "seed {seed} step {step}");
                    taken.extend(got);
                } else if what < 20 {
                    let calls = g.pick(&[0, 1, 60, 200, 10_000, u32::MAX]);
                    ledger.plan_calls(calls);
                } else if what < 100 {
                    let (kind, data) = (g.kind(), g.value());
                    ledger.push_envelope(kind, data.clone());
                    model.envelope(kind, data);
                } else if what < 500 {
                    let data = g.call();
                    ledger.push_prepaid(CALL_COMPLETED, data.clone());
                    model.prepaid(CALL_COMPLETED, data);
                } else {
                    let (kind, data) = (g.kind(), g.data());
                    let prepaid_events = g.pick(&[0, 0, 1, 1, 5_000]);
                    let prepaid_bytes = g.pick(&[0, 1_100, 100_000]);
                    let got = ledger.push_plugin(kind, data.clone(), prepaid_events, prepaid_bytes);
                    let want = model.plugin(kind, data, prepaid_events, prepaid_bytes);
                    assert_eq!(got, want, "seed {seed} step {step}");
                }
                assert_eq!(ledger.bytes().held(), model.held, "seed {seed} step {step}");
            }
            let rest = serialized(&ledger.take());
            assert_eq!(rest, serialized(&model.take()), "seed {seed}");
            taken.extend(rest);
            assert_eq!(taken, model.all, "seed {seed}: every event, once, in order");
            assert_eq!(*lock(&seen), model.all, "seed {seed}: the observer's");
            assert!(ledger.take().is_empty(), "seed {seed}");
        }
    }

    /// With the default ids and clock (whose lengths the ledger does not
    /// scan), every charge is still what the event measures serialized.
    #[test]
    fn default_ids_and_times_are_charged_as_serialized() {
        let mut g = Gen(0x2545_F491_4F6C_DD1D);
        let stamp = EventStamp {
            ids: IdSource::uuid(),
            clock: Arc::new(Timestamp::now),
            ..stamp()
        };
        let ledger = EventLedger::new(stamp, 100_000, 1 << 30, None);
        let mut factors = Vec::new();
        for _ in 0..3_000 {
            match g.below(3) {
                0 => {
                    ledger.push_envelope(g.kind(), g.value());
                    factors.push(1);
                }
                1 => {
                    ledger.push_prepaid(CALL_COMPLETED, g.call());
                    factors.push(0);
                }
                _ => {
                    let prepaid = g.pick(&[0, 1, 3]);
                    let pushed = ledger.push_plugin(g.kind(), g.data(), prepaid, 0);
                    assert_eq!(pushed, Ok(true));
                    factors.push(1 + prepaid);
                }
            }
        }
        let held = ledger.bytes().held();
        let events = ledger.take();
        let want: usize = events
            .iter()
            .zip(&factors)
            .map(|(e, f)| measured(e) * f)
            .sum();
        assert_eq!(held, STDERR_TAIL_RESERVE_BYTES + want);
    }

    fn push_calls(ledger: &EventLedger, calls: usize) {
        for i in 0..calls {
            let call = CallEventData::requested(ident(&format!("c-{i}")), ident("t"), None);
            assert_eq!(
                ledger.push_plugin(CALL_REQUESTED, EventData::Call(call.clone()), 1, 0),
                Ok(true)
            );
            ledger.push_prepaid(CALL_COMPLETED, call);
        }
    }

    fn capacity(ledger: &EventLedger) -> usize {
        lock(&ledger.log).events.capacity()
    }

    #[test]
    fn a_busy_log_is_given_its_plan_once_and_a_small_one_holds_little() {
        // A busy turn: no growth between its plan and its last call.
        let ledger = EventLedger::new(stamp(), 100_000, 1 << 30, None);
        ledger.plan_calls(1_000);
        push_calls(&ledger, PLAN_AFTER_EVENTS / 2 + 1);
        assert_eq!(capacity(&ledger), 2 * 1_000 + PLANNED_ENVELOPE_EVENTS);
        push_calls(&ledger, 1_000 - (PLAN_AFTER_EVENTS / 2 + 1));
        assert_eq!(capacity(&ledger), 2 * 1_000 + PLANNED_ENVELOPE_EVENTS);
        let events = ledger.take();
        assert_eq!(events.len(), 2_000);
        assert!(
            events
                .iter()
                .enumerate()
                .all(|(i, e)| e.sequence == i as u64)
        );

        // A turn under its plan's point never gets it.
        let ledger = EventLedger::new(stamp(), 100_000, 1 << 30, None);
        ledger.plan_calls(10_000);
        push_calls(&ledger, 3);
        assert!(capacity(&ledger) < PLAN_AFTER_EVENTS);

        // A turn that used little of its plan gives the room back.
        let ledger = EventLedger::new(stamp(), 100_000, 1 << 30, None);
        ledger.plan_calls(10_000);
        push_calls(&ledger, PLAN_AFTER_EVENTS / 2 + 1);
        assert!(capacity(&ledger) >= 20_000);
        let events = ledger.take();
        assert!(
            events.capacity() < 2 * events.len(),
            "{}",
            events.capacity()
        );

        // The plan stays within the count budget.
        let ledger = EventLedger::new(stamp(), 300, 1 << 30, None);
        ledger.plan_calls(u32::MAX);
        assert_eq!(lock(&ledger.log).planned, 300);
    }
}
