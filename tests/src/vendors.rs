//! The real vendor CLIs (Codex CLI, Claude Code, opencode, Qwen Code,
//! Gemini CLI, Cline) seated by the specs the
//! repository ships (`plugins/harness/specs/*.toml`), through the whole
//! host path: the host.toml parsed and checked by `HostConfig`, the seat
//! with its egress gateway, the full sandbox, the real kernel with a JSONL
//! audit trail and the kernel as the gateway's effect port, and a scripted
//! mock model (`egress::mock`) on the host's loopback as the route's
//! upstream. Nothing reaches a network.
//!
//! The CLIs come from `npm ci` of tests/vendor-cli (`scripts/test` does it,
//! into its cache, and sets SHAREDOS_VENDOR_CLI_DIR); a test that does not
//! find them fails naming the command, never skips.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_egress::mock::{MockModel, SeenRequest, Wire};
use sharedos_host::config::{HostConfig, RuntimeEntry};
use sharedos_host::executor::{ExecuteOptions, Executor, ExecutorOptions, OnEvent};
use sharedos_host::process::Launcher;
use sharedos_host::seat::{SeatError, registry_from_config};
use sharedos_kernel::{AuditRecord, JsonlAuditSink, Kernel, KernelConfig};
use sharedos_protocol::api_names::is_api_tool_name;
use sharedos_protocol::{ExecutionEvent, ExecutionResult};

use crate::engines::Engine;
use crate::turns::{MARKER_ENV, kernel_config, request, workspace_bin};

/// The pinned versions (tests/vendor-cli/package.json, which `scripts/test` installs).
pub const CODEX_VERSION: &str = "0.171.0";
pub const CLAUDE_VERSION: &str = "2.1.332";
pub const OPENCODE_VERSION: &str = "1.18.33";
pub const QWEN_VERSION: &str = "0.24.4";
pub const GEMINI_VERSION: &str = "0.61.0";
pub const CLINE_VERSION: &str = "3.0.65";
/// Where the Qwen Code and Gemini CLI specs say a Node.js >= 22 is.
const SPEC_NODE_DIR: &str = "/opt/sharedos-ci/node/bin";
/// The TypeScript MCP SDK the harness tests seat as a client
/// (tests/harness/mcp_client.mjs).
pub const MCP_SDK: (&str, &str) = ("@modelcontextprotocol/sdk", "1.32.2");
/// The real key the gateway adds; the CLIs only ever hold the placeholder.
pub const REAL_KEY: &str = "sk-vendor-real-5d0e27c1";
/// Where the specs say the CLIs are installed.
const SPEC_DIR: &str = "/opt/sharedos-ci/cli";

/// A vendor CLI with a shipped spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    Codex,
    ClaudeCode,
    Opencode,
    QwenCode,
    Gemini,
    Cline,
}

impl Vendor {
    fn spec_file(self) -> &'static str {
        match self {
            Vendor::Codex => "codex.toml",
            Vendor::ClaudeCode => "claude-code.toml",
            Vendor::Opencode => "opencode.toml",
            Vendor::QwenCode => "qwen-code.toml",
            Vendor::Gemini => "gemini.toml",
            Vendor::Cline => "cline.toml",
        }
    }
    fn package(self) -> (&'static str, &'static str) {
        match self {
            Vendor::Codex => ("@openai/codex", CODEX_VERSION),
            Vendor::ClaudeCode => ("@anthropic-ai/claude-code", CLAUDE_VERSION),
            Vendor::Opencode => ("opencode-ai", OPENCODE_VERSION),
            Vendor::QwenCode => ("@qwen-code/qwen-code", QWEN_VERSION),
            Vendor::Gemini => ("@google/gemini-cli", GEMINI_VERSION),
            Vendor::Cline => ("@cline/cli-linux-x64", CLINE_VERSION),
        }
    }
    /// The model API's wire the spec's CLI speaks.
    pub fn wire(self) -> Wire {
        match self {
            Vendor::Codex => Wire::OpenaiResponses,
            Vendor::ClaudeCode => Wire::AnthropicMessages,
            Vendor::Opencode | Vendor::QwenCode | Vendor::Cline => Wire::OpenaiChat,
            Vendor::Gemini => Wire::Gemini,
        }
    }
    /// The route the spec names and the upstream it points at.
    fn route(self) -> (&'static str, &'static str) {
        match self {
            Vendor::Codex | Vendor::Opencode | Vendor::QwenCode | Vendor::Cline => {
                ("openai", "https://api.openai.com/v1")
            }
            Vendor::ClaudeCode => ("anthropic", "https://api.anthropic.com"),
            Vendor::Gemini => ("gemini", "https://generativelanguage.googleapis.com"),
        }
    }
}

