//! The host's configuration: runtimes, agents, grants and tools, limits,
//! the sandbox minimum. TOML, camelCase keys, strict: an unknown key is an
//! error naming the file, the field and what is expected.
//!
//! ```toml
//! [host]
//! defaultTimeoutMs = 120000
//! drainGraceMs = 2000
//! auditPath = "audit.jsonl"     # relative to this file
//! filesRoot = "files"
//!
//! [[runtimes]]
//! id = "sharedos.standard"
//! version = "0.1.0"
//! program = "sharedos-standard" # a bare name is looked up next to the sharedos binary
//! transcript = [ { type = "complete", output = "done" } ]
//! maxInflightToolCalls = 64     # host/invokeTool requests of one turn waiting at once
//!
//! [[agents]]
//! agentId = "alice"
//! runtime = "sharedos.standard"
//!
//! [kernel]
//! # grants, file tools, escalation: see docs/KERNEL.md
//! ```

mod pin;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sharedos_kernel::config::KernelConfig;
use sharedos_protocol::{Identifier, JsonObject, MAX_EXECUTION_STEPS, RuntimeManifest, Version};
use sharedos_sandbox::SandboxPolicy;

use crate::limits::{
    DEFAULT_HANDSHAKE_TIMEOUT_MS, DEFAULT_MAX_STEPS, DEFAULT_TIMEOUT_MS, MAX_DEFAULT_TOOL_CALLS,
    MAX_TIMEOUT_MS, MAX_TURN_BYTES, MIN_TURN_BYTES,
};
pub use crate::limits::{
    DEFAULT_INFLIGHT_TOOL_CALLS, MAX_AFFINITY_TTL_MS, MAX_INFLIGHT_TOOL_CALLS, MAX_TOKENS_RANGE,
};
pub use crate::process::gvisor::config as gvisor;
pub use crate::process::microvm::config as microvm;
pub use crate::seat::standard::{DRIVER_KINDS, ModelDriver};

/// Limits and paths of the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HostSection {
    #[serde(default = "default_timeout")]
    pub default_timeout_ms: u64,
    #[serde(default = "default_steps")]
    pub default_max_steps: u32,
    #[serde(default)]
    pub default_max_tool_calls: Option<u32>,
    #[serde(default)]
    pub drain_grace_ms: u64,
    /// The per-turn byte ledger (docs/PROTOCOL.md section 5); the
    /// executor's default (16 MiB) when absent.
    #[serde(default)]
    pub max_turn_bytes: Option<usize>,
    /// The audit trail (JSONL, fsync'd). Relative paths are relative to the
    /// configuration file.
    pub audit_path: PathBuf,
    /// The root of the agents' namespace directories (files-as-memory).
    pub files_root: PathBuf,
}

impl HostSection {
    /// The host's defaults and bounds, each in its range.
    fn check(&self) -> Result<(), String> {
        let h = self;
        if !(1..=MAX_TIMEOUT_MS).contains(&h.default_timeout_ms) {
            return Err(format!(
                "host.defaultTimeoutMs: must be 1..={MAX_TIMEOUT_MS}, got {}",
                h.default_timeout_ms
            ));
        }
        if h.drain_grace_ms > MAX_TIMEOUT_MS {
            return Err(format!(
                "host.drainGraceMs: must be 0..={MAX_TIMEOUT_MS}, got {}",
                h.drain_grace_ms
            ));
        }
        if let Some(n) = h.max_turn_bytes
            && !(MIN_TURN_BYTES..=MAX_TURN_BYTES).contains(&n)
        {
            return Err(format!(
                "host.maxTurnBytes: must be {MIN_TURN_BYTES}..={MAX_TURN_BYTES} (256 KiB to 1 GiB), got {n}"
            ));
        }
        if !(1..=MAX_EXECUTION_STEPS).contains(&h.default_max_steps) {
            return Err(format!(
                "host.defaultMaxSteps: must be 1..={MAX_EXECUTION_STEPS}, got {}",
                h.default_max_steps
            ));
        }
        if let Some(n) = h.default_max_tool_calls
            && !(1..=MAX_DEFAULT_TOOL_CALLS).contains(&n)
        {
            return Err(format!(
                "host.defaultMaxToolCalls: must be 1..={MAX_DEFAULT_TOOL_CALLS}, got {n}"
            ));
        }
        Ok(())
    }
}

