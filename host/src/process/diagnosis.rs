//! Why a process turn ended without an outcome, in the host's fixed
//! vocabulary: a reason token (a stream violation's, or the handshake's or
//! the launch's), whether the same turn would fail the same way again, and
//! how the plugin process ended with its last stderr lines. The executor
//! writes it into the result (`error.details.reason`, `retryable`,
//! `metadata.runtime.process`).

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use serde_json::{Value, json};
use sharedos_sandbox::cgroup::LimitsHit;

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
/// still running when the turn ended, then killed by the host), its last
/// stderr lines, and the limits the kernel enforced on its tree, if any
/// was hit. `sandboxed`: the status is the sandbox helper's, which exits
/// with the plugin's code, or with 128 + N when the plugin was killed by
/// signal N (the shell's convention): such a code also names the signal
/// it stands for.
pub(crate) fn process_json(
    status: Option<ExitStatus>,
    tail: Vec<String>,
    sandboxed: bool,
    limits: Option<LimitsHit>,
) -> Value {
    let mut process = json!({"exit": exit_json(status, sandboxed), "stderrTail": tail});
    if let Some(hit) = limits {
        process["limitsHit"] = limits_json(&hit);
    }
    process
}

/// `limitsHit`: each cgroup bound the tree reached, with its value and
/// what the kernel did there (docs/PROTOCOL.md, "How the process ended").
fn limits_json(hit: &LimitsHit) -> Value {
    let mut rows = Vec::new();
    if hit.pids_refused > 0 {
        rows.push(json!({
            "limit": "pids.max",
            "value": hit.pids_max,
            "refused": hit.pids_refused,
            "what": "forks and threads refused: the tree reached its process count",
        }));
    }
    if hit.memory_reached > 0 || hit.oom_kills > 0 {
        rows.push(json!({
            "limit": "memory.max",
            "value": hit.memory_max,
            "reached": hit.memory_reached,
            "oomKills": hit.oom_kills,
            "what": "the tree reached its memory bound; the OOM killer ended the processes counted",
        }));
    }
    Value::Array(rows)
}

/// The rlimit a signal stands for when the kernel sends it at that
/// limit: `SIGXCPU` at `RLIMIT_CPU`, `SIGXFSZ` at `RLIMIT_FSIZE`.
fn rlimit_of_signal(sig: i32) -> Option<&'static str> {
    match sig {
        libc::SIGXCPU => Some("RLIMIT_CPU"),
        libc::SIGXFSZ => Some("RLIMIT_FSIZE"),
        _ => None,
    }
}

/// The `exit` of [`process_json`].
pub(crate) fn exit_json(status: Option<ExitStatus>, sandboxed: bool) -> Value {
    match status {
        Some(s) => match (s.code(), s.signal()) {
            (Some(code), _) if sandboxed && (129..=128 + 64).contains(&code) => {
                let sig = code - 128;
                with_rlimit(
                    json!({"code": code, "signal": sig, "name": signal_name(sig)}),
                    sig,
                )
            }
            (Some(code), _) => json!({"code": code}),
            (None, Some(sig)) => with_rlimit(json!({"signal": sig, "name": signal_name(sig)}), sig),
            _ => json!("unknown"),
        },
        None => json!("running (killed by the host at the end of the turn)"),
    }
}

/// `exit` with the rlimit its signal stands for, if it does.
fn with_rlimit(mut exit: Value, sig: i32) -> Value {
    if let Some(limit) = rlimit_of_signal(sig) {
        exit["limit"] = json!(limit);
    }
    exit
}

