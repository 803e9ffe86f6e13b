//! Checks at the edges: lines near the limit, noise on stderr.

use super::checks::{Battery, Check, DEFAULT_MAX, MIB, check, kind, outcome_of, outcome_or_fault};
use super::session::Session;
use super::turn;
use serde_json::{Value, json};

impl Battery<'_> {
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