fn default_timeout() -> u64 {
    DEFAULT_TIMEOUT_MS
}
fn default_steps() -> u32 {
    DEFAULT_MAX_STEPS
}

/// One runtime entry: the trusted manifest and how to launch it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RuntimeEntry {
    pub id: Identifier,
    pub version: Identifier,
    #[serde(default)]
    pub metadata: Option<JsonObject>,
    /// The plugin binary: an absolute path, a path relative to this file,
    /// or a bare name found next to the `sharedos` binary.
    pub program: String,
    /// The content pin: the SHA-256 of the program's bytes, 64 lowercase
    /// hex digits (`sha256sum <program>`). Checked at seating and at every
    /// spawn; the host executes the copy it hashed (docs/SECURITY.md,
    /// "Content pin").
    #[serde(default)]
    pub sha256: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment passed to the plugin (nothing of the host's is
    /// inherited).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// For the standard runtime: the transcript driver's decisions, passed
    /// as `--transcript <json>`.
    #[serde(default)]
    pub transcript: Option<Value>,
    /// How long `initialize` may take.
    #[serde(default = "default_handshake")]
    pub handshake_timeout_ms: u64,
    /// How many `host/invokeTool` requests of one turn may wait at once
    /// (protocol.md B.4); one more is answered `-32055` overloaded. Real
    /// harnesses issue many parallel calls, hence 64 by default; 1..=1024.
    #[serde(default = "default_inflight")]
    pub max_inflight_tool_calls: u32,
    /// How the plugin is launched: `sandbox` (the default), `gvisor`
    /// (under gVisor's runsc, docs/SECURITY.md "gVisor") or `direct` (no
    /// sandbox at all; the result's provenance says so).
    #[serde(default)]
    pub launcher: LauncherKind,
    /// `launcher = "gvisor"` only: where runsc is (absent: found on PATH
    /// when the runtime is seated).
    #[serde(default)]
    pub gvisor: Option<gvisor::GvisorSection>,
    /// `launcher = "microvm"` only: QEMU, the guest kernel and init, the
    /// VM's RAM and vCPUs (docs/SECURITY.md, "microVM").
    #[serde(default)]
    pub microvm: Option<microvm::MicrovmSection>,
    /// The sandbox policy of this runtime (see docs/SECURITY.md). Absent:
    /// the full sandbox, refusing to start below `isolated`.
    #[serde(default)]
    pub sandbox: SandboxPolicy,
    /// Egress: `"none"` (the default) or model routes and destinations
    /// served by the host's gateway (docs/EGRESS.md).
    #[serde(default)]
    pub network: sharedos_egress::NetworkPolicy,
    /// For the standard runtime: a model driver instead of a transcript.
    #[serde(default)]
    pub driver: Option<ModelDriver>,
    /// For the harness runtime (`sharedos-harness`): the vendor CLI it
    /// seats, passed as `--harness <json>` (docs/HARNESS.md).
    #[serde(default)]
    pub harness: Option<sharedos_protocol::harness::HarnessSpec>,
    /// Session affinity, off when absent: `{ ttlMs = N }` lets consecutive
    /// turns of one session reuse one process for up to N ms between them
    /// (docs/SECURITY.md, "Session affinity").
    #[serde(default)]
    pub affinity: Option<AffinityConfig>,
}

impl RuntimeEntry {
    /// The sandbox policy the launcher gets: the configured one, with the
    /// egress gateway's listener when the runtime has a network policy.
    pub fn sandbox_policy(&self) -> SandboxPolicy {
        let mut policy = self.sandbox.clone();
        policy.egress_port = match self.network {
            sharedos_egress::NetworkPolicy::None => None,
            sharedos_egress::NetworkPolicy::Routes(_) => Some(sharedos_egress::EGRESS_PORT),
        };
        policy.program_sha256 = self.program_pin();
        // The harness mode, for a harness serving MCP over HTTP only.
        policy.mcp_port = self
            .harness
            .as_ref()
            .filter(|h| h.mcp == sharedos_protocol::harness::McpTransport::Http)
            .map(|_| sharedos_protocol::harness::MCP_HTTP_PORT);
        policy
    }
}

