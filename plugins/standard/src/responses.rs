//! The OpenAI Responses wire (`openai-responses`).
//!
//! The catalogue becomes `tools` of type `function` (flat: `name`,
//! `description`, `parameters`). The answer streams as typed events:
//! `response.output_item.added` opens an output item (a `function_call`
//! carries `call_id` and `name`), `response.function_call_arguments.delta`
//! and `.done` carry its arguments, `response.output_text.delta` the text,
//! `response.output_item.done` the finished item, and `response.completed`
//! (or `response.incomplete`) the usage and status; `response.failed` and
//! `error` are the model's failures. The conversation is stateless: each
//! request sends the whole input, the answer's output items appended as
//! they came (a `namespace` on a call, as Codex writes, is kept), each
//! result as a `function_call_output` item with the call's `call_id`.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::wire::{Answer, Call, ModelApi, ToolSpec};

pub struct ResponsesApi {
    input: Vec<Value>,
    tools: Vec<Value>,
    /// The current answer's finished output items, in order.
    items: Vec<Value>,
    /// Output index → position in the answer's calls.
    by_output: HashMap<u64, usize>,
    /// Item id → position in the answer's calls (argument events name
    /// both; either is enough).
    by_item: HashMap<String, usize>,
}

impl ResponsesApi {
    pub fn new(prompt: String, tools: Vec<ToolSpec>) -> Self {
        let tools = tools
            .into_iter()
            .map(|t| {
                json!({"type": "function", "name": t.name, "description": t.description,
                    "parameters": t.schema, "strict": false})
            })
            .collect();
        Self {
            input: vec![json!({"role": "user", "content": prompt})],
            tools,
            items: Vec::new(),
            by_output: HashMap::new(),
            by_item: HashMap::new(),
        }
    }

    fn call_from(item: &Value) -> Call {
        let text = |k: &str| item.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        Call {
            id: text("call_id"),
            name: text("name"),
            arguments: text("arguments"),
            namespace: item
                .get("namespace")
                .and_then(Value::as_str)
                .map(str::to_owned),
        }
    }

    /// The call an arguments event is for (by its item id, or else its
    /// output index), opened by `output_item.added`.
    fn slot<'a>(&self, event: &Value, answer: &'a mut Answer) -> Result<&'a mut Call, String> {
        let index = event["output_index"].as_u64().unwrap_or(0);
        let by_item = event["item_id"].as_str().and_then(|i| self.by_item.get(i));
        let at = by_item.or_else(|| self.by_output.get(&index)).copied().ok_or_else(|| {
            format!(
                "model_stream_invalid: arguments for output {index}, which is not a function call"
            )
        })?;
        answer
            .calls
            .get_mut(at)
            .ok_or_else(|| "model_stream_invalid: a call out of order".to_owned())
    }

    fn item_event(&mut self, event: &Value, answer: &mut Answer, done: bool) {
        let item = &event["item"];
        if item["type"] != "function_call" {
            if done {
                self.items.push(item.clone());
            }
            return;
        }
        let index = event["output_index"].as_u64().unwrap_or(0);
        let call = Self::call_from(item);
        match self.by_output.get(&index).copied() {
            // The finished item is authoritative over the fragments.
            Some(at) if done => {
                if let Some(slot) = answer.calls.get_mut(at) {
                    *slot = call;
                }
            }
            Some(_) => {}
            None => {
                self.by_output.insert(index, answer.calls.len());
                if let Some(id) = item["id"].as_str() {
                    self.by_item.insert(id.to_owned(), answer.calls.len());
                }
                answer.calls.push(call);
            }
        }
        if done {
            self.items.push(item.clone());
        }
    }

    fn finished(event: &Value, answer: &mut Answer) {
        let response = &event["response"];
        if let Some(u) = response.get("usage").and_then(Value::as_object) {
            answer.usage.extend(u.clone());
        }
        let finish = response
            .pointer("/incomplete_details/reason")
            .or_else(|| response.get("status"))
            .and_then(Value::as_str)
            .unwrap_or("completed");
        answer.finish = Some(finish.to_owned());
        answer.done = true;
    }
}

fn failure_message(event: &Value) -> String {
    let error = event
        .pointer("/response/error")
        .or_else(|| event.get("error"))
        .unwrap_or(event);
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("the model failed");
    match error.get("code").and_then(Value::as_str) {
        Some(code) => format!("model_error: {code}: {message}"),
        None => format!("model_error: {message}"),
    }
}