/// The name of signal `sig` (`SIGSEGV`), `SIGRTMIN+n` for a real-time one.
pub(crate) fn signal_name(sig: i32) -> String {
    const NAMES: [(i32, &str); 31] = [
        (libc::SIGHUP, "SIGHUP"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGQUIT, "SIGQUIT"),
        (libc::SIGILL, "SIGILL"),
        (libc::SIGTRAP, "SIGTRAP"),
        (libc::SIGABRT, "SIGABRT"),
        (libc::SIGBUS, "SIGBUS"),
        (libc::SIGFPE, "SIGFPE"),
        (libc::SIGKILL, "SIGKILL"),
        (libc::SIGUSR1, "SIGUSR1"),
        (libc::SIGSEGV, "SIGSEGV"),
        (libc::SIGUSR2, "SIGUSR2"),
        (libc::SIGPIPE, "SIGPIPE"),
        (libc::SIGALRM, "SIGALRM"),
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGSTKFLT, "SIGSTKFLT"),
        (libc::SIGCHLD, "SIGCHLD"),
        (libc::SIGCONT, "SIGCONT"),
        (libc::SIGSTOP, "SIGSTOP"),
        (libc::SIGTSTP, "SIGTSTP"),
        (libc::SIGTTIN, "SIGTTIN"),
        (libc::SIGTTOU, "SIGTTOU"),
        (libc::SIGURG, "SIGURG"),
        (libc::SIGXCPU, "SIGXCPU"),
        (libc::SIGXFSZ, "SIGXFSZ"),
        (libc::SIGVTALRM, "SIGVTALRM"),
        (libc::SIGPROF, "SIGPROF"),
        (libc::SIGWINCH, "SIGWINCH"),
        (libc::SIGIO, "SIGIO"),
        (libc::SIGPWR, "SIGPWR"),
        (libc::SIGSYS, "SIGSYS"),
    ];
    match NAMES.iter().find(|(n, _)| *n == sig) {
        Some((_, name)) => (*name).to_owned(),
        None if sig >= libc::SIGRTMIN() => format!("SIGRTMIN+{}", sig - libc::SIGRTMIN()),
        None => format!("signal {sig}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_sent_at_an_rlimit_and_a_cgroup_bound_reached_are_named() {
        let xcpu = ExitStatus::from_raw((128 + libc::SIGXCPU) << 8);
        assert_eq!(
            exit_json(Some(xcpu), true),
            json!({"code": 128 + libc::SIGXCPU, "signal": libc::SIGXCPU, "name": "SIGXCPU", "limit": "RLIMIT_CPU"})
        );
        let xfsz = ExitStatus::from_raw(libc::SIGXFSZ);
        assert_eq!(exit_json(Some(xfsz), false)["limit"], json!("RLIMIT_FSIZE"));
        assert!(
            exit_json(Some(ExitStatus::from_raw(libc::SIGKILL)), false)
                .get("limit")
                .is_none()
        );
        let hit = LimitsHit {
            pids_max: Some(16),
            pids_refused: 3,
            memory_max: Some(1 << 20),
            memory_reached: 0,
            oom_kills: 1,
        };
        let p = process_json(None, vec![], true, Some(hit));
        assert_eq!(p["limitsHit"][0]["limit"], "pids.max");
        assert_eq!(p["limitsHit"][0]["value"], 16);
        assert_eq!(p["limitsHit"][0]["refused"], 3);
        assert_eq!(p["limitsHit"][1]["limit"], "memory.max");
        assert_eq!(p["limitsHit"][1]["oomKills"], 1);
        assert!(
            process_json(None, vec![], true, None)
                .get("limitsHit")
                .is_none()
        );
    }

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
        assert_eq!(
            process_json(Some(code), vec![], false, None)["exit"],
            json!({"code": 3})
        );
        let sig = ExitStatus::from_raw(libc::SIGABRT);
        assert_eq!(
            process_json(Some(sig), vec!["boom".into()], false, None),
            json!({"exit": {"signal": 6, "name": "SIGABRT"}, "stderrTail": ["boom"]})
        );
        // The sandbox's 128 + N names the signal too, keeping the code.
        let killed = ExitStatus::from_raw((128 + 9) << 8);
        assert_eq!(
            exit_json(Some(killed), true),
            json!({"code": 137, "signal": 9, "name": "SIGKILL"})
        );
        assert_eq!(exit_json(Some(killed), false), json!({"code": 137}));
        assert_eq!(
            exit_json(Some(ExitStatus::from_raw(128 << 8)), true),
            json!({"code": 128})
        );
        assert_eq!(signal_name(libc::SIGXCPU), "SIGXCPU");
        assert_eq!(signal_name(libc::SIGRTMIN() + 2), "SIGRTMIN+2");
    }
}
