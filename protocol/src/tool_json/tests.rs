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

/// The members of a result as text, `status` first (as the host writes
/// them), each value in serde_json's own text.
fn members(result: &ToolResult) -> Vec<(String, String)> {
    let Value::Object(map) = serde_json::to_value(result).unwrap() else {
        unreachable!("a result is an object")
    };
    let mut out: Vec<(String, String)> = map
        .iter()
        .map(|(k, v)| (serde_json::to_string(k).unwrap(), v.to_string()))
        .collect();
    let at = out.iter().position(|(k, _)| k == "\"status\"").unwrap();
    let status = out.remove(at);
    out.insert(0, status);
    out
}

impl Gen {
    /// A value of any JSON type, or of none: what a wrong member holds.
    fn wrong_value(&mut self) -> String {
        const WRONG: [&str; 16] = [
            "null",
            "1",
            "-1.5",
            "true",
            "[]",
            "{}",
            "\"\"",
            "\"x\"",
            "\"succeeded\"",
            "\"denied\"",
            "\"Failed\"",
            "{\"succeeded\":null}",
            "123456789012345678901234567890",
            "1e400",
            "\"2026-12-01T19:30:34Z\"",
            "{\"code\":\"c\",\"message\":\"m\"}",
        ];
        match self.below(WRONG.len() + 2) {
            i if i < WRONG.len() => WRONG[i].to_owned(),
            i if i == WRONG.len() => self.value(3).to_string(),
            _ => {
                // Nesting around serde_json's limit of 128.
                let depth = 120 + self.below(16);
                format!("{}{}", "[".repeat(depth), "]".repeat(depth))
            }
        }
    }

    /// A key as it may be spelled: escaped, cased otherwise, or unknown.
    fn respelled(&mut self, key: &str) -> String {
        match self.below(4) {
            0 => key.replacen('a', "\\u0061", 1),
            1 => key.to_uppercase(),
            2 => format!(
                "\"{}\"",
                self.string().replace('\\', "\\\\").replace('"', "\\\"")
            ),
            _ => "\"extra\"".to_owned(),
        }
    }

    /// One change to the members, of the kinds a hostile or careless host
    /// could make.
    fn mutate(&mut self, members: &mut Vec<(String, String)>) {
        let n = members.len();
        let at = self.below(n.max(1));
        match self.below(9) {
            0 if n > 0 => {
                let m = members.remove(at);
                let to = self.below(members.len() + 1);
                members.insert(to, m);
            }
            1 if n > 0 => {
                let m = members[at].clone();
                let to = self.below(members.len() + 1);
                members.insert(to, m);
            }
            2 if n > 0 => {
                let value = self.wrong_value();
                let key = members[at].0.clone();
                let to = self.below(members.len() + 1);
                members.insert(to, (key, value));
            }
            3 if n > 0 => {
                members.remove(at);
            }
            4 if n > 0 => members[at].1 = self.wrong_value(),
            5 if n > 0 => members[at].0 = self.respelled(&members[at].0.clone()),
            6 => {
                let value = ["null", "{}", "[]", "{\"k\":[1,{\"\\u00e9\":null}]}"][self.below(4)];
                members.retain(|(k, _)| k != "\"metadata\"");
                let to = self.below(members.len() + 1);
                members.insert(to, ("\"metadata\"".to_owned(), value.to_owned()));
            }
            7 => {
                let status = [
                    "\"succeeded\"",
                    "\"denied\"",
                    "\"failed\"",
                    "\"s\\u0075cceeded\"",
                ][self.below(4)];
                if let Some(m) = members.iter_mut().find(|(k, _)| k == "\"status\"") {
                    m.1 = status.to_owned();
                }
            }
            _ => {
                let value = self.wrong_value();
                let key = ["\"output\"", "\"error\"", "\"extra\""][self.below(3)];
                members.push((key.to_owned(), value));
            }
        }
    }

