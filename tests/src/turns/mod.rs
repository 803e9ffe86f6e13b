//! Real turns across the process boundary: a real kernel (grants, the file
//! tools, a non-idempotent `ledger.append` write tool, escalation), the
//! JSONL audit sink in a temporary directory, the real executor, and
//! `sharedos-testplugin` seated through `ProcessRuntime` with either the
//! direct or the sandboxed launcher.
//!
//! Every plugin process a turn starts carries a unique marker in its
//! environment (`SHAREDOS_TEST_MARKER`, inherited by anything it forks,
//! `setsid` and double-fork included), so the tests can find every
//! process of a turn in `/proc` whatever its pid namespace, and prove none
//! survives the turn.

mod cli;
mod procs;
mod records;
mod run;

pub use cli::*;
pub use procs::*;
pub use records::*;
pub use run::*;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use sharedos_host::process::{DirectLauncher, Launcher};
use sharedos_host::sandboxed::SandboxLauncher;
use sharedos_kernel::{AuditKind, HandlerAnswer, KernelConfig, ToolError, ToolHandler};
use sharedos_protocol::{AccessContext, RuntimeManifest, ToolCall, ToolDefinition, ToolResult};
use sharedos_sandbox::SandboxPolicy;
use tokio_util::sync::CancellationToken;

/// The environment key that marks every process of one turn.
pub const MARKER_ENV: &str = "SHAREDOS_TEST_MARKER";
/// The trace id the testplugin puts on its calls; the requests use it too.
pub const TRACE: &str = "trace-testplugin";
/// The agent of every turn here.
pub const AGENT: &str = "alice";
/// The tenant namespace of every turn here.
pub const NAMESPACE: &str = "endings";

pub use crate::binaries::workspace_bin;

/// How the plugin is launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    Direct,
    /// `SandboxLauncher` with the default policy (minimum level isolated).
    Sandbox,
    /// `SandboxLauncher` whose helper cannot create a user namespace
    /// (`emulate_no_userns`), so the sandbox comes out below the policy's
    /// minimum (strong) and the launch is refused.
    SandboxBelowMinimum,
}

impl Launch {
    pub fn launcher(self) -> Arc<dyn Launcher> {
        match self {
            Launch::Direct => Arc::new(DirectLauncher),
            Launch::Sandbox => Arc::new(SandboxLauncher::new(
                workspace_bin("sharedos"),
                SandboxPolicy::default(),
            )),
            Launch::SandboxBelowMinimum => Arc::new(SandboxLauncher::new(
                workspace_bin("sharedos"),
                SandboxPolicy {
                    emulate_no_userns: true,
                    ..SandboxPolicy::default()
                },
            )),
        }
    }
}

/// The decision-path records (`authority.resolved`,
/// `authorization.checked`, `tool.catalog.listed`): a `fault` step makes
/// them fail, an audit outage on demand. Outcome-path records
/// (`tool.invoked`, `turn.ended`, ...) still go through, so the trail shows
/// how the turn ended.
pub const DECISION_KINDS: [AuditKind; 3] = [
    AuditKind::AuthorityResolved,
    AuditKind::AuthorizationChecked,
    AuditKind::ToolCatalogListed,
];

/// `ledger.append`: a write tool that is not idempotent, so a call that
/// reached it makes a retry unsafe (envelope.md B.7).
#[derive(Debug)]
pub struct LedgerAppend;

#[async_trait]
impl ToolHandler for LedgerAppend {
    async fn invoke(
        &self,
        context: &AccessContext,
        call: &ToolCall,
        _abort: CancellationToken,
    ) -> Result<HandlerAnswer, ToolError> {
        Ok(ToolResult::succeeded(call, json!({"appended": true}), context.now.clone()).into())
    }
}

/// `ledger.slow`: a non-idempotent write whose handler takes
/// `arguments.ms` (default 30 s) and stops when the turn's abort fires.
#[derive(Debug)]
pub struct LedgerSlow;

#[async_trait]
impl ToolHandler for LedgerSlow {
    async fn invoke(
        &self,
        context: &AccessContext,
        call: &ToolCall,
        abort: CancellationToken,
    ) -> Result<HandlerAnswer, ToolError> {
        let ms = call
            .arguments
            .get("ms")
            .and_then(Value::as_u64)
            .unwrap_or(30_000);
        tokio::select! {
            _ = abort.cancelled() => Err(ToolError::Aborted),
            _ = tokio::time::sleep(Duration::from_millis(ms)) => {
                Ok(ToolResult::succeeded(call, json!({"slept": ms}), context.now.clone()).into())
            }
        }
    }
}

