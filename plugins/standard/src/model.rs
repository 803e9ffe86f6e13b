//! The model drivers of the standard runtime: one session shape for the
//! four APIs (OpenAI Chat Completions, OpenAI Responses, Anthropic
//! Messages, Gemini's streamGenerateContent), each reached through the host's egress gateway with a
//! placeholder key the gateway replaces.
//!
//! A [`ModelApi`] knows one wire: how the conversation so far is written
//! as a request, how a streamed answer is read, how the answer and each
//! tool result are kept for the next request. [`ModelSession`] does the
//! rest the same way for all four: the catalogue as tool definitions, one
//! `ToolCall` per model call (in the order the model made them), text
//! deltas as runtime events, usage and finish reason in the outcome's
//! metadata, and a typed failure for each way the model can go wrong.

use std::collections::VecDeque;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use sharedos_plugin_sdk::protocol::api_names::ApiNames;
use sharedos_plugin_sdk::protocol::{ProtocolError, RuntimeTurnRequest};
use sharedos_plugin_sdk::{
    AgentTurnDecision, AgentTurnDriver, AgentTurnInput, AgentTurnSession, DriverError, Signal,
};

use crate::deltas::TextDeltas;
use crate::sse::{BaseUrl, EventReader, post};
pub use crate::wire::{Answer, Call, ModelApi, ToolSpec};

/// The driver kinds a runtime entry may name (`driver.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverKind {
    OpenaiChat,
    OpenaiResponses,
    AnthropicMessages,
    GeminiGenerateContent,
}

impl DriverKind {
    pub const ALL: [DriverKind; 4] = [
        DriverKind::OpenaiChat,
        DriverKind::OpenaiResponses,
        DriverKind::AnthropicMessages,
        DriverKind::GeminiGenerateContent,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DriverKind::OpenaiChat => "openai-chat",
            DriverKind::OpenaiResponses => "openai-responses",
            DriverKind::AnthropicMessages => "anthropic-messages",
            DriverKind::GeminiGenerateContent => "gemini-generate-content",
        }
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == text)
            .ok_or_else(|| {
                let kinds: Vec<String> = Self::ALL
                    .iter()
                    .map(|k| format!("{:?}", k.as_str()))
                    .collect();
                format!(
                    "{text:?} is not a driver kind (one of {})",
                    kinds.join(", ")
                )
            })
    }
}

/// Where and how to reach the model.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub kind: DriverKind,
    pub base: BaseUrl,
    pub model: String,
    /// A placeholder: the gateway replaces it.
    pub key: String,
    /// Anthropic's `max_tokens` (`None`: its default) or Gemini's
    /// `generationConfig.maxOutputTokens` (`None`: not sent).
    pub max_tokens: Option<u64>,
}

/// The driver: one session per turn, on the configured API.
pub struct ModelDriver {
    config: Arc<ModelConfig>,
}

impl ModelDriver {
    pub fn new(config: ModelConfig) -> Self {
        Self {
            config: Arc::new(config),
        }
    }
}

/// A tool's schema as an object schema (`{}` says nothing; the APIs want
/// `"type": "object"`).
fn object_schema(schema: &Map<String, Value>) -> Value {
    let mut s = schema.clone();
    s.entry("type").or_insert_with(|| json!("object"));
    Value::Object(s)
}

fn open_api(config: &ModelConfig, prompt: String, tools: Vec<ToolSpec>) -> Box<dyn ModelApi> {
    match config.kind {
        DriverKind::OpenaiChat => Box::new(crate::chat::ChatApi::new(prompt, tools)),
        DriverKind::OpenaiResponses => Box::new(crate::responses::ResponsesApi::new(prompt, tools)),
        DriverKind::AnthropicMessages => {
            let max_tokens = config
                .max_tokens
                .unwrap_or(crate::anthropic::DEFAULT_MAX_TOKENS);
            Box::new(crate::anthropic::AnthropicApi::new(
                prompt, tools, max_tokens,
            ))
        }
        DriverKind::GeminiGenerateContent => Box::new(crate::gemini::GeminiApi::new(
            prompt,
            tools,
            config.max_tokens,
        )),
    }
}