/// How a runtime's plugin process is started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LauncherKind {
    /// Through the sandbox helper (the default).
    #[default]
    Sandbox,
    /// A plain child process in its own process group: no isolation. For
    /// trusted plugins and measurements only.
    Direct,
    /// Under gVisor's runsc: an OCI container built from the same policy,
    /// the plugin's system calls served by gVisor's user-space kernel.
    Gvisor,
    /// In a QEMU microVM of its own: a guest kernel, an image built from
    /// the same policy, the VM's RAM as the memory bound.
    Microvm,
}

fn default_handshake() -> u64 {
    DEFAULT_HANDSHAKE_TIMEOUT_MS
}

fn default_inflight() -> u32 {
    DEFAULT_INFLIGHT_TOOL_CALLS
}

impl RuntimeEntry {
    /// The entry's program, handshake, in-flight, warm pool, uid range and
    /// network shape (`i` its index, for the error).
    fn check_limits(&self, i: usize) -> Result<(), String> {
        let r = self;
        if r.program.trim().is_empty() {
            return Err(format!(
                "runtimes[{i}].program: must name the plugin binary"
            ));
        }
        if r.handshake_timeout_ms == 0 {
            return Err(format!(
                "runtimes[{i}].handshakeTimeoutMs: must be positive"
            ));
        }
        if !(1..=MAX_INFLIGHT_TOOL_CALLS).contains(&r.max_inflight_tool_calls) {
            return Err(format!(
                "runtimes[{i}].maxInflightToolCalls: must be 1..={MAX_INFLIGHT_TOOL_CALLS}, got {}",
                r.max_inflight_tool_calls
            ));
        }
        if r.sandbox.warm > sharedos_sandbox::MAX_WARM {
            return Err(format!(
                "runtimes[{i}].sandbox.warm: must be 0..={}, got {}",
                sharedos_sandbox::MAX_WARM,
                r.sandbox.warm
            ));
        }
        // The sandbox uid range is checked at start, against this
        // machine's accounts and the host's own ids: a bad range
        // refuses the config rather than sharing a uid with anyone.
        if matches!(
            r.launcher,
            LauncherKind::Sandbox | LauncherKind::Gvisor | LauncherKind::Microvm
        ) {
            sharedos_sandbox::uid::check_range(&r.sandbox.uids)
                .map_err(|e| format!("runtimes[{i}].sandbox.uids: {e}"))?;
        }
        r.network.check(&format!("runtimes[{i}].network"))?;
        if let Some(a) = &r.affinity {
            a.check(&format!("runtimes[{i}].affinity"))?;
            if r.network != sharedos_egress::NetworkPolicy::None {
                return Err(format!(
                    "runtimes[{i}].affinity: not available with a network policy (the gateway serves one turn at a time); remove one of them"
                ));
            }
        }
        if r.sandbox.egress_port.is_some() {
            return Err(format!(
                "runtimes[{i}].sandbox.egressPort: set by the host from runtimes[{i}].network; remove it"
            ));
        }
        pin::check(i, r)?;
        gvisor::check(i, r.launcher == LauncherKind::Gvisor, r.gvisor.as_ref())?;
        microvm::check(
            i,
            r.launcher == LauncherKind::Microvm,
            r.microvm.as_ref(),
            r.sandbox.cgroup.memory_max,
        )?;
        if r.sandbox.mcp_port.is_some() {
            return Err(format!(
                "runtimes[{i}].sandbox.mcpPort: set by the host from runtimes[{i}].harness.mcp; remove it"
            ));
        }
        Ok(())
    }

    /// The microVM launcher's settings for this entry.
    pub fn microvm_settings(&self) -> crate::process::microvm::MicrovmSettings {
        let cli = self.harness.as_ref().map(|h| PathBuf::from(&h.command));
        microvm::settings(self.microvm.as_ref(), self.sandbox.cgroup.memory_max, cli)
    }

    /// The trusted manifest of the entry.
    pub fn manifest(&self) -> RuntimeManifest {
        RuntimeManifest {
            id: self.id.clone(),
            version: self.version.clone(),
            protocol_version: Version::V1,
            metadata: self.metadata.clone(),
        }
    }
}

