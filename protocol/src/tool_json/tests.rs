//! The hand writer against serde_json over generated results: every
//! status, optional members present and absent, escapes, control
//! characters, quotes, backslashes, non-ASCII, U+2028, empty strings and
//! numbers at their edges. A fixed generator, so a failure replays.

use serde_json::{Map, Number, Value};

use super::*;
use crate::primitives::{ErrorMessage, Identifier, Timestamp};

/// A small xorshift generator.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn string(&mut self) -> String {
        const ALPHABET: [&str; 16] = [
            "a", "Z", "\"", "\\", "\n", "\r", "\t", "\u{1}", "\u{1f}", "\u{7f}", "é", "😀",
            "\u{2028}", "\u{2029}", "/", " ",
        ];
        let len = self.below(24);
        (0..len)
            .map(|_| ALPHABET[self.below(ALPHABET.len())])
            .collect()
    }
    fn identifier(&mut self) -> Identifier {
        Identifier::new(format!("x{}y", self.string())).unwrap()
    }
    fn number(&mut self) -> Number {
        match self.below(8) {
            0 => Number::from(u64::MAX),
            1 => Number::from(i64::MIN),
            2 => Number::from(self.next()),
            3 => Number::from(-(self.below(1000) as i64)),
            4 => Number::from_f64(0.1).unwrap(),
            5 => Number::from_f64(1e300).unwrap(),
            6 => Number::from_f64(-1.5e-7).unwrap(),
            _ => Number::from_f64(self.next() as f64 / 7.0).unwrap(),
        }
    }
    fn value(&mut self, depth: usize) -> Value {
        let kinds = if depth == 0 { 5 } else { 7 };
        match self.below(kinds) {
            0 => Value::Null,
            1 => Value::Bool(self.below(2) == 0),
            2 => Value::Number(self.number()),
            3 | 4 => Value::String(self.string()),
            5 => Value::Array((0..self.below(4)).map(|_| self.value(depth - 1)).collect()),
            _ => Value::Object(self.object(depth - 1)),
        }
    }
    fn object(&mut self, depth: usize) -> Map<String, Value> {
        (0..self.below(4))
            .map(|_| (self.string(), self.value(depth)))
            .collect()
    }
    fn maybe_object(&mut self) -> Option<Map<String, Value>> {
        (self.below(2) == 0).then(|| self.object(2))
    }
    fn error(&mut self) -> ProtocolError {
        ProtocolError {
            code: self.identifier(),
            message: ErrorMessage::new(format!("m{}n", self.string())).unwrap(),
            retryable: [None, Some(true), Some(false)][self.below(3)],
            details: self.maybe_object(),
        }
    }
    fn result(&mut self) -> ToolResult {
        let call_id = self.identifier();
        let tool = self.identifier();
        let completed_at = Timestamp::parse(
            [
                "2026-12-01T19:30:34.123Z",
                "2026-12-01T19:30:34Z",
                "2026-12-01T21:30:34.5+02:00",
            ][self.below(3)],
        )
        .unwrap();
        let metadata = self.maybe_object();
        match self.below(3) {
            0 => ToolResult::Succeeded {
                call_id,
                tool,
                completed_at,
                metadata,
                output: self.value(3),
            },
            1 => ToolResult::Denied {
                call_id,
                tool,
                completed_at,
                metadata,
                error: self.error(),
            },
            _ => ToolResult::Failed {
                call_id,
                tool,
                completed_at,
                metadata,
                error: self.error(),
            },
        }
    }
}

fn written(value: &impl WriteJson) -> String {
    let mut out = Vec::new();
    value.write_json(&mut out);
    String::from_utf8(out).unwrap()
}

#[test]
fn generated_results_are_written_as_serde_json_writes_them() {
    let mut generator = Gen(0x9e37_79b9_7f4a_7c15);
    let mut seen = [0usize; 3];
    for _ in 0..3000 {
        let result = generator.result();
        seen[result.status() as usize] += 1;
        assert_eq!(
            written(&result),
            serde_json::to_string(&result).unwrap(),
            "for {result:?}"
        );
    }
    assert!(
        seen.iter().all(|n| *n > 500),
        "every status drawn: {seen:?}"
    );
}

#[test]
fn values_at_the_edges_are_written_as_serde_json_writes_them() {
    for value in [
        serde_json::json!(null),
        serde_json::json!(""),
        serde_json::json!({}),
        serde_json::json!([]),
        serde_json::json!({"": [[], {}, ""], "\u{2028}": "\u{0}\u{8}\u{c}"}),
        serde_json::json!([u64::MAX, i64::MIN, 0, -0.0, 1e-300, f64::MAX, 2.5]),
        serde_json::json!({"b": 1, "a": {"z": [true, false, null]}}),
    ] {
        assert_eq!(written(&value), serde_json::to_string(&value).unwrap());
    }
}

#[test]
fn the_constructors_results_are_written_as_serde_json_writes_them() {
    let call: crate::contract::ToolCall = serde_json::from_value(serde_json::json!({
        "id": "c-1", "tool": "echo", "arguments": {"q": "\"x\""},
        "traceId": "t", "requestedAt": "2026-12-01T19:30:34Z"
    }))
    .unwrap();
    let at = Timestamp::now();
    for result in [
        ToolResult::succeeded(&call, serde_json::json!({"echo": "é\n"}), at.clone()),
        ToolResult::denied(&call, "policy_denied", "no \\ grant", at.clone()),
        ToolResult::failed(&call, "tool_failed", "", at),
    ] {
        assert_eq!(written(&result), serde_json::to_string(&result).unwrap());
    }
}

/// `completedAt` is escaped like any string: `Timestamp::parse` takes
/// any ASCII byte between the date and the time (as `time` does), a quote
/// or a control byte included. Every ASCII byte put in place of, and in
/// front of, each byte of timestamps of every shape: a result carrying
/// whatever parses is written as serde_json writes it.
#[test]
fn a_result_with_any_timestamp_that_parses_is_written_as_serde_json_writes_it() {
    let shapes = [
        "2026-12-01T19:30:34.123Z",
        "2026-12-01t19:30:34z",
        "2026-12-01 19:30:34Z",
        "1970-01-01T00:00:00+02:00",
        "2099-02-28T23:59:59.999999999-11:30",
    ];
    let mut generator = Gen(0x2545_f491_4f6c_dd1d);
    let mut parsed = 0;
    for shape in shapes {
        for at in 0..=shape.len() {
            let (head, tail) = shape.split_at(at);
            for c in (0u8..0x80).map(char::from) {
                let inserted = format!("{head}{c}{tail}");
                let replaced = format!("{head}{c}{}", tail.get(1..).unwrap_or_default());
                for text in [inserted, replaced] {
                    let Ok(time) = Timestamp::parse(&text) else {
                        continue;
                    };
                    parsed += 1;
                    let mut result = generator.result();
                    let (ToolResult::Succeeded { completed_at, .. }
                    | ToolResult::Denied { completed_at, .. }
                    | ToolResult::Failed { completed_at, .. }) = &mut result;
                    *completed_at = time;
                    assert_eq!(written(&result), serde_json::to_string(&result).unwrap());
                }
            }
        }
    }
    assert!(parsed > 100, "only {parsed} variations parsed");
}