    /// The members as an object's text, with or without whitespace;
    /// now and then as an array, or with something after it.
    fn text(&mut self, members: &[(String, String)]) -> String {
        let space = [" ", "", "\n\t"][self.below(3)];
        let body: Vec<String> = members
            .iter()
            .map(|(k, v)| format!("{k}{space}:{space}{v}"))
            .collect();
        match self.below(20) {
            0 => format!(
                "[{}]",
                members
                    .iter()
                    .map(|(_, v)| v.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            1 => format!("{{{}}} x", body.join(",")),
            2 => format!("{space}{{{}}}{space}", body.join(&format!(",{space}"))),
            _ => format!("{{{}}}", body.join(",")),
        }
    }
}

/// Reads `text` both ways. The one-pass reading, whenever it reads
/// anything, reads what the derive reads; `from_json` answers exactly as
/// the derive does (the same result, or the same error). Returns whether
/// the one-pass reading took it, and whether the derive did.
fn read_both_ways(text: &str) -> (bool, bool) {
    let derived = serde_json::from_str::<ToolResult>(text);
    let fast = read_status_first(text);
    if let Ok(fast) = &fast {
        assert_eq!(derived.as_ref().ok(), Some(fast), "for {text}");
    }
    match (ToolResult::from_json(text), &derived) {
        (Ok(read), Ok(derived)) => assert_eq!(&read, derived, "for {text}"),
        (Err(read), Err(derived)) => assert_eq!(read.to_string(), derived.to_string()),
        (read, derived) => panic!("for {text}: {read:?} but the derive gives {derived:?}"),
    }
    (fast.is_ok(), derived.is_ok())
}

#[test]
fn results_as_the_host_writes_them_are_read_in_one_pass_as_the_derive_reads_them() {
    let mut generator = Gen(0x6a09_e667_f3bc_c908);
    for _ in 0..3000 {
        let result = generator.result();
        let text = written(&result);
        // (Not always `result` itself: serde_json reads some floats back
        // one bit off, by either way.)
        assert_eq!(read_both_ways(&text), (true, true), "for {text}");
    }
}

#[test]
fn hostile_results_are_read_as_the_derive_reads_them() {
    let mut generator = Gen(0xbb67_ae85_84ca_a73b);
    // [one pass took it, the derive took it after the one pass refused,
    //  both refused]
    let mut seen = [0usize; 3];
    for _ in 0..20_000 {
        let result = generator.result();
        let mut members = members(&result);
        for _ in 0..=generator.below(3) {
            generator.mutate(&mut members);
        }
        let text = generator.text(&members);
        match read_both_ways(&text) {
            (true, _) => seen[0] += 1,
            (false, true) => seen[1] += 1,
            (false, false) => seen[2] += 1,
        }
    }
    assert!(
        seen.iter().all(|n| *n > 300),
        "every outcome drawn: {seen:?}"
    );
}

#[test]
fn results_at_the_edges_are_read_as_the_derive_reads_them() {
    let head = r#""callId":"c","tool":"t","completedAt":"2026-12-01T19:30:34Z""#;
    let deep = format!("{}{}", "[".repeat(126), "]".repeat(126));
    let deeper = format!("{}{}", "[".repeat(127), "]".repeat(127));
    for text in [
        format!(r#"{{"status":"succeeded",{head},"output":null}}"#),
        format!(r#"{{"status":"succeeded",{head}}}"#),
        format!(r#"{{"status":"succeeded",{head},"output":{deep}}}"#),
        format!(r#"{{"status":"succeeded",{head},"output":{deeper}}}"#),
        format!(r#"{{"status":"succeeded",{head},"metadata":null,"output":1}}"#),
        format!(r#"{{"status":"succeeded",{head},"metadata":7,"output":1}}"#),
        format!(r#"{{"status":"succeeded","status":"succeeded",{head},"output":1}}"#),
        format!(r#"{{{head},"status":"denied","error":{{"code":"c","message":"m"}}}}"#),
        format!(r#"{{"status":"failed",{head},"error":{{"code":"c","message":"m","x":1}}}}"#),
        format!(r#"{{"status":"failed",{head},"error":null}}"#),
        format!(r#"{{"st\u0061tus":"failed",{head},"error":{{"code":"c","message":"m"}}}}"#),
        format!(r#"{{"status":null,{head},"output":1}}"#),
        format!(r#"{{"status":{{"succeeded":null}},{head},"output":1}}"#),
        r#"["succeeded","c","t","2026-12-01T19:30:34Z",null,1]"#.to_owned(),
        "{}".to_owned(),
        "{".to_owned(),
        String::new(),
        "null".to_owned(),
    ] {
        read_both_ways(&text);
    }
}