/// The directory the CLIs are installed in: `SHAREDOS_VENDOR_CLI_DIR`, or
/// the specs' `/opt/sharedos-ci/cli`. Fails the test (never skips it) when
/// `vendor`'s pinned version is not there.
pub fn cli_dir(vendor: Vendor) -> PathBuf {
    let (package, version) = vendor.package();
    installed(package, version)
}

/// The directory of the pinned packages of tests/vendor-cli (the one
/// holding `node_modules`): `SHAREDOS_VENDOR_CLI_DIR`, or the specs'
/// `/opt/sharedos-ci/cli`. Fails the test (never skips it) when
/// `package@version` is not installed there.
pub fn installed(package: &str, version: &str) -> PathBuf {
    let dir = PathBuf::from(
        std::env::var("SHAREDOS_VENDOR_CLI_DIR").unwrap_or_else(|_| SPEC_DIR.to_owned()),
    );
    let manifest = dir.join("node_modules").join(package).join("package.json");
    let found = std::fs::read_to_string(&manifest)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v["version"].as_str().map(str::to_owned));
    assert_eq!(
        found.as_deref(),
        Some(version),
        "{package}@{version} is not installed in {dir}: run the tests with `scripts/test`, which \
         installs the pinned packages (tests/vendor-cli) and sets SHAREDOS_VENDOR_CLI_DIR, or run \
         `npm ci` in a copy of tests/vendor-cli and point SHAREDOS_VENDOR_CLI_DIR at it",
        dir = dir.display(),
    );
    dir
}

/// The directory of the Node.js >= 22 the Qwen Code spec runs:
/// `SHAREDOS_VENDOR_NODE_DIR` (`scripts/test` sets it, installing one when
/// the machine's is older), else the specs' `/opt/sharedos-ci/node/bin`.
/// Fails the test (never skips it) when the `node` there is missing or
/// older.
pub fn vendor_node_dir() -> PathBuf {
    let dir = PathBuf::from(
        std::env::var("SHAREDOS_VENDOR_NODE_DIR").unwrap_or_else(|_| SPEC_NODE_DIR.to_owned()),
    );
    let node = dir.join("node");
    let version = std::process::Command::new(&node)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let major = version.as_deref().and_then(|v| {
        v.trim_start_matches('v')
            .split('.')
            .next()?
            .parse::<u32>()
            .ok()
    });
    assert!(
        major.is_some_and(|m| m >= 22),
        "{} is {version:?}, not a Node.js >= 22: run the tests with `scripts/test`, which provides \
         one and sets SHAREDOS_VENDOR_NODE_DIR, or point SHAREDOS_VENDOR_NODE_DIR at the directory \
         of one",
        node.display()
    );
    dir
}

/// The shipped spec of `vendor` as it will be loaded: installed in `dir`,
/// the route's upstream the mock model (a loopback target, allowed for the
/// test) with the key in `key_file`, the harness binary of this build, and
/// every process carrying `marker` in its environment.
pub fn spec_text(
    vendor: Vendor,
    dir: &Path,
    mock: &MockModel,
    key_file: &Path,
    marker: &str,
) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../plugins/harness/specs")
        .join(vendor.spec_file());
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (route, upstream) = vendor.route();
    let mock_upstream = match vendor {
        Vendor::Codex | Vendor::Opencode | Vendor::QwenCode | Vendor::Cline => mock.base_url(),
        // Both CLIs add the API's version segment themselves.
        Vendor::ClaudeCode | Vendor::Gemini => format!("http://127.0.0.1:{}", mock.port),
    };
    let mut out = text
        .replace(SPEC_DIR, &dir.display().to_string())
        .replace(SPEC_NODE_DIR, &vendor_node_dir().display().to_string());
    for (from, to) in [
        (
            "program = \"sharedos-harness\"".to_owned(),
            format!(
                "program = {:?}\nenv = {{ {MARKER_ENV} = \"{marker}\" }}",
                workspace_bin("sharedos-harness").display().to_string()
            ),
        ),
        (
            format!(
                "upstream = \"{upstream}\", secret = \"env:{}\"",
                secret_env(vendor)
            ),
            format!(
                "upstream = \"{mock_upstream}\", secret = \"file:{}\", allow = [\"loopback\"]",
                key_file.display()
            ),
        ),
        // Codex offers a catalogued model's MCP tools behind its
        // `tool_search` tool; the mock model is no catalogued model, so
        // they are offered directly and the script calls them at once.
        match vendor {
            Vendor::Codex => (
                "model = \"gpt-5.5\"".to_owned(),
                "model = \"sharedos-mock-model\"".to_owned(),
            ),
            Vendor::ClaudeCode
            | Vendor::Opencode
            | Vendor::QwenCode
            | Vendor::Gemini
            | Vendor::Cline => (String::new(), String::new()),
        },
        (
            "env = { ".to_owned() + first_env_key(vendor),
            format!(
                "env = {{ {MARKER_ENV} = \"{marker}\", {}",
                first_env_key(vendor)
            ),
        ),
    ] {
        if from.is_empty() {
            continue;
        }
        assert!(
            out.contains(&from),
            "the spec {} no longer has {from:?}",
            path.display()
        );
        out = out.replacen(&from, &to, 1);
    }
    assert!(out.contains(&format!("name = \"{route}\"")), "{out}");
    out
}

