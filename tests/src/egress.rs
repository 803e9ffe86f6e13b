//! Turns of a runtime with a network policy through the whole host path:
//! the registry from a configuration, the sandbox launcher, the kernel
//! with a JSONL audit file, the executor; and
//! what the host can observe of them (the result, the events, the audit
//! file, a plugin's environment in /proc).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use sharedos_cli::demo::{ModelSetup, model_config};
use sharedos_host::config::HostConfig;
use sharedos_host::executor::{ExecuteOptions, Executor, ExecutorOptions, OnEvent};
use sharedos_host::seat::{LauncherFor, registry_from_config};
use sharedos_kernel::{JsonlAuditSink, Kernel};
use sharedos_protocol::{ExecutionEvent, ExecutionResult};

use crate::engines::Engine;
use crate::turns::{AGENT, NAMESPACE, workspace_bin};

/// The real key of every route here; nothing the host writes may hold it.
pub const REAL_KEY: &str = "sk-real-e2e-91f0c3aa6d";
/// What the plugin is given instead (`SHAREDOS_MODEL_KEY`).
pub const PLACEHOLDER: &str = "sharedos-placeholder";
/// The demo's turn request (alice writes her plan).
pub const DEMO_REQUEST: &str = include_str!("../../host/demo/turn.json");

/// The demo's configuration with the standard runtime on driver `kind`
/// and a route to `upstream` keyed by `key_file`; `network_extra` and
/// `driver_extra` as in [`ModelSetup`]; alice granted the route when
/// `grant`.
pub fn model_text(
    kind: &str,
    upstream: &str,
    key_file: &Path,
    network_extra: &str,
    driver_extra: &str,
    grant: bool,
) -> String {
    let secret = format!("file:{}", key_file.display());
    let text = model_config(&ModelSetup {
        kind,
        upstream,
        secret: &secret,
        allow: &["loopback".to_owned()],
        model: "test-model",
        driver_extra,
        network_extra,
        grant,
    })
    .expect("the demo configuration");
    let program = workspace_bin("sharedos-standard");
    text.replace(
        "program = \"sharedos-standard\"",
        &format!("program = \"{}\"", program.display()),
    )
}

/// What the host saw of one turn.
pub struct Turn {
    pub result: ExecutionResult,
    pub events: Vec<ExecutionEvent>,
    /// The JSONL audit file's text.
    pub audit: String,
}

impl Turn {
    /// The data of every event of `kind`.
    pub fn events_of(&self, kind: &str) -> Vec<Value> {
        self.events
            .iter()
            .filter(|e| e.kind.as_str() == kind)
            .map(|e| e.data.clone().into_value())
            .collect()
    }

    /// Everything the host wrote: the result, the events, the audit.
    pub fn everything(&self) -> String {
        format!(
            "{}\n{}\n{}",
            serde_json::to_string(&self.result).unwrap_or_default(),
            serde_json::to_string(&self.events).unwrap_or_default(),
            self.audit
        )
    }
}

/// One turn of the demo's request on `sharedos.standard`.
pub async fn run(dir: &Path, text: &str) -> Turn {
    run_request(dir, text, "sharedos.standard", DEMO_REQUEST, None).await
}

/// One turn of `request` on `runtime`, configured by `text`, with `watch`
/// called on each event as it happens.
pub async fn run_request(
    dir: &Path,
    text: &str,
    runtime: &str,
    request: &str,
    watch: Option<OnEvent>,
) -> Turn {
    run_request_in(Engine::Sandbox, dir, text, runtime, request, watch).await
}

/// [`run_request`] with every runtime launched in `engine`.
pub async fn run_request_in(
    engine: Engine,
    dir: &Path,
    text: &str,
    runtime: &str,
    request: &str,
    watch: Option<OnEvent>,
) -> Turn {
    let launcher_for = move |e: &sharedos_host::config::RuntimeEntry| Ok(engine.launcher(e));
    run_request_launched(dir, text, runtime, request, watch, &launcher_for).await
}

/// [`run_request`] with each runtime launched as `launcher_for` says
/// (`configured_launcher`: as the entry configures, e.g. a microVM).
pub async fn run_request_launched(
    dir: &Path,
    text: &str,
    runtime: &str,
    request: &str,
    watch: Option<OnEvent>,
    launcher_for: &LauncherFor,
) -> Turn {
    let (executor, registry, audit_path) = executor_for(dir, text, runtime, launcher_for);
    let events: Arc<Mutex<Vec<ExecutionEvent>>> = Arc::default();
    let sink = events.clone();
    let on_event: OnEvent = Arc::new(move |e| {
        sink.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(e.clone());
        if let Some(watch) = &watch {
            watch(e);
        }
    });
    let result = executor
        .execute_json(
            request,
            ExecuteOptions {
                cancel: None,
                on_event: Some(on_event),
            },
        )
        .await
        .expect("a valid request");
    drop(executor);
    drop(registry);
    sharedos_host::process::settle_kills();
    let events = events.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Turn {
        result,
        events,
        audit: std::fs::read_to_string(&audit_path).unwrap_or_default(),
    }
}

