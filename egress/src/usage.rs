//! Token usage read from a response as it streams past, in the OpenAI
//! (Chat Completions and Responses), Anthropic and Gemini shapes, plain
//! JSON or server-sent events. Memory is bounded: at most one line (or a
//! JSON body) of [`MAX_HELD`] bytes is held; longer ones are not parsed.

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// The most bytes held to find usage in.
pub const MAX_HELD: usize = 256 * 1024;

/// Tokens as the upstream reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    pub input: u64,
    pub output: u64,
}

impl TokenUsage {
    pub fn total(&self) -> u64 {
        self.input.saturating_add(self.output)
    }
}

/// Scans response bytes for usage objects.
#[derive(Debug, Default)]
pub struct UsageScanner {
    /// The current line (SSE `data:` lines, NDJSON).
    line: Vec<u8>,
    line_overflowed: bool,
    /// The whole body, for a (possibly pretty-printed) JSON answer; given
    /// up once the body is seen to be an event stream or too large.
    body: Vec<u8>,
    body_dropped: bool,
    found: Option<TokenUsage>,
}

impl UsageScanner {
    pub fn feed(&mut self, mut chunk: &[u8]) {
        if !self.body_dropped {
            if self.body.len() + chunk.len() > MAX_HELD {
                self.drop_body();
            } else {
                self.body.extend_from_slice(chunk);
            }
        }
        while let Some(i) = chunk.iter().position(|b| *b == b'\n') {
            self.push(&chunk[..i]);
            self.line_done();
            chunk = &chunk[i + 1..];
        }
        self.push(chunk);
    }

    fn drop_body(&mut self) {
        self.body_dropped = true;
        self.body = Vec::new();
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.line.len() + bytes.len() > MAX_HELD {
            self.line_overflowed = true;
            self.line.clear();
        } else if !self.line_overflowed {
            self.line.extend_from_slice(bytes);
        }
    }

    fn line_done(&mut self) {
        let line = std::mem::take(&mut self.line);
        if std::mem::replace(&mut self.line_overflowed, false) {
            return;
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim();
        let sse = text.starts_with("data:") || text.starts_with("event:");
        if sse {
            // An event stream: usage comes in its data lines only.
            self.drop_body();
        }
        let json = text.strip_prefix("data:").map(str::trim).unwrap_or(text);
        if (sse || text.starts_with('{'))
            && json.starts_with('{')
            && may_hold_usage(json.as_bytes())
        {
            self.observe(json);
        }
    }

    /// The usage seen, after the body ended.
    pub fn finish(mut self) -> Option<TokenUsage> {
        let body = std::mem::take(&mut self.body);
        if !self.body_dropped
            && may_hold_usage(&body)
            && let Ok(text) = std::str::from_utf8(&body)
        {
            self.observe(text);
        }
        self.found
    }

    /// Takes the usage objects of one JSON document: `usage`,
    /// `response.usage`, `message.usage`, `usageMetadata`. Only those are
    /// read; the rest of the document is skipped as it is parsed, never
    /// built.
    fn observe(&mut self, json: &str) {
        let Some(keys) = object::<Keys>(json) else {
            return;
        };
        let candidates = [
            keys.usage,
            nested(keys.response),
            nested(keys.message),
            keys.usage_metadata,
        ];
        for u in candidates.into_iter().flatten() {
            // A usage that is not an object counts zero, as it is found.
            let counts = object::<Counts>(u.get()).unwrap_or_default();
            let seen = self.found.get_or_insert_default();
            // Streams repeat or split counts (Anthropic: input at start,
            // output at the end); the largest of each is the total.
            seen.input = seen.input.max(counts.input());
            seen.output = seen.output.max(counts.output());
        }
    }
}

/// The `usage` of a `response` or `message` object.
fn nested(raw: Option<&RawValue>) -> Option<&RawValue> {
    object::<Inner>(raw?.get())?.usage
}

/// `json` parsed as `T` when it is a JSON object (serde would also take
/// an array for a struct).
fn object<'a, T: Deserialize<'a>>(json: &'a str) -> Option<T> {
    if !json.trim_start().starts_with('{') {
        return None;
    }
    serde_json::from_str(json).ok()
}

/// A present key, whatever its value (`null` included).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// The keys a usage is under, each kept as its raw text.
#[derive(Deserialize)]
struct Keys<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    usage: Option<&'a RawValue>,
    #[serde(
        borrow,
        default,
        deserialize_with = "present",
        rename = "usageMetadata"
    )]
    usage_metadata: Option<&'a RawValue>,
    #[serde(borrow, default)]
    response: Option<&'a RawValue>,
    #[serde(borrow, default)]
    message: Option<&'a RawValue>,
}

