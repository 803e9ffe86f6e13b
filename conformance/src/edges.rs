//! The edges of the wire through the real envelope (`envelope.rs`):
//! `large_messages`, the real peer with a 1 MiB line limit, a `turn/run`
//! and a tool result each near it (an argument the echo tool echoes back),
//! the plugin's own lines held to it by the host's reader; and
//! `stderr_noise`, a turn in which the plugin prints, read by the real
//! peer, which ends the turn over a line on stdout that is not JSON-RPC.

use std::time::Duration;

use serde_json::json;
use sharedos_protocol::{EventKind, ExecutionStatus};

use super::checks::{Check, check};
use super::envelope::{ECHO_TOOL, Envelope, Plan};
use super::real::{failure_text, reason, stderr_tail};

/// The line limit the peer is given for this check.
const LIMIT: usize = 1 << 20;
/// What the lines keep free of the blob for their envelopes.
const ROOM: usize = 16 * 1024;

const FIX: &str = "keep every line within maxMessageBytes from initialize; read lines of any size up to it; answer -32057 when an answer would not fit";

pub(super) fn large(envelope: &Envelope, timeout: Duration) -> Check {
    let c = check("large_messages", "2, 6", FIX);
    let blob = "x".repeat(LIMIT - ROOM);
    let payload = json!({"calls": [{"tool": ECHO_TOOL, "arguments": {"blob": blob}}]});
    let plan = Plan {
        payload,
        catalogue: &[ECHO_TOOL],
        timeout,
        read_back: None,
        drain_grace: None,
        max_message_bytes: Some(LIMIT),
        abort_grace: None,
    };
    let result = match envelope.run(plan) {
        Ok(r) => r.result,
        Err(e) => return c.fail(e),
    };
    let calls = result
        .events
        .iter()
        .filter(|e| e.kind == EventKind::ToolCompleted)
        .count();
    match result.status {
        ExecutionStatus::Succeeded if calls == 0 => c.na("made no tool call for the echo payload"),
        ExecutionStatus::Succeeded => c.pass(format!(
            "the real peer with a {LIMIT} byte line limit: a turn/run carrying {} bytes of argument, the echo tool's result carrying them back, and every line the plugin wrote within the limit",
            blob.len()
        )),
        _ => {
            let mut c = c.fail(failure_text(&result));
            c.fix = reason(&result).map_or(FIX, |(_, _, fix)| fix);
            c.stderr = stderr_tail(&result);
            c
        }
    }
}

pub(super) fn noise(envelope: &Envelope, timeout: Duration) -> Check {
    let fix = "write logs and prints to stderr only; redirect print/console.log to stderr at startup (the SDKs do)";
    let c = check("stderr_noise", "1", fix);
    let payload = json!({"noise": true, "calls": [{"tool": ECHO_TOOL, "arguments": {}}]});
    let plan = Plan {
        payload,
        catalogue: &[ECHO_TOOL],
        timeout,
        read_back: None,
        drain_grace: None,
        max_message_bytes: None,
        abort_grace: None,
    };
    let result = match envelope.run(plan) {
        Ok(r) => r.result,
        Err(e) => return c.fail(e),
    };
    if result.status == ExecutionStatus::Succeeded {
        return c.pass("asked to print, the plugin kept stdout clean: the real peer read every line as JSON-RPC and the turn succeeded");
    }
    let mut c = c.fail(failure_text(&result));
    c.fix = reason(&result).map_or(fix, |(_, _, f)| f);
    c.stderr = stderr_tail(&result);
    c
}
