//! `stderr_noise`: logs and prints on stderr, stdout clean.

use super::checks::{Battery, Check, DEFAULT_MAX, check, kind, outcome_or_fault};
use super::session::Session;
use super::turn;
use serde_json::{Value, json};

impl Battery<'_> {
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
