//! The standard runtime with a transcript driver or a model driver
//! (`model`: OpenAI Chat Completions, OpenAI Responses, Anthropic
//! Messages, Gemini) seated.
//!
//! The transcript is a scripted sequence of decisions named by the
//! runtime's trusted registry entry (never by a request). Each entry is an
//! `AgentTurnDecision` as JSON, with two conveniences:
//!
//! - a `tool_call` may leave out `call.id`, `call.traceId` and
//!   `call.requestedAt`; the driver fills them from the turn
//!   (`<executionId>.<n>`, the context's trace id, the context's `now`);
//! - a `complete` whose `output` is the string `"$results"` completes with
//!   the list of results the seat was handed, `{tool, status, output|code}`.
//!
//! The driver states no manifest, so the runtime reports itself as
//! `sharedos.standard`.

#![forbid(unsafe_code)]

pub mod anthropic;
pub mod chat;
pub mod command;
pub mod deltas;
pub mod gemini;
pub mod model;
pub mod responses;
mod sse;
pub mod wire;

pub use model::DriverKind;

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sharedos_plugin_sdk::protocol::{RuntimeTurnRequest, canonical_json};
use sharedos_plugin_sdk::{
    AgentTurnDecision, AgentTurnDriver, AgentTurnInput, AgentTurnSession, DriverError,
    RuntimePlugin, Signal, StandardRuntimeOptions, create_standard_runtime,
};

/// Why a transcript was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TranscriptError(pub String);

impl std::fmt::Display for TranscriptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TranscriptError {}

/// A driver that replays a transcript.
pub struct TranscriptDriver {
    entries: Arc<Vec<Value>>,
}

impl TranscriptDriver {
    /// Takes the transcript as a JSON array of decisions.
    pub fn new(transcript: Value) -> Result<Self, TranscriptError> {
        match transcript {
            Value::Array(entries) if !entries.is_empty() => {
                for (i, e) in entries.iter().enumerate() {
                    if e.get("type").and_then(Value::as_str).is_none() {
                        return Err(TranscriptError(format!(
                            "transcript[{i}]: each decision needs a \"type\""
                        )));
                    }
                }
                Ok(Self {
                    entries: Arc::new(entries),
                })
            }
            _ => Err(TranscriptError(
                "the transcript must be a non-empty JSON array of decisions".into(),
            )),
        }
    }
}

