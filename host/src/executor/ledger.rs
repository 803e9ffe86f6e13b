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
use sharedos_protocol::ExecutionEvent;

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

/// How many JSON values `v` is made of (itself included). Iterative: a
/// value built by the host may be deeper than the parser's limit.
fn value_nodes(v: &Value) -> usize {
    let scalar = |v: &Value| !matches!(v, Value::Array(_) | Value::Object(_));
    // An event's `data` is mostly a flat object: counted without a stack.
    if let Value::Object(o) = v
        && o.values().all(scalar)
    {
        return 1 + o.len();
    }
    let mut n = 0;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        n += 1;
        match v {
            Value::Array(a) => stack.extend(a.iter()),
            Value::Object(o) => stack.extend(o.values()),
            _ => {}
        }
    }
    n
}

/// What holding `v` costs, as the ledger counts it.
pub(crate) fn value_held_bytes(v: &Value) -> usize {
    serialized_len(v).saturating_add(value_nodes(v).saturating_mul(VALUE_NODE_BYTES))
}

/// The punctuation and keys of a serialized `ExecutionEvent`, around its
/// values (the field order is the struct's).
const EVENT_FRAME: &str = r#"{"version":"1","eventId":,"executionId":,"traceId":,"sequence":,"type":,"data":,"occurredAt":}"#;

/// The length of `s` as serde_json writes it as a JSON string: quotes,
/// the two-character escapes, `\u00XX` for the other control characters.
fn json_str_len(s: &str) -> usize {
    let escaped: usize = s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum();
    escaped + 2
}

/// The decimal digits of `n`.
fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// What holding `event` costs, as the ledger counts it. Its serialized
/// size is summed from its parts (every event of a tool call is sized
/// here, so the event is not serialized just to be measured); only `data`
/// is walked.
pub(crate) fn event_held_bytes(event: &ExecutionEvent) -> usize {
    let serialized = EVENT_FRAME.len()
        + json_str_len(event.event_id.as_str())
        + json_str_len(event.execution_id.as_str())
        + json_str_len(event.trace_id.as_str())
        + digits(event.sequence)
        + json_str_len(event.kind.as_str())
        + serialized_len(&event.data)
        + json_str_len(event.occurred_at.as_str());
    serialized
        .saturating_add(value_nodes(&event.data).saturating_mul(VALUE_NODE_BYTES))
        .saturating_add(EVENT_OVERHEAD_BYTES)
}

#[cfg(test)]
mod tests {
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

    /// The ledger's measure of an event, from its whole serialization.
    fn measured(event: &ExecutionEvent) -> usize {
        serialized_len(event) + value_nodes(&event.data) * VALUE_NODE_BYTES + EVENT_OVERHEAD_BYTES
    }

    fn event(sequence: u64, data: Value) -> ExecutionEvent {
        ExecutionEvent {
            version: sharedos_protocol::Version::V1,
            event_id: sharedos_protocol::ident("0b6f9b7e-4c1e-4d8a-9f1a-6f3c2b1a0e9d"),
            execution_id: sharedos_protocol::ident("exec \"quoted\" \\ and\ttab"),
            trace_id: sharedos_protocol::ident("trace-\u{1}-\u{7f}-é-☃"),
            sequence,
            kind: sharedos_protocol::ShortName::new("tool.requested").unwrap(),
            data,
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
}
