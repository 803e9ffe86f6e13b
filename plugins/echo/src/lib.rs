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
//! it calls the tool (all at once when `payload.parallel` is true), emits a
//! `progress` event after each call, annotates how many calls it made, and
//! completes with the results. `payload.outcome` set to `fail` or
//! `escalate` ends the turn that way instead; `payload.noise` prints to
//! stdout and stderr (both land in the host's log). The Python and
//! TypeScript echo examples read the same payload, and `sharedos
//! conformance` drives all three with it.

#![forbid(unsafe_code)]

use std::sync::Arc;

use serde_json::{Value, json};
use sharedos_plugin_sdk::protocol::{Identifier, ProtocolError, Reason, RuntimeEvent, Timestamp};
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

/// One entry of `payload.calls`, called as `call-{i}` at step `i`.
async fn call_one(
    i: usize,
    entry: &Value,
    total: usize,
    done: &std::sync::atomic::AtomicUsize,
    trace_id: &Identifier,
    host: &Arc<dyn RuntimeHost>,
    abort: &Signal,
) -> Result<Option<Value>, RuntimeError> {
    // Stop taking new work once the host drains or aborts the turn.
    if abort.is_raised() || host.draining().is_raised() {
        return Ok(None);
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
        trace_id: trace_id.clone(),
        requested_at: Timestamp::now(),
    };
    // Refusals (`denied`) come back as results, not errors; an `Err` means
    // the host is closed or the call was malformed.
    let result = host
        .invoke_tool(call, Some(i as u64))
        .await
        .map_err(|e| RuntimeError::Failed(e.to_string()))?;
    let done = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    let progress = RuntimeEvent {
        kind: ident("progress", "event type")?,
        data: json!({"done": done, "total": total}),
    };
    host.emit(progress)
        .map_err(|e| RuntimeError::Failed(e.to_string()))?;
    serde_json::to_value(&result)
        .map(Some)
        .map_err(|e| RuntimeError::Failed(e.to_string()))
}

/// The outcome `payload.outcome` asks for.
fn requested_outcome(payload: &Value, results: Vec<Value>) -> RuntimeTurnOutcome {
    match payload.get("outcome").and_then(Value::as_str) {
        Some("fail") => RuntimeTurnOutcome::Fail {
            error: ProtocolError::new(
                "echo_requested_failure",
                "The request asked to fail.",
                Some(false),
            ),
            metadata: None,
        },
        Some("escalate") => match Reason::new("The request asked for a human.") {
            Ok(reason) => RuntimeTurnOutcome::Escalate {
                reason,
                metadata: None,
            },
            Err(e) => RuntimeTurnOutcome::Fail {
                error: ProtocolError::new("echo_invalid_reason", &e.to_string(), Some(false)),
                metadata: None,
            },
        },
        _ => RuntimeTurnOutcome::complete(json!({ "results": results })),
    }
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
        let payload = &request.message.payload;
        if payload.get("noise").and_then(Value::as_bool) == Some(true) {
            // `serve` pointed fd 1 at stderr: this lands in the host's log.
            println!("a stray println: the SDK routes it to stderr");
            eprintln!("{}", "noise on stderr ".repeat(64));
        }
        let calls = payload
            .get("calls")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let total = calls.len();
        let done = std::sync::atomic::AtomicUsize::new(0);
        let trace = &request.context.trace_id;
        let mut results = Vec::with_capacity(total);
        if payload.get("parallel").and_then(Value::as_bool) == Some(true) {
            let all = calls
                .iter()
                .enumerate()
                .map(|(i, c)| call_one(i, c, total, &done, trace, &host, &abort));
            for r in futures_util::future::join_all(all).await {
                results.extend(r?);
            }
        } else {
            for (i, c) in calls.iter().enumerate() {
                match call_one(i, c, total, &done, trace, &host, &abort).await? {
                    Some(r) => results.push(r),
                    None => break,
                }
            }
        }
        // Annotations land in the result's metadata on every ending.
        host.annotate("echo.calls", json!(results.len()))
            .map_err(|e| RuntimeError::Failed(e.to_string()))?;
        Ok(requested_outcome(payload, results))
    }
}
