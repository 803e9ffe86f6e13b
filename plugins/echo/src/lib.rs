//! `sharedos-echo`: the smallest complete sharedos runtime plugin, and the
//! template for plugin authors.
//!
//! A plugin is one type implementing `RuntimePlugin` (a manifest and a
//! `run` per turn) and a `main` that hands it to `serve`. Everything the
//! plugin can reach comes through the `RuntimeHost` it is given: its
//! limits, tool calls, events, annotations and the drain signal.
//!
//! What this one does with a turn: for each entry of
//! `request.message.payload.calls` (`[{"tool": "...", "arguments": {...}}]`)
//! it calls the tool, emits a `progress` event after each call, annotates
//! how many calls it made, and completes with the results.

use std::sync::Arc;

use serde_json::{Value, json};
use sharedos_plugin_sdk::protocol::{Identifier, RuntimeEvent, Timestamp};
use sharedos_plugin_sdk::{
    RuntimeError, RuntimeHost, RuntimeManifest, RuntimePlugin, RuntimeTurnOutcome,
    RuntimeTurnRequest, Signal, ToolCall,
};

/// The runtime. It holds no state between turns: every turn runs in a
/// fresh process anyway.
pub struct Echo;

/// The manifest the host's registry entry must match exactly.
fn manifest() -> Result<RuntimeManifest, RuntimeError> {
    RuntimeManifest::new("sharedos-echo", env!("CARGO_PKG_VERSION"))
        .map_err(|e| RuntimeError::Failed(e.to_string()))
}

/// Turns a string from the request into an `Identifier`, or fails the
/// turn with a message the caller can act on.
fn ident(value: &str, what: &str) -> Result<Identifier, RuntimeError> {
    Identifier::new(value).map_err(|e| RuntimeError::Failed(format!("{what}: {e}")))
}

#[async_trait::async_trait]
impl RuntimePlugin for Echo {
    fn manifest(&self) -> RuntimeManifest {
        // `new` only fails on an invalid literal; both are valid.
        manifest().unwrap_or_else(|e| panic!("{e}"))
    }

    async fn run(
        &self,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
    ) -> Result<RuntimeTurnOutcome, RuntimeError> {
        let calls = request
            .message
            .payload
            .get("calls")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let total = calls.len();
        let mut results = Vec::with_capacity(total);
        for (i, entry) in calls.iter().enumerate() {
            // Stop taking new work once the host drains or aborts the turn.
            if abort.is_raised() || host.draining().is_raised() {
                break;
            }
            let tool = entry
                .get("tool")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let arguments = entry
                .get("arguments")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let call = ToolCall {
                id: ident(&format!("call-{i}"), "call id")?,
                tool: ident(tool, "calls[].tool")?,
                arguments,
                trace_id: request.context.trace_id.clone(),
                requested_at: Timestamp::now(),
            };
            // Refusals (`denied`) come back as results, not errors; an
            // `Err` means the host is closed or the call was malformed.
            let result = host
                .invoke_tool(call, Some(i as u64))
                .await
                .map_err(|e| RuntimeError::Failed(e.to_string()))?;
            results.push(
                serde_json::to_value(&result).map_err(|e| RuntimeError::Failed(e.to_string()))?,
            );
            let progress = RuntimeEvent {
                kind: ident("progress", "event type")?,
                data: json!({"done": i + 1, "total": total}),
            };
            host.emit(progress)
                .map_err(|e| RuntimeError::Failed(e.to_string()))?;
        }
        // Annotations land in the result's metadata on every ending.
        host.annotate("echo.calls", json!(results.len()))
            .map_err(|e| RuntimeError::Failed(e.to_string()))?;
        Ok(RuntimeTurnOutcome::complete(json!({ "results": results })))
    }
}
