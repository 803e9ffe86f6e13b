//! Harness turns through the real host path: a host.toml with a
//! `[runtimes.harness]` spec parsed and checked by `HostConfig`, the seat
//! built by `seat::process_runtime` (so the plugin gets `--harness`), the
//! full sandbox, the real kernel with a JSONL audit trail, the executor.
//!
//! The seated CLI is the real Python `mcp` SDK client
//! (`tests/harness/mcp_client.py`, `pip install mcp==1.20.0`), the real
//! TypeScript SDK client (`tests/harness/mcp_client.mjs`, the
//! `@modelcontextprotocol/sdk` of tests/vendor-cli) or a small shell script
//! for the bad-input cases. Every process of the turn carries
//! a marker in its environment, so the host can prove none survives.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_host::config::HostConfig;
use sharedos_host::executor::{ExecuteOptions, Executor, ExecutorOptions};
use sharedos_host::seat::{process_runtime, process_seat};
use sharedos_kernel::{AuditRecord, JsonlAuditSink, Kernel, KernelConfig};
use sharedos_protocol::ExecutionResult;

use crate::engines::Engine;
use crate::turns::{
    LedgerAppend, LedgerSlow, MARKER_ENV, kernel_config, ledger_definition, ledger_slow_definition,
    ledger_slow_twin_definition, marked_pids, request, wait_gone, workspace_bin,
};

/// The Python that has the `mcp` package, and what the sandbox must see.
pub struct Python {
    pub exe: PathBuf,
    /// Directories to name in `extraRoPaths`: the interpreter's prefix and
    /// the package's site directory when it lies elsewhere.
    pub ro_paths: Vec<PathBuf>,
}

/// Finds `python3` with `mcp` 1.20.0 installed; fails the test (never
/// skips it) when it is missing.
pub fn python_with_mcp() -> Python {
    let probe = "import sys, os, importlib.metadata as m, mcp; \
                 print(sys.executable); print(sys.base_prefix); \
                 print(os.path.dirname(os.path.dirname(mcp.__file__))); print(m.version('mcp')); \
                 print(sys.prefix)";
    let out = Command::new("python3").args(["-c", probe]).output();
    let text = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(o) => panic!(
            "the Python `mcp` package is missing from the `python3` on PATH: run the tests with `scripts/test`, which provisions it (or `python3 -m pip install -r tests/requirements.lock`): {}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!(
            "python3 is not runnable ({e}): run the tests with `scripts/test`, which provisions it"
        ),
    };
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "unexpected probe output: {text}");
    assert_eq!(
        lines[3], "1.20.0",
        "mcp {} is installed, the tests need 1.20.0: run the tests with `scripts/test` (or `python3 -m pip install -r tests/requirements.lock`)",
        lines[3]
    );
    let prefix = PathBuf::from(lines[1]);
    let venv = PathBuf::from(lines[4]);
    let site = PathBuf::from(lines[2]);
    let mut ro_paths = vec![prefix.clone()];
    // In a virtual environment (scripts/test makes one) the interpreter
    // runs from the environment's own bin/python, which finds its
    // site-packages through pyvenv.cfg beside it; the sandbox sees the
    // environment and the base installation it points at.
    let exe = if venv != prefix {
        ro_paths.push(venv.clone());
        PathBuf::from(lines[0])
    } else {
        std::fs::canonicalize(lines[0]).expect("the interpreter's real path")
    };
    if !ro_paths.iter().any(|p| site.starts_with(p)) {
        ro_paths.push(site);
    }
    if !ro_paths.iter().any(|p| exe.starts_with(p)) && !exe.starts_with("/usr") {
        ro_paths.push(exe.parent().expect("bin dir").to_path_buf());
    }
    Python { exe, ro_paths }
}

/// A directory the sandbox uid may read (outside /tmp, o+rx), holding the
/// test's CLI scripts.
pub fn fixture_dir() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("sharedos-harness-")
        .tempdir_in("/var/tmp")
        .expect("fixture dir");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// Writes an executable script into `dir`.
pub fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// The Python client, copied into `dir`.
pub fn mcp_client(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("harness/mcp_client.py");
    let p = dir.join("mcp_client.py");
    std::fs::copy(src, &p).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    p
}

