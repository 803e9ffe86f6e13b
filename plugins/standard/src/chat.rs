//! A driver for the OpenAI Chat Completions API (also served by vLLM,
//! Ollama, llama.cpp, LM Studio, DeepSeek), streaming, through the host's
//! egress gateway. It holds a placeholder key only; the gateway adds the
//! real one.
//!
//! The turn's catalogue becomes the `tools` of the request (each tool's
//! input JSON Schema as `parameters`; `.` in a name becomes `__`, which
//! function names may not hold); each streamed tool call becomes a
//! `ToolCall`, its result goes back as a `tool` message; the final text
//! completes the turn with `{text}` and the usage and finish reason in the
//! outcome's metadata.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use sharedos_plugin_sdk::protocol::{ProtocolError, RuntimeTurnRequest};
use sharedos_plugin_sdk::{
    AgentTurnDecision, AgentTurnDriver, AgentTurnInput, AgentTurnSession, DriverError, Signal,
};

use crate::sse::{BaseUrl, EventReader, post};

/// Where and how to reach the model.
#[derive(Debug, Clone)]
pub struct ChatConfig {
    pub base: BaseUrl,
    pub model: String,
    /// A placeholder: the gateway replaces it.
    pub key: String,
}

pub struct ChatDriver {
    config: Arc<ChatConfig>,
}

impl ChatDriver {
    pub fn new(config: ChatConfig) -> Self {
        Self {
            config: Arc::new(config),
        }
    }
}

struct ChatSession {
    config: Arc<ChatConfig>,
    messages: Vec<Value>,
    tools: Vec<Value>,
    /// Function name → catalogue name.
    names: HashMap<String, String>,
    pending: VecDeque<(String, String, String)>,
    execution_id: String,
    trace_id: String,
    now: String,
    calls: u64,
    usage: Map<String, Value>,
}

fn function_name(tool: &str) -> String {
    tool.replace('.', "__")
}

