//! The real envelope a check's turn runs through: the code path of
//! `sharedos run` (the executor, the process runtime with the battery's
//! launcher, the kernel) with the catalogue the check declares. Its tools
//! really answer: the kernel's `files.write` and `files.read` on a
//! temporary files root, and `conformance.echo`, a host-side tool
//! registered in the kernel the way the kernel's own tools are, which
//! echoes its call, waits `delayMs` when asked (so calls overlap), holds a
//! call until the turn's drain has begun (`"untilDrained": true`) and fails
//! when asked (`"fail": true`), counting the calls in flight at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};
use sharedos_kernel::registry::{HandlerAnswer, ToolError, ToolHandler};
use sharedos_kernel::{Kernel, KernelConfig, MemoryAuditSink};
use sharedos_protocol::ESCALATE_TOOL;
use sharedos_protocol::{
    AccessContext, ExecutionRequest, ExecutionResult, PLUGIN_COOKIE_ENV, RuntimeManifest,
    Timestamp, ToolCall, ToolDefinition, ToolResult,
};
use tokio_util::sync::CancellationToken;

use sharedos_host::executor::{ExecuteOptions, Executor, ExecutorOptions};
use sharedos_host::process::{LaunchSpec, Launcher, ProcessRuntime, ProcessRuntimeConfig};

/// The agent the turns run as, and the directory of the files root it may use.
pub(super) const AGENT: &str = "conformance";
/// The host-side test tool (the name the scripted turns' catalogue gives).
pub(super) use super::turn::ECHO_TOOL;
/// The longest wait `conformance.echo` grants one call: the `abort`
/// check's hold with the most launch allowance (every turn's deadline
/// bounds it anyway).
const MAX_DELAY: Duration = Duration::from_secs(125);
/// How long after the drain began a call held `untilDrained` is answered,
/// so the `turn/draining` the host wrote is on the wire before its answer.
const AFTER_DRAIN: Duration = Duration::from_secs(1);

/// What launches the plugin for a real turn.
pub(super) struct Envelope {
    pub launcher: Arc<dyn Launcher>,
    pub spec: LaunchSpec,
    /// The manifest the plugin stated in the handshake check, so the
    /// seat's comparison passes for a plugin whose manifest is stable.
    pub manifest: RuntimeManifest,
    pub handshake: Duration,
    /// Added to the deadline of the checks that time a deadline against
    /// the plugin's first call (`drain`, `abort`): twice a launch of the
    /// plugin in this engine measured before them ([`launch_allowance`]),
    /// zero when a launch takes under [`SLOW_LAUNCH`]. A turn's deadline
    /// covers its launch, and a microVM under TCG boots for seconds: the
    /// deadline would otherwise pass before the plugin is up, and the
    /// check would not see what it asks about.
    pub allowance: Duration,
}

/// A launch shorter than this adds nothing to the deadline checks.
const SLOW_LAUNCH: Duration = Duration::from_millis(500);

/// Twice the time one launch of `spec` takes in `launcher` (its tree
/// killed and reaped at once), or zero under [`SLOW_LAUNCH`] or when it
/// fails (the checks then say what they see). At most 120 s.
pub(super) fn launch_allowance(launcher: &dyn Launcher, spec: &LaunchSpec) -> Duration {
    let started = Instant::now();
    let Ok(mut child) = launcher.launch(spec) else {
        return Duration::ZERO;
    };
    let took = started.elapsed();
    child.tree.start_kill();
    let _ = child.tree.kill_tree();
    if took < SLOW_LAUNCH {
        return Duration::ZERO;
    }
    (took * 2).min(Duration::from_secs(120))
}

/// What `conformance.echo` saw.
#[derive(Debug, Default)]
pub(super) struct EchoProbe {
    inflight: AtomicUsize,
    /// The most calls in flight at once.
    pub widest: AtomicUsize,
    pub calls: AtomicUsize,
    /// When the turn's drain begins, at the latest (a turn with a drain).
    drain_at: std::sync::OnceLock<Instant>,
}

/// One real turn to run: the payload, the catalogue the check declares,
/// the deadline, and optionally a drain.
pub(super) struct Plan<'a> {
    pub payload: Value,
    pub catalogue: &'a [&'a str],
    pub timeout: Duration,
    /// A file of the agent's directory to return as the turn left it.
    pub read_back: Option<&'a str>,
    /// The host's drain grace: `turn/draining` comes `timeout - grace`
    /// into the turn (the real deadline's drain).
    pub drain_grace: Option<Duration>,
    /// The peer's line limit (`maxMessageBytes`), when not the default.
    pub max_message_bytes: Option<usize>,
    /// How long the plugin may take to exit by itself after its
    /// `turn/abort` (`ProcessRuntimeConfig::abort_grace`); `None`: the
    /// host's default (killed once the abort is delivered).
    pub abort_grace: Option<Duration>,
}