fn secret_env(vendor: Vendor) -> &'static str {
    match vendor {
        Vendor::Codex | Vendor::Opencode | Vendor::QwenCode | Vendor::Cline => "OPENAI_API_KEY",
        Vendor::ClaudeCode => "ANTHROPIC_API_KEY",
        Vendor::Gemini => "GEMINI_API_KEY",
    }
}

/// The first key of the spec's `[runtimes.harness] env` table.
fn first_env_key(vendor: Vendor) -> &'static str {
    match vendor {
        Vendor::Codex => "CODEX_HOME",
        Vendor::ClaudeCode => "ANTHROPIC_BASE_URL",
        Vendor::Opencode => "OPENCODE_CONFIG",
        Vendor::QwenCode => "QWEN_HOME",
        Vendor::Gemini => "GEMINI_CLI_HOME",
        Vendor::Cline => "CLINE_SESSION_BACKEND_MODE",
    }
}

/// `vendor`'s spec switched to streamable HTTP, as docs/HARNESS.md says
/// for each: `mcp = "http"` and the server entry's URL and bearer token
/// instead of the relay's command.
pub fn http_variant(vendor: Vendor, spec: &str) -> String {
    let server: [(&str, &str); 2] = match vendor {
        Vendor::Codex => [
            (
                "command = {json:mcpCommand}\nargs = {json:mcpArgs}\n",
                "url = {json:mcpUrl}\nbearer_token_env_var = \"SHAREDOS_MCP_TOKEN\"\n",
            ),
            (
                "CODEX_HOME = ",
                "SHAREDOS_MCP_TOKEN = \"{mcpToken}\", CODEX_HOME = ",
            ),
        ],
        Vendor::Opencode => [
            (
                "{\"type\": \"local\", \"command\": {json:mcpCommandLine}, \"enabled\": true}",
                "{\"type\": \"remote\", \"url\": {json:mcpUrl}, \"headers\": {\"Authorization\": \"Bearer {mcpToken}\"}, \"oauth\": false, \"enabled\": true}",
            ),
            ("", ""),
        ],
        Vendor::QwenCode | Vendor::Gemini => [
            (
                "\"command\": {json:mcpCommand}, \"args\": {json:mcpArgs},",
                "\"httpUrl\": {json:mcpUrl}, \"headers\": {\"Authorization\": \"Bearer {mcpToken}\"},",
            ),
            ("", ""),
        ],
        Vendor::Cline => [
            (
                "\"type\": \"stdio\", \"command\": {json:mcpCommand}, \"args\": {json:mcpArgs}",
                "\"type\": \"streamableHttp\", \"url\": {json:mcpUrl}, \"headers\": {\"Authorization\": \"Bearer {mcpToken}\"}",
            ),
            ("", ""),
        ],
        Vendor::ClaudeCode => [
            (
                "\"type\": \"stdio\", \"command\": {json:mcpCommand}, \"args\": {json:mcpArgs},",
                "\"type\": \"http\", \"url\": {json:mcpUrl}, \"headers\": {\"Authorization\": \"Bearer {mcpToken}\"},",
            ),
            ("", ""),
        ],
    };
    let mut out = spec.to_owned();
    for (from, to) in std::iter::once(("mcp = \"stdio\"", "mcp = \"http\"")).chain(server) {
        if from.is_empty() {
            continue;
        }
        assert!(
            out.contains(from),
            "the {vendor:?} spec no longer has {from:?}"
        );
        out = out.replacen(from, to, 1);
    }
    out
}

