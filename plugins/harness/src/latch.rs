//! The escalation latch (envelope.md E.3): between the CLI's tool calls and
//! the host. The first `sharedos.escalate` call on a turn that offers it
//! sets the latch and is answered by the harness itself (nothing reaches
//! the kernel); every call after it is refused `escalation_pending` without
//! reaching the envelope, and counted.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

use sharedos_protocol::ESCALATE_TOOL;

/// The reason used when the ask carries none (missing, empty, or not a
/// string).
pub const FALLBACK_REASON: &str = "The agent asked for human review without giving a reason.";

/// The most characters of a reason (A.7).
const MAX_REASON_CHARS: usize = 512;

/// What the latch decides for one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Not the ask, latch open: the call goes to the envelope.
    Pass,
    /// This call set the latch, with this reason.
    Asked(String),
    /// The latch was already set: refused `escalation_pending`.
    Pending,
}

/// One turn's latch.
#[derive(Debug)]
pub struct Latch {
    offered: bool,
    reason: Mutex<Option<String>>,
    after: AtomicU64,
}

impl Latch {
    /// `offered`: the turn's catalogue has `sharedos.escalate` and the spec
    /// offers it to the CLI.
    pub fn new(offered: bool) -> Self {
        Self {
            offered,
            reason: Mutex::new(None),
            after: AtomicU64::new(0),
        }
    }

    pub fn offered(&self) -> bool {
        self.offered
    }

    /// Decides a call to `tool` with `arguments`. Not offered, an ask is an
    /// ordinary call (the envelope refuses it).
    pub fn gate(&self, tool: &str, arguments: &Value) -> Gate {
        let mut reason = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if reason.is_some() {
            self.after.fetch_add(1, Ordering::SeqCst);
            return Gate::Pending;
        }
        if self.offered && tool == ESCALATE_TOOL {
            let r = reason_of(arguments);
            *reason = Some(r.clone());
            return Gate::Asked(r);
        }
        Gate::Pass
    }

    /// The reason, once the latch is set.
    pub fn asked(&self) -> Option<String> {
        self.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Calls refused because the latch was set.
    pub fn calls_after(&self) -> u64 {
        self.after.load(Ordering::SeqCst)
    }
}

/// The ask's reason: the `reason` argument trimmed and cut to 512
/// characters (whole characters, so never half a surrogate pair in UTF-16
/// terms either), or the fallback.
pub fn reason_of(arguments: &Value) -> String {
    let Some(text) = arguments.get("reason").and_then(Value::as_str) else {
        return FALLBACK_REASON.into();
    };
    let mut out = String::new();
    let mut units = 0;
    for c in text.trim().chars() {
        // Count in UTF-16 units so the cut fits a 512-"character" limit
        // however characters are counted.
        units += c.len_utf16();
        if units > MAX_REASON_CHARS {
            break;
        }
        out.push(c);
    }
    let out = out.trim().to_owned();
    if out.is_empty() {
        FALLBACK_REASON.into()
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_first_ask_sets_the_latch_and_later_calls_are_pending() {
        let l = Latch::new(true);
        assert_eq!(l.gate("files.read", &json!({})), Gate::Pass);
        assert_eq!(
            l.gate(ESCALATE_TOOL, &json!({"reason": "  needs a human  "})),
            Gate::Asked("needs a human".into())
        );
        assert_eq!(l.gate("files.read", &json!({})), Gate::Pending);
        assert_eq!(
            l.gate(ESCALATE_TOOL, &json!({"reason": "again"})),
            Gate::Pending
        );
        assert_eq!(l.asked().as_deref(), Some("needs a human"));
        assert_eq!(l.calls_after(), 2);
    }

    #[test]
    fn not_offered_the_ask_passes_to_the_envelope() {
        let l = Latch::new(false);
        assert_eq!(l.gate(ESCALATE_TOOL, &json!({"reason": "x"})), Gate::Pass);
        assert_eq!(l.asked(), None);
    }

    #[test]
    fn reasons_are_cut_and_fall_back() {
        assert_eq!(reason_of(&json!({"reason": 42})), FALLBACK_REASON);
        assert_eq!(reason_of(&json!({"reason": {"a": 1}})), FALLBACK_REASON);
        assert_eq!(reason_of(&json!({"reason": "   "})), FALLBACK_REASON);
        assert_eq!(reason_of(&json!({})), FALLBACK_REASON);
        let long = "😀".repeat(300);
        let cut = reason_of(&json!({ "reason": long }));
        assert_eq!(cut.chars().count(), 256);
        assert_eq!(reason_of(&json!({"reason": "a".repeat(600)})).len(), 512);
    }
}