/// One real turn: its result, and a file of the files root as the kernel
/// left it (when the check asked for one).
pub(super) struct Ran {
    pub result: ExecutionResult,
    pub file: Option<String>,
    pub echo: Arc<EchoProbe>,
}

struct EchoTool(Arc<EchoProbe>);

#[async_trait]
impl ToolHandler for EchoTool {
    async fn invoke(
        &self,
        _context: &AccessContext,
        call: &ToolCall,
        abort: CancellationToken,
    ) -> Result<HandlerAnswer, ToolError> {
        let probe = &self.0;
        probe.calls.fetch_add(1, Ordering::SeqCst);
        let now = probe.inflight.fetch_add(1, Ordering::SeqCst) + 1;
        probe.widest.fetch_max(now, Ordering::SeqCst);
        let args = &call.arguments;
        let delay = Duration::from_millis(args.get("delayMs").and_then(Value::as_u64).unwrap_or(0))
            .min(MAX_DELAY);
        let mut until = Instant::now() + delay;
        if args.get("untilDrained").and_then(Value::as_bool) == Some(true)
            && let Some(drain) = probe.drain_at.get()
        {
            until = until.max(*drain + AFTER_DRAIN);
        }
        let waited = tokio::select! {
            () = tokio::time::sleep_until(until.into()) => true,
            () = abort.cancelled() => false,
        };
        probe.inflight.fetch_sub(1, Ordering::SeqCst);
        if !waited {
            return Err(ToolError::Aborted);
        }
        let at = Timestamp::now();
        if args.get("fail").and_then(Value::as_bool) == Some(true) {
            return Ok(
                ToolResult::failed(call, "echo_failed", "The call asked to fail.", at).into(),
            );
        }
        let output = json!({"callId": call.id.as_str(), "arguments": Value::Object(args.clone())});
        Ok(ToolResult::succeeded(call, output, at).into())
    }
}

/// The kernel's grants: admission of the agent, read/write under its own
/// directory of the files root, and the echo tool.
fn kernel_config() -> Result<KernelConfig, String> {
    let issuer = json!({"kind": "service", "serviceId": "sharedos-conformance"});
    let subject = json!({"kind": "agent", "agentId": AGENT});
    serde_json::from_value(json!({"namespaces": ["conformance"], "grants": [
        {"id": "conformance-admission", "subject": subject, "issuer": issuer,
         "namespaceId": AGENT, "capabilities": [{"namespace": "sharedos.execution",
            "path": ["agent", AGENT], "scope": "exact", "actions": ["invoke"]}]},
        {"id": "conformance-files", "subject": subject, "issuer": issuer,
         "namespaceId": AGENT, "capabilities": [{"namespace": "files", "path": [AGENT],
            "scope": "descendants", "actions": ["read", "write", "list"]}]},
        {"id": "conformance-echo", "subject": subject, "issuer": issuer,
         "namespaceId": AGENT, "capabilities": [{"namespace": "conformance", "path": [],
            "scope": "descendants", "actions": ["read"]}]},
        {"id": "conformance-escalation", "subject": subject, "issuer": issuer,
         "namespaceId": AGENT, "capabilities": [{"namespace": "sharedos.escalation", "path": [],
            "scope": "descendants", "actions": ["request"]}]}
    ]}))
    .map_err(|e| format!("the conformance kernel configuration is invalid: {e}"))
}

/// The definition of catalogue entry `name` (a kernel file tool, the
/// kernel's `sharedos.escalate`, or the echo tool), as the request lists it.
fn tool(name: &str) -> Value {
    if name == ESCALATE_TOOL {
        return serde_json::to_value(sharedos_kernel::tools::escalate::definition())
            .unwrap_or_default();
    }
    let (namespace, action) = match name {
        "files.write" => ("files", "write"),
        ECHO_TOOL => ("conformance", "read"),
        _ => ("files", "read"),
    };
    json!({"name": name, "description": format!("The host's {name}."), "namespace": namespace,
           "source": "request", "readWrite": if action == "write" { "write" } else { "read" },
           "inputSchema": {},
           "requiredCapability": {"resource": {"namespace": namespace, "path": []}, "action": action}})
}

