//! The Anthropic Messages wire (`anthropic-messages`).
//!
//! The catalogue becomes `tools` (`name`, `description`, `input_schema`).
//! The key goes in `x-api-key` (the placeholder; the gateway's
//! `api = "anthropic"` route drops it and adds the real one) with
//! `anthropic-version`. The answer streams as `message_start` (input
//! usage), `content_block_start` (a `text` block, or a `tool_use` block
//! with `id` and `name`), `content_block_delta` (`text_delta`, or
//! `input_json_delta` with `partial_json`), `content_block_stop`,
//! `message_delta` (`stop_reason`, output usage), `message_stop`; `error`
//! is the model's failure. The answer goes back as the assistant message's
//! content blocks; the results of its calls as `tool_result` blocks in one
//! user message.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::wire::{Answer, Call, ModelApi, ToolSpec};

/// The API version the request is written for.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// `max_tokens` is required by the API: this, unless the driver table's
/// `maxTokens` says otherwise (docs/EGRESS.md).
pub const DEFAULT_MAX_TOKENS: u64 = 4096;
/// The `maxTokens` a driver table may set.
pub const MAX_TOKENS_RANGE: std::ops::RangeInclusive<u64> = 1..=131_072;

pub struct AnthropicApi {
    messages: Vec<Value>,
    tools: Vec<Value>,
    max_tokens: u64,
    /// Content block index → position in the answer's calls.
    by_block: HashMap<u64, usize>,
}

impl AnthropicApi {
    pub fn new(prompt: String, tools: Vec<ToolSpec>, max_tokens: u64) -> Self {
        let tools = tools
            .into_iter()
            .map(
                |t| json!({"name": t.name, "description": t.description, "input_schema": t.schema}),
            )
            .collect();
        Self {
            messages: vec![json!({"role": "user", "content": prompt})],
            tools,
            max_tokens,
            by_block: HashMap::new(),
        }
    }

    fn block_start(&mut self, event: &Value, answer: &mut Answer) -> String {
        let block = &event["content_block"];
        match block["type"].as_str() {
            Some("tool_use") => {
                let index = event["index"].as_u64().unwrap_or(0);
                let text = |k: &str| {
                    block
                        .get(k)
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned()
                };
                // The input arrives as `input_json_delta`s; a start that
                // already holds a non-empty input is taken as written.
                let input = block
                    .get("input")
                    .and_then(Value::as_object)
                    .filter(|o| !o.is_empty())
                    .map(|o| Value::Object(o.clone()).to_string())
                    .unwrap_or_default();
                self.by_block.insert(index, answer.calls.len());
                answer.calls.push(Call {
                    id: text("id"),
                    name: text("name"),
                    arguments: input,
                    namespace: None,
                });
                String::new()
            }
            Some("text") => {
                let text = block["text"].as_str().unwrap_or("");
                answer.text.push_str(text);
                text.to_owned()
            }
            _ => String::new(),
        }
    }

    fn block_delta(&mut self, event: &Value, answer: &mut Answer) -> Result<String, String> {
        let delta = &event["delta"];
        match delta["type"].as_str() {
            Some("text_delta") => {
                let text = delta["text"].as_str().unwrap_or("");
                answer.text.push_str(text);
                Ok(text.to_owned())
            }
            Some("input_json_delta") => {
                let index = event["index"].as_u64().unwrap_or(0);
                let call = self
                    .by_block
                    .get(&index)
                    .and_then(|at| answer.calls.get_mut(*at))
                    .ok_or_else(|| {
                        format!("model_stream_invalid: input for block {index}, which is not a tool_use block")
                    })?;
                call.arguments
                    .push_str(delta["partial_json"].as_str().unwrap_or(""));
                Ok(String::new())
            }
            _ => Ok(String::new()),
        }
    }
}