#[async_trait]
impl AgentTurnDriver for ModelDriver {
    async fn open(
        &self,
        request: &RuntimeTurnRequest,
        _signal: Signal,
    ) -> Result<Box<dyn AgentTurnSession>, DriverError> {
        // The names model APIs accept (`files.write` is `files__write`),
        // one table both ways; a catalogue where two collide is refused.
        let names = ApiNames::new(request.tools.iter().map(|t| t.name.as_str()))
            .map_err(|e| DriverError::Failed(format!("tool_names_collide: {e}")))?;
        let tools = request
            .tools
            .iter()
            .map(|t| ToolSpec {
                name: names.api(t.name.as_str()).unwrap_or_default().to_owned(),
                description: t.description.to_string(),
                schema: object_schema(&t.input_schema),
            })
            .collect();
        let prompt = match &request.message.payload {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        Ok(Box::new(ModelSession {
            api: open_api(&self.config, prompt, tools),
            config: self.config.clone(),
            names,
            pending: VecDeque::new(),
            execution_id: request.execution_id.to_string(),
            trace_id: request.context.trace_id.to_string(),
            now: request.context.now.to_string(),
            calls: 0,
            usage: Map::new(),
        }))
    }
}

struct ModelSession {
    config: Arc<ModelConfig>,
    api: Box<dyn ModelApi>,
    /// The catalogue's names as the model API has them, both ways.
    names: ApiNames,
    /// The calls of the last answer not yet handed to the loop (the front
    /// one is in flight once decided).
    pending: VecDeque<Call>,
    execution_id: String,
    trace_id: String,
    now: String,
    calls: u64,
    /// The turn's usage: each answer's counts added up.
    usage: Map<String, Value>,
}

/// The catalogue name the model meant: the function name mapped back,
/// or, for a namespaced call, the namespace and name joined; a name the
/// catalogue does not hold is passed on for the envelope to refuse.
fn catalogue_name(names: &ApiNames, call: &Call) -> String {
    if let Some(t) = names.catalogue(&call.name) {
        return t.to_owned();
    }
    if let Some(ns) = call.namespace.as_deref().filter(|n| !n.is_empty()) {
        if let Some(t) = names.catalogue(&format!("{ns}__{}", call.name)) {
            return t.to_owned();
        }
        let dotted = format!("{ns}.{}", call.name);
        if names.api(&dotted).is_some() {
            return dotted;
        }
    }
    call.name.clone()
}

/// Splits `code: message`.
fn failure(e: &str) -> (&str, &str) {
    e.split_once(": ").unwrap_or((e, ""))
}

impl ModelSession {
    async fn ask(&mut self) -> Result<Answer, String> {
        let (path, headers, body) = self.api.request(&self.config.model, &self.config.key);
        let (status, body) = post(&self.config.base, &path, &headers, &body).await?;
        let mut events = EventReader::new(body);
        if status >= 400 {
            let text = events.rest().await;
            return Err(format!("model_http_{status}: {text}"));
        }
        let mut answer = Answer::default();
        let mut deltas = TextDeltas::for_this_turn();
        let read = async {
            while let Some(data) = events.next_data().await? {
                let text = self.api.absorb(&data, &mut answer)?;
                deltas.push(&text);
                if answer.done {
                    return Ok(());
                }
            }
            self.api.stream_ended(&mut answer);
            if answer.done {
                return Ok(());
            }
            Err("model_stream_cut: the stream ended before the model finished its answer".into())
        };
        let read: Result<(), String> = read.await;
        deltas.flush();
        read?;
        self.add_usage(&answer.usage);
        Ok(answer)
    }

    fn add_usage(&mut self, usage: &Map<String, Value>) {
        for (k, v) in usage {
            let sum = match (self.usage.get(k).and_then(Value::as_u64), v.as_u64()) {
                (Some(a), Some(b)) => json!(a.saturating_add(b)),
                _ => v.clone(),
            };
            self.usage.insert(k.clone(), sum);
        }
    }