/// The TypeScript MCP SDK client, copied into `dir` beside a
/// `node_modules` link to the pinned installation of tests/vendor-cli
/// (`vendors::installed`, failing the test when it is missing). Returns
/// the script and the directories the sandbox must see: `dir` and the
/// installation's `node_modules`, where Node resolves the link to.
pub fn ts_mcp_client(dir: &Path) -> (PathBuf, Vec<PathBuf>) {
    let (package, version) = crate::vendors::MCP_SDK;
    let modules = crate::vendors::installed(package, version).join("node_modules");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("harness/mcp_client.mjs");
    let p = dir.join("mcp_client.mjs");
    std::fs::copy(src, &p).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::symlink(&modules, dir.join("node_modules")).unwrap();
    (p, vec![dir.to_path_buf(), modules])
}

/// A harness spec seating `exe script http {mcpUrl} {mcpToken}` over
/// streamable HTTP (`mcp = "http"`) with the client's `steps`; keys of
/// `[runtimes.harness]` may follow.
pub fn http_harness(exe: &Path, script: &Path, steps: &Value) -> String {
    format!(
        r#"[runtimes.harness]
command = {exe:?}
args = [{script:?}, "http", "{{mcpUrl}}", "{{mcpToken}}"]
mcp = "http"
env = {{ STEPS = '{steps}', SHAREDOS_TEST_MARKER = "MARKER" }}
final = {{ from = "stdout" }}
"#,
        exe = exe.display().to_string(),
        script = script.display().to_string(),
    )
}

/// One harness turn's setup.
pub struct HarnessCase {
    /// The `[runtimes.harness]` table and anything after it (TOML), with
    /// `MARKER` replaced by the turn's marker.
    pub harness: String,
    /// `extraRoPaths` of the runtime.
    pub ro_paths: Vec<PathBuf>,
    /// Extra `[runtimes.sandbox]` lines.
    pub sandbox: String,
    pub prompt: Value,
    pub tools: Vec<&'static str>,
    pub timeout_ms: u64,
    pub drain_grace_ms: u64,
    pub escalation_grant: bool,
    pub max_tool_calls: Option<u64>,
    /// Called once the runtime is seated, before its turn (a file
    /// replaced between the load's checks and the turn).
    pub after_seating: Option<Box<dyn FnOnce() + Send>>,
    /// The engine the harness runs in (the namespace sandbox unless set).
    pub engine: Engine,
}

impl HarnessCase {
    pub fn new(harness: &str, ro_paths: Vec<PathBuf>) -> Self {
        Self {
            harness: harness.to_owned(),
            ro_paths,
            sandbox: String::new(),
            prompt: json!("Read notes/a.md and tell me what it says."),
            tools: vec![
                "files.read",
                "files.write",
                "files.list",
                "files.delete",
                "ledger.slow",
                "sharedos.escalate",
            ],
            timeout_ms: 30_000,
            drain_grace_ms: 0,
            escalation_grant: true,
            max_tool_calls: None,
            after_seating: None,
            engine: Engine::Sandbox,
        }
    }
}

/// What a harness turn left.
pub struct HarnessTurn {
    pub result: ExecutionResult,
    pub audit: Vec<AuditRecord>,
    pub marker: String,
    /// Time from `execute()` to the result.
    pub elapsed: Duration,
    /// The wall clock at `execute()`, seconds since the epoch.
    pub started_wall: f64,
}

impl HarnessTurn {
    pub fn json(&self) -> Value {
        serde_json::to_value(&self.result).unwrap()
    }
    pub fn status(&self) -> String {
        self.json()["status"].as_str().unwrap_or("").to_owned()
    }
    pub fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    }
    pub fn metadata(&self) -> Value {
        self.json()["metadata"].clone()
    }
    pub fn events(&self, kind: &str) -> Vec<Value> {
        self.result
            .events
            .iter()
            .filter(|e| e.kind.as_str() == kind)
            .map(|e| e.data.clone().into_value())
            .collect()
    }
    pub fn audit_of(&self, kind: &str) -> Vec<&AuditRecord> {
        self.audit.iter().filter(|r| r.kind == kind).collect()
    }
    /// The client's summary: the output string parsed as JSON.
    pub fn client(&self) -> Value {
        let v = self.json();
        let out = match v.get("output") {
            Some(o) => o.clone(),
            None => v["metadata"]["finalMessage"].clone(),
        };
        serde_json::from_str(out.as_str().unwrap_or("null"))
            .unwrap_or_else(|e| panic!("the output is not the client's JSON ({e}): {out}"))
    }
    /// No process of the turn is left (checked from the host's /proc).
    pub fn assert_no_survivor(&self) {
        let left = wait_gone(&self.marker, Duration::from_secs(5));
        assert!(left.is_empty(), "processes of the turn survived: {left:?}");
    }
}

fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "h{}x{}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    )
}

/// The host.toml of a harness case (the kernel comes from
/// `turns::kernel_config`, not from this file).
pub fn host_toml(case: &HarnessCase, marker: &str) -> String {
    let ro: Vec<String> = case
        .ro_paths
        .iter()
        .map(|p| format!("{:?}", p.display().to_string()))
        .collect();
    format!(
        r#"[host]
auditPath = "audit.jsonl"
filesRoot = "files"

[[runtimes]]
id = "sharedos.test.mcp"
version = "0.1.0"
program = {program:?}
env = {{ {MARKER_ENV} = "{marker}" }}
[runtimes.sandbox]
extraRoPaths = [{ro}]
{sandbox}
{harness}
"#,
        program = workspace_bin("sharedos-harness").display().to_string(),
        ro = ro.join(", "),
        sandbox = case.sandbox,
        harness = case.harness.replace("MARKER", marker),
    )
}

/// The host.toml of `case` in its engine, `marker` in its environment.
pub fn harness_text(case: &HarnessCase, marker: &str) -> String {
    case.engine.configure(&host_toml(case, marker))
}

fn kernel(files_root: &Path, audit: &Path, escalation_grant: bool) -> Kernel {
    let mut config: Value = serde_json::to_value(kernel_config()).unwrap();
    if !escalation_grant {
        for g in config["grants"].as_array_mut().unwrap() {
            if let Some(caps) = g["capabilities"].as_array_mut() {
                caps.retain(|c| c["namespace"] != "sharedos.escalation");
            }
        }
    }
    let config: KernelConfig = serde_json::from_value(config).unwrap();
    Kernel::builder_from_config(
        &config,
        files_root,
        Arc::new(JsonlAuditSink::open(audit).unwrap()),
    )
    .expect("kernel builder")
    .tool(ledger_definition(), Arc::new(LedgerAppend))
    .expect("ledger tool")
    .tool(ledger_slow_definition(), Arc::new(LedgerSlow))
    .expect("ledger.slow tool")
    .tool(ledger_slow_twin_definition(), Arc::new(LedgerSlow))
    .expect("ledger__slow tool")
    .build()
}

/// Runs one harness turn.
pub async fn run_harness(mut case: HarnessCase) -> HarnessTurn {
    let dir = tempfile::tempdir().expect("tempdir");
    let files_root = dir.path().join("files");
    std::fs::create_dir_all(
        files_root
            .join(crate::turns::NAMESPACE)
            .join(crate::turns::AGENT)
            .join("notes"),
    )
    .unwrap();
    let marker = unique();
    let text = harness_text(&case, &marker);
    let config = HostConfig::parse(&text, "harness.toml", dir.path())
        .unwrap_or_else(|e| panic!("the configuration: {e}\n{text}"));
    let entry = &config.runtimes[0];
    let launcher = case.engine.launcher(entry);
    let runtime = process_runtime(&config, entry, launcher).expect("the seat");
    if let Some(after) = case.after_seating.take() {
        after();
    }
    let audit_path = dir.path().join("audit.jsonl");
    let kernel = kernel(&files_root, &audit_path, case.escalation_grant);
    let options = ExecutorOptions {
        drain_grace_ms: case.drain_grace_ms,
        ..ExecutorOptions::default()
    };
    let executor =
        Executor::new(Arc::new(kernel), process_seat(runtime), options).expect("executor");
    let mut req = request(
        &format!("exec-{marker}"),
        Value::Null,
        &case.tools,
        case.timeout_ms,
    );
    req["message"]["payload"] = case.prompt.clone();
    if let Some(n) = case.max_tool_calls {
        req["options"]["maxToolCalls"] = json!(n);
    }
    let started_wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = Instant::now();
    let result = executor
        .execute_json(&req.to_string(), ExecuteOptions::default())
        .await
        .expect("a result");
    let elapsed = started.elapsed();
    drop(executor);
    sharedos_host::process::settle_kills();
    let audit = sharedos_kernel::audit::read_jsonl(&audit_path).unwrap_or_default();
    HarnessTurn {
        result,
        audit,
        marker,
        elapsed,
        started_wall,
    }
}

/// Processes carrying the marker right now.
pub fn live(marker: &str) -> Vec<u32> {
    marked_pids(marker)
}