#[async_trait]
impl AgentTurnDriver for ChatDriver {
    async fn open(
        &self,
        request: &RuntimeTurnRequest,
        _signal: Signal,
    ) -> Result<Box<dyn AgentTurnSession>, DriverError> {
        let mut names = HashMap::new();
        let tools = request
            .tools
            .iter()
            .map(|t| {
                let f = function_name(t.name.as_str());
                names.insert(f.clone(), t.name.to_string());
                json!({"type": "function", "function": {
                    "name": f,
                    "description": t.description.as_str(),
                    "parameters": t.input_schema,
                }})
            })
            .collect();
        let prompt = match &request.message.payload {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        Ok(Box::new(ChatSession {
            config: self.config.clone(),
            messages: vec![json!({"role": "user", "content": prompt})],
            tools,
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

/// What one streamed answer said.
#[derive(Default)]
struct Answer {
    text: String,
    /// index → (id, name, arguments so far)
    calls: Vec<(String, String, String)>,
    finish: Option<String>,
}

impl ChatSession {
    async fn ask(&mut self) -> Result<Answer, String> {
        let mut body = json!({
            "model": self.config.model,
            "messages": self.messages,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if !self.tools.is_empty() {
            body["tools"] = json!(self.tools);
        }
        let auth = [("authorization", format!("Bearer {}", self.config.key))];
        let (status, body) = post(&self.config.base, "/chat/completions", &auth, &body).await?;
        let mut events = EventReader::new(body);
        if status >= 400 {
            let text = events.rest().await;
            return Err(format!("model_http_{status}: {text}"));
        }
        let mut answer = Answer::default();
        while let Some(data) = events.next_data().await? {
            if data == "[DONE]" {
                break;
            }
            let chunk: Value =
                serde_json::from_str(&data).map_err(|e| format!("model_stream_invalid: {e}"))?;
            self.absorb(&chunk, &mut answer);
        }
        Ok(answer)
    }

    fn absorb(&mut self, chunk: &Value, answer: &mut Answer) {
        if let Some(u) = chunk.get("usage").and_then(Value::as_object) {
            for (k, v) in u {
                self.usage.insert(k.clone(), v.clone());
            }
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            return;
        };
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            answer.finish = Some(f.to_owned());
        }
        let delta = &choice["delta"];
        if let Some(t) = delta.get("content").and_then(Value::as_str) {
            answer.text.push_str(t);
        }
        for c in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = c["index"].as_u64().unwrap_or(0) as usize;
            // Bounded by the stream's own size: an index far past the
            // calls seen is a broken stream, not a reason to allocate.
            if i > answer.calls.len() {
                continue;
            }
            if i == answer.calls.len() {
                answer.calls.push(Default::default());
            }
            let slot = &mut answer.calls[i];
            if let Some(id) = c["id"].as_str() {
                slot.0 = id.to_owned();
            }
            if let Some(n) = c.pointer("/function/name").and_then(Value::as_str) {
                slot.1.push_str(n);
            }
            if let Some(a) = c.pointer("/function/arguments").and_then(Value::as_str) {
                slot.2.push_str(a);
            }
        }
    }

    fn decide_call(&mut self) -> Option<Result<AgentTurnDecision, DriverError>> {
        let (id, name, args) = self.pending.front().cloned()?;
        self.calls += 1;
        let arguments: Value =
            match serde_json::from_str(if args.is_empty() { "{}" } else { &args }) {
                Ok(v @ Value::Object(_)) => v,
                _ => {
                    return Some(Ok(self.fail(
                        "model_arguments_invalid",
                        &format!(
                            "the model called {name} with arguments that are not a JSON object"
                        ),
                    )));
                }
            };
        let tool = self.names.get(&name).cloned().unwrap_or(name);
        let call = json!({"type": "tool_call", "call": {
            "id": format!("{}.{}", self.execution_id, self.calls),
            "tool": tool,
            "arguments": arguments,
            "traceId": self.trace_id,
            "requestedAt": self.now,
        }});
        let _ = id;
        Some(serde_json::from_value(call).map_err(|e| DriverError::InvalidDecision(e.to_string())))
    }

    fn fail(&self, code: &str, message: &str) -> AgentTurnDecision {
        AgentTurnDecision::Fail {
            error: ProtocolError::new(code, message, Some(false)),
            metadata: Some(self.metadata(None)),
        }
    }

    fn metadata(&self, finish: Option<&str>) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("driver".into(), json!("openai-chat"));
        if !self.usage.is_empty() {
            m.insert("usage".into(), Value::Object(self.usage.clone()));
        }
        if let Some(f) = finish {
            m.insert("finishReason".into(), json!(f));
        }
        m
    }
}

#[async_trait]
impl AgentTurnSession for ChatSession {
    async fn next(
        &mut self,
        input: AgentTurnInput,
        _signal: Signal,
    ) -> Result<AgentTurnDecision, DriverError> {
        if let AgentTurnInput::ToolResult(r) = input {
            let content = match r.output() {
                Some(o) => json!({"status": r.status().as_str(), "output": o}),
                None => {
                    json!({"status": r.status().as_str(), "code": r.error().map(|e| e.code.as_str())})
                }
            };
            if let Some((id, _, _)) = self.pending.pop_front() {
                self.messages.push(
                    json!({"role": "tool", "tool_call_id": id, "content": content.to_string()}),
                );
            }
        }
        if let Some(d) = self.decide_call() {
            return d;
        }
        let answer = match self.ask().await {
            Ok(a) => a,
            Err(e) => {
                let (code, message) = e.split_once(": ").unwrap_or((e.as_str(), ""));
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
        let calls: Vec<Value> = answer
            .calls
            .iter()
            .map(|(id, name, args)| {
                json!({"id": id, "type": "function",
                "function": {"name": name, "arguments": args}})
            })
            .collect();
        let mut assistant = json!({"role": "assistant", "tool_calls": calls});
        if !answer.text.is_empty() {
            assistant["content"] = json!(answer.text);
        }
        self.messages.push(assistant);
        self.pending.extend(answer.calls);
        self.decide_call()
            .unwrap_or_else(|| Err(DriverError::Failed("no tool call to make".into())))
    }
}
