//! The MCP server of one turn: JSON-RPC messages in, answers out, the same
//! for every transport (the stdio bridge and streamable HTTP).
//!
//! `tools/list` is exactly the catalogue the turn offers the CLI, with its
//! JSON Schemas and `_meta["sharedos/catalogHash"]`, each name as every
//! model API accepts it (`files.write` is `files__write`,
//! `sharedos_protocol::api_names`), since CLIs pass MCP names on to their
//! model; a call's name is mapped back to the catalogue's. `tools/call` goes
//! through the escalation latch to `host/invokeTool`; a refusal is a tool
//! result with `isError: true` and `_meta` status and code, never a
//! JSON-RPC error. Unknown methods are answered `-32601` at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use sharedos_plugin_sdk::RuntimeHost;
use sharedos_protocol::api_names::{ApiNameCollision, ApiNames};
use sharedos_protocol::harness::SERVER_NAME;
use sharedos_protocol::{
    Identifier, Timestamp, ToolCall, ToolDefinition, ToolResult, ToolStatus, canonical_json,
};

use sharedos_protocol::ESCALATE_TOOL;

use crate::latch::{Gate, Latch};

/// The MCP versions spoken, oldest first; an unknown one gets the newest.
pub const MCP_VERSIONS: [&str; 2] = ["2025-06-18", "2025-11-25"];

/// What the CLI is told after its ask.
pub const ASKED_TEXT: &str = "Escalation requested: a human will review this turn. The turn is over: make no further tool calls and end your reply now.";

/// JSON-RPC error codes used here.
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const INVALID_REQUEST: i64 = -32600;

/// The server of one turn, shared by every MCP session of the CLI.
pub struct TurnServer {
    host: Arc<dyn RuntimeHost>,
    latch: Latch,
    tools: Vec<Value>,
    /// The listed tools' names as the CLI has them, both ways.
    names: ApiNames,
    catalog_hash: String,
    trace_id: Identifier,
    execution_id: String,
    calls: AtomicU64,
    closed: AtomicBool,
    /// Set at the first `tools/list` (for the benchmark and diagnostics).
    first_list: std::sync::OnceLock<std::time::Instant>,
}

impl TurnServer {
    /// The server for a turn whose effective catalogue is `tools`;
    /// `escalation` is the spec's: offer `sharedos.escalate` when present.
    /// Refused when two listed names would be the same for the CLI.
    pub fn new(
        host: Arc<dyn RuntimeHost>,
        tools: &[ToolDefinition],
        escalation: bool,
        trace_id: Identifier,
        execution_id: &str,
    ) -> Result<Self, ApiNameCollision> {
        let offered = escalation && tools.iter().any(|t| t.name.as_str() == ESCALATE_TOOL);
        let tools: Vec<&ToolDefinition> = tools
            .iter()
            .filter(|t| offered || t.name.as_str() != ESCALATE_TOOL)
            .collect();
        let names = ApiNames::new(tools.iter().map(|t| t.name.as_str()))?;
        let listed: Vec<Value> = tools.iter().map(|t| mcp_tool(t, &names)).collect();
        let catalog_hash = hex(&Sha256::digest(
            canonical_json(&Value::Array(listed.clone())).as_bytes(),
        ));
        Ok(Self {
            host,
            latch: Latch::new(offered),
            tools: listed,
            names,
            catalog_hash,
            trace_id,
            execution_id: execution_id.to_owned(),
            calls: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            first_list: std::sync::OnceLock::new(),
        })
    }

    pub fn catalog_hash(&self) -> &str {
        &self.catalog_hash
    }

    pub fn latch(&self) -> &Latch {
        &self.latch
    }

    pub fn first_list(&self) -> Option<std::time::Instant> {
        self.first_list.get().copied()
    }

    /// After this, every call is refused (the turn is over).
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// Answers one JSON-RPC message; `None` for a notification or a
    /// response (nothing is sent back).
    pub async fn handle(&self, message: Value) -> Option<Value> {
        let Value::Object(m) = message else {
            return Some(error(
                Value::Null,
                INVALID_REQUEST,
                "not a JSON-RPC message",
            ));
        };
        let Some(method) = m.get("method").and_then(Value::as_str) else {
            // A response to a request we never send, or garbage: no answer.
            return None;
        };
        let id = m.get("id").cloned()?; // a notification: ignored
        let params = m.get("params").cloned().unwrap_or(Value::Null);
        Some(match method {
            "initialize" => ok(id, self.initialize(&params)),
            "ping" => ok(id, json!({})),
            "tools/list" => {
                let _ = self.first_list.set(std::time::Instant::now());
                ok(
                    id,
                    json!({"tools": self.tools, "_meta": {"sharedos/catalogHash": self.catalog_hash}}),
                )
            }
            "tools/call" => match self.call(&params).await {
                Ok(result) => ok(id, result),
                Err(message) => error(id, INVALID_PARAMS, &message),
            },
            other => error(id, METHOD_NOT_FOUND, &format!("method not found: {other}")),
        })
    }