impl ModelApi for ResponsesApi {
    fn request(&self, model: &str, key: &str) -> (String, Vec<(&'static str, String)>, Value) {
        let mut body = json!({"model": model, "input": self.input, "stream": true});
        if !self.tools.is_empty() {
            body["tools"] = json!(self.tools);
        }
        let headers = vec![("authorization", format!("Bearer {key}"))];
        ("/responses".to_owned(), headers, body)
    }

    fn absorb(&mut self, data: &str, answer: &mut Answer) -> Result<String, String> {
        let event: Value =
            serde_json::from_str(data).map_err(|e| format!("model_stream_invalid: {e}"))?;
        match event["type"].as_str().unwrap_or("") {
            "response.created" => {
                self.items.clear();
                self.by_output.clear();
                self.by_item.clear();
            }
            "response.output_item.added" => self.item_event(&event, answer, false),
            "response.output_item.done" => self.item_event(&event, answer, true),
            "response.function_call_arguments.delta" => {
                let delta = event["delta"].as_str().unwrap_or("").to_owned();
                self.slot(&event, answer)?.arguments.push_str(&delta);
            }
            "response.function_call_arguments.done" => {
                if let Some(args) = event["arguments"].as_str() {
                    self.slot(&event, answer)?.arguments = args.to_owned();
                }
            }
            "response.output_text.delta" => {
                let text = event["delta"].as_str().unwrap_or("");
                answer.text.push_str(text);
                return Ok(text.to_owned());
            }
            "response.completed" | "response.incomplete" => Self::finished(&event, answer),
            "response.failed" | "error" => return Err(failure_message(&event)),
            _ => {}
        }
        Ok(String::new())
    }

    fn record_answer(&mut self, answer: &Answer) {
        let mut items = std::mem::take(&mut self.items);
        // A call the stream never finished as an item is written from
        // what was streamed, so every result has its call.
        for c in &answer.calls {
            let present = items
                .iter()
                .any(|i| i["type"] == "function_call" && i["call_id"] == c.id.as_str());
            if !present {
                items.push(json!({"type": "function_call", "call_id": c.id,
                    "name": c.name, "arguments": c.arguments}));
            }
        }
        self.input.extend(items);
        self.by_output.clear();
        self.by_item.clear();
    }

    fn record_result(&mut self, call: &Call, content: String, _ok: bool) {
        self.input
            .push(json!({"type": "function_call_output", "call_id": call.id, "output": content}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(api: &mut ResponsesApi, events: &[Value]) -> Answer {
        let mut a = Answer::default();
        for e in events {
            api.absorb(&e.to_string(), &mut a).unwrap();
        }
        a
    }

    #[test]
    fn reads_a_namespaced_call_in_fragments_and_keeps_its_item() {
        let mut api = ResponsesApi::new("hi".into(), vec![]);
        let item = json!({"type": "function_call", "id": "fc_1", "call_id": "call_1",
            "name": "read", "namespace": "files", "arguments": ""});
        let mut done = item.clone();
        done["arguments"] = json!("{\"path\":\"a\"}");
        let a = run(
            &mut api,
            &[
                json!({"type": "response.created", "response": {}}),
                json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
                json!({"type": "response.function_call_arguments.delta", "output_index": 0, "delta": "{\"pa"}),
                json!({"type": "response.function_call_arguments.delta", "output_index": 0, "delta": "th\":\"a\"}"}),
                json!({"type": "response.output_item.done", "output_index": 0, "item": done}),
                json!({"type": "response.completed", "response": {"status": "completed",
                    "usage": {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8}}}),
            ],
        );
        assert!(a.done);
        assert_eq!(a.calls.len(), 1);
        assert_eq!(a.calls[0].id, "call_1");
        assert_eq!(a.calls[0].namespace.as_deref(), Some("files"));
        assert_eq!(a.calls[0].arguments, "{\"path\":\"a\"}");
        assert_eq!(a.usage["total_tokens"], 8);
        api.record_answer(&a);
        api.record_result(&a.calls[0], "ok".into(), true);
        let (_, _, body) = api.request("m", "k");
        let input = body["input"].as_array().unwrap();
        assert_eq!(input[1]["namespace"], "files");
        assert_eq!(input[2]["type"], "function_call_output");
        assert_eq!(input[2]["call_id"], "call_1");
    }

    #[test]
    fn arguments_for_an_unknown_output_and_failures_are_errors() {
        let mut api = ResponsesApi::new("hi".into(), vec![]);
        let mut a = Answer::default();
        let stray = json!({"type": "response.function_call_arguments.delta", "output_index": 4, "delta": "x"});
        assert!(api.absorb(&stray.to_string(), &mut a).is_err());
        let failed = json!({"type": "response.failed", "response": {"error": {"code": "server_error", "message": "boom"}}});
        let e = api.absorb(&failed.to_string(), &mut a).unwrap_err();
        assert_eq!(e, "model_error: server_error: boom");
    }
}
