//! One turn of the adversary through the real host path, and the host
//! configuration it runs under.

use crate::leftovers::own_cgroups as leftover_cgroups;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_host::config::HostConfig;
use sharedos_host::executor::{ExecuteOptions, Executor, ExecutorOptions, OnTurnError, TurnError};
use sharedos_host::process::Launcher;
use sharedos_host::seat::{process_runtime, process_seat};
use sharedos_kernel::{Kernel, MemoryAuditSink};
use sharedos_protocol::ExecutionResult;
use sharedos_sandbox::SandboxPolicy;

use super::verdicts::{leftover_workspaces, survivors};
use super::{AGENT, CONFIG_SECRET_ENV, SANDBOX_UID, plugin_copy};
use crate::engines::Engine;

// ------------------------------------------------------------------- turn

/// How to run one turn of the adversary.
pub struct TurnSpec {
    pub policy: SandboxPolicy,
    /// `payload.bait`.
    pub bait: Value,
    /// `payload.only`; `None` runs the default sequence.
    pub only: Option<Vec<String>>,
    pub timeout_ms: u64,
    pub drain_grace_ms: u64,
    /// The engine the adversary runs in (the namespace sandbox unless set).
    pub engine: Engine,
}

impl TurnSpec {
    pub fn new(policy: SandboxPolicy, bait: Value) -> TurnSpec {
        TurnSpec {
            policy,
            bait,
            only: None,
            timeout_ms: 60_000,
            drain_grace_ms: 0,
            engine: Engine::Sandbox,
        }
    }
    /// The same turn in `engine`.
    pub fn engine(mut self, engine: Engine) -> TurnSpec {
        self.engine = engine;
        self
    }
    pub fn only(mut self, ids: &[&str]) -> TurnSpec {
        self.only = Some(ids.iter().map(|s| s.to_string()).collect());
        self
    }
    pub fn timeout_ms(mut self, ms: u64) -> TurnSpec {
        self.timeout_ms = ms;
        self
    }
    /// `turn/draining` this long before the deadline.
    pub fn drain_grace_ms(mut self, ms: u64) -> TurnSpec {
        self.drain_grace_ms = ms;
        self
    }
}

/// What a turn left behind, host side.
#[derive(Debug)]
pub struct TurnRun {
    pub result: ExecutionResult,
    /// Every `on_turn_error` call, in order.
    pub turn_errors: Vec<TurnError>,
    pub elapsed: Duration,
    /// Processes of the turn still alive after it (pid and description).
    pub survivors: Vec<String>,
    /// Per-turn workspaces left in the private `TMPDIR`.
    pub leftover_workspaces: Vec<PathBuf>,
    /// Throwaway cgroups of this process left behind.
    pub leftover_cgroups: Vec<PathBuf>,
    /// Whether the launcher was ever asked to start a plugin, and how many
    /// plugin processes (the marker in the cmdline) were seen while it ran.
    pub launches: u32,
}

