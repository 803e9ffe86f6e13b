//! `real_turn`: one turn through the real envelope, the code path of
//! `sharedos run` (the executor, the process runtime with the battery's
//! launcher, the kernel and its file tools on a temporary files root). The
//! catalogue is the kernel's `files.write` and `files.read`; each tool
//! really answers, and every host rule (JSON-RPC ids, the line limit, the
//! budgets, the catalogue) is the host's own code, so a plugin that passes
//! this check passes the same turn under `sharedos run`.

use std::time::Duration;

use serde_json::{Value, json};
use sharedos_protocol::text::escape_text;
use sharedos_protocol::{EventKind, ExecutionResult, ExecutionStatus};

use super::envelope::{Envelope, Plan};

/// What the turn writes and reads back.
pub(super) const PROBE_PATH: &str = "probe/conformance.txt";
const PROBE_TEXT: &str = "written by sharedos conformance through the kernel's files.write";

/// The catalogue of the real turn (the kernel's own file tools).
pub const CATALOGUE: [&str; 2] = ["files.write", "files.read"];

/// How the real turn went: `Ok(detail)` or `Err(cause)`, and the plugin's
/// stderr tail (escaped whole lines) as the host kept it.
pub(super) struct RealTurn {
    pub verdict: Result<String, String>,
    /// What to fix for the cause found, when it is one the host names.
    pub fix: Option<&'static str>,
    pub stderr: Vec<String>,
}

/// The host's violation reasons (`error.details.reason` of a turn the
/// runtime failed), each with what it means and what to fix.
const REASONS: [(&str, &str, &str); 9] = [
    (
        "invalid_envelope",
        "a line that is not a valid JSON-RPC 2.0 message (an id that is null, a float or a string over 64 bytes; a missing method)",
        "give every request an id that is a string of at most 64 bytes or an integer 0..2^53-1 (never null), and send only JSON-RPC 2.0 objects",
    ),
    (
        "frame_too_large",
        "a line longer than the host's line limit",
        "keep every line within limits.maxMessageBytes of initialize (put large data in a file tool, not one message)",
    ),
    (
        "invalid_json",
        "a line that is not JSON",
        "write only JSON-RPC lines on stdout; log to stderr",
    ),
    (
        "invalid_utf8",
        "a line that is not UTF-8",
        "write only UTF-8 JSON-RPC lines on stdout; log to stderr",
    ),
    (
        "batch_not_supported",
        "a JSON-RPC batch (an array)",
        "send one message per line, never an array",
    ),
    (
        "duplicate_inflight_id",
        "a request id reused while its request was still in flight",
        "give every request in flight its own id",
    ),
    (
        "rate_limit_exceeded",
        "more messages than the host's rate and burst budgets allow",
        "stay within the notification budgets of PROTOCOL.md section 5 (10,000 burst, 2,000/s)",
    ),
    (
        "stdout_before_handshake",
        "output on stdout before the answer to initialize",
        "write nothing on stdout before the answer to initialize; log to stderr",
    ),
    (
        "plugin_exited",
        "the plugin exited before answering turn/run",
        "keep running until turn/run is answered and stdin ends; its stderr says why it stopped",
    ),
];

/// The payload of the real turn: the echo payload asking to write the
/// probe, then read it.
fn payload() -> Value {
    json!({"calls": [
        {"tool": "files.write", "arguments": {"path": PROBE_PATH, "content": PROBE_TEXT}},
        {"tool": "files.read", "arguments": {"path": PROBE_PATH}}
    ]})
}

/// Runs the real turn through `envelope`.
pub(super) fn real_turn(envelope: &Envelope, timeout: Duration) -> RealTurn {
    let plan = Plan {
        payload: payload(),
        catalogue: &CATALOGUE,
        timeout,
        read_back: Some(PROBE_PATH),
        drain_grace: None,
        max_message_bytes: None,
        abort_grace: None,
    };
    match envelope.run(plan) {
        Ok(ran) => RealTurn {
            stderr: stderr_tail(&ran.result),
            fix: reason(&ran.result).map(|(_, _, fix)| fix),
            verdict: judge(&ran.result, ran.file.as_deref()),
        },
        Err(e) => RealTurn {
            verdict: Err(e),
            fix: None,
            stderr: Vec::new(),
        },
    }
}

/// The plugin's stderr tail as the host reported it.
pub(super) fn stderr_tail(result: &ExecutionResult) -> Vec<String> {
    let runtime = result.metadata.get("runtime").cloned().unwrap_or_default();
    runtime["process"]["stderrTail"]
        .as_array()
        .map(|lines| {
            lines
                .iter()
                .filter_map(Value::as_str)
                .map(escape_text)
                .collect()
        })
        .unwrap_or_default()
}

/// The verdict on the result: it succeeded, every call the plugin made was
/// answered `succeeded` by a real tool, and the file it wrote is there.
fn judge(result: &ExecutionResult, written: Option<&str>) -> Result<String, String> {
    if result.status != ExecutionStatus::Succeeded {
        return Err(failure_text(result));
    }
    let completed: Vec<&Value> = result
        .events
        .iter()
        .filter(|e| e.kind == EventKind::ToolCompleted)
        .map(|e| &*e.data)
        .collect();
    if let Some(bad) = completed.iter().find(|d| d["status"] != "succeeded") {
        let tool = bad["tool"].as_str().unwrap_or("");
        let code = bad["code"].as_str().unwrap_or("");
        let not_listed = !CATALOGUE.contains(&tool);
        return Err(format!(
            "called {:?}, which the host answered {} {code}{}",
            escape_text(tool),
            bad["status"].as_str().unwrap_or("?"),
            if not_listed {
                format!(
                    " (it is not in the turn's catalogue [{}])",
                    CATALOGUE.join(", ")
                )
            } else {
                String::new()
            }
        ));
    }
    match (completed.len(), written) {
        (0, _) => Ok(
            "a real turn succeeded without a tool call (the plugin does not follow the echo payload)"
                .into(),
        ),
        (n, Some(text)) if text == PROBE_TEXT => Ok(format!(
            "a real turn succeeded: {n} call(s) answered by the kernel's file tools, the probe file written and read back"
        )),
        (n, _) => Ok(format!(
            "a real turn succeeded with {n} call(s) answered by the kernel's file tools"
        )),
    }
}

/// The violation the host named in the result, from [`REASONS`].
pub(super) fn reason(
    result: &ExecutionResult,
) -> Option<(&'static str, &'static str, &'static str)> {
    let e = serde_json::to_value(result.error.as_ref()?).ok()?;
    let token = e["details"]["reason"].as_str()?;
    REASONS.iter().find(|(r, _, _)| *r == token).copied()
}

/// `the turn ended failed runtime_failed: <message> <details>`, escaped,
/// with what a named violation means.
pub(super) fn failure_text(result: &ExecutionResult) -> String {
    if let Some((token, meaning, _)) = reason(result) {
        return format!("the real host refused {meaning} and ended the turn failed ({token})");
    }
    let status = serde_json::to_value(result.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let Some(e) = &result.error else {
        return format!("the turn ended {status}");
    };
    let e = serde_json::to_value(e).unwrap_or_default();
    let details = e
        .get("details")
        .map(|d| format!(" {}", super::turn::short(d)))
        .unwrap_or_default();
    escape_text(&format!(
        "the turn ended {status} {}: {}{details}",
        e["code"].as_str().unwrap_or(""),
        e["message"].as_str().unwrap_or("")
    ))
}