/// The kernel of the harness tests (`turns::kernel_config`: files, ledger,
/// escalation) with the `egress` namespace, and the model route granted
/// to the agent when there is one.
fn kernel_config_with_route(route: Option<&str>) -> KernelConfig {
    let mut config = serde_json::to_value(kernel_config()).expect("kernel config");
    if let Some(namespaces) = config["namespaces"].as_array_mut() {
        namespaces.push(json!("egress"));
    }
    let Some(route) = route else {
        return serde_json::from_value(config).expect("kernel config");
    };
    let grants = config["grants"].as_array_mut().expect("grants");
    let caps = grants[1]["capabilities"]
        .as_array_mut()
        .expect("capabilities");
    caps.push(
        json!({"namespace": "egress", "path": [route], "scope": "exact", "actions": ["request"]}),
    );
    serde_json::from_value(config).expect("kernel config")
}

/// One vendor turn's setup.
pub struct VendorCase {
    pub vendor: Vendor,
    pub prompt: Value,
    pub tools: Vec<&'static str>,
    pub timeout_ms: u64,
    /// Seat the CLI over streamable HTTP (`mcp = "http"`) instead of the
    /// spec's stdio relay: [`http_variant`].
    pub http: bool,
    /// The request's `maxToolCalls` (1000 when `None`).
    pub max_tool_calls: Option<u64>,
    /// Grant the agent the route (`egress` / `[<route>]` / `request`, as
    /// docs/HARNESS.md, "The grants a route needs" says); `false` leaves
    /// it out.
    pub route_granted: bool,
    /// The engine the CLI runs in (the tests' cases: the namespace
    /// sandbox; tests/tests/engines.rs: each engine).
    pub engine: Engine,
}

/// What a vendor turn left.
pub struct VendorTurn {
    pub result: ExecutionResult,
    pub events: Vec<ExecutionEvent>,
    pub audit: Vec<AuditRecord>,
    /// The audit file as written (to look for keys).
    pub audit_text: String,
    pub marker: String,
    /// When `execute()` was called.
    pub started: Instant,
    pub elapsed: Duration,
}

impl VendorTurn {
    pub fn json(&self) -> Value {
        serde_json::to_value(&self.result).expect("result")
    }
    pub fn events(&self, kind: &str) -> Vec<Value> {
        self.events
            .iter()
            .filter(|e| e.kind.as_str() == kind)
            .map(|e| e.data.clone().into_value())
            .collect()
    }
    pub fn audit_of(&self, kind: &str) -> Vec<&AuditRecord> {
        self.audit.iter().filter(|r| r.kind == kind).collect()
    }
}

/// A marker unique to this turn.
pub fn unique_marker() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "v{}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// The real kernel over `dir/files` with the route granted, its JSONL
/// audit trail at `dir/audit.jsonl`.
fn kernel_in(dir: &Path, route: Option<&str>) -> (Arc<Kernel>, PathBuf) {
    let files_root = dir.join("files");
    let notes = files_root
        .join(crate::turns::NAMESPACE)
        .join(crate::turns::AGENT)
        .join("notes");
    std::fs::create_dir_all(notes).unwrap();
    let audit_path = dir.join("audit.jsonl");
    let kernel = Kernel::builder_from_config(
        &kernel_config_with_route(route),
        &files_root,
        Arc::new(JsonlAuditSink::open(&audit_path).unwrap()),
    )
    .expect("kernel builder")
    .build();
    (Arc::new(kernel), audit_path)
}

/// The host.toml of one vendor turn in `dir`.
fn host_toml(case: &VendorCase, dir: &Path, mock: &MockModel, marker: &str) -> String {
    let key_file = dir.join("model.key");
    std::fs::write(&key_file, REAL_KEY).unwrap();
    let spec = spec_text(case.vendor, &cli_dir(case.vendor), mock, &key_file, marker);
    let spec = if case.http {
        http_variant(case.vendor, &spec)
    } else {
        spec
    };
    format!("[host]\nauditPath = \"audit.jsonl\"\nfilesRoot = \"files\"\n\n{spec}")
}

/// The host.toml of `case` in its engine, in `dir`, its model `mock`.
pub fn vendor_text(case: &VendorCase, dir: &Path, mock: &MockModel, marker: &str) -> String {
    case.engine.configure(&host_toml(case, dir, mock, marker))
}

