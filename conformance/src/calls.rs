//! Checks of the plugin's tool calls through the real envelope
//! (`envelope.rs`): calls in flight at once, answered by the real tool out
//! of order; the real deadline's drain raised with a call in flight; and
//! every outcome kind, a call's (`succeeded`, `failed`, and
//! `denied` for a tool outside the catalogue, by the real kernel) and the
//! turn's (`complete`, `fail`, `escalate`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};
use sharedos_protocol::{ESCALATE_TOOL, EventKind, ExecutionResult, ExecutionStatus};

use super::checks::{Check, check};
use super::envelope::{ECHO_TOOL, Envelope, Plan, Ran};
use super::real::{failure_text, stderr_tail};

/// The calls of the concurrency turn; each waits at the real tool, the
/// first longest, so their answers arrive in the reverse order.
const CONCURRENT: u64 = 8;
/// How long the first call waits; each later one `STEP` less.
const STEP_MS: u64 = 150;
/// When the drain check's `turn/draining` comes, from the start of the
/// turn: time for the plugin to start and make its first call (which the
/// echo tool holds until the drain began).
const DRAIN_AFTER: Duration = Duration::from_secs(5);
/// The drain grace of that turn: time to answer `turn/run` once draining.
const DRAIN_GRACE: Duration = Duration::from_secs(20);
/// A tool outside every catalogue of the battery: the kernel denies it.
const UNLISTED: &str = "conformance.unlisted";

/// The codes of a `failed` result that the host gives, never a plugin's
/// `fail` outcome (PROTOCOL.md, the table of endings).
const HOST_CODES: [&str; 5] = [
    "runtime_failed",
    "invalid_runtime_outcome",
    "audit_unavailable",
    "tool_unavailable",
    "turn_cancelled",
];

/// The turn ended `failed` by the plugin's own `fail` outcome.
fn plugin_failed(result: &ExecutionResult) -> bool {
    result.status == ExecutionStatus::Failed
        && result
            .error
            .as_ref()
            .is_some_and(|e| !HOST_CODES.contains(&e.code.as_str()))
}

/// A check's failure from a turn the host ended otherwise than asked:
/// the host's own words, and the plugin's stderr tail.
fn failed_turn(c: Check, result: &ExecutionResult, asked: &str) -> Check {
    let mut c = c.fail(format!("{asked}: {}", failure_text(result)));
    c.stderr = stderr_tail(result);
    c
}

/// The `tool.completed` events of a turn: (tool, status, code).
fn completed(result: &ExecutionResult) -> Vec<(String, String, String)> {
    result
        .events
        .iter()
        .filter(|e| e.kind == EventKind::ToolCompleted)
        .map(|e| {
            let s = |k: &str| e.data[k].as_str().unwrap_or("").to_owned();
            (s("tool"), s("status"), s("code"))
        })
        .collect()
}

/// The results the plugin reported in its `complete` output (the echo
/// payload's `output.results`), if it reported them.
fn reported(result: &ExecutionResult) -> Option<&Vec<Value>> {
    result.output.as_ref()?.get("results")?.as_array()
}

pub(super) fn concurrent(envelope: &Envelope, timeout: Duration) -> Check {
    let c = check(
        "concurrent_calls_out_of_order",
        "4.3, 5",
        "match each tool result to its call by the JSON-RPC id, not by arrival order; keep reading stdin while calls are in flight",
    );
    let calls: Vec<Value> = (0..CONCURRENT)
        .map(|i| {
            json!({"tool": ECHO_TOOL, "arguments": {"n": i, "delayMs": (CONCURRENT - i) * STEP_MS}})
        })
        .collect();
    let payload = json!({"calls": calls, "parallel": true});
    let plan = Plan {
        payload,
        catalogue: &[ECHO_TOOL],
        timeout,
        read_back: None,
        drain_grace: None,
        max_message_bytes: None,
        abort_grace: None,
    };
    let Ran { result, echo, .. } = match envelope.run(plan) {
        Ok(r) => r,
        Err(e) => return c.fail(e),
    };
    if result.status != ExecutionStatus::Succeeded {
        return failed_turn(c, &result, "asked for parallel calls");
    }
    let done = completed(&result);
    if done.is_empty() {
        return c.na("made no tool call for the echo payload");
    }
    if let Some((tool, status, _)) = done.iter().find(|(_, s, _)| s != "succeeded") {
        return c.fail(format!("a call of {tool:?} was answered {status}"));
    }
    let crossed = reported(&result).map_or(0, |results| {
        results
            .iter()
            .filter(|r| r["output"]["callId"] != r["callId"])
            .count()
    });
    if crossed > 0 {
        return c.fail(format!(
            "{crossed} result(s) were attached to the wrong call"
        ));
    }
    let widest = echo.widest.load(Ordering::SeqCst);
    c.pass(if widest > 1 {
        format!(
            "{} calls, up to {widest} in flight at once at the real tool, answered in reverse order",
            done.len()
        )
    } else {
        format!(
            "{} calls, one at a time (allowed: PROTOCOL.md 4.3 permits, never requires, calls in flight at once)",
            done.len()
        )
    })
}