/// The kernel definition of `ledger.slow`.
pub fn ledger_slow_definition() -> ToolDefinition {
    let mut d = serde_json::to_value(ledger_definition()).expect("definition");
    d["name"] = json!("ledger.slow");
    d["description"] = json!("Append an entry slowly (not idempotent).");
    serde_json::from_value(d).expect("ledger.slow definition")
}

/// `ledger__slow`: `ledger.slow` under the name model APIs know it by, a
/// tool whose name collides with it there.
pub fn ledger_slow_twin_definition() -> ToolDefinition {
    let mut d = serde_json::to_value(ledger_slow_definition()).expect("definition");
    d["name"] = json!("ledger__slow");
    serde_json::from_value(d).expect("ledger__slow definition")
}

/// The kernel definition of `ledger.append`.
pub fn ledger_definition() -> ToolDefinition {
    serde_json::from_value(json!({
        "name": "ledger.append",
        "description": "Append an entry to the ledger (not idempotent).",
        "namespace": "ledger",
        "source": "sharedos-tests",
        "readWrite": "write",
        "inputSchema": {"type": "object"},
        "requiredCapability": {"resource": {"namespace": "ledger", "path": []}, "action": "append"}
    }))
    .expect("ledger definition")
}

/// The kernel configuration: admission, the agent's files (read, write,
/// list; no delete), the ledger, and escalation.
pub fn kernel_config() -> KernelConfig {
    let subject = json!({"kind": "agent", "agentId": AGENT});
    let issuer = json!({"kind": "service", "serviceId": "test-host"});
    serde_json::from_value(json!({
        "namespaces": ["ledger"],
        "grants": [
            {"id": "alice-admission", "subject": subject, "issuer": issuer, "namespaceId": NAMESPACE,
             "capabilities": [{"namespace": "sharedos.execution", "path": ["agent", AGENT], "scope": "exact", "actions": ["invoke"]}]},
            {"id": "alice-files", "subject": subject, "issuer": issuer, "namespaceId": NAMESPACE,
             "capabilities": [
                {"namespace": "files", "path": [AGENT], "scope": "descendants", "actions": ["read", "write", "list"]},
                {"namespace": "ledger", "path": [], "scope": "descendants", "actions": ["append"]},
                {"namespace": "sharedos.escalation", "path": [], "scope": "exact", "actions": ["request"]}
             ]}
        ]
    }))
    .expect("kernel config")
}

/// A request definition naming a tool (the kernel's listing decides what
/// it really is; only the name matters).
fn request_tool(name: &str) -> Value {
    let (ns, cap_ns, action, rw) = match name {
        "files.read" => ("files", "files", "read", "read"),
        "files.write" => ("files", "files", "write", "write"),
        "files.list" => ("files", "files", "list", "read"),
        "files.delete" => ("files", "files", "delete", "write"),
        "ledger.append" | "ledger.slow" | "ledger__slow" => ("ledger", "ledger", "append", "write"),
        "sharedos.escalate" => ("sharedos", "sharedos.escalation", "request", "read"),
        other => panic!("unknown tool {other}"),
    };
    json!({"name": name, "description": format!("caller's {name}"), "namespace": ns,
           "source": "request", "readWrite": rw, "inputSchema": {},
           "requiredCapability": {"resource": {"namespace": cap_ns, "path": []}, "action": action}})
}

/// A v1 request for the testplugin: `script` is its payload script.
pub fn request(execution_id: &str, script: Value, tools: &[&str], timeout_ms: u64) -> Value {
    let agent = json!({"kind": "agent", "agentId": AGENT});
    let purpose = "Exercise one ending of the envelope";
    json!({
        "version": "1",
        "executionId": execution_id,
        "agent": agent,
        "context": {
            "namespaceId": NAMESPACE,
            "actor": agent,
            "authority": {"kind": "service", "serviceId": "test-host"},
            "owner": {"kind": "human", "userId": "operator"},
            "purpose": purpose,
            "traceId": TRACE,
            "enabledToolNamespaces": ["files", "ledger", "sharedos"],
            "now": "2026-11-30T12:00:00Z"
        },
        "message": {
            "version": "1", "id": "msg-1",
            "sender": {"kind": "human", "userId": "operator"},
            "receiver": agent,
            "purpose": purpose,
            "payload": {"script": script},
            "traceId": TRACE,
            "createdAt": "2026-11-30T12:00:00Z"
        },
        "tools": tools.iter().map(|t| request_tool(t)).collect::<Vec<_>>(),
        "options": {"timeoutMs": timeout_ms, "maxSteps": 64, "maxToolCalls": 1000}
    })
}

/// The trusted manifest of the testplugin (what it reports).
pub fn testplugin_manifest() -> RuntimeManifest {
    serde_json::from_value(
        json!({"id": "sharedos-testplugin", "version": "0.1.0", "protocolVersion": "1"}),
    )
    .expect("manifest")
}
