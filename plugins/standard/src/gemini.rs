//! The Gemini wire (`gemini-generate-content`): Gemini API's
//! `POST /models/<model>:streamGenerateContent?alt=sse`.
//!
//! The catalogue becomes one `tools` entry of `functionDeclarations`
//! (`name`, `description`, `parametersJsonSchema`: the tool's JSON Schema
//! as it is; the older `parameters` field takes an OpenAPI subset that
//! refuses ordinary JSON Schema such as `additionalProperties`). The key
//! goes in `x-goog-api-key` (the placeholder; the gateway's
//! `api = "gemini"` route drops it and adds the real one). The
//! conversation is `contents` of `user` and `model` turns, each a list of
//! `parts`.
//!
//! The answer streams as `GenerateContentResponse` chunks, one per event:
//! `candidates[0].content.parts` hold text (a part marked `thought` is
//! the model's reasoning, kept but not shown) and whole `functionCall`s
//! (`name`, `args` as an object, an `id` only on some models: a call
//! without one gets a synthetic id, never sent back). `finishReason`
//! (`STOP`, `MAX_TOKENS`) comes on the last chunk, and the stream has no
//! end event of its own: the answer is done when the body ends after a
//! finish. Any other finish (`SAFETY`, `RECITATION`, `BLOCKLIST`,
//! `PROHIBITED_CONTENT`, `SPII`, `MALFORMED_FUNCTION_CALL`, ...) and a
//! `promptFeedback.blockReason` are the model's refusal, `model_error`;
//! an `error` chunk too. `usageMetadata` (cumulative) is the usage,
//! mapped to `input_tokens`, `output_tokens` (candidates and thoughts, as
//! the other APIs count reasoning) and `total_tokens`.
//!
//! The answer goes back as a `model` turn with its parts as they came
//! (thought signatures included, which Gemini's thinking models require
//! back), the results of its calls as `functionResponse` parts (the
//! function's name, the API's call id when it gave one, the result as
//! `response`) in one `user` turn.

use std::collections::HashSet;

use serde_json::{Map, Value, json};

use crate::wire::{Answer, Call, ModelApi, ToolSpec};

/// The finishes of an answer the model gave; any other is a refusal.
const FINISHED: &[&str] = &["STOP", "MAX_TOKENS"];

