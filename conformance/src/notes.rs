//! `tool_call_round_trip` and `emit_annotate` through the real envelope
//! (`envelope.rs`), one real turn each with the catalogue
//! `[conformance.echo]` and the echo payload. The round trip is judged
//! from the result: the real echo tool was called, and its answers
//! (`{"callId", "arguments"}`, a shape nothing else in the turn has) came
//! back in the outcome. The notes are judged from what the executor
//! recorded (the `runtime.event` events of the result, its annotations)
//! and from what the host dropped and counted
//! (`metadata.runtime.protocolViolations`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Map, Value};
use sharedos_protocol::{EventKind, ExecutionResult, ExecutionStatus};

use super::checks::{Check, check};
use super::envelope::{ECHO_TOOL, Envelope, Plan, Ran};
use super::real::{failure_text, reason, stderr_tail};
use super::turn;

const ROUND_TRIP_FIX: &str = "send host/invokeTool with a strict ToolCall (call.traceId = request.context.traceId), use the ToolResult the host answers, and answer turn/run with a valid outcome";

const NOTES_FIX: &str = "send host/emit {turnId, event: {type, data}} and host/annotate {turnId, key, value} with the turn's turnId and a key other than \"\", runtime, __proto__; check each locally before sending (the host drops an invalid one without an answer)";

/// The calls of the echo payload.
const CALLS: usize = 2;

/// The echo payload's turn, with the echo tool as the catalogue.
fn echo_turn(envelope: &Envelope, timeout: Duration) -> Result<Ran, String> {
    envelope.run(Plan {
        payload: turn::calls(CALLS, false),
        catalogue: &[ECHO_TOOL],
        timeout,
        read_back: None,
        drain_grace: None,
        max_message_bytes: None,
        abort_grace: None,
    })
}

/// A failed turn: its cause, the fix the host's reason names, the stderr.
fn failed(c: Check, result: &ExecutionResult, fix: &'static str) -> Check {
    let mut c = c.fail(failure_text(result));
    c.fix = reason(result).map_or(fix, |(_, _, f)| f);
    c.stderr = stderr_tail(result);
    c
}

pub(super) fn round_trip(envelope: &Envelope, timeout: Duration) -> Check {
    let c = check("tool_call_round_trip", "4.2, 4.3", ROUND_TRIP_FIX);
    let ran = match echo_turn(envelope, timeout) {
        Ok(r) => r,
        Err(e) => return c.fail(e),
    };
    let result = &ran.result;
    if result.status != ExecutionStatus::Succeeded {
        return failed(c, result, ROUND_TRIP_FIX);
    }
    let called = ran.echo.calls.load(Ordering::SeqCst);
    if called == 0 {
        return c.na("made no tool call for the echo payload {\"calls\": [...]}");
    }
    let answered = result.output.as_ref().map_or(0, echo_answers);
    if answered == 0 {
        return c.fail(format!(
            "the real conformance.echo tool answered {called} call(s), and the outcome carries none of its answers (no {{\"callId\", \"arguments\"}} in the output)"
        ));
    }
    c.pass(format!(
        "{called} call(s) answered by the real conformance.echo tool, {answered} of its answers back in a complete outcome"
    ))
}

pub(super) fn notes(envelope: &Envelope, timeout: Duration) -> Check {
    let c = check("emit_annotate", "4.4, 5", NOTES_FIX);
    let ran = match echo_turn(envelope, timeout) {
        Ok(r) => r,
        Err(e) => return c.fail(e),
    };
    let result = &ran.result;
    if result.status != ExecutionStatus::Succeeded {
        return failed(c, result, NOTES_FIX);
    }
    let dropped = &result.metadata["runtime"]["protocolViolations"];
    if let Some(dropped) = dropped.as_object().filter(|d| !d.is_empty()) {
        let mut c = c.fail(format!(
            "the real host dropped and counted {} message(s) of the plugin: {}",
            dropped.values().filter_map(Value::as_u64).sum::<u64>(),
            named(dropped)
        ));
        c.fix = NOTES_FIX;
        return c;
    }
    let events = result
        .events
        .iter()
        .filter(|e| e.kind == EventKind::RuntimeEvent)
        .count();
    let annotations = result.metadata.keys().filter(|k| *k != "runtime").count();
    if events == 0 && annotations == 0 {
        return c.na("sent no host/emit or host/annotate");
    }
    c.pass(format!(
        "{events} events and {annotations} annotations recorded by the real host, none dropped"
    ))
}

/// How many of the echo tool's answers (`{"callId", "arguments"}`, a
/// shape neither the payload nor a `ToolResult` has) `v` holds.
fn echo_answers(v: &Value) -> usize {
    match v {
        Value::Object(o)
            if o.len() == 2 && o.contains_key("callId") && o.contains_key("arguments") =>
        {
            1
        }
        Value::Object(o) => o.values().map(echo_answers).sum(),
        Value::Array(a) => a.iter().map(echo_answers).sum(),
        _ => 0,
    }
}

/// `name xN, ...` of what the host counted.
fn named(dropped: &Map<String, Value>) -> String {
    dropped
        .iter()
        .map(|(k, v)| format!("{k} x{}", v.as_u64().unwrap_or(0)))
        .collect::<Vec<_>>()
        .join(", ")
}