impl TurnRun {
    /// The result as JSON.
    pub fn json(&self) -> Value {
        serde_json::to_value(&self.result).expect("result json")
    }
    /// `metadata.runtime.sandbox`.
    pub fn sandbox_report(&self) -> Value {
        self.json()["metadata"]["runtime"]["sandbox"].clone()
    }
    pub fn level(&self) -> String {
        self.sandbox_report()["level"]
            .as_str()
            .unwrap_or("<no level>")
            .to_string()
    }
    pub fn status(&self) -> String {
        self.json()["status"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
    pub fn code(&self) -> Option<String> {
        self.result.code().map(str::to_owned)
    }
    /// The `sandbox.attack` receipts, by attack id (`C07`, `C44a`).
    pub fn receipts(&self) -> BTreeMap<String, Value> {
        self.result
            .events
            .iter()
            .filter(|e| e.kind.as_str() == "runtime.event")
            .filter_map(|e| {
                let v = serde_json::to_value(e).ok()?;
                let data = &v["data"];
                (data["type"] == "sandbox.attack").then(|| data["data"].clone())
            })
            .filter_map(|r| {
                let label = r["attack"].as_str()?.to_string();
                let id = label.split('-').next()?.to_string();
                Some((id, r))
            })
            .collect()
    }
    /// The turn errors, as text.
    pub fn error_text(&self) -> String {
        self.turn_errors
            .iter()
            .map(|e| format!("{e:?}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// A launcher that counts launches and otherwise is the engine's.
struct CountingLauncher {
    inner: Arc<dyn Launcher>,
    launches: Arc<AtomicU32>,
}

impl Launcher for CountingLauncher {
    fn launch(
        &self,
        spec: &sharedos_host::process::LaunchSpec,
    ) -> Result<sharedos_host::process::LaunchedChild, sharedos_host::process::LaunchError> {
        self.launches.fetch_add(1, Ordering::SeqCst);
        self.inner.launch(spec)
    }
}

/// The host configuration of the turns: the adversary seated for one
/// agent, admission granted, no tools.
pub fn host_config(base: &Path) -> HostConfig {
    HostConfig::parse(&host_config_text(), "sandbox-tests.toml", base)
        .expect("the test configuration")
}

/// The TOML of [`host_config`] (the default sandbox policy).
pub fn host_config_text() -> String {
    host_config_text_with("")
}

/// [`host_config_text`] with extra keys for the runtime entry, e.g.
/// `sandbox = { emulateNoUserns = true, minLevel = "reduced" }`.
pub fn host_config_text_with(runtime_keys: &str) -> String {
    format!(
        r#"
[host]
defaultTimeoutMs = 60000
auditPath = "audit.jsonl"
filesRoot = "files"

[[runtimes]]
id = "sharedos-adversary"
version = "{version}"
program = "{program}"
env = {{ RUST_BACKTRACE = "0" }}
{runtime_keys}

[[agents]]
agentId = "{AGENT}"
runtime = "sharedos-adversary"

[[kernel.grants]]
id = "adversary-admission"
subject = {{ kind = "agent", agentId = "{AGENT}" }}
issuer = {{ kind = "service", serviceId = "sandbox-tests" }}
namespaceId = "sandbox-tests"
[[kernel.grants.capabilities]]
namespace = "sharedos.execution"
path = ["agent", "{AGENT}"]
scope = "exact"
actions = ["invoke"]
"#,
        version = env!("CARGO_PKG_VERSION"),
        program = plugin_copy().path.display(),
    )
}

/// The `ExecutionRequest` of a turn (`n` makes its ids unique).
pub fn request(spec: &TurnSpec, n: u32) -> Value {
    let agent = json!({"kind": "agent", "agentId": AGENT});
    let mut payload = json!({ "bait": spec.bait });
    if let Some(only) = &spec.only {
        payload["only"] = json!(only);
    }
    let trace = format!("trace-bait-{}-{n}", std::process::id());
    json!({
        "version": "1",
        "executionId": format!("exec-bait-{}-{n}", std::process::id()),
        "agent": agent,
        "context": {
            "namespaceId": "sandbox-tests",
            "actor": agent,
            "authority": {"kind": "service", "serviceId": "sandbox-tests"},
            "owner": {"kind": "human", "userId": "operator"},
            "purpose": "Prove the sandbox",
            "traceId": trace,
            "enabledToolNamespaces": [],
            "now": "2026-11-30T12:00:00Z"
        },
        "message": {
            "version": "1",
            "id": format!("msg-bait-{n}"),
            "sender": {"kind": "human", "userId": "operator"},
            "receiver": agent,
            "purpose": "Prove the sandbox",
            "payload": payload,
            "traceId": trace,
            "createdAt": "2026-11-30T12:00:00Z"
        },
        "tools": [],
        "options": {"timeoutMs": spec.timeout_ms}
    })
}

/// Runs one turn of the adversary through the real host path and looks
/// for what it left behind.
pub fn run_turn(spec: TurnSpec) -> TurnRun {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let base = tempfile::tempdir().expect("config dir");
    let mut config = host_config(base.path());
    config.host.drain_grace_ms = spec.drain_grace_ms;
    let mut spec = spec;
    if spec.policy.warm == 0 && spec.policy.uids == sharedos_sandbox::UidPolicy::default() {
        spec.policy.uids = sharedos_sandbox::UidPolicy {
            first: SANDBOX_UID,
            count: 1,
            required: false,
        };
    }
    config.runtimes[0].sandbox = spec.policy.clone();
    // A configured credential is refused at load (`runtimes[0].env.*`);
    // one a host passes anyway, past the load check, must still be dropped
    // by the sandbox's allowlist (C28).
    config.runtimes[0].env.insert(
        CONFIG_SECRET_ENV.0.to_owned(),
        CONFIG_SECRET_ENV.1.to_owned(),
    );
    spec.engine.set_up(&mut config.runtimes[0]);
    let entry = config.runtimes[0].clone();
    let launches = Arc::new(AtomicU32::new(0));
    let launcher = Arc::new(CountingLauncher {
        inner: spec.engine.launcher(&entry),
        launches: launches.clone(),
    });
    let runtime = process_runtime(&config, &entry, launcher).expect("seat the adversary");
    let seat = process_seat(runtime);
    let files_root = base.path().join("files");
    std::fs::create_dir_all(&files_root).unwrap();
    let kernel = Kernel::from_config(
        &config.kernel,
        &files_root,
        Arc::new(MemoryAuditSink::new()),
    )
    .expect("kernel");
    let errors: Arc<Mutex<Vec<TurnError>>> = Arc::default();
    let sink = errors.clone();
    let on_turn_error: OnTurnError = Arc::new(move |e: &TurnError, _| {
        sink.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(e.clone());
    });
    let options = ExecutorOptions {
        default_timeout_ms: spec.timeout_ms,
        drain_grace_ms: spec.drain_grace_ms,
        on_turn_error: Some(on_turn_error),
        ..ExecutorOptions::default()
    };
    let executor = Executor::new(Arc::new(kernel), seat, options).expect("executor");
    let req = request(&spec, n).to_string();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let result = rt
        .block_on(executor.execute_json(&req, ExecuteOptions::default()))
        .expect("a valid request");
    let elapsed = started.elapsed();
    drop(executor);
    rt.shutdown_timeout(Duration::from_secs(5));
    // The tree is reaped before `execute` returns; give the kernel a moment
    // to tear the namespaces down before calling anything a survivor.
    let survivors = settle(Duration::from_secs(3), survivors);
    let leftover_workspaces = settle(Duration::from_secs(3), leftover_workspaces);
    let leftover_cgroups = settle(Duration::from_secs(3), leftover_cgroups);
    let turn_errors = errors.lock().unwrap_or_else(|p| p.into_inner()).clone();
    TurnRun {
        result,
        turn_errors,
        elapsed,
        survivors,
        leftover_workspaces,
        leftover_cgroups,
        launches: launches.load(Ordering::SeqCst),
    }
}

/// Polls `probe` until it finds nothing or `limit` passes.
fn settle<T>(limit: Duration, probe: fn() -> Vec<T>) -> Vec<T> {
    let end = Instant::now() + limit;
    loop {
        let found = probe();
        if found.is_empty() || Instant::now() >= end {
            return found;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