/// `affinity` of a runtime entry: how long a process may wait, parked,
/// for the next turn of its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AffinityConfig {
    pub ttl_ms: u64,
}

impl AffinityConfig {
    /// Refuses a TTL out of `1..=MAX_AFFINITY_TTL_MS`; `at` names the entry.
    pub fn check(&self, at: &str) -> Result<(), String> {
        if !(1..=MAX_AFFINITY_TTL_MS).contains(&self.ttl_ms) {
            return Err(format!(
                "{at}.ttlMs: must be 1..={MAX_AFFINITY_TTL_MS} (at most 5 minutes), got {}",
                self.ttl_ms
            ));
        }
        Ok(())
    }

    pub fn ttl(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.ttl_ms)
    }
}

/// Which runtime serves an agent. Chosen by the host, never by a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AgentEntry {
    pub agent_id: Identifier,
    pub runtime: Identifier,
}

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HostConfig {
    pub host: HostSection,
    #[serde(default)]
    pub runtimes: Vec<RuntimeEntry>,
    #[serde(default)]
    pub agents: Vec<AgentEntry>,
    #[serde(default)]
    pub kernel: KernelConfig,
    /// `[serve]`: what `sharedos serve` alone reads, kept unread here;
    /// the `sharedos-serve` crate parses and checks it
    /// (`sharedos_serve::config::ServeConfig`).
    #[serde(default)]
    pub serve: toml::Table,
    /// The directory relative paths are resolved against.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// A configuration file's text, its name for errors and the directory
/// its relative paths are resolved against.
pub struct ConfigText {
    pub text: String,
    pub file: String,
    pub base_dir: PathBuf,
}

impl ConfigText {
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            message: format!("cannot be read: {e}"),
        })?;
        let base_dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Ok(Self {
            text,
            file,
            base_dir,
        })
    }
}

/// A configuration that cannot be used, with the file and what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {message}")]
pub struct ConfigError {
    pub file: String,
    pub message: String,
}

