//! The streamed answers of the four model APIs as their wires write them
//! (OpenAI Chat Completions, OpenAI Responses, Anthropic Messages,
//! Gemini's streamGenerateContent), and
//! readers of what a driver sent: the tools it offered, the results it
//! returned.

use serde_json::{Value, json};

/// A model API's wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    OpenaiChat,
    OpenaiResponses,
    AnthropicMessages,
    Gemini,
}

impl Wire {
    pub const ALL: [Wire; 4] = [
        Wire::OpenaiChat,
        Wire::OpenaiResponses,
        Wire::AnthropicMessages,
        Wire::Gemini,
    ];

    /// From a driver's `kind` in host.toml (`openai-chat`, ...).
    pub fn from_kind(kind: &str) -> Option<Wire> {
        Some(match kind {
            "openai-chat" => Wire::OpenaiChat,
            "openai-responses" => Wire::OpenaiResponses,
            "anthropic-messages" => Wire::AnthropicMessages,
            "gemini-generate-content" => Wire::Gemini,
            _ => return None,
        })
    }

    /// The driver `kind` in host.toml.
    pub fn kind(self) -> &'static str {
        match self {
            Wire::OpenaiChat => "openai-chat",
            Wire::OpenaiResponses => "openai-responses",
            Wire::AnthropicMessages => "anthropic-messages",
            Wire::Gemini => "gemini-generate-content",
        }
    }

    /// The path a driver of `model` posts to, under the route's upstream
    /// `/v1` (Gemini's names the model; its query is `alt=sse`).
    pub fn upstream_path(self, model: &str) -> String {
        match self {
            Wire::OpenaiChat => "/v1/chat/completions".into(),
            Wire::OpenaiResponses => "/v1/responses".into(),
            Wire::AnthropicMessages => "/v1/messages".into(),
            Wire::Gemini => format!("/v1/models/{model}:streamGenerateContent"),
        }
    }

    /// The gateway route's `api` (how the real key is added).
    pub fn route_api(self) -> &'static str {
        match self {
            Wire::AnthropicMessages => "anthropic",
            Wire::Gemini => "gemini",
            _ => "openai",
        }
    }

    /// The header the route puts the real key in.
    pub fn key_header(self) -> &'static str {
        match self {
            Wire::AnthropicMessages => "x-api-key",
            Wire::Gemini => "x-goog-api-key",
            _ => "authorization",
        }
    }

    /// The finish reason the wire states for a text answer.
    pub fn stop_reason(self) -> &'static str {
        match self {
            Wire::OpenaiChat => "stop",
            Wire::OpenaiResponses => "completed",
            Wire::AnthropicMessages => "end_turn",
            Wire::Gemini => "STOP",
        }
    }
}

/// A tool call the scripted model makes: its id, its function name (and,
/// on the Responses wire, the namespace Codex puts it in), and its
/// arguments as text, sent in two fragments.
#[derive(Debug, Clone, Copy)]
pub struct ScriptedCall<'a> {
    pub id: &'a str,
    /// Written on the Responses wire only (`namespace` next to `name`).
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    pub arguments: &'a str,
}

fn halves(s: &str) -> (&str, &str) {
    let mut at = s.len() / 2;
    while !s.is_char_boundary(at) {
        at += 1;
    }
    s.split_at(at)
}

fn data(v: Value) -> String {
    format!("data: {v}\n\n")
}

fn typed(v: Value) -> String {
    let kind = v["type"].as_str().unwrap_or("").to_owned();
    format!("event: {kind}\ndata: {v}\n\n")
}

/// An answer that calls these tools (usage 30+10).
pub fn calls_turn(wire: Wire, calls: &[ScriptedCall]) -> Vec<String> {
    match wire {
        Wire::OpenaiChat => chat_calls(calls),
        Wire::OpenaiResponses => responses_calls(calls),
        Wire::AnthropicMessages => anthropic_calls(calls),
        Wire::Gemini => gemini::calls(calls),
    }
}

