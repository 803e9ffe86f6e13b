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

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};
use sharedos_host::executor::{
    ExecuteOptions, Executor, ExecutorOptions, OnEvent, OnTurnError, TurnError,
};
use sharedos_host::process::{DirectLauncher, Launcher, ProcessRuntime, ProcessRuntimeConfig};
use sharedos_host::sandboxed::SandboxLauncher;
use sharedos_host::seat::process_seat;
use sharedos_kernel::{
    AuditError, AuditRecord, AuditSink, HandlerAnswer, JsonlAuditSink, Kernel, KernelConfig,
    ToolError, ToolHandler,
};
use sharedos_protocol::{
    AccessContext, ExecutionEvent, ExecutionResult, RuntimeManifest, ToolCall, ToolDefinition,
    ToolResult,
};
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
    /// `SandboxLauncher` with the default policy (minimum level strong).
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

/// The JSONL sink, with a switch that makes every decision-path write
/// (`authority.resolved`, `authorization.checked`, `tool.catalog.listed`)
/// fail while it is on: an audit outage on demand. Outcome-path records
/// (`tool.invoked`, `turn.ended`, ...) still go through, so the trail shows
/// how the turn ended.
pub struct FaultySink {
    inner: JsonlAuditSink,
    broken: Arc<std::sync::atomic::AtomicBool>,
    /// While non-zero, each call's `authorization.checked` takes this many
    /// milliseconds to become durable (a slow disk).
    decision_delay_ms: Arc<std::sync::atomic::AtomicU64>,
}

#[async_trait]
impl AuditSink for FaultySink {
    async fn append(&self, record: &AuditRecord) -> Result<(), AuditError> {
        let decision = matches!(
            record.kind.as_str(),
            "authority.resolved" | "authorization.checked" | "tool.catalog.listed"
        );
        if decision && self.broken.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(AuditError::Sink("disk on fire (test fault)".into()));
        }
        let delay = self
            .decision_delay_ms
            .load(std::sync::atomic::Ordering::SeqCst);
        if delay > 0 && record.kind == "authorization.checked" && record.tool.is_some() {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        self.inner.append(record).await
    }
}

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
        "ledger.append" | "ledger.slow" => ("ledger", "ledger", "append", "write"),
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