/// The hash of what the seat was told: SHA-256 of canonical JSON
/// `{instructions, prompt}`, lowercase hex.
pub fn prompt_hash(instructions: Option<&str>, prompt: &Value) -> String {
    let text = canonical_json(&json!({"instructions": instructions, "prompt": prompt}));
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

struct TranscriptSession {
    entries: Arc<Vec<Value>>,
    cursor: usize,
    execution_id: String,
    trace_id: String,
    now: String,
    prompt_hash: String,
    results: Vec<Value>,
}

#[async_trait]
impl AgentTurnDriver for TranscriptDriver {
    async fn open(
        &self,
        request: &RuntimeTurnRequest,
        _signal: Signal,
    ) -> Result<Box<dyn AgentTurnSession>, DriverError> {
        Ok(Box::new(TranscriptSession {
            entries: self.entries.clone(),
            cursor: 0,
            execution_id: request.execution_id.to_string(),
            trace_id: request.context.trace_id.to_string(),
            now: request.context.now.to_string(),
            prompt_hash: prompt_hash(None, &request.message.payload),
            results: Vec::new(),
        }))
    }
}

#[async_trait]
impl AgentTurnSession for TranscriptSession {
    fn prompt_hash(&self) -> Option<String> {
        Some(self.prompt_hash.clone())
    }

    async fn next(
        &mut self,
        input: AgentTurnInput,
        _signal: Signal,
    ) -> Result<AgentTurnDecision, DriverError> {
        if let AgentTurnInput::ToolResult(r) = input {
            let mut summary = json!({"tool": r.tool().as_str(), "status": r.status().as_str()});
            match r.output() {
                Some(o) => summary["output"] = o.clone(),
                None => summary["code"] = json!(r.error().map(|e| e.code.as_str())),
            }
            self.results.push(summary);
        }
        let Some(entry) = self.entries.get(self.cursor).cloned() else {
            return Err(DriverError::InvalidDecision(
                "the transcript ran out of decisions".into(),
            ));
        };
        self.cursor += 1;
        let mut entry = entry;
        if entry["type"] == "tool_call"
            && let Some(call) = entry.get_mut("call").and_then(Value::as_object_mut)
        {
            call.entry("id")
                .or_insert_with(|| json!(format!("{}.{}", self.execution_id, self.cursor)));
            call.entry("traceId")
                .or_insert_with(|| json!(self.trace_id));
            call.entry("requestedAt").or_insert_with(|| json!(self.now));
            call.entry("arguments").or_insert_with(|| json!({}));
        }
        if entry["type"] == "complete" && entry.get("output") == Some(&json!("$results")) {
            entry["output"] = json!({"results": self.results});
        }
        serde_json::from_value(entry).map_err(|e| DriverError::InvalidDecision(e.to_string()))
    }
}

/// The standard runtime with this transcript seated.
pub fn plugin(transcript: Value) -> Result<Arc<dyn RuntimePlugin>, TranscriptError> {
    let driver = TranscriptDriver::new(transcript)?;
    Ok(create_standard_runtime(StandardRuntimeOptions::new(
        Arc::new(driver),
    )))
}

/// The standard runtime with a model driver of `kind` seated, reaching
/// the model at `base_url` (the gateway's route) with a placeholder key;
/// the text the model streams is emitted as `text_delta` events.
pub fn model_plugin(
    kind: DriverKind,
    base_url: &str,
    model: &str,
    key: &str,
) -> Result<Arc<dyn RuntimePlugin>, TranscriptError> {
    model_plugin_with(kind, base_url, model, key, None)
}

/// [`model_plugin`] with a limit on the answer's tokens: Anthropic's
/// `max_tokens` (`None`: its default, [`anthropic::DEFAULT_MAX_TOKENS`])
/// or Gemini's `generationConfig.maxOutputTokens` (`None`: not sent); a
/// value outside [`anthropic::MAX_TOKENS_RANGE`], or one for an OpenAI
/// wire, is refused. A Gemini model must be a plain id
/// ([`gemini::model_id_ok`]): it is a segment of the request's path.
pub fn model_plugin_with(
    kind: DriverKind,
    base_url: &str,
    model: &str,
    key: &str,
    max_tokens: Option<u64>,
) -> Result<Arc<dyn RuntimePlugin>, TranscriptError> {
    if let Some(n) = max_tokens {
        if !matches!(
            kind,
            DriverKind::AnthropicMessages | DriverKind::GeminiGenerateContent
        ) {
            return Err(TranscriptError(
                "max tokens applies to the anthropic-messages and gemini-generate-content drivers only"
                    .into(),
            ));
        }
        if !anthropic::MAX_TOKENS_RANGE.contains(&n) {
            return Err(TranscriptError(format!(
                "max tokens must be {}..={}, got {n}",
                anthropic::MAX_TOKENS_RANGE.start(),
                anthropic::MAX_TOKENS_RANGE.end()
            )));
        }
    }
    let base = sse::BaseUrl::parse(base_url).map_err(TranscriptError)?;
    if model.trim().is_empty() {
        return Err(TranscriptError("the model must be named".into()));
    }
    if kind == DriverKind::GeminiGenerateContent && !gemini::model_id_ok(model) {
        return Err(TranscriptError(format!(
            "the Gemini model {model:?} must be a plain id such as gemini-2.5-flash \
             (letters, digits, '.', '_', '-'; no \"models/\" prefix)"
        )));
    }
    let driver = model::ModelDriver::new(model::ModelConfig {
        kind,
        base,
        model: model.to_owned(),
        key: key.to_owned(),
        max_tokens,
    });
    let inner = create_standard_runtime(StandardRuntimeOptions::new(Arc::new(driver)));
    Ok(Arc::new(deltas::Streaming { inner }))
}

/// The standard runtime with the Chat Completions driver seated.
pub fn chat_plugin(
    base_url: &str,
    model: &str,
    key: &str,
) -> Result<Arc<dyn RuntimePlugin>, TranscriptError> {
    model_plugin(DriverKind::OpenaiChat, base_url, model, key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_empty_or_untyped_transcripts() {
        assert!(TranscriptDriver::new(json!([])).is_err());
        assert!(TranscriptDriver::new(json!({"type": "complete"})).is_err());
        assert!(TranscriptDriver::new(json!([{"output": 1}])).is_err());
        assert!(TranscriptDriver::new(json!([{"type": "complete", "output": 1}])).is_ok());
    }

    #[test]
    fn prompt_hash_is_64_hex() {
        let h = prompt_hash(None, &json!({"b": 1, "a": 2}));
        assert_eq!(h.len(), 64);
        assert!(
            h.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_eq!(h, prompt_hash(None, &json!({"a": 2, "b": 1})));
    }
}