fn chat_calls(calls: &[ScriptedCall]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        let (a, b) = halves(c.arguments);
        out.push(data(
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": a}}]}}]}),
        ));
        out.push(data(
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "function": {"arguments": b}}]}}]}),
        ));
    }
    out.push(data(
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
    ));
    out.push(data(
        json!({"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 10, "total_tokens": 40}}),
    ));
    out.push("data: [DONE]\n\n".into());
    out
}

fn responses_calls(calls: &[ScriptedCall]) -> Vec<String> {
    let mut out = vec![typed(
        json!({"type": "response.created", "response": {"id": "resp_calls", "status": "in_progress"}}),
    )];
    for (i, c) in calls.iter().enumerate() {
        let (a, b) = halves(c.arguments);
        let item_id = format!("fc_{i}");
        let mut item = json!({"type": "function_call", "id": item_id, "call_id": c.id,
            "name": c.name, "arguments": "", "status": "in_progress"});
        if let Some(ns) = c.namespace {
            item["namespace"] = json!(ns);
        }
        out.push(typed(
            json!({"type": "response.output_item.added", "output_index": i, "item": item}),
        ));
        for d in [a, b] {
            out.push(typed(
                json!({"type": "response.function_call_arguments.delta", "output_index": i, "item_id": item_id, "delta": d}),
            ));
        }
        out.push(typed(
            json!({"type": "response.function_call_arguments.done", "output_index": i, "item_id": item_id, "arguments": c.arguments}),
        ));
        item["arguments"] = json!(c.arguments);
        item["status"] = json!("completed");
        out.push(typed(
            json!({"type": "response.output_item.done", "output_index": i, "item": item}),
        ));
    }
    out.push(typed(
        json!({"type": "response.completed", "response": {"id": "resp_calls", "status": "completed", "usage": {"input_tokens": 30, "output_tokens": 10, "total_tokens": 40}}}),
    ));
    out
}

fn anthropic_calls(calls: &[ScriptedCall]) -> Vec<String> {
    let mut out = vec![typed(
        json!({"type": "message_start", "message": {"id": "msg_1", "role": "assistant", "content": [], "usage": {"input_tokens": 30, "output_tokens": 1}}}),
    )];
    for (i, c) in calls.iter().enumerate() {
        let (a, b) = halves(c.arguments);
        out.push(typed(
            json!({"type": "content_block_start", "index": i, "content_block": {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}}),
        ));
        for d in [a, b] {
            out.push(typed(
                json!({"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": d}}),
            ));
        }
        out.push(typed(json!({"type": "content_block_stop", "index": i})));
    }
    out.push(typed(
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 10}}),
    ));
    out.push(typed(json!({"type": "message_stop"})));
    out
}

/// An answer that writes these pieces of text and stops (usage 50+6).
pub fn text_turn(wire: Wire, pieces: &[&str]) -> Vec<String> {
    text_turn_with_usage(wire, pieces, (50, 6))
}