/// One turn's setup.
pub struct TurnSpec {
    pub launch: Launch,
    /// The testplugin's argv mode (`normal`, `silent`, ...).
    pub mode: &'static str,
    pub script: Value,
    pub tools: Vec<&'static str>,
    pub timeout_ms: u64,
    pub drain_grace_ms: u64,
    /// Cancel the turn (the host's own cancellation) this long after start.
    pub cancel_after: Option<Duration>,
    /// Cancel the turn when the plugin emits an event of this type.
    pub cancel_on_event: Option<&'static str>,
    /// Cancel the turn before `execute` is called.
    pub precancel: bool,
    /// Break the audit sink's decision path when the plugin emits an event
    /// of this type.
    pub audit_fault_on_event: Option<&'static str>,
    /// Changes the request before it is sent.
    pub patch_request: Option<fn(&mut Value)>,
    /// `on_event` takes this long over each `tool.requested` (a slow
    /// observer, e.g. one that writes to a slow terminal).
    pub slow_observer_ms: Option<u64>,
    /// Do not check the per-turn invariants (for tests of their breach).
    pub skip_invariants: bool,
    /// Extra environment for the plugin.
    pub env: Vec<(String, String)>,
    /// When the plugin emits an event of this type, each call's decision
    /// write starts taking the given time.
    pub slow_decisions_on_event: Option<(&'static str, u64)>,
    /// The executor's byte ledger; its default when `None`.
    pub max_turn_bytes: Option<usize>,
}

impl TurnSpec {
    pub fn new(launch: Launch, script: Value) -> Self {
        Self {
            launch,
            mode: "normal",
            script,
            tools: vec![
                "files.read",
                "files.write",
                "files.list",
                "ledger.append",
                "ledger.slow",
            ],
            timeout_ms: 20_000,
            drain_grace_ms: 0,
            cancel_after: None,
            cancel_on_event: None,
            precancel: false,
            audit_fault_on_event: None,
            patch_request: None,
            slow_observer_ms: None,
            skip_invariants: false,
            env: Vec::new(),
            slow_decisions_on_event: None,
            max_turn_bytes: None,
        }
    }
    pub fn tools(mut self, tools: &[&'static str]) -> Self {
        self.tools = tools.to_vec();
        self
    }
    pub fn timeout(mut self, ms: u64) -> Self {
        self.timeout_ms = ms;
        self
    }
    pub fn grace(mut self, ms: u64) -> Self {
        self.drain_grace_ms = ms;
        self
    }
    pub fn mode(mut self, mode: &'static str) -> Self {
        self.mode = mode;
        self
    }
}

/// What a turn left behind.
pub struct TurnRun {
    pub result: ExecutionResult,
    /// How long `execute` took.
    pub elapsed: Duration,
    /// Every `on_turn_error` report.
    pub turn_errors: Vec<TurnError>,
    /// The events as `on_event` saw them, in order (as of `run_turn`'s
    /// return, or of the last [`TurnRun::reload`]).
    pub streamed: Vec<ExecutionEvent>,
    streamed_log: Arc<Mutex<Vec<ExecutionEvent>>>,
    /// What `on_event` had seen when `execute` returned.
    pub streamed_at_return: Vec<ExecutionEvent>,
    /// Every process that carried the turn's marker while it ran (host
    /// pids, found in `/proc`).
    pub seen_pids: Vec<u32>,
    /// The pids the plugin reported itself (`pid` and `forked` events).
    pub reported_pids: Vec<u32>,
    pub marker: String,
    pub launch: Launch,
    pub audit: Vec<AuditRecord>,
    pub audit_path: PathBuf,
    pub files_root: PathBuf,
    _dir: tempfile::TempDir,
}

impl TurnRun {
    pub fn code(&self) -> Option<&str> {
        self.result.code()
    }
    pub fn retryable(&self) -> Option<bool> {
        self.result.retryable()
    }
    /// The last event: `(type, data)`.
    pub fn last_event(&self) -> (String, Value) {
        let e = self.result.events.last().expect("at least one event");
        (e.kind.as_str().to_owned(), e.data.clone())
    }
    pub fn event_types(&self) -> Vec<&str> {
        self.result.event_types()
    }
    /// The data of every `runtime.event` of the plugin's type `kind`.
    pub fn runtime_events(&self, kind: &str) -> Vec<Value> {
        self.result
            .events
            .iter()
            .filter(|e| e.kind.as_str() == "runtime.event" && e.data["type"] == kind)
            .map(|e| e.data["data"].clone())
            .collect()
    }
    /// `metadata.runtime`.
    pub fn runtime_provenance(&self) -> Value {
        self.result
            .metadata
            .get("runtime")
            .cloned()
            .unwrap_or(Value::Null)
    }
    /// Asserts `metadata.runtime` names the testplugin and carries the
    /// sandbox report the launcher implies.
    pub fn assert_provenance(&self, launch: Launch) {
        let rt = self.runtime_provenance();
        assert_eq!(rt["id"], "sharedos-testplugin", "provenance: {rt}");
        assert_eq!(rt["version"], "0.1.0", "provenance: {rt}");
        assert_eq!(rt["protocolVersion"], "1", "provenance: {rt}");
        match launch {
            Launch::Direct => assert_eq!(
                rt["sandbox"],
                json!({"launcher": "direct", "level": "none", "reason": "launched without a sandbox",
                       "use": "development only", "containment": "cgroup"}),
                "provenance: {rt}"
            ),
            Launch::Sandbox | Launch::SandboxBelowMinimum => {
                let report = &rt["sandbox"];
                assert_eq!(report["level"], "strong", "sandbox report: {report}");
                assert_eq!(report["missing"], json!([]), "sandbox report: {report}");
                for layer in ["lifeline", "pidns", "mountns", "netns", "userns", "root"] {
                    assert_eq!(
                        report[layer]["state"], "applied",
                        "{layer} in the sandbox report: {report}"
                    );
                }
                assert_eq!(report["self_check"]["cap_eff"], 0, "{report}");
                assert_eq!(report["self_check"]["no_new_privs"], true, "{report}");
                let env = report["env_keys"].as_array().cloned().unwrap_or_default();
                assert!(
                    env.contains(&json!(MARKER_ENV)) && env.contains(&json!("SHAREDOS_PLUGIN")),
                    "env keys in the sandbox report: {env:?}"
                );
            }
        }
    }
    /// Re-reads the audit trail until `pred` holds for some record or
    /// `bound` passed (outcome-path records of an interrupted handler may
    /// land after the result); returns whether it held.
    pub fn wait_audit(&mut self, bound: Duration, pred: impl Fn(&AuditRecord) -> bool) -> bool {
        let until = Instant::now() + bound;
        loop {
            self.audit = sharedos_kernel::audit::read_jsonl(&self.audit_path)
                .expect("the audit trail parses");
            if self.audit.iter().any(&pred) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    /// Re-reads what `on_event` saw and the audit trail.
    pub fn reload(&mut self) {
        self.streamed = self.streamed_log.lock().unwrap().clone();
        self.audit =
            sharedos_kernel::audit::read_jsonl(&self.audit_path).expect("the audit trail parses");
    }
    /// The audit record `turn.ended`.
    pub fn turn_ended(&self) -> &AuditRecord {
        self.audit
            .iter()
            .rev()
            .find(|r| r.kind == "turn.ended")
            .expect("a turn.ended audit record")
    }
    /// Asserts no process of the turn is alive, polling under a generous
    /// bound (the reaping runs off-thread after the result).
    pub fn assert_no_survivor(&self) {
        let mut pids: Vec<u32> = self.seen_pids.clone();
        pids.extend(&self.reported_pids);
        let survivors = wait_gone(&self.marker, Duration::from_secs(10));
        assert!(
            survivors.is_empty(),
            "processes of the turn survived: {survivors:?} (seen {pids:?})"
        );
        if self.launch == Launch::Direct {
            // The plugin's own pids are host pids: each is gone too.
            let until = Instant::now() + Duration::from_secs(10);
            let mut alive: Vec<u32> = self.reported_pids.clone();
            while !alive.is_empty() && Instant::now() < until {
                alive.retain(|p| is_alive(*p));
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(alive.is_empty(), "reported pids still alive: {alive:?}");
        }
    }
}

/// Live (not zombie) processes whose environment carries `marker`.
pub fn marked_pids(marker: &str) -> Vec<u32> {
    let needle = format!("{MARKER_ENV}={marker}");
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if !env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) {
            continue;
        }
        if is_alive(pid) {
            out.push(pid);
        }
    }
    out
}

/// A process exists and is not a zombie.
pub fn is_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the parenthesised command name.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim().chars().next());
            !matches!(state, Some('Z') | Some('X') | None)
        }
        Err(_) => false,
    }
}