/// Runs one turn of `case.vendor` against `mock`, with `marker` in the
/// environment of every process of the turn.
pub async fn run_vendor(case: VendorCase, mock: &MockModel, marker: &str) -> VendorTurn {
    let engine = case.engine;
    let configure = move |text: &str| engine.configure(text);
    let launcher_for = move |e: &RuntimeEntry| Ok(engine.launcher(e));
    run_vendor_in(case, mock, marker, &configure, &launcher_for).await
}

/// Each entry's launcher, for [`run_vendor_in`].
pub type LauncherFor<'a> = &'a dyn Fn(&RuntimeEntry) -> Result<Arc<dyn Launcher>, SeatError>;

/// [`run_vendor`] with the host.toml passed through `configure` and each
/// entry's launcher from `launcher_for` (`case.engine` unused): an engine
/// the shared suites do not list, such as the microVM
/// (tests/tests/microvm_harness.rs).
pub async fn run_vendor_in(
    case: VendorCase,
    mock: &MockModel,
    marker: &str,
    configure: &dyn Fn(&str) -> String,
    launcher_for: LauncherFor<'_>,
) -> VendorTurn {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = configure(&host_toml(&case, dir.path(), mock, marker));
    let config = HostConfig::parse(&text, "vendor.toml", dir.path())
        .unwrap_or_else(|e| panic!("the configuration: {e}\n{text}"));
    let registry =
        registry_from_config(&config, launcher_for).unwrap_or_else(|e| panic!("the seats: {e}"));
    let seat = registry
        .resolve(config.runtimes[0].id.as_str())
        .expect("the seat")
        .clone();
    let route = case.route_granted.then_some(case.vendor.route().0);
    let (kernel, audit_path) = kernel_in(dir.path(), route);
    let executor = Executor::new(kernel, seat, ExecutorOptions::default()).expect("executor");
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
    let events: Arc<Mutex<Vec<ExecutionEvent>>> = Arc::default();
    let sink = events.clone();
    let on_event: OnEvent = Arc::new(move |e| {
        sink.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(e.clone());
    });
    let started = Instant::now();
    let options = ExecuteOptions {
        cancel: None,
        on_event: Some(on_event),
    };
    let result = executor
        .execute_json(&req.to_string(), options)
        .await
        .expect("a valid request");
    let elapsed = started.elapsed();
    drop(executor);
    drop(registry);
    sharedos_host::process::settle_kills();
    let events = events.lock().unwrap_or_else(|p| p.into_inner()).clone();
    VendorTurn {
        result,
        events,
        audit: sharedos_kernel::audit::read_jsonl(&audit_path).unwrap_or_default(),
        audit_text: std::fs::read_to_string(&audit_path).unwrap_or_default(),
        marker: marker.to_owned(),
        started,
        elapsed,
    }
}

/// What every vendor turn keeps: the real key reached only the upstream,
/// in the header `vendor`'s route writes it (never the result, the events
/// or the audit), and every model request went through the gateway and
/// was answered 200.
pub fn assert_key_kept(turn: &VendorTurn, seen: &[SeenRequest], vendor: Vendor) {
    assert!(!seen.is_empty(), "the mock model saw no request");
    let wire = vendor.wire();
    let want = match wire {
        Wire::OpenaiChat | Wire::OpenaiResponses => format!("Bearer {REAL_KEY}"),
        Wire::AnthropicMessages | Wire::Gemini => REAL_KEY.to_owned(),
    };
    for s in seen {
        let key = s.header(wire.key_header());
        assert_eq!(key, Some(want.as_str()), "{vendor:?}: {}", s.path);
    }
    let everything = format!("{:?}{}", turn.json(), turn.audit_text);
    assert!(!everything.contains(REAL_KEY), "{vendor:?}: the key leaked");
    let requests = turn.events("egress.request");
    assert_eq!(requests.len(), seen.len(), "{vendor:?}: {requests:?}");
    assert!(
        requests.iter().all(|r| r["status"] == 200),
        "{vendor:?}: {requests:?}"
    );
}

/// Whether `name` is a function name every model API accepts: OpenAI's
/// and Anthropic's `^[a-zA-Z0-9_-]{1,64}$`, and Google's rule for Gemini
/// (the Gemini API also allows `.` and `:`, but Vertex AI and Firebase AI
/// Logic require a letter or `_` first), so the strictest of them:
/// `^[a-zA-Z_][a-zA-Z0-9_-]{0,63}$`.
pub fn every_model_api_accepts(name: &str) -> bool {
    is_api_tool_name(name) && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
}