/// An executor of `runtime` as `text` configures it, each runtime
/// launched as `launcher_for` says: with its registry (drop it, then
/// `settle_kills`) and its audit file.
fn executor_for(
    dir: &Path,
    text: &str,
    runtime: &str,
    launcher_for: &LauncherFor,
) -> (Executor, sharedos_host::registry::RuntimeRegistry, PathBuf) {
    let config = HostConfig::parse(text, "egress-e2e.toml", dir).expect("the configuration");
    let registry = registry_from_config(&config, launcher_for).expect("the seats");
    let seat = registry.resolve(runtime).expect("the runtime").clone();
    let files_root = config.resolve(&config.host.files_root);
    std::fs::create_dir_all(&files_root).expect("the files root");
    let audit_path = dir.join("audit.jsonl");
    let audit = JsonlAuditSink::open(&audit_path).expect("the audit file");
    let kernel = Arc::new(
        Kernel::from_config(&config.kernel, &files_root, Arc::new(audit)).expect("the kernel"),
    );
    // The host's limits as `sharedos run` takes them from the file.
    let options = ExecutorOptions {
        default_max_steps: config.host.default_max_steps,
        default_max_tool_calls: config.host.default_max_tool_calls,
        default_timeout_ms: config.host.default_timeout_ms,
        drain_grace_ms: config.host.drain_grace_ms,
        ..ExecutorOptions::default()
    };
    let executor = Executor::new(kernel, seat, options).expect("the executor");
    (executor, registry, audit_path)
}

/// Turns of `requests` one after another on one seat (so a runtime's
/// warm processes serve the later ones), `pause` before each but the
/// first: each result with its wall time.
pub async fn run_requests_launched(
    dir: &Path,
    text: &str,
    runtime: &str,
    requests: &[String],
    pause: std::time::Duration,
    launcher_for: &LauncherFor,
) -> Vec<(ExecutionResult, std::time::Duration)> {
    let (executor, registry, _) = executor_for(dir, text, runtime, launcher_for);
    let mut out = Vec::new();
    for (i, request) in requests.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(pause).await;
        }
        let started = std::time::Instant::now();
        let result = executor
            .execute_json(request, ExecuteOptions::default())
            .await
            .expect("a valid request");
        out.push((result, started.elapsed()));
    }
    drop(executor);
    drop(registry);
    sharedos_host::process::settle_kills();
    out
}

/// A file in `dir` holding [`REAL_KEY`].
pub fn key_file(dir: &Path) -> PathBuf {
    let p = dir.join("model.key");
    std::fs::write(&p, REAL_KEY).expect("the key file");
    p
}

/// The environment of every process whose command line holds `marker`
/// (a driver kind), read by the host from /proc.
pub fn environments_of(marker: &str) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(marker)
            && let Ok(env) = std::fs::read(entry.path().join("environ"))
        {
            out.push(String::from_utf8_lossy(&env).replace('\0', "\n"));
        }
    }
    out
}

/// A `[[kernel.grants]]` entry giving the test agent one egress capability:
/// `path` is a route name (action `request`) or a `host:port` destination
/// (action `connect`).
pub fn egress_grant(id: &str, path: &str, action: &str) -> String {
    format!(
        r#"
[[kernel.grants]]
id = "{id}"
subject = {{ kind = "agent", agentId = "{AGENT}" }}
issuer = {{ kind = "service", serviceId = "test-host" }}
namespaceId = "{NAMESPACE}"
[[kernel.grants.capabilities]]
namespace = "egress"
path = ["{path}"]
scope = "exact"
actions = ["{action}"]
"#
    )
}

/// A listener on the host's loopback that no policy allows, counting the
/// connections it accepts.
pub struct Bystander {
    pub port: u16,
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Bystander {
    /// Starts accepting; must be called inside a tokio runtime.
    pub async fn start() -> Bystander {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("the bystander's listener");
        let port = listener.local_addr().expect("its address").port();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            while listener.accept().await.is_ok() {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        Bystander {
            port,
            accepted,
            task,
        }
    }

    /// The connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Bystander {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a plugin with a network policy probes (`net_probe`): the
/// bystander's port and the model's on the host's loopback, two outside
/// addresses (none of which may answer), and last the gateway's port.
pub fn probe_targets(bystander: u16, model: u16) -> [String; 5] {
    [
        format!("127.0.0.1:{bystander}"),
        format!("127.0.0.1:{model}"),
        "10.0.0.1:443".to_owned(),
        "1.1.1.1:443".to_owned(),
        format!("127.0.0.1:{}", sharedos_egress::EGRESS_PORT),
    ]
}
