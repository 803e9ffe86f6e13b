//! Checks under load and at the edges: 64 concurrent calls answered out of
//! order, every outcome kind, lines near the limit, noise on stderr.

use serde_json::{Value, json};
use sharedos_protocol::RuntimeTurnOutcome;

use super::checks::{Battery, Check, DEFAULT_MAX, MIB, check, kind, outcome_of, outcome_or_fault};
use super::session::Session;
use super::turn;

const CONCURRENT: usize = 64;

impl Battery<'_> {
    pub fn concurrent(&self) -> Check {
        let c = check(
            "concurrent_calls_out_of_order",
            "4.3, 5",
            "match each tool result to its call by the JSON-RPC id, not by arrival order; keep reading stdin while calls are in flight",
        );
        let mut held: Vec<Value> = Vec::new();
        let mut widest = 0usize;
        let mut on_call = |s: &mut Session, req: Option<&Value>| {
            if let Some(r) = req {
                held.push(r.clone());
                widest = widest.max(held.len());
                if held.len() < CONCURRENT {
                    return;
                }
            }
            // Answer whatever is held, last asked first.
            while let Some(r) = held.pop() {
                let id = r["params"]["call"]["id"].clone();
                let _ = s.send(&turn::succeeded(&r, json!({"callId": id})));
            }
        };
        let (_s, t) = match self.turn(DEFAULT_MAX, turn::calls(CONCURRENT, true), &mut on_call) {
            Ok(x) => x,
            Err(e) => return c.fail(e),
        };
        let outcome = match outcome_or_fault(&t) {
            Ok(o) => o,
            Err(e) => return c.fail(e),
        };
        if t.calls.is_empty() {
            return c.na("made no tool call for the echo payload");
        }
        if let RuntimeTurnOutcome::Complete { output, .. } = &outcome
            && let Some(results) = output.get("results").and_then(Value::as_array)
        {
            let crossed = results
                .iter()
                .filter(|r| r["output"]["callId"] != r["callId"])
                .count();
            if crossed > 0 {
                return c.fail(format!(
                    "{crossed} result(s) were attached to the wrong call"
                ));
            }
        }
        c.pass(format!(
            "{} calls, up to {widest} in flight at once, answered in reverse order; a {} outcome",
            t.calls.len(),
            kind(&outcome)
        ))
    }

    pub fn outcome_kinds(&self) -> Check {
        let c = check(
            "outcome_kinds",
            "4.2",
            "answer turn/run with exactly {type: complete, output[, metadata]}, {type: fail, error: {code, message}} or {type: escalate, reason}; no other keys",
        );
        let mut seen = Vec::new();
        for asked in ["complete", "fail", "escalate"] {
            let mut answer = |s: &mut Session, req: Option<&Value>| {
                if let Some(r) = req {
                    let _ = s.send(&turn::succeeded(r, Value::Null));
                }
            };
            let ran = self.turn(
                DEFAULT_MAX,
                json!({"calls": [], "outcome": asked}),
                &mut answer,
            );
            let (_s, t) = match ran {
                Ok(x) => x,
                Err(e) => return c.fail(e),
            };
            match outcome_or_fault(&t) {
                Ok(o) => seen.push(format!("asked {asked}, got {}", kind(&o))),
                Err(e) => return c.fail(format!("asked for {asked}: {e}")),
            }
        }
        let all = seen.iter().all(|s| {
            let mut w = s.split(", got ");
            w.next().map(|a| a.trim_start_matches("asked ")) == w.next()
        });
        if all {
            c.pass(seen.join("; "))
        } else {
            c.na(format!(
                "every outcome was valid, but the plugin does not follow payload.outcome: {}",
                seen.join("; ")
            ))
        }
    }

    pub fn large(&self) -> Check {
        let c = check(
            "large_messages",
            "2, 6",
            "keep every line within maxMessageBytes from initialize; read lines of any size up to it; answer -32057 when an answer would not fit",
        );
        let limit = MIB;
        let blob = "x".repeat((limit - 16 * 1024) as usize);
        let payload = json!({"calls": [{"tool": "conformance.echo", "arguments": {"blob": blob}}]});
        let mut answer = |s: &mut Session, req: Option<&Value>| {
            if let Some(r) = req {
                let _ = s.send(&turn::succeeded(r, json!({"blob": blob})));
            }
        };
        let (_s, t) = match self.turn(limit, payload, &mut answer) {
            Ok(x) => x,
            Err(e) => return c.fail(e),
        };
        if let Some(p) = t.fault() {
            return c.fail(p);
        }
        if t.longest_line as u64 > limit {
            return c.fail(format!(
                "wrote a {} byte line; the limit was {limit}",
                t.longest_line
            ));
        }
        let Some(resp) = &t.outcome else {
            return c.fail("no outcome");
        };
        let too_large = resp["error"]["data"]["kind"] == json!("message_too_large");
        match outcome_of(resp) {
            _ if t.calls.is_empty() => c.na("made no tool call for the echo payload"),
            Ok(o) => c.pass(format!(
                "a {} byte turn/run, a {} byte tool result; longest line written {} bytes; a {} outcome",
                blob.len(), blob.len(), t.longest_line, kind(&o)
            )),
            Err(_) if too_large => c.pass("the outcome would not fit and was answered -32057 message_too_large"),
            Err(e) => c.fail(e),
        }
    }

    pub fn noise(&self) -> Check {
        let c = check(
            "stderr_noise",
            "1",
            "write logs and prints to stderr only; redirect print/console.log to stderr at startup (the SDKs do)",
        );
        let mut answer = |s: &mut Session, req: Option<&Value>| {
            if let Some(r) = req {
                let _ = s.send(&turn::succeeded(r, Value::Null));
            }
        };
        let payload =
            json!({"noise": true, "calls": [{"tool": "conformance.echo", "arguments": {}}]});
        let (s, t) = match self.turn(DEFAULT_MAX, payload, &mut answer) {
            Ok(x) => x,
            Err(e) => return c.fail(e),
        };
        let mut s = s;
        // The stderr reader runs on its own: let the plugin finish first.
        s.close_stdin();
        let _ = s.wait_exit(std::time::Duration::from_secs(2));
        let bytes = s.stderr.lock().map(|l| l.bytes).unwrap_or(0);
        match outcome_or_fault(&t) {
            Ok(o) => c.pass(format!(
                "{bytes} bytes on stderr, stdout clean, a {} outcome",
                kind(&o)
            )),
            Err(e) => c.fail(e),
        }
    }
}
