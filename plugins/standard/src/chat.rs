//! The OpenAI Chat Completions wire (`openai-chat`; also served by vLLM,
//! Ollama, llama.cpp, LM Studio, DeepSeek).
//!
//! The catalogue becomes `tools` of type `function`; the answer streams as
//! `chat.completion.chunk`s whose `delta` holds text (`content`) or tool
//! calls (`tool_calls`, by `index`, the arguments in fragments) and whose
//! last choice states `finish_reason`; usage comes in a final chunk asked
//! for with `stream_options.include_usage`, and `[DONE]` ends the stream.
//! The answer's calls go back as the assistant message's `tool_calls`,
//! each result as a `tool` message with its `tool_call_id`.

use serde_json::{Value, json};

use crate::wire::{Answer, Call, ModelApi, ToolSpec};

pub struct ChatApi {
    messages: Vec<Value>,
    tools: Vec<Value>,
}

impl ChatApi {
    pub fn new(prompt: String, tools: Vec<ToolSpec>) -> Self {
        let tools = tools
            .into_iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.schema,
                }})
            })
            .collect();
        Self {
            messages: vec![json!({"role": "user", "content": prompt})],
            tools,
        }
    }
}

impl ModelApi for ChatApi {
    fn request(&self, model: &str, key: &str) -> (String, Vec<(&'static str, String)>, Value) {
        let mut body = json!({
            "model": model,
            "messages": self.messages,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if !self.tools.is_empty() {
            body["tools"] = json!(self.tools);
        }
        let headers = vec![("authorization", format!("Bearer {key}"))];
        ("/chat/completions".to_owned(), headers, body)
    }

    fn absorb(&mut self, data: &str, answer: &mut Answer) -> Result<String, String> {
        if data == "[DONE]" {
            answer.done = true;
            return Ok(String::new());
        }
        let chunk: Value =
            serde_json::from_str(data).map_err(|e| format!("model_stream_invalid: {e}"))?;
        if let Some(message) = chunk.pointer("/error/message").and_then(Value::as_str) {
            return Err(format!("model_error: {message}"));
        }
        if let Some(u) = chunk.get("usage").and_then(Value::as_object) {
            answer.usage.extend(u.clone());
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            return Ok(String::new());
        };
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            answer.finish = Some(f.to_owned());
        }
        let delta = &choice["delta"];
        for c in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = c["index"].as_u64().unwrap_or(0) as usize;
            // Bounded by the stream's own size: an index far past the
            // calls seen is a broken stream, not a reason to allocate.
            if i > answer.calls.len() {
                return Err(format!(
                    "model_stream_invalid: a tool call at index {i} after {} calls",
                    answer.calls.len()
                ));
            }
            if i == answer.calls.len() {
                answer.calls.push(Call::default());
            }
            let slot = &mut answer.calls[i];
            if let Some(id) = c["id"].as_str() {
                slot.id = id.to_owned();
            }
            if let Some(n) = c.pointer("/function/name").and_then(Value::as_str) {
                slot.name.push_str(n);
            }
            if let Some(a) = c.pointer("/function/arguments").and_then(Value::as_str) {
                slot.arguments.push_str(a);
            }
        }
        let text = delta.get("content").and_then(Value::as_str).unwrap_or("");
        answer.text.push_str(text);
        Ok(text.to_owned())
    }

    fn record_answer(&mut self, answer: &Answer) {
        let calls: Vec<Value> = answer
            .calls
            .iter()
            .map(|c| {
                json!({"id": c.id, "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
        let mut assistant = json!({"role": "assistant", "tool_calls": calls});
        if !answer.text.is_empty() {
            assistant["content"] = json!(answer.text);
        }
        self.messages.push(assistant);
    }

    fn record_result(&mut self, call: &Call, content: String, _ok: bool) {
        self.messages
            .push(json!({"role": "tool", "tool_call_id": call.id, "content": content}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fragmented_calls_text_usage_and_done() {
        let mut api = ChatApi::new("hi".into(), vec![]);
        let mut a = Answer::default();
        let events = [
            r#"{"choices":[{"index":0,"delta":{"content":"Hel"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"files__read","arguments":"{\"pa"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"th\":\"x\"}"}}]},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
        ];
        let texts: Vec<String> = events
            .iter()
            .map(|e| api.absorb(e, &mut a).unwrap())
            .collect();
        assert_eq!(texts[0], "Hel");
        assert!(!a.done);
        api.absorb("[DONE]", &mut a).unwrap();
        assert!(a.done);
        assert_eq!(a.calls.len(), 1);
        assert_eq!(a.calls[0].arguments, r#"{"path":"x"}"#);
        assert_eq!(a.finish.as_deref(), Some("tool_calls"));
        assert_eq!(a.usage["prompt_tokens"], 3);
    }

    #[test]
    fn refuses_a_call_index_past_the_calls_seen() {
        let mut api = ChatApi::new("hi".into(), vec![]);
        let e = r#"{"choices":[{"delta":{"tool_calls":[{"index":9000000}]}}]}"#;
        let err = api.absorb(e, &mut Answer::default()).unwrap_err();
        assert!(err.starts_with("model_stream_invalid"), "{err}");
    }
}