/// `response` or `message`: only their `usage`.
#[derive(Deserialize)]
struct Inner<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    usage: Option<&'a RawValue>,
}

/// A usage object's counts, under each API's names.
#[derive(Deserialize, Default)]
#[allow(non_snake_case)]
struct Counts<'a> {
    #[serde(borrow, default)]
    prompt_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    promptTokenCount: Option<&'a RawValue>,
    #[serde(borrow, default)]
    completion_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    output_tokens: Option<&'a RawValue>,
    #[serde(borrow, default)]
    candidatesTokenCount: Option<&'a RawValue>,
    /// Gemini's thinking tokens, billed as output but not counted in
    /// `candidatesTokenCount` (OpenAI's and Anthropic's output counts
    /// include reasoning).
    #[serde(borrow, default)]
    thoughtsTokenCount: Option<&'a RawValue>,
}

impl Counts<'_> {
    fn input(&self) -> u64 {
        first_count(&[self.prompt_tokens, self.input_tokens, self.promptTokenCount]).unwrap_or(0)
    }

    /// OpenAI's or Anthropic's output count, else Gemini's candidates and
    /// thoughts together.
    fn output(&self) -> u64 {
        first_count(&[self.completion_tokens, self.output_tokens]).unwrap_or_else(|| {
            let candidates = first_count(&[self.candidatesTokenCount]).unwrap_or(0);
            candidates.saturating_add(first_count(&[self.thoughtsTokenCount]).unwrap_or(0))
        })
    }
}

/// The first of `raws` that is a whole number in `u64` (a JSON integer
/// written plainly; a fraction, exponent or sign is not a count).
fn first_count(raws: &[Option<&RawValue>]) -> Option<u64> {
    raws.iter()
        .flatten()
        .find_map(|r| r.get().parse::<u64>().ok())
}

