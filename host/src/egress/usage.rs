//! Token usage read from a response as it streams past, in the OpenAI
//! (Chat Completions and Responses), Anthropic and Gemini shapes, plain
//! JSON or server-sent events. Memory is bounded: at most one line (or a
//! JSON body) of [`MAX_HELD`] bytes is held; longer ones are not parsed.

use serde_json::Value;

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
            && let Ok(v) = serde_json::from_str::<Value>(json)
        {
            self.observe(&v);
        }
    }

    /// The usage seen, after the body ended.
    pub fn finish(mut self) -> Option<TokenUsage> {
        if !self.body_dropped
            && let Ok(v) = serde_json::from_slice::<Value>(&self.body)
        {
            self.observe(&v);
        }
        self.found
    }

    fn observe(&mut self, v: &Value) {
        let candidates = [
            v.get("usage"),
            v.pointer("/response/usage"),
            v.pointer("/message/usage"),
            v.get("usageMetadata"),
        ];
        for u in candidates.into_iter().flatten() {
            let field = |names: &[&str]| {
                names
                    .iter()
                    .find_map(|n| u.get(*n).and_then(Value::as_u64))
                    .unwrap_or(0)
            };
            let input = field(&["prompt_tokens", "input_tokens", "promptTokenCount"]);
            let output = field(&["completion_tokens", "output_tokens", "candidatesTokenCount"]);
            let seen = self.found.get_or_insert_default();
            // Streams repeat or split counts (Anthropic: input at start,
            // output at the end); the largest of each is the total.
            seen.input = seen.input.max(input);
            seen.output = seen.output.max(output);
        }
    }
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
    fn no_usage_and_oversized_lines_hold_nothing() {
        assert_eq!(scan(&["{\"choices\":[]}"]), None);
        let mut s = UsageScanner::default();
        s.feed(&vec![b'x'; MAX_HELD + 10]);
        assert!(s.line.is_empty() && s.body.is_empty());
        assert_eq!(s.finish(), None);
    }
}