    fn initialize(&self, params: &Value) -> Value {
        let asked = params.get("protocolVersion").and_then(Value::as_str);
        let version = match asked {
            Some(v) if MCP_VERSIONS.contains(&v) => v,
            _ => MCP_VERSIONS[MCP_VERSIONS.len() - 1],
        };
        json!({
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": false}},
            "serverInfo": {"name": SERVER_NAME, "version": env!("CARGO_PKG_VERSION")},
            "instructions": "The tools of this turn, served by the sharedos host. Every call is authorized and audited by the host.",
        })
    }

    async fn call(&self, params: &Value) -> Result<Value, String> {
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .ok_or("tools/call needs params.name, a string")?;
        // The catalogue's name; one it never listed goes on as given, for
        // the envelope to refuse and audit.
        let name = self.names.catalogue(name).unwrap_or(name);
        let arguments = match params.get("arguments") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(a)) => a.clone(),
            Some(_) => return Err("tools/call params.arguments must be an object".into()),
        };
        if self.closed.load(Ordering::SeqCst) {
            return Ok(refusal("denied", "turn_not_active", "The turn is over."));
        }
        match self.latch.gate(name, &Value::Object(arguments.clone())) {
            Gate::Pending => {
                return Ok(refusal(
                    "denied",
                    "escalation_pending",
                    "The turn has been escalated to a human; no further tool calls are accepted.",
                ));
            }
            Gate::Asked(reason) => {
                // Annotated before the answer, so the ending sees it.
                let _ = self.host.annotate(
                    "escalationAsked",
                    json!({"tool": ESCALATE_TOOL, "reason": reason}),
                );
                return Ok(json!({
                    "content": [{"type": "text", "text": ASKED_TEXT}],
                    "isError": false,
                    "_meta": {"sharedos/status": "succeeded"},
                }));
            }
            Gate::Pass => {}
        }
        let Ok(tool) = Identifier::new(name) else {
            return Ok(refusal(
                "denied",
                "tool_unavailable",
                "No such tool on this turn.",
            ));
        };
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let id = Identifier::new(format!("{}.mcp.{n}", self.execution_id))
            .or_else(|_| Identifier::new(format!("mcp.{n}")))
            .map_err(|e| e.to_string())?;
        let call = ToolCall {
            id,
            tool,
            arguments,
            trace_id: self.trace_id.clone(),
            requested_at: Timestamp::now(),
        };
        Ok(match self.host.invoke_tool(call, None).await {
            Ok(result) => tool_result(&result),
            Err(e) => {
                let code = serde_json::to_value(e.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_else(|| "runtime_failed".into());
                refusal("failed", &code, &e.message)
            }
        })
    }
}

/// A tool definition as MCP lists it, under its API name.
fn mcp_tool(t: &ToolDefinition, names: &ApiNames) -> Value {
    let mut tool = json!({
        "name": names.api(t.name.as_str()).unwrap_or(t.name.as_str()),
        "description": t.description.as_str(),
        "inputSchema": t.input_schema,
    });
    if let Some(o) = &t.output_schema {
        tool["outputSchema"] = Value::Object(o.clone());
    }
    let ann = t.annotations.clone().unwrap_or_default();
    let mut hints = json!({"readOnlyHint": ann.read_only.unwrap_or(t.read_write == sharedos_protocol::ReadWrite::Read)});
    if let Some(d) = ann.destructive {
        hints["destructiveHint"] = json!(d);
    }
    if let Some(i) = ann.idempotent {
        hints["idempotentHint"] = json!(i);
    }
    tool["annotations"] = hints;
    tool
}

/// An envelope `ToolResult` as an MCP `CallToolResult`.
fn tool_result(r: &ToolResult) -> Value {
    match r.status() {
        ToolStatus::Succeeded => {
            let output = r.output().cloned().unwrap_or(Value::Null);
            let text = match &output {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let mut v = json!({
                "content": [{"type": "text", "text": text}],
                "isError": false,
                "_meta": {"sharedos/status": "succeeded"},
            });
            if output.is_object() {
                v["structuredContent"] = output;
            }
            v
        }
        status => {
            let (code, message) = r
                .error()
                .map(|e| (e.code.as_str().to_owned(), e.message.as_str().to_owned()))
                .unwrap_or_else(|| ("runtime_failed".into(), "refused".into()));
            let status = if status == ToolStatus::Denied {
                "denied"
            } else {
                "failed"
            };
            refusal(status, &code, &message)
        }
    }
}

fn refusal(status: &str, code: &str, message: &str) -> Value {
    json!({
        "content": [{"type": "text", "text": format!("{code}: {message}")}],
        "isError": true,
        "_meta": {"sharedos/status": status, "sharedos/code": code},
    })
}

fn ok(id: Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
