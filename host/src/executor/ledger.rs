//! The per-turn byte ledger (docs/PROTOCOL.md section 5, docs/ENVELOPE.md
//! "Bounded memory"): every byte a turn makes the host hold, whatever
//! wrote it, is charged to one ledger with one limit.
//!
//! What is charged, and how much:
//! - each event the turn's log holds: its whole serialized size (ids,
//!   timestamps, type and `data`), plus `VALUE_NODE_BYTES` per JSON value
//!   in it, plus `EVENT_OVERHEAD_BYTES`. The per-value charge is what the
//!   parsed form costs in memory: `[0,0,0]` is 7 bytes on the wire but four
//!   `serde_json::Value`s in the host, so a count of wire bytes alone would
//!   let a plugin make the host hold 16 times its limit;
//! - each annotation the store keeps, measured the same way (its key plus
//!   its value);
//! - a call's `tool.completed`, paid when the call is requested;
//! - a fixed reserve for the plugin's stderr tail (`metadata.runtime.process`)
//!   and one for the envelope's own ending, so neither can be crowded out.
//!
//! Tool arguments and results are not retained by the turn (they pass
//! through, each bounded by `maxMessageBytes`); the outcome's `output` is
//! bounded by the same line limit, so a result holds at most the ledger's
//! limit plus one line.

use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Serialize;
use serde_json::Value;
#[cfg(test)]
use sharedos_protocol::ExecutionEvent;
use sharedos_protocol::json::str_len;
use sharedos_protocol::{CallEventData, EventData, Identifier, Timestamp};

use crate::limits::{EVENT_OVERHEAD_BYTES, VALUE_NODE_BYTES};

/// One turn's ledger. Charges and releases are atomic; a charge that
/// would pass the limit (minus what it must keep back) is refused whole.
#[derive(Debug)]
pub(crate) struct ByteLedger {
    held: AtomicUsize,
    limit: usize,
}

impl ByteLedger {
    pub fn new(limit: usize) -> Self {
        Self {
            held: AtomicUsize::new(0),
            limit,
        }
    }

    /// Charges `n` if `held + n + keep_back` stays within the limit.
    pub fn try_charge(&self, n: usize, keep_back: usize) -> bool {
        let ceiling = self.limit.saturating_sub(keep_back);
        self.held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                let next = held.checked_add(n)?;
                (next <= ceiling).then_some(next)
            })
            .is_ok()
    }

    /// Charges `n` whatever the limit: what the envelope itself writes
    /// (its own events, the reserves), bounded by construction.
    pub fn charge(&self, n: usize) {
        let _ = self
            .held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |h| {
                Some(h.saturating_add(n))
            });
    }

    /// Gives back `n` (an annotation replaced by a smaller value).
    pub fn release(&self, n: usize) {
        let _ = self
            .held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |h| {
                Some(h.saturating_sub(n))
            });
    }

    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }
}

/// The serialized length of `v`, without building the string.
pub(crate) fn serialized_len<T: Serialize + ?Sized>(v: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// The serialized length of a number, as serde_json writes it: integers
/// counted digit by digit; a float (rare in an event) written to count it.
fn number_len(n: &serde_json::Number) -> usize {
    if let Some(u) = n.as_u64() {
        digits(u)
    } else if let Some(i) = n.as_i64() {
        1 + digits(i.unsigned_abs())
    } else {
        serialized_len(n)
    }
}

/// The serialized length of a scalar, or of an array's or object's own
/// brackets and commas (its keys and members are counted by [`visit`]).
fn own_len(v: &Value) -> usize {
    match v {
        Value::Null => 4,
        Value::Bool(true) => 4,
        Value::Bool(false) => 5,
        Value::Number(n) => number_len(n),
        Value::String(s) => str_len(s),
        Value::Array(a) => 2 + a.len().saturating_sub(1),
        Value::Object(o) => 2 + o.len().saturating_sub(1),
    }
}

/// The serialized length of `v` and how many JSON values it is made of
/// (itself included), summed from its parts without writing it.
/// Iterative: a value built by the host may be deeper than the parser's
/// limit. A flat object or array (most events' `data`) needs no stack.
fn measure(v: &Value) -> (usize, usize) {
    let mut total = (0usize, 0usize);
    let mut stack: Vec<&Value> = Vec::new();
    visit(v, &mut total, &mut stack);
    while let Some(v) = stack.pop() {
        visit(v, &mut total, &mut stack);
    }
    total
}

/// Adds `v`, its keys and its scalar members to `total` (length, values);
/// leaves its nested arrays and objects on `stack`.
fn visit<'v>(v: &'v Value, total: &mut (usize, usize), stack: &mut Vec<&'v Value>) {
    let (mut len, mut nodes) = (own_len(v), 1usize);
    let mut member = |m: &'v Value, len: &mut usize| {
        if matches!(m, Value::Array(_) | Value::Object(_)) {
            stack.push(m);
        } else {
            *len = len.saturating_add(own_len(m));
            nodes += 1;
        }
    };
    match v {
        Value::Array(a) => a.iter().for_each(|m| member(m, &mut len)),
        Value::Object(o) => {
            for (k, m) in o {
                // The key, quoted and escaped, and its colon.
                len = len.saturating_add(str_len(k) + 1);
                member(m, &mut len);
            }
        }
        _ => {}
    }
    total.0 = total.0.saturating_add(len);
    total.1 += nodes;
}

