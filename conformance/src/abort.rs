//! `abort` through the real envelope: a turn whose deadline passes with a
//! tool call in flight (the `conformance.echo` tool holds it), so the real
//! host sends `turn/abort` and ends the turn. The seat gives the plugin
//! [`ABORT_GRACE`] to exit by itself before its tree is killed
//! (`ProcessRuntimeConfig::abort_grace`); the result's
//! `metadata.runtime.process.exit` then says which it was: the plugin's own
//! exit, or the host's SIGKILL after the grace. No clock judges the plugin:
//! the grace is generous, and the verdict is the kind of ending.

use std::time::Duration;

use serde_json::{Value, json};
use sharedos_protocol::{ExecutionResult, ExecutionStatus};

use super::checks::{Check, check};
use super::envelope::{ECHO_TOOL, Envelope, Plan};
use super::real::stderr_tail;

/// The turn's deadline: the echo tool holds the first call past it.
const ABORT_AT: Duration = Duration::from_secs(3);
/// How long the echo tool holds the call (past the deadline).
const HOLD_MS: u64 = 5_000;
/// How long the plugin may take to exit by itself after `turn/abort`.
const ABORT_GRACE: Duration = Duration::from_secs(5);

pub(super) fn abort(envelope: &Envelope, _timeout: Duration) -> Check {
    let c = check(
        "abort",
        "1, 4.5",
        "on turn/abort stop at once; exit when stdin reaches end-of-file, and start no process that outlives you",
    );
    let hold = HOLD_MS + u64::try_from(envelope.allowance.as_millis()).unwrap_or(0);
    let plan = Plan {
        payload: json!({"calls": [{"tool": ECHO_TOOL, "arguments": {"n": 0, "delayMs": hold}}]}),
        catalogue: &[ECHO_TOOL],
        timeout: ABORT_AT + envelope.allowance,
        read_back: None,
        drain_grace: None,
        max_message_bytes: None,
        abort_grace: Some(ABORT_GRACE),
    };
    let ran = match envelope.run(plan) {
        Ok(r) => r,
        Err(e) => return c.fail(e),
    };
    if ran.result.status != ExecutionStatus::Cancelled {
        // The turn ended by itself before its deadline (a plugin that does
        // not follow the echo payload answers at once): no `turn/abort`
        // was sent, so the situation was not produced.
        return c.na(format!(
            "the turn ended {:?} before its {} deadline, so no turn/abort was sent (the plugin does not follow the echo payload {{\"calls\": [...]}})",
            ran.result.status,
            deadline(envelope)
        ));
    }
    let during_call = ran.echo.calls.load(std::sync::atomic::Ordering::SeqCst) > 0;
    let when = if during_call {
        "a tool call in flight"
    } else {
        "before its first tool call"
    };
    match ended_how(&ran.result) {
        Ending::ByItself(exit) => c.pass(format!(
            "the real deadline's turn/abort came with {when}: the plugin exited by itself ({exit}) within the {} s grace",
            ABORT_GRACE.as_secs()
        )),
        Ending::Killed => {
            let mut c = c.fail(format!(
                "still running {} s after the real deadline's turn/abort ({when}) and the end of its stdin: the host killed it (SIGKILL)",
                ABORT_GRACE.as_secs()
            ));
            c.stderr = stderr_tail(&ran.result);
            c
        }
        // No call was made and no end of the process is known: the
        // deadline passed while the plugin was still being launched.
        Ending::Unknown(what) if !during_call => c.na(format!(
            "the turn's {} deadline passed before the plugin made its first call, and no end of its process is known ({what}): the launch took about as long as the deadline",
            deadline(envelope)
        )),
        Ending::Unknown(what) => {
            let mut c = c.fail(format!(
                "the turn did not end with a known process exit after turn/abort: {what}"
            ));
            c.stderr = stderr_tail(&ran.result);
            c
        }
    }
}

enum Ending {
    ByItself(String),
    Killed,
    Unknown(String),
}

/// How the plugin's process ended, from the result's account of it.
fn ended_how(result: &ExecutionResult) -> Ending {
    let exit = result
        .metadata
        .get("runtime")
        .and_then(|r| r.get("process"))
        .and_then(|p| p.get("exit"))
        .cloned()
        .unwrap_or(Value::Null);
    match (exit.get("code"), exit.get("signal")) {
        (_, Some(sig)) if sig.as_i64() == Some(SIGKILL) => Ending::Killed,
        (_, Some(_)) | (Some(_), None) => Ending::ByItself(exit.to_string()),
        (None, None) => Ending::Unknown(format!("status {:?}, exit {exit}", result.status)),
    }
}

/// The turn's deadline as the check set it.
fn deadline(envelope: &Envelope) -> String {
    super::calls::deadline_text(ABORT_AT, envelope.allowance)
}

/// SIGKILL's number (9 on every Linux architecture).
const SIGKILL: i64 = 9;