/// Whether JSON text can hold a `usage` or `usageMetadata` key: it has
/// `"usage` as written, or a `\u` escape (the only way to spell a letter
/// of the key otherwise). Most lines of a stream hold neither and are not
/// parsed at all.
fn may_hold_usage(json: &[u8]) -> bool {
    json.windows(6)
        .any(|w| w == b"\"usage" || w.starts_with(b"\\u"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(parts: &[&str]) -> Option<TokenUsage> {
        let mut s = UsageScanner::default();
        for p in parts {
            s.feed(p.as_bytes());
        }
        s.finish()
    }

    #[test]
    fn openai_chat_json_and_stream() {
        let body = r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5}}"#;
        assert_eq!(
            scan(&[body]),
            Some(TokenUsage {
                input: 12,
                output: 5
            })
        );
        let sse = "data: {\"choices\":[{\"delta\":{}}]}\n\ndata: {\"choices\":[],\"usa";
        let rest = "ge\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\ndata: [DONE]\n\n";
        assert_eq!(
            scan(&[sse, rest]),
            Some(TokenUsage {
                input: 3,
                output: 4
            })
        );
    }

    #[test]
    fn responses_anthropic_gemini() {
        let resp = "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":7,\"output_tokens\":8}}}\n\n";
        assert_eq!(
            scan(&[resp]),
            Some(TokenUsage {
                input: 7,
                output: 8
            })
        );
        let anth = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n";
        assert_eq!(
            scan(&[anth]),
            Some(TokenUsage {
                input: 25,
                output: 15
            })
        );
        let gem =
            "{\n \"usageMetadata\": {\"promptTokenCount\": 4, \"candidatesTokenCount\": 9}\n}";
        assert_eq!(
            scan(&[gem]),
            Some(TokenUsage {
                input: 4,
                output: 9
            })
        );
    }

    #[test]
    fn a_gemini_stream_counts_its_thoughts_as_output() {
        // Cumulative usageMetadata on every chunk, CRLF between events;
        // the last chunk holds the totals.
        let first = "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Hi\"}]}}],\"usageMetadata\":{\"promptTokenCount\":12,\"totalTokenCount\":12}}\r\n\r\n";
        let last = "data: {\"candidates\":[{\"finishReason\":\"STOP\"}],\"usageMetadata\":{\"promptTokenCount\":12,\"candidatesTokenCount\":5,\"thoughtsTokenCount\":30,\"totalTokenCount\":47}}\r\n\r\n";
        assert_eq!(
            scan(&[first, &last[..40], &last[40..]]),
            Some(TokenUsage {
                input: 12,
                output: 35
            })
        );
    }

    /// The reading before the typed one: the whole document as a `Value`.
    fn by_value(json: &str) -> Option<TokenUsage> {
        let v: serde_json::Value = serde_json::from_str(json).ok()?;
        let candidates = [
            v.get("usage"),
            v.pointer("/response/usage"),
            v.pointer("/message/usage"),
            v.get("usageMetadata"),
        ];
        let mut found: Option<TokenUsage> = None;
        for u in candidates.into_iter().flatten() {
            let field = |names: &[&str]| {
                names
                    .iter()
                    .find_map(|n| u.get(*n).and_then(serde_json::Value::as_u64))
            };
            let seen = found.get_or_insert_default();
            let input = field(&["prompt_tokens", "input_tokens", "promptTokenCount"]);
            seen.input = seen.input.max(input.unwrap_or(0));
            let output = field(&["completion_tokens", "output_tokens"]).unwrap_or_else(|| {
                let candidates = field(&["candidatesTokenCount"]).unwrap_or(0);
                candidates.saturating_add(field(&["thoughtsTokenCount"]).unwrap_or(0))
            });
            seen.output = seen.output.max(output);
        }
        found
    }

    #[test]
    fn the_typed_reading_finds_what_the_whole_document_holds() {
        let cases = [
            r#"{"usage":null}"#,
            r#"{"usage":7}"#,
            r#"{"usage":[1,2]}"#,
            r#"{"usage":{"prompt_tokens":1.5,"input_tokens":4,"output_tokens":-2}}"#,
            r#"{"usage":{"prompt_tokens":"3","completion_tokens":18446744073709551615}}"#,
            r#"{"usage":{"prompt_tokens":1e3,"completion_tokens":2}}"#,
            r#"{"usage":{"prompt_tokens":null,"input_tokens":5,"output_tokens":{"x":1}}}"#,
            r#"{"response":"done","message":{"usage":{"input_tokens":9}}}"#,
            r#"{"response":{"output":[{"content":[{"text":"usage"}]}],"usage":{"input_tokens":7,"output_tokens":8}}}"#,
            r#"{"message":[{"usage":{"input_tokens":1}}],"usageMetadata":{"promptTokenCount":2}}"#,
            r#"{"choices":[{"message":{"content":"usage","usage":{"prompt_tokens":1}}}]}"#,
            r#"[{"usage":{"prompt_tokens":1}}]"#,
            r#"{"usage":{"prompt_tokens":3},"usageMetadata":{"candidatesTokenCount":6}}"#,
            r#"{"usageMetadata":{"promptTokenCount":2,"candidatesTokenCount":6,"thoughtsTokenCount":9}}"#,
            r#"{"usageMetadata":{"thoughtsTokenCount":18446744073709551615,"candidatesTokenCount":1}}"#,
            r#"{"usageMetadata":{"thoughtsTokenCount":4,"candidatesTokenCount":-1}}"#,
            r#"{"usage":{"output_tokens":5,"thoughtsTokenCount":7}}"#,
            r#"  {"usage" : { "prompt_tokens" : 12 , "completion_tokens" : 5 } }  "#,
            r#"{"usage":{"prompt_tokens":3}"#,
        ];
        for json in cases {
            assert_eq!(scan(&[json]), by_value(json), "{json}");
        }
    }

    #[test]
    fn lines_without_a_usage_key_are_skipped_but_escaped_keys_count() {
        assert!(!may_hold_usage(
            br#"{"choices":[{"delta":{"content":"he"}}]}"#
        ));
        assert!(may_hold_usage(br#"{"usage":{}}"#));
        let escaped = "data: {\"\\u0075sage\":{\"prompt_tokens\":2,\"completion_tokens\":1}}\n\n";
        assert_eq!(
            scan(&[escaped]),
            Some(TokenUsage {
                input: 2,
                output: 1
            })
        );
        let body = r#"{"\u0075sageMetadata":{"promptTokenCount":4,"candidatesTokenCount":9}}"#;
        assert_eq!(
            scan(&[body]),
            Some(TokenUsage {
                input: 4,
                output: 9
            })
        );
    }

    #[test]
    fn no_usage_and_oversized_lines_hold_nothing() {
        assert_eq!(scan(&["{\"choices\":[]}"]), None);
        let mut s = UsageScanner::default();
        s.feed(&vec![b'x'; MAX_HELD + 10]);
        assert!(s.line.is_empty() && s.body.is_empty());
        assert_eq!(s.finish(), None);
    }
}
