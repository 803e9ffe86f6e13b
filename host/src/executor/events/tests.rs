//! The event log's tests: generated pushes, seals and takes against a plain
//! model log, the planned room, and held bytes against serialized sizes.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use serde_json::json;
use sharedos_protocol::{Timestamp, ToolStatus, ident};

use super::super::ledger::tests::measured;
use super::*;

/// The test kit's generator with this suite's values, so a failure names
/// its seed.
struct Gen(sharedos_testkit::XorShift);

impl Gen {
    fn new(seed: u64) -> Self {
        Self(sharedos_testkit::XorShift::new(seed))
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0.below(n)
    }
    fn pick<T: Clone>(&mut self, from: &[T]) -> T {
        self.0.pick(from)
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
    fn kind(&mut self) -> EventKind {
        self.pick(&[
            CALL_REQUESTED,
            CALL_COMPLETED,
            EventKind::RuntimeEvent,
            EventKind::TurnStarted,
            EventKind::EgressBudgetExceeded,
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

    fn candidate(&mut self, kind: EventKind, data: EventData) -> ExecutionEvent {
        let id = self.next_id;
        self.next_id += 1;
        ExecutionEvent {
            version: Version::V1,
            event_id: ident(&format!("id-{id}")),
            execution_id: ident("exec-1"),
            trace_id: ident("trace \"q\" é"),
            sequence: self.events.len() as u64,
            kind: ShortName::new(kind.as_str()).unwrap(),
            data,
            occurred_at: at(),
        }
    }

    fn append(&mut self, e: ExecutionEvent) {
        self.all.push(serde_json::to_string(&e).unwrap());
        self.events.push(e);
    }

    fn envelope(&mut self, kind: EventKind, data: Value) {
        if self.taken {
            return;
        }
        self.sealed |= EventKind::TERMINAL.contains(&kind);
        self.charged_events += 1;
        let e = self.candidate(kind, data.into());
        self.held += measured(&e);
        self.append(e);
    }

    fn prepaid(&mut self, kind: EventKind, data: CallEventData) {
        if !self.sealed {
            let e = self.candidate(kind, EventData::Call(data));
            self.append(e);
        }
    }

    fn plugin(
        &mut self,
        kind: EventKind,
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
        let mut g = Gen::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
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
                let kind = g.pick(EventKind::TERMINAL);
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
    let mut g = Gen::new(0x2545_F491_4F6C_DD1D);
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