pub(super) fn outcome_kinds(envelope: &Envelope, timeout: Duration) -> Check {
    let c = check(
        "outcome_kinds",
        "4.2",
        "answer turn/run with exactly {type: complete, output[, metadata]}, {type: fail, error: {code, message}} or {type: escalate, reason}; no other keys; report each call's result as the host answered it",
    );
    let calls = json!([
        {"tool": ECHO_TOOL, "arguments": {"n": 0}},
        {"tool": ECHO_TOOL, "arguments": {"n": 1, "fail": true}},
        {"tool": UNLISTED, "arguments": {}}
    ]);
    let mut seen = Vec::new();
    let mut follows = true;
    for asked in ["complete", "fail", "escalate"] {
        let payload = json!({"calls": if asked == "complete" { calls.clone() } else { json!([]) },
                             "outcome": asked});
        let plan = Plan {
            payload,
            catalogue: &[ECHO_TOOL, ESCALATE_TOOL],
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
        let got = match result.status {
            ExecutionStatus::Succeeded => "complete",
            ExecutionStatus::Escalated => "escalate",
            _ if plugin_failed(&result) => "fail",
            _ => return failed_turn(c, &result, &format!("asked for {asked}")),
        };
        if asked == "complete"
            && let Err(why) = call_kinds(&result)
        {
            let mut c = c.fail(why);
            c.stderr = stderr_tail(&result);
            return c;
        }
        follows &= got == asked;
        seen.push(format!("asked {asked}, got {got}"));
    }
    if follows {
        c.pass(format!(
            "{}; the calls answered succeeded, failed and denied (a tool outside the catalogue) by the real host",
            seen.join("; ")
        ))
    } else {
        c.na(format!(
            "every outcome was valid, but the plugin does not follow payload.outcome: {}",
            seen.join("; ")
        ))
    }
}

/// The calls of the `complete` turn were answered succeeded, failed and
/// denied by the real host, and the plugin reported each as answered.
fn call_kinds(result: &ExecutionResult) -> Result<(), String> {
    let done = completed(result);
    let statuses: Vec<&str> = done.iter().map(|(_, s, _)| s.as_str()).collect();
    if statuses.is_empty() {
        return Ok(());
    }
    let Some(results) = reported(result) else {
        return Ok(());
    };
    let said: Vec<&str> = results
        .iter()
        .map(|r| r["status"].as_str().unwrap_or("?"))
        .collect();
    if said != statuses {
        return Err(format!(
            "the host answered the calls {statuses:?}, the plugin reported them as {said:?}"
        ));
    }
    Ok(())
}

pub(super) fn drain(envelope: &Envelope, _timeout: Duration) -> Check {
    let c = check(
        "drain",
        "4.5",
        "after turn/draining start no new tool call (check host.draining before each), let calls in flight finish, and answer turn/run",
    );
    let calls: Vec<Value> = (0..3)
        .map(|i| json!({"tool": ECHO_TOOL, "arguments": {"n": i, "untilDrained": i == 0}}))
        .collect();
    let plan = Plan {
        payload: json!({"calls": calls}),
        catalogue: &[ECHO_TOOL],
        timeout: DRAIN_AFTER + envelope.allowance + DRAIN_GRACE,
        read_back: None,
        drain_grace: Some(DRAIN_GRACE),
        max_message_bytes: None,
        abort_grace: None,
    };
    let result = match envelope.run(plan) {
        Ok(r) => r.result,
        Err(e) => return c.fail(e),
    };
    let done = completed(&result);
    let Some((_, first, _)) = done.first() else {
        return c
            .na("made no tool call for the echo payload, so no call was in flight at the drain");
    };
    if first != "succeeded" {
        return c.na(format!(
            "the first call came after the drain began ({} into the turn) and was answered {first}: the plugin started too slowly for this check",
            deadline_text(DRAIN_AFTER, envelope.allowance)
        ));
    }
    let late = done
        .iter()
        .filter(|(_, _, code)| code == "turn_draining")
        .count();
    if late > 0 {
        let mut c = c.fail(format!(
            "started {late} new tool call(s) after turn/draining; the real host denied each turn_draining"
        ));
        c.stderr = stderr_tail(&result);
        return c;
    }
    match result.status {
        ExecutionStatus::Cancelled => failed_turn(
            c,
            &result,
            &format!(
                "did not answer turn/run within the {} s drain grace",
                DRAIN_GRACE.as_secs()
            ),
        ),
        ExecutionStatus::Succeeded | ExecutionStatus::Escalated => c.pass(
            "the real deadline's turn/draining came with a call in flight: its result arrived, no new call was started, turn/run was answered within the grace",
        ),
        _ if plugin_failed(&result) => c.pass(
            "the real deadline's turn/draining came with a call in flight: no new call was started, a fail outcome within the grace",
        ),
        _ => failed_turn(c, &result, "drained"),
    }
}

/// `base` plus the launch allowance, as a check's detail says it.
pub(super) fn deadline_text(base: Duration, allowance: Duration) -> String {
    if allowance.is_zero() {
        format!("{} s", base.as_secs())
    } else {
        format!(
            "{} s + {} ms for the launch (twice one measured before the check)",
            base.as_secs(),
            allowance.as_millis()
        )
    }
}