/// Polls until no process carries `marker`, or `bound` passed; returns the
/// survivors.
pub fn wait_gone(marker: &str, bound: Duration) -> Vec<u32> {
    let until = Instant::now() + bound;
    loop {
        let left = marked_pids(marker);
        if left.is_empty() || Instant::now() >= until {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGKILLs every process carrying `marker` (cleanup after a documented
/// escape, so a test does not leave sleepers behind).
pub fn kill_marked(marker: &str) {
    for pid in marked_pids(marker) {
        if let Ok(p) = i32::try_from(pid) {
            // SAFETY: kill(2) with a pid we found carrying our marker.
            unsafe {
                libc::kill(p, libc::SIGKILL);
            }
        }
    }
}

fn pids_of(v: &Value) -> Vec<u32> {
    let mut out = Vec::new();
    if let Some(p) = v.get("pid").and_then(Value::as_u64) {
        out.push(p as u32);
    }
    if let Some(ps) = v.get("pids").and_then(Value::as_array) {
        out.extend(ps.iter().filter_map(Value::as_u64).map(|p| p as u32));
    }
    out
}

/// Runs one turn of the testplugin through the real executor and kernel.
pub async fn run_turn(spec: TurnSpec) -> TurnRun {
    let dir = tempfile::tempdir().expect("tempdir");
    let files_root = dir.path().join("files");
    std::fs::create_dir_all(&files_root).expect("files root");
    let audit_path = dir.path().join("audit.jsonl");
    let broken: Arc<std::sync::atomic::AtomicBool> = Arc::default();
    let delay: Arc<std::sync::atomic::AtomicU64> = Arc::default();
    let audit = FaultySink {
        inner: JsonlAuditSink::open(&audit_path).expect("audit sink"),
        broken: broken.clone(),
        decision_delay_ms: delay.clone(),
    };
    let kernel = Kernel::builder_from_config(&kernel_config(), &files_root, Arc::new(audit))
        .expect("kernel builder")
        .tool(ledger_definition(), Arc::new(LedgerAppend))
        .expect("ledger tool")
        .tool(ledger_slow_definition(), Arc::new(LedgerSlow))
        .expect("ledger.slow tool")
        .build();

    let marker = format!("m{}", std::process::id()) + &unique_suffix();
    let mut pc =
        ProcessRuntimeConfig::new(workspace_bin("sharedos-testplugin"), testplugin_manifest());
    pc.args = vec![spec.mode.to_owned()];
    pc.env = vec![(MARKER_ENV.to_owned(), marker.clone())];
    pc.env.extend(spec.env.iter().cloned());
    let runtime = Arc::new(ProcessRuntime::new(pc, spec.launch.launcher()).expect("runtime"));

    let errors: Arc<Mutex<Vec<TurnError>>> = Arc::default();
    let errs = errors.clone();
    let on_turn_error: OnTurnError = Arc::new(move |e, _| errs.lock().unwrap().push(e.clone()));
    let defaults = ExecutorOptions::default();
    let options = ExecutorOptions {
        drain_grace_ms: spec.drain_grace_ms,
        on_turn_error: Some(on_turn_error),
        max_turn_bytes: spec.max_turn_bytes.unwrap_or(defaults.max_turn_bytes),
        ..defaults
    };
    let executor =
        Executor::new(Arc::new(kernel), process_seat(runtime), options).expect("executor");

    let cancel = CancellationToken::new();
    let streamed: Arc<Mutex<Vec<ExecutionEvent>>> = Arc::default();
    let seen: Arc<Mutex<Vec<u32>>> = Arc::default();
    let slow_decisions = spec.slow_decisions_on_event;
    let (s2, seen2, marker2, cancel2, cancel_on, fault_on, slow) = (
        streamed.clone(),
        seen.clone(),
        marker.clone(),
        cancel.clone(),
        spec.cancel_on_event,
        spec.audit_fault_on_event,
        spec.slow_observer_ms,
    );
    let on_event: OnEvent = Arc::new(move |e: &ExecutionEvent| {
        s2.lock().unwrap().push(e.clone());
        if let Some(ms) = slow
            && e.kind.as_str() == "tool.requested"
        {
            std::thread::sleep(Duration::from_millis(ms));
        }
        if e.kind.as_str() == "runtime.event" {
            // The plugin said something about its processes: look at /proc
            // while they still run.
            // Two scans a moment apart: one listing of /proc on a loaded
            // machine has been seen to miss a process.
            let mut s = seen2.lock().unwrap();
            for round in 0..2 {
                if round > 0 {
                    std::thread::sleep(Duration::from_millis(10));
                }
                for p in marked_pids(&marker2) {
                    if !s.contains(&p) {
                        s.push(p);
                    }
                }
            }
            if cancel_on.is_some_and(|k| e.data["type"] == k) {
                cancel2.cancel();
            }
            if fault_on.is_some_and(|k| e.data["type"] == k) {
                broken.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            if let Some((k, ms)) = slow_decisions
                && e.data["type"] == k
            {
                delay.store(ms, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    if let Some(after) = spec.cancel_after {
        let c = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            c.cancel();
        });
    }
    if spec.precancel {
        cancel.cancel();
    }
    let mut req = request("exec-1", spec.script, &spec.tools, spec.timeout_ms);
    if let Some(patch) = spec.patch_request {
        patch(&mut req);
    }
    let started = Instant::now();
    let result = executor
        .execute_json(
            &req.to_string(),
            ExecuteOptions {
                cancel: Some(cancel),
                on_event: Some(on_event),
            },
        )
        .await
        .expect("a result");
    let elapsed = started.elapsed();
    let streamed_at_return = streamed.lock().unwrap().clone();
    let reported_pids = result
        .events
        .iter()
        .filter(|e| {
            e.kind.as_str() == "runtime.event"
                && (e.data["type"] == "pid" || e.data["type"] == "forked")
        })
        .flat_map(|e| pids_of(&e.data["data"]))
        .collect();
    let audit = sharedos_kernel::audit::read_jsonl(&audit_path).expect("the audit trail parses");
    if !spec.skip_invariants {
        // Invariants of every ending: the events are numbered 0, 1, 2, ...
        // and belong to this turn, and `on_event` saw exactly them, in
        // order (waiting, bounded, for a delivery still running on another
        // thread: see `streamed_at_return`).
        for (i, e) in result.events.iter().enumerate() {
            assert_eq!(
                e.sequence, i as u64,
                "event {i} has sequence {}",
                e.sequence
            );
            assert_eq!(e.execution_id.as_str(), "exec-1");
            assert_eq!(e.trace_id.as_str(), TRACE);
        }
        check_audit_invariants(&audit);
        let until = Instant::now() + Duration::from_secs(5);
        while streamed.lock().unwrap().len() < result.events.len() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let observed = streamed.lock().unwrap().clone();
        assert_eq!(
            observed.len(),
            result.events.len(),
            "on_event saw {} events {:?}, the result has {} {:?}",
            observed.len(),
            observed
                .iter()
                .map(|e| (e.kind.as_str(), e.data.to_string()))
                .collect::<Vec<_>>(),
            result.events.len(),
            result.event_types()
        );
        assert!(
            observed == result.events,
            "on_event saw other events than the result's"
        );
    }
    let observed = streamed.lock().unwrap().clone();
    let seen_pids = seen.lock().unwrap().clone();
    let turn_errors = errors.lock().unwrap().clone();
    TurnRun {
        result,
        elapsed,
        turn_errors,
        streamed: observed,
        streamed_log: streamed,
        streamed_at_return,
        seen_pids,
        reported_pids,
        marker,
        launch: spec.launch,
        audit,
        audit_path,
        files_root,
        _dir: dir,
    }
}

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

fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("-{}-{nanos}", N.fetch_add(1, Ordering::Relaxed))
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

/// The pids of every live descendant of `root` (children first found by
/// walking `/proc/<pid>/stat`'s ppid field).
pub fn descendants(root: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for (child, parent) in &parent_of {
            if *parent == p && !out.contains(child) {
                out.push(*child);
                frontier.push(*child);
            }
        }
    }
    out.retain(|p| is_alive(*p));
    out
}
