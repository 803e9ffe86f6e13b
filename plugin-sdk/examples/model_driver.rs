//! A model-driven plugin in Rust: the standard loop around a driver that
//! asks an OpenAI-compatible chat-completions endpoint what to do next. The
//! Python and TypeScript SDKs have the same example
//! (`sdk/python/examples/model_driver.py`, `sdk/typescript/examples/model-driver.mjs`).
//!
//! Environment: `SHAREDOS_MODEL_URL` (an `http://` base URL; the driver
//! POSTs to `<url>/chat/completions`), `SHAREDOS_MODEL_KEY` (a bearer
//! token, optional), `SHAREDOS_MODEL_NAME`. The sandbox has no network: see
//! docs/PLUGINS.md. Plain HTTP/1.0 over `std::net` keeps the example free of
//! an HTTP client dependency; a real plugin would use one (and TLS).
//!
//! Build: `cargo build -p sharedos-plugin-sdk --example model_driver`.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};
use sharedos_plugin_sdk::protocol::api_names::ApiNames;
use sharedos_plugin_sdk::protocol::{Identifier, Timestamp};
use sharedos_plugin_sdk::{
    AgentTurnDecision, AgentTurnDriver, AgentTurnInput, AgentTurnSession, DriverError,
    RuntimeManifest, RuntimeTurnRequest, Signal, StandardRuntimeOptions, ToolCall,
    create_standard_runtime,
};

fn failed(e: impl std::fmt::Display) -> DriverError {
    DriverError::Failed(e.to_string())
}

/// One blocking `POST`; returns the JSON body.
fn post(url: &str, key: &str, body: &Value) -> Result<Value, DriverError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| failed("SHAREDOS_MODEL_URL must start with http://"))?;
    let (authority, base) = rest.split_once('/').unwrap_or((rest, ""));
    let path =
        format!("/{}/chat/completions", base.trim_end_matches('/')).replace("//chat", "/chat");
    let payload = body.to_string();
    let auth = if key.is_empty() {
        String::new()
    } else {
        format!("Authorization: Bearer {key}\r\n")
    };
    let mut conn = std::net::TcpStream::connect(authority).map_err(failed)?;
    write!(
        conn,
        "POST {path} HTTP/1.0\r\nHost: {authority}\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n{payload}",
        payload.len()
    )
    .map_err(failed)?;
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).map_err(failed)?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| failed("the endpoint sent no HTTP body"))?;
    if head.split_whitespace().nth(1) != Some("200") {
        return Err(failed(format!(
            "the endpoint answered {}",
            head.lines().next().unwrap_or("")
        )));
    }
    serde_json::from_str(body).map_err(failed)
}

struct ChatSession {
    url: String,
    key: String,
    model: String,
    trace_id: Identifier,
    names: ApiNames,
    tools: Vec<Value>,
    messages: Vec<Value>,
    /// Tool calls of the last answer not yet made: one per step.
    queued: VecDeque<Value>,
}

impl ChatSession {
    async fn ask(&mut self) -> Result<Value, DriverError> {
        let mut body = json!({"model": self.model, "messages": self.messages});
        if !self.tools.is_empty() {
            body["tools"] = Value::from(self.tools.clone());
        }
        let (url, key) = (self.url.clone(), self.key.clone());
        let answer = tokio::task::spawn_blocking(move || post(&url, &key, &body))
            .await
            .map_err(failed)??;
        Ok(answer["choices"][0]["message"].clone())
    }

    fn call(&self, tc: &Value) -> Result<AgentTurnDecision, DriverError> {
        let f = &tc["function"];
        let name = f["name"].as_str().unwrap_or_default();
        let tool = self.names.catalogue(name).unwrap_or(name);
        let arguments = serde_json::from_str(f["arguments"].as_str().unwrap_or("{}"))
            .map_err(|e| DriverError::InvalidDecision(e.to_string()))?;
        let id = tc["id"].as_str().unwrap_or("call");
        Ok(AgentTurnDecision::ToolCall {
            call: ToolCall {
                id: Identifier::new(id).map_err(failed)?,
                tool: Identifier::new(tool).map_err(failed)?,
                arguments,
                trace_id: self.trace_id.clone(),
                requested_at: Timestamp::now(),
            },
            step: None,
        })
    }
}

#[async_trait]
impl AgentTurnSession for ChatSession {
    async fn next(
        &mut self,
        input: AgentTurnInput,
        _signal: Signal,
    ) -> Result<AgentTurnDecision, DriverError> {
        if let AgentTurnInput::ToolResult(result) = input {
            let content = serde_json::to_value(&result).map_err(failed)?;
            let id = content["callId"].clone();
            self.messages
                .push(json!({"role": "tool", "tool_call_id": id, "content": content.to_string()}));
        }
        if self.queued.is_empty() {
            let message = self.ask().await?;
            self.messages.push(message.clone());
            self.queued = message["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into();
            if self.queued.is_empty() {
                let text = message["content"].as_str().unwrap_or_default();
                return Ok(AgentTurnDecision::Complete {
                    output: json!({"text": text}),
                    metadata: None,
                });
            }
        }
        match self.queued.pop_front() {
            Some(tc) => self.call(&tc),
            None => Err(failed("no tool call queued")),
        }
    }
}

struct ChatDriver;

#[async_trait]
impl AgentTurnDriver for ChatDriver {
    fn manifest(&self) -> Option<RuntimeManifest> {
        RuntimeManifest::new("sharedos-model-rust", "0.1.0").ok()
    }

    async fn open(
        &self,
        request: &RuntimeTurnRequest,
        _signal: Signal,
    ) -> Result<Box<dyn AgentTurnSession>, DriverError> {
        let url = std::env::var("SHAREDOS_MODEL_URL")
            .map_err(|_| failed("SHAREDOS_MODEL_URL is not set"))?;
        // Chat APIs allow `[A-Za-z0-9_-]{1,64}` in function names; sharedos
        // tools use dots. One table maps both ways (and refuses a catalogue
        // whose names would collide).
        let names = ApiNames::new(request.tools.iter().map(|t| t.name.as_str())).map_err(failed)?;
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": names.api(t.name.as_str()),
                    "description": t.description.as_str(),
                    "parameters": t.input_schema}})
            })
            .collect();
        let payload = &request.message.payload;
        let text = payload
            .as_str()
            .map_or_else(|| payload.to_string(), str::to_owned);
        Ok(Box::new(ChatSession {
            url,
            key: std::env::var(sharedos_protocol::MODEL_KEY_ENV).unwrap_or_default(),
            model: std::env::var("SHAREDOS_MODEL_NAME").unwrap_or_else(|_| "default".into()),
            trace_id: request.context.trace_id.clone(),
            names,
            tools,
            messages: vec![json!({"role": "user", "content": text})],
            queued: VecDeque::new(),
        }))
    }
}

fn main() -> ExitCode {
    let runtime = create_standard_runtime(StandardRuntimeOptions::new(Arc::new(ChatDriver)));
    sharedos_plugin_sdk::serve(runtime)
}