impl ModelApi for AnthropicApi {
    fn request(&self, model: &str, key: &str) -> (String, Vec<(&'static str, String)>, Value) {
        let mut body = json!({"model": model, "max_tokens": self.max_tokens,
            "messages": self.messages, "stream": true});
        if !self.tools.is_empty() {
            body["tools"] = json!(self.tools);
        }
        let headers = vec![
            ("x-api-key", key.to_owned()),
            ("anthropic-version", ANTHROPIC_VERSION.to_owned()),
        ];
        ("/messages".to_owned(), headers, body)
    }

    fn absorb(&mut self, data: &str, answer: &mut Answer) -> Result<String, String> {
        let event: Value =
            serde_json::from_str(data).map_err(|e| format!("model_stream_invalid: {e}"))?;
        match event["type"].as_str().unwrap_or("") {
            "message_start" => {
                self.by_block.clear();
                if let Some(u) = event.pointer("/message/usage").and_then(Value::as_object) {
                    answer.usage.extend(u.clone());
                }
            }
            "content_block_start" => return Ok(self.block_start(&event, answer)),
            "content_block_delta" => return self.block_delta(&event, answer),
            "message_delta" => {
                if let Some(r) = event.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    answer.finish = Some(r.to_owned());
                }
                // Counts here are cumulative: they replace the start's.
                if let Some(u) = event.get("usage").and_then(Value::as_object) {
                    answer.usage.extend(u.clone());
                }
            }
            "message_stop" => answer.done = true,
            "error" => {
                let kind = event.pointer("/error/type").and_then(Value::as_str);
                let message = event
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .unwrap_or("the model failed");
                return Err(format!(
                    "model_error: {}: {message}",
                    kind.unwrap_or("error")
                ));
            }
            _ => {}
        }
        Ok(String::new())
    }

    fn record_answer(&mut self, answer: &Answer) {
        let mut content = Vec::new();
        if !answer.text.is_empty() {
            content.push(json!({"type": "text", "text": answer.text}));
        }
        for c in &answer.calls {
            let input = serde_json::from_str::<Value>(&c.arguments)
                .ok()
                .filter(Value::is_object)
                .unwrap_or_else(|| json!({}));
            content.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}));
        }
        self.messages
            .push(json!({"role": "assistant", "content": content}));
        self.by_block.clear();
    }

    fn record_result(&mut self, call: &Call, content: String, ok: bool) {
        let block = json!({"type": "tool_result", "tool_use_id": call.id,
            "content": content, "is_error": !ok});
        // All results of one answer go in one user message.
        if let Some(last) = self.messages.last_mut()
            && last["role"] == "user"
            && let Some(blocks) = last["content"].as_array_mut()
        {
            blocks.push(block);
            return;
        }
        self.messages
            .push(json!({"role": "user", "content": [block]}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_text_and_two_calls_and_returns_both_results_in_one_message() {
        let mut api = AnthropicApi::new("hi".into(), vec![], DEFAULT_MAX_TOKENS);
        let mut a = Answer::default();
        let events = [
            json!({"type": "message_start", "message": {"usage": {"input_tokens": 9, "output_tokens": 1}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me"}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "tu_1", "name": "files__read", "input": {}}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"path\":"}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "\"a\"}"}}),
            json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "tu_2", "name": "files__list", "input": {}}}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 20}}),
            json!({"type": "message_stop"}),
        ];
        let mut text = String::new();
        for e in &events {
            text.push_str(&api.absorb(&e.to_string(), &mut a).unwrap());
        }
        assert_eq!(text, "Let me");
        assert!(a.done);
        assert_eq!(a.finish.as_deref(), Some("tool_use"));
        assert_eq!(a.usage["input_tokens"], 9);
        assert_eq!(a.usage["output_tokens"], 20);
        assert_eq!(a.calls[0].arguments, "{\"path\":\"a\"}");
        api.record_answer(&a);
        api.record_result(&a.calls[0], "r1".into(), true);
        api.record_result(&a.calls[1], "r2".into(), false);
        let (path, headers, body) = api.request("m", "placeholder");
        assert_eq!(path, "/messages");
        assert!(
            headers
                .iter()
                .any(|(k, v)| *k == "x-api-key" && v == "placeholder")
        );
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 3);
        assert_eq!(messages[1]["content"][1]["input"]["path"], "a");
        let results = messages[2]["content"].as_array().unwrap();
        assert_eq!(results.len(), 2);
        assert_eq!(results[1]["tool_use_id"], "tu_2");
        assert_eq!(results[1]["is_error"], true);
    }

    #[test]
    fn an_error_event_is_a_model_error() {
        let mut api = AnthropicApi::new("hi".into(), vec![], DEFAULT_MAX_TOKENS);
        let e = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
        let err = api
            .absorb(&e.to_string(), &mut Answer::default())
            .unwrap_err();
        assert_eq!(err, "model_error: overloaded_error: Overloaded");
    }
}