/// The request: `payload` as the message, `catalogue` as the tools.
fn request(
    payload: Value,
    catalogue: &[&str],
    timeout: Duration,
) -> Result<ExecutionRequest, String> {
    let agent = json!({"kind": "agent", "agentId": AGENT});
    let human = json!({"kind": "human", "userId": "conformance"});
    let now = serde_json::to_value(Timestamp::now()).map_err(|e| e.to_string())?;
    let tools: Vec<Value> = catalogue.iter().map(|n| tool(n)).collect();
    serde_json::from_value(json!({
        "version": "1", "executionId": "exec-conformance-real", "agent": agent,
        "context": {"namespaceId": AGENT, "actor": agent, "owner": human,
                    "authority": {"kind": "service", "serviceId": "sharedos-conformance"},
                    "purpose": "conformance", "traceId": "trace-conformance-real",
                    "enabledToolNamespaces": ["files", "conformance", "sharedos"], "now": now},
        "message": {"version": "1", "id": "msg-conformance-real", "sender": human,
                    "receiver": agent, "purpose": "conformance", "payload": payload,
                    "traceId": "trace-conformance-real", "createdAt": now},
        "tools": tools,
        "options": {"timeoutMs": u64::try_from(timeout.as_millis()).unwrap_or(60_000)}
    }))
    .map_err(|e| format!("the conformance request is invalid: {e}"))
}

impl Envelope {
    /// Runs the turn `plan` describes.
    pub fn run(&self, plan: Plan<'_>) -> Result<Ran, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("cannot create a files root: {e}"))?;
        let root = dir.path().join("files");
        std::fs::create_dir_all(&root).map_err(|e| format!("cannot create a files root: {e}"))?;
        let kernel =
            Kernel::from_config(&kernel_config()?, &root, Arc::new(MemoryAuditSink::new()))
                .map_err(|e| format!("the conformance kernel cannot start: {e}"))?;
        let echo = Arc::new(EchoProbe::default());
        let definition: ToolDefinition = serde_json::from_value(tool(ECHO_TOOL))
            .map_err(|e| format!("the echo tool's definition is invalid: {e}"))?;
        kernel
            .register(definition, Arc::new(EchoTool(echo.clone())))
            .map_err(|e| format!("cannot register the echo tool: {e}"))?;
        let options = ExecutorOptions {
            drain_grace_ms: plan
                .drain_grace
                .map_or(0, |g| u64::try_from(g.as_millis()).unwrap_or(u64::MAX)),
            ..ExecutorOptions::default()
        };
        let executor = Executor::new(
            Arc::new(kernel),
            self.seat(plan.max_message_bytes, plan.abort_grace)?,
            options,
        )
        .map_err(|e| format!("executor: {e}"))?;
        let request = request(plan.payload, plan.catalogue, plan.timeout)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the async runtime: {e}"))?;
        if let Some(grace) = plan.drain_grace {
            // The deadline is armed after this, so its drain comes no sooner.
            let _ = echo
                .drain_at
                .set(Instant::now() + plan.timeout.saturating_sub(grace));
        }
        let result = rt
            .block_on(executor.execute(request, ExecuteOptions::default()))
            .map_err(|e| e.to_string());
        // The turn's tree is killed and reaped off its path (under gVisor
        // with `runsc kill` and `runsc delete`); wait for that here, so the
        // next check's sweep does not count this turn's teardown as a
        // process left behind.
        sharedos_host::process::settle_kills();
        let result = result?;
        let file = plan
            .read_back
            .and_then(|p| std::fs::read_to_string(root.join(AGENT).join(AGENT).join(p)).ok());
        Ok(Ran { result, file, echo })
    }

    fn seat(
        &self,
        max_message_bytes: Option<usize>,
        abort_grace: Option<Duration>,
    ) -> Result<sharedos_host::executor::Seat, String> {
        let mut pc = ProcessRuntimeConfig::new(self.spec.program.clone(), self.manifest.clone());
        pc.args = self.spec.args.clone();
        pc.env = self
            .spec
            .env
            .iter()
            .filter(|(k, _)| k != PLUGIN_COOKIE_ENV)
            .cloned()
            .collect();
        pc.handshake_timeout = self.handshake;
        if let Some(grace) = abort_grace {
            pc.abort_grace = grace;
        }
        if let Some(max) = max_message_bytes {
            pc.max_message_bytes = max;
        }
        let runtime = ProcessRuntime::new(pc, self.launcher.clone()).map_err(|e| e.to_string())?;
        Ok(sharedos_host::seat::process_seat(Arc::new(runtime)))
    }
}