/// What holding `v` costs, as the ledger counts it.
pub(crate) fn value_held_bytes(v: &Value) -> usize {
    let (len, nodes) = measure(v);
    len.saturating_add(nodes.saturating_mul(VALUE_NODE_BYTES))
}

/// What holding an event's `data` costs: a call's summed from its parts
/// (`{"callId":…,"code":…,"status":…,"step":…,"tool":…}`, each member a
/// value), without building its JSON; any other by [`value_held_bytes`].
pub(crate) fn data_held_bytes(data: &EventData) -> usize {
    match data {
        EventData::Value(v) => value_held_bytes(v),
        EventData::Call(call) => call_held_bytes(call),
    }
}

fn call_held_bytes(call: &CallEventData) -> usize {
    const FRAME: usize = r#"{"callId":,"tool":}"#.len();
    const STEP: usize = r#","step":"#.len();
    const STATUS: usize = r#","status":"#.len();
    const CODE: usize = r#","code":"#.len();
    let mut len = FRAME + str_len(call.call_id().as_str()) + str_len(call.tool().as_str());
    let mut values = 3;
    if let Some(step) = call.step() {
        len += STEP + digits(step);
        values += 1;
    }
    if let Some(status) = call.status() {
        len += STATUS + str_len(status.as_str());
        values += 1;
    }
    if let Some(code) = call.code() {
        len += CODE + str_len(code.as_str());
        values += 1;
    }
    len.saturating_add(values * VALUE_NODE_BYTES)
}

/// The punctuation and keys of a serialized `ExecutionEvent`, around its
/// values (the field order is the struct's).
const EVENT_FRAME: &str = r#"{"version":"1","eventId":,"executionId":,"traceId":,"sequence":,"type":,"data":,"occurredAt":}"#;

/// The decimal digits of `n`.
pub(crate) fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// What holding `event` costs, measured on its own (the tests' form of
/// [`event_held_bytes_in_turn`]).
#[cfg(test)]
pub(crate) fn event_held_bytes(event: &ExecutionEvent) -> usize {
    event_held_bytes_in_turn(event, turn_fixed_len(&event.execution_id, &event.trace_id))
}

/// The part of an event's serialized size that is the same for every
/// event of a turn: the frame, the execution id and the trace id.
pub(crate) fn turn_fixed_len(execution_id: &Identifier, trace_id: &Identifier) -> usize {
    EVENT_FRAME.len() + str_len(execution_id.as_str()) + str_len(trace_id.as_str())
}

/// What holding `event` costs, as the ledger counts it, for an event of
/// the turn whose ids measure `fixed` ([`turn_fixed_len`]). Its serialized
/// size is summed from its parts (every event of a tool call is sized
/// here, so the event is not serialized just to be measured): strings by
/// their escaped length, `data` by [`data_held_bytes`].
#[cfg(test)]
pub(crate) fn event_held_bytes_in_turn(event: &ExecutionEvent, fixed: usize) -> usize {
    event_frame_held_bytes(event, fixed).saturating_add(data_held_bytes(&event.data))
}

/// What holding `event` costs apart from its `data` (the tests' form of
/// [`frame_held_bytes`], every string measured).
#[cfg(test)]
pub(crate) fn event_frame_held_bytes(event: &ExecutionEvent, fixed: usize) -> usize {
    frame_held_bytes(
        fixed,
        str_len(event.event_id.as_str()),
        event.sequence,
        str_len(event.kind.as_str()),
        time_len(&event.occurred_at),
    )
}