/// Whether `model` can be the path segment `models/<model>:...`: letters,
/// digits, `.`, `_`, `-`, at least one letter or digit (no `models/`
/// prefix, no `:`).
pub fn model_id_ok(model: &str) -> bool {
    model.bytes().any(|b| b.is_ascii_alphanumeric())
        && model
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

pub struct GeminiApi {
    contents: Vec<Value>,
    declarations: Vec<Value>,
    /// `generationConfig.maxOutputTokens`; `None`, the model's default.
    max_tokens: Option<u64>,
    /// The current answer's parts as the API sent them.
    parts: Vec<Value>,
    /// Calls seen in the turn, for synthetic ids.
    calls_seen: u64,
    /// The ids this driver made up (never sent to the API).
    synthetic: HashSet<String>,
}

impl GeminiApi {
    pub fn new(prompt: String, tools: Vec<ToolSpec>, max_tokens: Option<u64>) -> Self {
        let declarations = tools
            .into_iter()
            .map(|t| {
                json!({"name": t.name, "description": t.description,
                    "parametersJsonSchema": t.schema})
            })
            .collect();
        Self {
            contents: vec![json!({"role": "user", "parts": [{"text": prompt}]})],
            declarations,
            max_tokens,
            parts: Vec::new(),
            calls_seen: 0,
            synthetic: HashSet::new(),
        }
    }

    /// Keeps `part` of the answer; a plain text part joins a plain text
    /// part before it, so a streamed answer goes back as one part.
    fn keep(&mut self, part: &Value) {
        let plain =
            |p: &Value| p.as_object().is_some_and(|o| o.len() == 1) && p["text"].is_string();
        if plain(part)
            && let Some(last) = self.parts.last_mut()
            && plain(last)
        {
            let joined = format!(
                "{}{}",
                last["text"].as_str().unwrap_or(""),
                part["text"].as_str().unwrap_or("")
            );
            last["text"] = json!(joined);
            return;
        }
        self.parts.push(part.clone());
    }

    fn call(&mut self, call: &Value) -> Result<Call, String> {
        let name = call["name"].as_str().unwrap_or("");
        if name.is_empty() {
            return Err("model_stream_invalid: a functionCall without a name".into());
        }
        let arguments = match &call["args"] {
            Value::Null => "{}".to_owned(),
            args => args.to_string(),
        };
        self.calls_seen += 1;
        let id = match call["id"].as_str().filter(|i| !i.is_empty()) {
            Some(id) => id.to_owned(),
            None => {
                let id = format!("gemini_call_{}", self.calls_seen);
                self.synthetic.insert(id.clone());
                id
            }
        };
        Ok(Call {
            id,
            name: name.to_owned(),
            arguments,
            namespace: None,
        })
    }

    /// Reads one candidate's parts; returns the text shown.
    fn parts_of(&mut self, candidate: &Value, answer: &mut Answer) -> Result<String, String> {
        let mut shown = String::new();
        let parts = candidate
            .pointer("/content/parts")
            .and_then(Value::as_array);
        for part in parts.into_iter().flatten() {
            if let Some(call) = part.get("functionCall") {
                answer.calls.push(self.call(call)?);
            } else if let Some(text) = part["text"].as_str()
                && part["thought"] != true
            {
                shown.push_str(text);
            }
            self.keep(part);
        }
        answer.text.push_str(&shown);
        Ok(shown)
    }
}

/// `usageMetadata` as the usage the other wires report.
fn usage(meta: &Map<String, Value>, answer: &mut Answer) {
    let count = |k: &str| meta.get(k).and_then(Value::as_u64);
    if let Some(n) = count("promptTokenCount") {
        answer.usage.insert("input_tokens".into(), json!(n));
    }
    let (candidates, thoughts) = (count("candidatesTokenCount"), count("thoughtsTokenCount"));
    if candidates.is_some() || thoughts.is_some() {
        let n = candidates
            .unwrap_or(0)
            .saturating_add(thoughts.unwrap_or(0));
        answer.usage.insert("output_tokens".into(), json!(n));
    }
    if let Some(n) = count("totalTokenCount") {
        answer.usage.insert("total_tokens".into(), json!(n));
    }
}

/// An `error` chunk, a blocked prompt or a finish that is a refusal.
fn refusal(chunk: &Value) -> Option<String> {
    if let Some(error) = chunk.get("error") {
        let message = error["message"].as_str().unwrap_or("the model failed");
        return Some(match error["status"].as_str() {
            Some(status) => format!("model_error: {status}: {message}"),
            None => format!("model_error: {message}"),
        });
    }
    if let Some(reason) = chunk
        .pointer("/promptFeedback/blockReason")
        .and_then(Value::as_str)
    {
        return Some(format!(
            "model_error: {reason}: the model refused the prompt (promptFeedback.blockReason {reason})"
        ));
    }
    let candidate = chunk.pointer("/candidates/0")?;
    let reason = candidate["finishReason"].as_str()?;
    if FINISHED.contains(&reason) {
        return None;
    }
    let detail = candidate["finishMessage"].as_str().unwrap_or("");
    Some(format!(
        "model_error: {reason}: the model stopped without an answer (finishReason {reason}) {detail}"
    ).trim_end().to_owned())
}

impl ModelApi for GeminiApi {
    fn request(&self, model: &str, key: &str) -> (String, Vec<(&'static str, String)>, Value) {
        let mut body = json!({"contents": self.contents});
        if !self.declarations.is_empty() {
            body["tools"] = json!([{"functionDeclarations": self.declarations}]);
        }
        if let Some(n) = self.max_tokens {
            body["generationConfig"] = json!({"maxOutputTokens": n});
        }
        let headers = vec![("x-goog-api-key", key.to_owned())];
        let path = format!("/models/{model}:streamGenerateContent?alt=sse");
        (path, headers, body)
    }

    fn absorb(&mut self, data: &str, answer: &mut Answer) -> Result<String, String> {
        let chunk: Value =
            serde_json::from_str(data).map_err(|e| format!("model_stream_invalid: {e}"))?;
        if !chunk.is_object() {
            return Err("model_stream_invalid: a chunk that is not a JSON object".into());
        }
        if let Some(message) = refusal(&chunk) {
            return Err(message);
        }
        if let Some(meta) = chunk.get("usageMetadata").and_then(Value::as_object) {
            usage(meta, answer);
        }
        let Some(candidate) = chunk.pointer("/candidates/0") else {
            return Ok(String::new());
        };
        let shown = self.parts_of(candidate, answer)?;
        if let Some(reason) = candidate["finishReason"].as_str() {
            answer.finish = Some(reason.to_owned());
        }
        Ok(shown)
    }

    fn stream_ended(&mut self, answer: &mut Answer) {
        answer.done = answer.finish.is_some();
    }

    fn record_answer(&mut self, _answer: &Answer) {
        let parts = std::mem::take(&mut self.parts);
        self.contents.push(json!({"role": "model", "parts": parts}));
    }

    fn record_result(&mut self, call: &Call, content: String, _ok: bool) {
        let response = match serde_json::from_str::<Value>(&content) {
            Ok(v @ Value::Object(_)) => v,
            _ => json!({"output": content}),
        };
        let mut reply = json!({"name": call.name, "response": response});
        if !self.synthetic.contains(&call.id) {
            reply["id"] = json!(call.id);
        }
        let part = json!({"functionResponse": reply});
        // All results of one answer go in one user turn.
        if let Some(last) = self.contents.last_mut()
            && last["role"] == "user"
            && let Some(parts) = last["parts"].as_array_mut()
        {
            parts.push(part);
            return;
        }
        self.contents.push(json!({"role": "user", "parts": [part]}));
    }
}

#[cfg(test)]
#[path = "gemini_tests.rs"]
mod tests;