impl HostConfig {
    /// Reads and checks a configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let f = ConfigText::read(path)?;
        Self::parse(&f.text, &f.file, &f.base_dir)
    }

    /// Parses and checks configuration text; `file` names it in errors.
    pub fn parse(text: &str, file: &str, base_dir: &Path) -> Result<Self, ConfigError> {
        let err = |message: String| ConfigError {
            file: file.to_owned(),
            message,
        };
        let mut config: HostConfig =
            toml::from_str(text).map_err(|e| err(describe_toml_error(&e)))?;
        // The kernel's section accepts unknown keys at its top level (so a
        // host may flatten it); nested under `[kernel]` it must be strict.
        let raw: toml::Table = toml::from_str(text).map_err(|e| err(describe_toml_error(&e)))?;
        if let Some(toml::Value::Table(kernel)) = raw.get("kernel") {
            for key in kernel.keys() {
                if !KERNEL_KEYS.contains(&key.as_str()) {
                    return Err(err(format!(
                        "kernel.{key}: unknown field, expected one of {}",
                        KERNEL_KEYS.join(", ")
                    )));
                }
            }
        }
        crate::process::direct::config::check(&raw).map_err(err)?;
        config.base_dir = base_dir.to_path_buf();
        // The gateway's effects are the host's own namespace: grants may
        // name it wherever a runtime has a network policy.
        let egress = sharedos_egress::EGRESS_NAMESPACE;
        if config
            .runtimes
            .iter()
            .any(|r| r.network != sharedos_egress::NetworkPolicy::None)
            && !config.kernel.namespaces.iter().any(|n| n == egress)
        {
            config.kernel.namespaces.push(egress.to_owned());
        }
        config.check().map_err(err)?;
        Ok(config)
    }

    fn check(&self) -> Result<(), String> {
        self.host.check()?;
        let mut ids = std::collections::HashSet::new();
        for (i, r) in self.runtimes.iter().enumerate() {
            if !ids.insert(r.id.as_str()) {
                return Err(format!(
                    "runtimes[{i}].id: runtime {:?} is defined twice",
                    r.id.as_str()
                ));
            }
            r.check_limits(i)?;
            self.check_runtime(i, r)?;
        }
        self.check_agents(&ids)?;
        self.kernel.validate().map_err(|e| format!("kernel: {e}"))?;
        Ok(())
    }

    /// A runtime entry's network, driver or harness, environment and
    /// sandbox policy (`i` its index, for the error).
    fn check_runtime(&self, i: usize, r: &RuntimeEntry) -> Result<(), String> {
        if r.network != sharedos_egress::NetworkPolicy::None
            && matches!(r.launcher, LauncherKind::Direct)
        {
            return Err(format!(
                "runtimes[{i}].network: needs launcher = \"sandbox\" (the gateway's listener lives in the sandbox's own network namespace; a direct launch would have the host's network)"
            ));
        }
        if let Some(d) = &r.driver {
            if r.transcript.is_some() {
                return Err(format!(
                    "runtimes[{i}]: give a transcript or a driver, not both"
                ));
            }
            d.check(&format!("runtimes[{i}]"), &r.network)?;
        }
        if let Some(h) = &r.harness {
            if r.transcript.is_some() || r.driver.is_some() {
                return Err(format!(
                    "runtimes[{i}]: a harness runtime takes no transcript or driver"
                ));
            }
            crate::seat::harness::check(&crate::seat::harness::HarnessEntry {
                index: i,
                manifest: r.manifest(),
                spec: h,
                sandbox_view: matches!(r.launcher, LauncherKind::Sandbox | LauncherKind::Gvisor),
                direct: r.launcher == LauncherKind::Direct,
                microvm: r.launcher == LauncherKind::Microvm,
                network: &r.network,
                sandbox: &r.sandbox,
            })?;
        }
        for k in r.env.keys() {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(format!(
                    "runtimes[{i}].env: {k:?} is not a valid variable name"
                ));
            }
        }
        // What the sandbox would drop or skip when the plugin starts
        // is refused now, naming the entry (docs/PLUGINS.md, section 4).
        if matches!(
            r.launcher,
            LauncherKind::Sandbox | LauncherKind::Gvisor | LauncherKind::Microvm
        ) {
            crate::runtime_policy::check_sandboxed(i, &r.env, &r.sandbox, &self.program_path(r))?;
        }
        Ok(())
    }

    /// Every agent bound once, to a runtime of `ids`.
    fn check_agents(&self, ids: &std::collections::HashSet<&str>) -> Result<(), String> {
        let mut agents = std::collections::HashSet::new();
        for (i, a) in self.agents.iter().enumerate() {
            if !ids.contains(a.runtime.as_str()) {
                return Err(format!(
                    "agents[{i}].runtime: no runtime {:?} is defined (defined: {})",
                    a.runtime.as_str(),
                    self.runtimes
                        .iter()
                        .map(|r| r.id.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            if !agents.insert(a.agent_id.as_str()) {
                return Err(format!(
                    "agents[{i}].agentId: agent {:?} is bound twice",
                    a.agent_id.as_str()
                ));
            }
        }
        Ok(())
    }

    /// Resolves a path of the configuration against its directory.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base_dir.join(p)
        }
    }

    /// The runtime bound to an agent.
    pub fn runtime_for(&self, agent_id: &str) -> Option<&RuntimeEntry> {
        let a = self
            .agents
            .iter()
            .find(|a| a.agent_id.as_str() == agent_id)?;
        self.runtimes.iter().find(|r| r.id == a.runtime)
    }

    /// The plugin binary of an entry.
    pub fn program_path(&self, entry: &RuntimeEntry) -> PathBuf {
        let p = Path::new(&entry.program);
        if p.is_absolute() {
            return p.to_path_buf();
        }
        if p.components().count() > 1 {
            return self.base_dir.join(p);
        }
        std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|d| d.join(p)))
            .unwrap_or_else(|| p.to_path_buf())
    }
}

/// The keys of the `[kernel]` section.
const KERNEL_KEYS: &[&str] = &[
    "grants",
    "namespaces",
    "files",
    "escalation",
    "hostPolicy",
    "usageStorePath",
    "auditWriteTimeoutMs",
];

/// A TOML error as the configuration's errors say it: the message, and
/// the byte it was found at.
pub fn describe_toml_error(e: &toml::de::Error) -> String {
    let msg = e.message().trim().to_owned();
    match e.span() {
        Some(span) => format!("{msg} (at byte {})", span.start),
        None => msg,
    }
}

#[cfg(test)]
mod tests;