/// What holding an event costs apart from its `data`: its frame and turn
/// ids (`fixed`), its id, sequence, type and time (the strings by their
/// serialized lengths, quotes included) and the per-event overhead. The
/// event's writer knows most of these lengths without a scan: its call
/// kinds' are measured once, a UUID's is fixed, a time's is its length.
pub(crate) fn frame_held_bytes(
    fixed: usize,
    id_len: usize,
    sequence: u64,
    kind_len: usize,
    time_len: usize,
) -> usize {
    let serialized = fixed + id_len + digits(sequence) + kind_len + time_len;
    serialized.saturating_add(EVENT_OVERHEAD_BYTES)
}

/// The serialized length of a time, quotes included. RFC 3339 text holds
/// nothing a JSON string escapes (digits, `-`, `:`, `.`, `+`, `T`, `Z` and
/// their lowercase forms) except at one place: a `Timestamp` takes any
/// ASCII byte between its date (always ten bytes) and its time, as `time`
/// does, a quote or a control byte included. Only a time with such a byte
/// there is scanned (the test generates and damages times everywhere).
pub(crate) fn time_len(at: &Timestamp) -> usize {
    let text = at.as_str();
    match text.as_bytes().get(10) {
        Some(b'T' | b't' | b' ') => text.len() + 2,
        _ => str_len(text),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_charge_past_the_limit_is_refused_whole() {
        let l = ByteLedger::new(100);
        assert!(l.try_charge(60, 0));
        assert!(!l.try_charge(41, 0));
        assert!(!l.try_charge(30, 20), "the kept-back room is not given");
        assert!(l.try_charge(20, 20));
        assert_eq!(l.held(), 80);
        l.charge(50);
        assert_eq!(l.held(), 130, "the envelope's own writes always land");
        l.release(1000);
        assert_eq!(l.held(), 0);
        assert!(!l.try_charge(usize::MAX, 0));
    }

    /// How many JSON values `v` is made of, counted the plain way.
    fn value_nodes(v: &Value) -> usize {
        1 + match v {
            Value::Array(a) => a.iter().map(value_nodes).sum(),
            Value::Object(o) => o.values().map(value_nodes).sum(),
            _ => 0,
        }
    }

    /// The ledger's measure of an event, from its whole serialization.
    pub(in crate::executor) fn measured(event: &ExecutionEvent) -> usize {
        serialized_len(event) + value_nodes(&event.data) * VALUE_NODE_BYTES + EVENT_OVERHEAD_BYTES
    }

    fn event(sequence: u64, data: Value) -> ExecutionEvent {
        ExecutionEvent {
            version: sharedos_protocol::Version::V1,
            event_id: sharedos_protocol::ident("0b6f9b7e-4c1e-4d8a-9f1a-6f3c2b1a0e9d"),
            execution_id: sharedos_protocol::ident("exec \"quoted\" \\ and\ttab"),
            trace_id: sharedos_protocol::ident("trace-\u{1}-\u{7f}-é-☃"),
            sequence,
            kind: sharedos_protocol::EventKind::ToolRequested.short_name(),
            data: data.into(),
            occurred_at: sharedos_protocol::Timestamp::now(),
        }
    }

    #[test]
    fn an_events_size_is_its_serialized_size() {
        let datas = [
            json!({"callId": "c-1", "tool": "bench.noop", "step": 3}),
            json!({"callId": "a\"b\\c\n\u{0}\u{1f}", "tool": "t", "status": "denied", "code": null}),
            json!({"nested": {"a": [1, 2.5, -3, true, null, "x"]}, "e": {}, "f": []}),
            json!([]),
            json!("plain"),
            json!(u64::MAX),
        ];
        for (i, data) in datas.into_iter().enumerate() {
            for sequence in [0, 9, 10, 99_999, u64::MAX] {
                let e = event(sequence, data.clone());
                assert_eq!(
                    event_held_bytes(&e),
                    measured(&e),
                    "data {i}, sequence {sequence}"
                );
            }
        }
    }

    #[test]
    fn a_value_costs_its_bytes_and_its_parsed_nodes() {
        assert_eq!(value_held_bytes(&json!(0)), 1 + VALUE_NODE_BYTES);
        let zeros = Value::Array(vec![json!(0); 1000]);
        assert_eq!(
            value_held_bytes(&zeros),
            serialized_len(&zeros) + 1001 * VALUE_NODE_BYTES
        );
        let nested = json!({"a": {"b": [1, "x"]}});
        assert_eq!(
            value_held_bytes(&nested),
            serialized_len(&nested) + 5 * VALUE_NODE_BYTES
        );
    }

    /// The test kit's generator with this suite's values, so a failure
    /// names its seed.
    struct Gen(sharedos_testkit::XorShift);

    impl Gen {
        fn new(seed: u64) -> Self {
            Self(sharedos_testkit::XorShift::new(seed))
        }
        fn next(&mut self) -> u64 {
            self.0.next_u64()
        }
        fn pick<T: Clone>(&mut self, from: &[T]) -> T {
            self.0.pick(from)
        }
        fn string(&mut self) -> String {
            const PIECES: &[&str] = &[
                "",
                "a",
                "call-17",
                "bench.noop",
                "\"",
                "\\",
                "\n",
                "\r",
                "\t",
                "\u{8}",
                "\u{c}",
                "\u{0}",
                "\u{1f}",
                "\u{7f}",
                "é",
                "☃",
                "\u{2028}",
                "\u{2029}",
                "😀",
                "/",
                "<script>",
                "0123456789abcdef",
            ];
            let n = self.next() % 6;
            (0..n).map(|_| self.pick(PIECES)).collect()
        }
        fn value(&mut self, depth: u32) -> Value {
            let kinds = if depth == 0 { 6 } else { 8 };
            match self.next() % kinds {
                0 => Value::Null,
                1 => Value::Bool(self.next().is_multiple_of(2)),
                2 => json!(self.pick(&[0u64, 7, 9, 10, 99, 100, 12_345, u64::MAX, u64::MAX / 3])),
                3 => json!(self.pick(&[-1i64, -9, -10, -100_000, i64::MIN, i64::MIN + 1])),
                4 => json!(self.pick(&[0.5f64, -0.0, 1.0, 2.5e-8, 1e300, -123.456, f64::MAX])),
                5 => Value::String(self.string()),
                6 => Value::Array(
                    (0..self.next() % 5)
                        .map(|_| self.value(depth - 1))
                        .collect(),
                ),
                _ => Value::Object(
                    (0..self.next() % 5)
                        .map(|_| (self.string(), self.value(depth - 1)))
                        .collect(),
                ),
            }
        }
    }

    #[test]
    fn generated_values_cost_their_serialized_bytes_and_nodes() {
        for seed in 1..3_000u64 {
            let mut g = Gen::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let v = g.value(3);
            assert_eq!(
                value_held_bytes(&v),
                serialized_len(&v) + value_nodes(&v) * VALUE_NODE_BYTES,
                "seed {seed}: {v}"
            );
            let e = event(g.next(), v);
            assert_eq!(event_held_bytes(&e), measured(&e), "seed {seed}");
        }
    }

    /// A call's event `data` as it was built before it had a type: a map
    /// filled through `json!`, in the order the fields are known.
    fn call_data_the_old_way(
        call_id: &str,
        tool: &str,
        step: Option<u64>,
        ending: Option<(&str, Option<&str>)>,
    ) -> Value {
        let mut m = serde_json::Map::new();
        m.insert("callId".into(), json!(call_id));
        m.insert("tool".into(), json!(tool));
        if let Some(s) = step {
            m.insert("step".into(), json!(s));
        }
        if let Some((status, code)) = ending {
            m.insert("status".into(), json!(status));
            if let Some(code) = code {
                m.insert("code".into(), json!(code));
            }
        }
        Value::Object(m)
    }

    impl Gen {
        /// An identifier: generated text (escapes, controls, unicode),
        /// sometimes long; a fixed one when the text is not an identifier.
        fn identifier(&mut self) -> Identifier {
            let text = match self.next() % 8 {
                0 => self.string().repeat(1 + (self.next() % 60) as usize),
                _ => self.string(),
            };
            Identifier::new(format!("{text}{}", self.pick(&["", "x", "é"])))
                .unwrap_or_else(|_| sharedos_protocol::ident("fallback-id"))
        }
    }

    #[test]
    fn a_call_event_is_written_and_measured_as_the_map_it_replaced() {
        use sharedos_protocol::{CallEventData, EventData, ToolStatus};
        const STATUSES: [ToolStatus; 3] = [
            ToolStatus::Succeeded,
            ToolStatus::Denied,
            ToolStatus::Failed,
        ];
        for seed in 1..5_000u64 {
            let mut g = Gen::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let (call_id, tool) = (g.identifier(), g.identifier());
            let step = match g.next() % 4 {
                0 => None,
                _ => Some(g.pick(&[0u64, 1, 9, 10, 999, 1_000, u64::MAX / 7, u64::MAX])),
            };
            let ending = match g.next() % 3 {
                0 => None,
                _ => Some((
                    g.pick(&STATUSES),
                    g.next().is_multiple_of(2).then(|| g.identifier()),
                )),
            };
            let typed = match &ending {
                None => CallEventData::requested(call_id.clone(), tool.clone(), step),
                Some((status, code)) => CallEventData::completed(
                    call_id.clone(),
                    tool.clone(),
                    step,
                    *status,
                    code.clone(),
                ),
            };
            let old = call_data_the_old_way(
                call_id.as_str(),
                tool.as_str(),
                step,
                ending
                    .as_ref()
                    .map(|(status, code)| (status.as_str(), code.as_ref().map(|c| c.as_str()))),
            );
            let data = EventData::Call(typed);
            let old_bytes = serde_json::to_string(&old).unwrap();
            assert_eq!(
                serde_json::to_string(&data).unwrap(),
                old_bytes,
                "seed {seed}"
            );
            assert_eq!(
                serde_json::to_string_pretty(&data).unwrap(),
                serde_json::to_string_pretty(&old).unwrap(),
                "seed {seed}"
            );
            assert_eq!(
                data_held_bytes(&data),
                value_held_bytes(&old),
                "seed {seed}"
            );
            assert_eq!(data, old, "seed {seed}: read as a value");
            let e = ExecutionEvent {
                data: data.clone(),
                ..event(g.next(), Value::Null)
            };
            assert_eq!(event_held_bytes(&e), measured(&e), "seed {seed}");
            let read_back: ExecutionEvent =
                serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
            assert_eq!(read_back, e, "seed {seed}");
            assert_eq!(
                serde_json::to_string(&read_back.data).unwrap(),
                old_bytes,
                "seed {seed}"
            );
            assert_eq!(data.into_value(), old, "seed {seed}");
        }
    }

    /// Every text a `Timestamp` accepts is measured by its length: none
    /// has a byte a JSON string escapes. Generated from RFC 3339 shapes
    /// with hostile bytes put anywhere in them.
    #[test]
    fn a_times_length_is_its_serialized_length() {
        const SHAPES: &[&str] = &[
            "2026-01-02T03:04:05Z",
            "2026-01-02T03:04:05.678Z",
            "2026-01-02t03:04:05.123456789z",
            "1999-12-31T23:59:60+23:59",
            "0000-01-01T00:00:00-00:00",
            "2026-02-28T12:00:00.5+01:30",
        ];
        const BYTES: &[&str] = &[
            "\"", "\\", "\n", "\t", "\u{0}", "\u{1f}", "\u{7f}", " ", "é", "\u{2028}", "T", "z",
            "0", "9", ":", "-", "+", ".", "", "",
        ];
        let mut g = Gen::new(0x9E37_79B9_7F4A_7C15);
        let mut accepted = 0;
        for case in 0..50_000u64 {
            let mut text = g.pick(SHAPES).to_owned();
            for _ in 0..case % 3 {
                let at = (g.next() as usize) % (text.len() + 1);
                if text.is_char_boundary(at) {
                    text.insert_str(at, g.pick(BYTES));
                }
            }
            // The separator between date and time replaced: any ASCII
            // byte is taken there.
            if case % 4 == 3 && text.is_char_boundary(10) && text.is_char_boundary(11) {
                text.replace_range(10..11, g.pick(BYTES));
            }
            if let Ok(t) = Timestamp::parse(&text) {
                accepted += 1;
                assert_eq!(time_len(&t), serialized_len(&t), "{text:?}");
            }
        }
        assert!(accepted > 1_000, "{accepted}");
        for _ in 0..1_000 {
            let t = Timestamp::now();
            assert_eq!(time_len(&t), serialized_len(&t), "{}", t.as_str());
        }
    }

    #[test]
    fn a_value_deeper_than_any_parser_allows_is_measured() {
        let mut v = json!("x");
        for _ in 0..100_000 {
            v = Value::Array(vec![v]);
        }
        assert_eq!(
            value_held_bytes(&v),
            2 * 100_000 + 3 + 100_001 * VALUE_NODE_BYTES
        );
        // Dropping it recursively would overflow the test's stack.
        while let Value::Array(mut a) = v {
            v = a.pop().unwrap_or(Value::Null);
        }
    }
}