    fn decide_call(&mut self) -> Option<AgentTurnDecision> {
        let call = self.pending.front().cloned()?;
        self.calls += 1;
        let text = if call.arguments.trim().is_empty() {
            "{}"
        } else {
            &call.arguments
        };
        let Ok(arguments @ Value::Object(_)) = serde_json::from_str::<Value>(text) else {
            return Some(self.fail(
                "model_arguments_invalid",
                &format!(
                    "the model called {} with arguments that are not a JSON object",
                    call.name
                ),
            ));
        };
        let tool = catalogue_name(&self.names, &call);
        let decision = json!({"type": "tool_call", "call": {
            "id": format!("{}.{}", self.execution_id, self.calls),
            "tool": tool,
            "arguments": arguments,
            "traceId": self.trace_id,
            "requestedAt": self.now,
        }});
        Some(serde_json::from_value(decision).unwrap_or_else(|e| {
            self.fail(
                "model_call_invalid",
                &format!("the model called {tool:?}, which cannot name a tool: {e}"),
            )
        }))
    }

    fn fail(&self, code: &str, message: &str) -> AgentTurnDecision {
        AgentTurnDecision::Fail {
            error: ProtocolError::new(code, message, Some(false)),
            metadata: Some(self.metadata(None)),
        }
    }

    fn metadata(&self, finish: Option<&str>) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("driver".into(), json!(self.config.kind.as_str()));
        m.insert("model".into(), json!(self.config.model));
        if !self.usage.is_empty() {
            m.insert("usage".into(), Value::Object(self.usage.clone()));
        }
        if let Some(f) = finish {
            m.insert("finishReason".into(), json!(f));
        }
        m
    }
}

/// A tool result as the model reads it: status and output, or the code
/// (and message) of a refusal or failure.
fn result_content(r: &sharedos_plugin_sdk::protocol::ToolResult) -> String {
    let content = match r.output() {
        Some(o) => json!({"status": r.status().as_str(), "output": o}),
        None => json!({
            "status": r.status().as_str(),
            "code": r.error().map(|e| e.code.as_str()),
            "message": r.error().map(|e| e.message.as_str()),
        }),
    };
    content.to_string()
}

#[async_trait]
impl AgentTurnSession for ModelSession {
    async fn next(
        &mut self,
        input: AgentTurnInput,
        _signal: Signal,
    ) -> Result<AgentTurnDecision, DriverError> {
        if let AgentTurnInput::ToolResult(r) = input
            && let Some(call) = self.pending.pop_front()
        {
            let ok = r.status().as_str() == "succeeded";
            self.api.record_result(&call, result_content(&r), ok);
        }
        if let Some(d) = self.decide_call() {
            return Ok(d);
        }
        let answer = match self.ask().await {
            Ok(a) => a,
            Err(e) => {
                let (code, message) = failure(&e);
                return Ok(self.fail(code, message));
            }
        };
        if answer.calls.is_empty() {
            let finish = answer.finish.as_deref().unwrap_or("stop");
            return Ok(AgentTurnDecision::Complete {
                output: json!({"text": answer.text}),
                metadata: Some(self.metadata(Some(finish))),
            });
        }
        self.api.record_answer(&answer);
        self.pending.extend(answer.calls);
        Ok(self
            .decide_call()
            .unwrap_or_else(|| self.fail("model_call_invalid", "no tool call to make")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_back_to_the_catalogue_with_or_without_a_namespace() {
        let names = ApiNames::new(["files.read"]).unwrap();
        let call = |name: &str, ns: Option<&str>| Call {
            name: name.into(),
            namespace: ns.map(str::to_owned),
            ..Call::default()
        };
        assert_eq!(
            catalogue_name(&names, &call("files__read", None)),
            "files.read"
        );
        assert_eq!(
            catalogue_name(&names, &call("read", Some("files"))),
            "files.read"
        );
        assert_eq!(catalogue_name(&names, &call("read", None)), "read");
        assert_eq!(
            catalogue_name(&names, &call("transfer", Some("bank"))),
            "transfer"
        );
    }

    #[test]
    fn kinds_parse_from_their_names_only() {
        for k in DriverKind::ALL {
            assert_eq!(DriverKind::parse(k.as_str()), Ok(k));
        }
        let e = DriverKind::parse("openai").unwrap_err();
        assert!(e.contains("openai-responses"), "{e}");
        assert!(e.contains("\"gemini-generate-content\""), "{e}");
    }
}
