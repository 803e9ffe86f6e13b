//! Why a process turn ended without an outcome, in the host's fixed
//! vocabulary: a reason token (a stream violation's, or the handshake's or
//! the launch's), whether the same turn would fail the same way again, and
//! how the plugin process ended with its last stderr lines. The executor
//! writes it into the result (`error.details.reason`, `retryable`,
//! `metadata.runtime.process`).

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use serde_json::{Value, json};

use super::driver::HandshakeError;

/// Stream violations that a plugin commits whatever the moment: a retry
/// repeats them. `plugin_exited`, `write_stall` and `io` may pass.
const DETERMINISTIC: &[&str] = &[
    "frame_too_large",
    "invalid_utf8",
    "invalid_json",
    "invalid_envelope",
    "batch_not_supported",
    "duplicate_inflight_id",
    "rate_limit_exceeded",
    "violation_budget_exceeded",
    "stdout_before_handshake",
    "handshake_rejected",
    "manifest_mismatch",
    "launch_refused",
];

const STREAM_REASONS: &[&str] = &[
    "frame_too_large",
    "invalid_utf8",
    "invalid_json",
    "invalid_envelope",
    "batch_not_supported",
    "duplicate_inflight_id",
    "rate_limit_exceeded",
    "write_stall",
    "violation_budget_exceeded",
    "stdout_before_handshake",
    "plugin_exited",
    "io",
];

/// Whether a reason token names a failure a retry repeats.
pub fn is_deterministic(reason: &str) -> bool {
    DETERMINISTIC.contains(&reason)
}

/// The reason of a violation rendered by `Violation`'s `Display`
/// (`"<reason>: <detail>"`), or `plugin_exited` for a connection that
/// stopped without one.
pub(crate) fn stream_reason(text: &str) -> &'static str {
    let head = text.split(':').next().unwrap_or_default();
    STREAM_REASONS
        .iter()
        .copied()
        .find(|r| *r == head)
        .unwrap_or("plugin_exited")
}

pub(crate) fn handshake_reason(e: &HandshakeError) -> &'static str {
    match e {
        HandshakeError::Timeout(_) => "handshake_timeout",
        HandshakeError::StdoutBeforeHandshake { .. } => "stdout_before_handshake",
        HandshakeError::Violation(v) => stream_reason(v.reason.as_str()),
        HandshakeError::Rejected { .. }
        | HandshakeError::InvalidResult(_)
        | HandshakeError::UnsupportedVersion { .. } => "handshake_rejected",
        HandshakeError::ManifestMismatch { .. } => "manifest_mismatch",
    }
}

/// `metadata.runtime.process`: how the launched process ended (`None`:
/// still running when the turn ended, then killed by the host) and its
/// last stderr lines.
pub(crate) fn process_json(status: Option<ExitStatus>, tail: Vec<String>) -> Value {
    let exit = match status {
        Some(s) => match (s.code(), s.signal()) {
            (Some(code), _) => json!({"code": code}),
            (None, Some(sig)) => json!({"signal": sig, "name": signal_name(sig)}),
            _ => json!("unknown"),
        },
        None => json!("running (killed by the host at the end of the turn)"),
    };
    json!({"exit": exit, "stderrTail": tail})
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGILL => "SIGILL",
        libc::SIGINT => "SIGINT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGSYS => "SIGSYS",
        libc::SIGTERM => "SIGTERM",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_violations_are_told_from_transient_ones() {
        assert_eq!(
            stream_reason("invalid_json: not JSON (sample: x)"),
            "invalid_json"
        );
        assert!(is_deterministic(stream_reason("invalid_json: x")));
        assert!(is_deterministic("stdout_before_handshake"));
        assert!(!is_deterministic(stream_reason("plugin_exited: EOF")));
        assert!(!is_deterministic(stream_reason("write_stall: 10 s")));
        assert!(!is_deterministic("handshake_timeout"));
        assert_eq!(
            stream_reason("the plugin connection stopped"),
            "plugin_exited"
        );
    }

    #[test]
    fn the_exit_status_is_a_code_or_a_signal() {
        let code = ExitStatus::from_raw(3 << 8);
        assert_eq!(process_json(Some(code), vec![])["exit"], json!({"code": 3}));
        let sig = ExitStatus::from_raw(libc::SIGABRT);
        assert_eq!(
            process_json(Some(sig), vec!["boom".into()]),
            json!({"exit": {"signal": 6, "name": "SIGABRT"}, "stderrTail": ["boom"]})
        );
    }
}