/// An answer that writes these pieces of text and stops, reporting
/// `(input, output)` tokens.
pub fn text_turn_with_usage(wire: Wire, pieces: &[&str], usage: (u64, u64)) -> Vec<String> {
    if wire == Wire::Gemini {
        return gemini::text(pieces, usage);
    }
    let (input, output) = usage;
    let mut out = Vec::new();
    match wire {
        Wire::OpenaiChat => {
            for p in pieces {
                out.push(data(
                    json!({"choices": [{"index": 0, "delta": {"content": p}}]}),
                ));
            }
            out.push(data(
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            ));
            out.push(data(
                json!({"choices": [], "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output}}),
            ));
            out.push("data: [DONE]\n\n".into());
        }
        Wire::OpenaiResponses => {
            out.push(typed(
                json!({"type": "response.created", "response": {"id": "resp_text", "status": "in_progress"}}),
            ));
            let item = json!({"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress", "content": []});
            out.push(typed(
                json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
            ));
            for p in pieces {
                out.push(typed(
                    json!({"type": "response.output_text.delta", "output_index": 0, "item_id": "msg_1", "content_index": 0, "delta": p}),
                ));
            }
            let text: String = pieces.concat();
            out.push(typed(
                json!({"type": "response.output_item.done", "output_index": 0, "item": {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": text, "annotations": []}]}}),
            ));
            out.push(typed(
                json!({"type": "response.completed", "response": {"id": "resp_text", "status": "completed", "usage": {"input_tokens": input, "output_tokens": output, "total_tokens": input + output}}}),
            ));
        }
        Wire::AnthropicMessages => {
            out.push(typed(
                json!({"type": "message_start", "message": {"id": "msg_2", "role": "assistant", "content": [], "usage": {"input_tokens": input, "output_tokens": 1}}}),
            ));
            out.push(typed(
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ));
            out.push(typed(json!({"type": "ping"})));
            for p in pieces {
                out.push(typed(
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}),
                ));
            }
            out.push(typed(json!({"type": "content_block_stop", "index": 0})));
            out.push(typed(
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": output}}),
            ));
            out.push(typed(json!({"type": "message_stop"})));
        }
        Wire::Gemini => {}
    }
    out
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or("").to_owned()
}

fn items(v: &Value) -> impl Iterator<Item = &Value> {
    v.as_array().into_iter().flatten()
}

/// The tool results a driver sent back, in order, as `(call id, content
/// text)`, read from a request body. Gemini's results carry the
/// function's name (and an id only when the call had one): `(id or name,
/// the response object as JSON text)`.
pub fn results_sent(wire: Wire, body: &Value) -> Vec<(String, String)> {
    match wire {
        Wire::OpenaiChat => items(&body["messages"])
            .filter(|m| m["role"] == "tool")
            .map(|m| (text(&m["tool_call_id"]), text(&m["content"])))
            .collect(),
        Wire::OpenaiResponses => items(&body["input"])
            .filter(|i| i["type"] == "function_call_output")
            .map(|i| (text(&i["call_id"]), text(&i["output"])))
            .collect(),
        Wire::AnthropicMessages => items(&body["messages"])
            .filter(|m| m["role"] == "user")
            .flat_map(|m| items(&m["content"]))
            .filter(|b| b["type"] == "tool_result")
            .map(|b| (text(&b["tool_use_id"]), text(&b["content"])))
            .collect(),
        Wire::Gemini => gemini::results(body),
    }
}

/// The function names a driver offered the model, read from a request
/// body.
pub fn tools_offered(wire: Wire, body: &Value) -> Vec<String> {
    if wire == Wire::Gemini {
        return items(&body["tools"])
            .flat_map(|t| items(&t["functionDeclarations"]))
            .map(|d| text(&d["name"]))
            .collect();
    }
    items(&body["tools"])
        .map(|t| match wire {
            Wire::OpenaiChat => text(&t["function"]["name"]),
            _ => text(&t["name"]),
        })
        .collect()
}

/// Gemini's `streamGenerateContent?alt=sse`: one `GenerateContentResponse`
/// a `data:` event, CRLF-separated as Google's servers write them; calls
/// whole (`args` an object) and without an id, as Gemini 2.x models send
/// them, each with a `thoughtSignature` as thinking models write it; a
/// text answer's first chunk opens with a `thought` part (reasoning, not
/// the answer); cumulative `usageMetadata`; `finishReason` on the last
/// chunk and no end event.
pub mod gemini {
    use serde_json::{Value, json};

    use super::{ScriptedCall, items, text as text_of};

    /// The `thoughtSignature` of every scripted call; a driver must send
    /// it back with the call.
    pub const SIGNATURE: &str = "bW9jay1zaWduYXR1cmU=";
    /// The reasoning a text answer opens with; never the answer's text.
    pub const THOUGHT: &str = "(the mock thinks)";

    fn data(v: Value) -> String {
        format!("data: {v}\r\n\r\n")
    }

    fn chunk(parts: Value, finish: Option<&str>, usage: Value) -> String {
        let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
        if let Some(f) = finish {
            candidate["finishReason"] = json!(f);
        }
        data(json!({"candidates": [candidate], "usageMetadata": usage,
            "modelVersion": "gemini-mock"}))
    }

    /// Calls (usage 30+10); arguments that are not JSON are sent as a
    /// string, which no Gemini model writes, so a driver's check of them
    /// can be tested.
    pub fn calls(calls: &[ScriptedCall]) -> Vec<String> {
        let prompt = json!({"promptTokenCount": 30, "totalTokenCount": 30});
        let mut out: Vec<String> = calls
            .iter()
            .map(|c| {
                let args = serde_json::from_str::<Value>(c.arguments)
                    .unwrap_or_else(|_| json!(c.arguments));
                let call = json!({"functionCall": {"name": c.name, "args": args},
                    "thoughtSignature": SIGNATURE});
                chunk(json!([call]), None, prompt.clone())
            })
            .collect();
        out.push(chunk(
            json!([]),
            Some("STOP"),
            json!({"promptTokenCount": 30, "candidatesTokenCount": 10, "totalTokenCount": 40}),
        ));
        out
    }

    pub fn text(pieces: &[&str], usage: (u64, u64)) -> Vec<String> {
        let (input, output) = usage;
        let prompt = json!({"promptTokenCount": input, "totalTokenCount": input});
        let mut out: Vec<String> = pieces
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut parts = vec![json!({"text": p})];
                if i == 0 {
                    parts.insert(0, json!({"text": THOUGHT, "thought": true}));
                }
                chunk(json!(parts), None, prompt.clone())
            })
            .collect();
        out.push(chunk(
            json!([{"text": ""}]),
            Some("STOP"),
            json!({"promptTokenCount": input, "candidatesTokenCount": output,
                "totalTokenCount": input + output}),
        ));
        out
    }

    pub fn results(body: &Value) -> Vec<(String, String)> {
        items(&body["contents"])
            .filter(|c| c["role"] == "user")
            .flat_map(|c| items(&c["parts"]))
            .filter_map(|p| p.get("functionResponse"))
            .map(|r| {
                let id = r.get("id").unwrap_or(&r["name"]);
                (text_of(id), r["response"].to_string())
            })
            .collect()
    }
}
