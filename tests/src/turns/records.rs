//! The audit trail's invariants, read strictly from the JSONL file, and
//! the host configuration the testplugin's turns run under.

use std::path::Path;

use serde_json::Value;
use sharedos_kernel::AuditRecord;

use super::{AGENT, MARKER_ENV, NAMESPACE, TRACE, workspace_bin};

/// Invariants of every trail: one `turn.ended` for the turn; every kernel
/// `tool.invoked` that got past the checks made before authorization has
/// its `authorization.checked` earlier in the trail; every record is this
/// turn's.
pub fn check_audit_invariants(audit: &[AuditRecord]) {
    let ended: Vec<_> = audit.iter().filter(|r| r.kind == "turn.ended").collect();
    assert_eq!(ended.len(), 1, "turn.ended records: {ended:?}");
    assert_eq!(ended[0].operation_id.as_deref(), Some("exec-1"));
    for r in audit {
        assert_eq!(r.trace_id, TRACE, "{r:?}");
        assert_eq!(r.namespace_id, NAMESPACE, "{r:?}");
    }
    let before_authorization = [
        "invalid_tool_arguments",
        "tool_unavailable",
        "trace_mismatch",
        "authority_unavailable",
        "audit_unavailable",
    ];
    for (i, r) in audit.iter().enumerate() {
        if r.kind != "tool.invoked"
            || r.source != sharedos_kernel::AuditSource::Kernel
            || r.reason
                .as_deref()
                .is_some_and(|c| before_authorization.contains(&c))
        {
            continue;
        }
        let decided = audit[..i]
            .iter()
            .any(|d| d.kind == "authorization.checked" && d.operation_id == r.operation_id);
        assert!(decided, "tool.invoked without an earlier decision: {r:?}");
    }
}

/// Every non-empty line of a JSONL file parses as a JSON object; returns
/// them. Panics naming the first line that does not (a torn record).
pub fn parse_jsonl_strict(path: &Path) -> Vec<Value> {
    let bytes = std::fs::read(path).expect("read audit file");
    assert!(
        bytes.is_empty() || bytes.ends_with(b"\n"),
        "the audit file does not end with a newline: a torn last record"
    );
    let text = String::from_utf8(bytes).expect("audit file is UTF-8");
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            let v: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("audit line {} does not parse: {e}: {l:?}", i + 1));
            let _: AuditRecord = serde_json::from_value(v.clone())
                .unwrap_or_else(|e| panic!("audit line {} is not a record: {e}", i + 1));
            v
        })
        .collect()
}

/// A host configuration (TOML) seating the testplugin for agent `alice`
/// with the grants of [`kernel_config`], the audit trail and files root in
/// the configuration's directory. `launcher` is `sandbox` or `direct`.
pub fn testplugin_host_toml(marker: &str, launcher: &str, timeout_ms: u64) -> String {
    format!(
        r#"[host]
defaultTimeoutMs = {timeout_ms}
defaultMaxSteps = 64
auditPath = "audit.jsonl"
filesRoot = "files"

[[runtimes]]
id = "sharedos-testplugin"
version = "0.1.0"
program = "{program}"
args = ["normal"]
env = {{ {MARKER_ENV} = "{marker}" }}
launcher = "{launcher}"

[[agents]]
agentId = "{AGENT}"
runtime = "sharedos-testplugin"

[[kernel.grants]]
id = "alice-admission"
subject = {{ kind = "agent", agentId = "{AGENT}" }}
issuer = {{ kind = "service", serviceId = "test-host" }}
namespaceId = "{NAMESPACE}"
[[kernel.grants.capabilities]]
namespace = "sharedos.execution"
path = ["agent", "{AGENT}"]
scope = "exact"
actions = ["invoke"]

[[kernel.grants]]
id = "alice-files"
subject = {{ kind = "agent", agentId = "{AGENT}" }}
issuer = {{ kind = "service", serviceId = "test-host" }}
namespaceId = "{NAMESPACE}"
[[kernel.grants.capabilities]]
namespace = "files"
path = ["{AGENT}"]
scope = "descendants"
actions = ["read", "write", "list"]
"#,
        program = workspace_bin("sharedos-testplugin").display(),
    )
}

/// A host configuration seating runtime `id` for the test agent, with
/// admission granted; `body` is the rest of its `[[runtimes]]` entry.
pub fn seat_toml(id: &str, body: &str) -> String {
    format!(
        r#"[host]
auditPath = "audit.jsonl"
filesRoot = "files"

[[runtimes]]
id = "{id}"
version = "0.1.0"
{body}

[[agents]]
agentId = "{AGENT}"
runtime = "{id}"

[[kernel.grants]]
id = "admission"
subject = {{ kind = "agent", agentId = "{AGENT}" }}
issuer = {{ kind = "service", serviceId = "test-host" }}
namespaceId = "{NAMESPACE}"
[[kernel.grants.capabilities]]
namespace = "sharedos.execution"
path = ["agent", "{AGENT}"]
scope = "exact"
actions = ["invoke"]
"#
    )
}
