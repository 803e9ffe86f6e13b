//! Seating a configured runtime: the trusted registry entry, launched as a
//! child process through the configured launcher.

pub(crate) mod harness;
pub(crate) mod standard;

use std::sync::Arc;
use std::time::Duration;

use crate::config::{HostConfig, LauncherKind, RuntimeEntry};
use sharedos_egress::{EgressSeat, Gateway, GatewayLimits, NetworkPolicy};
use sharedos_plugin_sdk::{RuntimeHost, Signal};
use sharedos_protocol::RuntimeTurnRequest;
use sharedos_protocol::{EGRESS_URL_ENV, MODEL_KEY_ENV, PLACEHOLDER_MODEL_KEY};

use crate::executor::{
    DEFAULT_MAX_TURN_BYTES, ExecutorOptions, OnTurnError, Seat, SeatedRuntime, SeatedTurn,
    SessionSeat, TurnReport,
};
use crate::process::{
    AffinityKey, DirectLauncher, Launcher, LoadError, ProcessRuntime, ProcessRuntimeConfig,
};
use crate::registry::{RegistryError, RuntimeRegistry};
use crate::sandboxed::SandboxLauncher;

impl SeatedRuntime for ProcessRuntime {
    /// One turn in a fresh process. Its report gets the launcher's report
    /// at launch (the sandbox report, the refusal's report, or the direct
    /// launcher's explicit `level: none`), and the diagnosis of a turn
    /// that ended without an outcome.
    fn turn(
        &self,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
    ) -> SeatedTurn<'_> {
        let report = self.unrun();
        let filled = report.clone();
        SeatedTurn {
            outcome: Box::pin(
                async move { self.run_reported(request, host, abort, &filled).await },
            ),
            report,
        }
    }

    /// Until a launch was tried, a process seat's turn says so.
    fn unrun(&self) -> TurnReport {
        TurnReport::with_sandbox(serde_json::json!({
            "level": "none",
            "reason": "the turn ended before a plugin process was running"
        }))
    }
}

impl SessionSeat for ProcessRuntime {
    fn run_in_session(
        &self,
        key: AffinityKey,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
    ) -> SeatedTurn<'_> {
        let report = self.unrun();
        let filled = report.clone();
        SeatedTurn {
            outcome: Box::pin(async move {
                ProcessRuntime::run_in_session(self, key, request, host, abort, &filled).await
            }),
            report,
        }
    }
    fn turn_ended(&self, execution_id: &str, keep: bool) {
        self.session_turn_ended(execution_id, keep);
    }
    fn release_session(&self, session: &str) {
        ProcessRuntime::release_session(self, session);
    }
    fn release_all(&self) {
        self.release_parked();
    }
}

/// Why a configured runtime could not be seated.
#[derive(Debug, thiserror::Error)]
pub enum SeatError {
    #[error("runtime {runtime:?}: {source}")]
    Load { runtime: String, source: LoadError },
    #[error("runtime {runtime:?}: {message}")]
    Invalid { runtime: String, message: String },
    /// The runtime's engine cannot run on this host (runsc missing, ...);
    /// the error names the fix.
    #[error("runtime {runtime:?}: {source}")]
    Engine {
        runtime: String,
        source: crate::process::GvisorError,
    },
    /// The microVM engine cannot run on this host (QEMU or the guest
    /// kernel missing, ...); the error names the fix.
    #[error("runtime {runtime:?}: {source}")]
    Microvm {
        runtime: String,
        source: crate::process::MicrovmError,
    },
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

/// The process runtime of one entry.
pub fn process_runtime(
    config: &HostConfig,
    entry: &RuntimeEntry,
    launcher: Arc<dyn Launcher>,
) -> Result<Arc<ProcessRuntime>, SeatError> {
    let mut pc = ProcessRuntimeConfig::new(config.program_path(entry), entry.manifest());
    pc.program_sha256 = entry.program_pin();
    // Checked at load (seat/harness.rs): a pin that does not parse
    // never gets here.
    pc.cli_sha256 = entry
        .harness
        .as_ref()
        .and_then(|h| h.sha256.as_deref())
        .and_then(|hex| sharedos_sandbox::ProgramDigest::parse(hex).ok());
    pc.args = entry.args.clone();
    if let Some(t) = &entry.transcript {
        pc.args.push("--transcript".into());
        pc.args
            .push(serde_json::to_string(t).map_err(|e| SeatError::Invalid {
                runtime: entry.id.to_string(),
                message: format!("transcript: {e}"),
            })?);
    }
    if let Some(arg) = entry
        .harness
        .as_ref()
        .and_then(|spec| harness::launch_arg(entry.manifest(), spec))
    {
        pc.args.push("--harness".into());
        pc.args.push(arg);
    }
    pc.env = entry
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if entry.launcher == crate::config::LauncherKind::Direct {
        // The sandbox filters by its policy's allowlist; a direct child
        // gets the same environment.
        pc.env.retain(|(k, _)| {
            let allowed = entry.sandbox.env_allowed(k);
            if !allowed {
                tracing::warn!(runtime = %entry.id, "env key {k:?} is not in envAllowlist; it is not passed to the plugin");
            }
            allowed
        });
    }
    if let Some(d) = &entry.driver {
        pc.args.extend(d.args());
        // A placeholder, so a program that insists on a key has one; the
        // real key stays in the host's gateway.
        pc.env
            .push((MODEL_KEY_ENV.into(), PLACEHOLDER_MODEL_KEY.into()));
    }
    pc.egress = egress_seat(entry)?;
    if pc.egress.is_some() {
        pc.env
            .push((EGRESS_URL_ENV.into(), sharedos_egress::egress_url()));
    }
    pc.handshake_timeout = Duration::from_millis(entry.handshake_timeout_ms);
    pc.max_inflight_tool_calls = entry.max_inflight_tool_calls as usize;
    pc.affinity = entry.affinity;
    let runtime = ProcessRuntime::new(pc, launcher).map_err(|source| SeatError::Load {
        runtime: entry.id.to_string(),
        source,
    })?;
    Ok(Arc::new(runtime))
}

/// The entry's gateway, built now so a missing secret or CA file fails the
/// start, not a turn; `None` for `network = "none"`.
fn egress_seat(entry: &RuntimeEntry) -> Result<Option<Arc<EgressSeat>>, SeatError> {
    let NetworkPolicy::Routes(routes) = &entry.network else {
        return Ok(None);
    };
    let gateway = Gateway::from_policy(routes, GatewayLimits::default()).map_err(|message| {
        SeatError::Invalid {
            runtime: entry.id.to_string(),
            message: format!("network: {message}"),
        }
    })?;
    Ok(Some(Arc::new(EgressSeat::new(gateway))))
}

/// A seat for a process runtime.
pub fn process_seat(runtime: Arc<ProcessRuntime>) -> Seat {
    let affine = runtime.config().affinity.is_some();
    Seat {
        manifest: runtime.config().manifest.clone(),
        runtime: runtime.clone(),
        egress: runtime.config().egress.clone(),
        sessions: affine.then_some(runtime as Arc<dyn SessionSeat>),
    }
}

/// How the runtime of an entry is launched: [`configured_launcher`], or a
/// host's own choice (a test's direct launcher, a launcher at another path).
pub type LauncherFor = dyn Fn(&RuntimeEntry) -> Result<Arc<dyn Launcher>, SeatError>;

/// The launcher an entry configures: the sandbox helper (the current
/// executable, re-executed as `__sandbox-exec`) with the entry's policy,
/// runsc with a container built from that policy (`launcher = "gvisor"`),
/// or a direct child when the entry says `launcher = "direct"`.
pub fn configured_launcher(entry: &RuntimeEntry) -> Result<Arc<dyn Launcher>, SeatError> {
    match entry.launcher {
        LauncherKind::Direct => Ok(Arc::new(DirectLauncher)),
        LauncherKind::Sandbox => {
            let l = SandboxLauncher::current_exe(entry.sandbox_policy()).map_err(|e| {
                SeatError::Invalid {
                    runtime: entry.id.to_string(),
                    message: format!("cannot find the sharedos binary: {e}"),
                }
            })?;
            Ok(Arc::new(l))
        }
        LauncherKind::Gvisor => {
            let runsc = entry.gvisor.as_ref().and_then(|g| g.runsc.as_deref());
            let l = crate::process::GvisorLauncher::new(entry.sandbox_policy(), runsc).map_err(
                |source| SeatError::Engine {
                    runtime: entry.id.to_string(),
                    source,
                },
            )?;
            Ok(Arc::new(l))
        }
        LauncherKind::Microvm => {
            let settings = entry.microvm_settings();
            let l = crate::process::MicrovmLauncher::new(entry.sandbox_policy(), &settings)
                .map_err(|source| SeatError::Microvm {
                    runtime: entry.id.to_string(),
                    source,
                })?;
            Ok(Arc::new(l))
        }
    }
}

/// The executor options `[host]` configures (steps, tool calls, timeout,
/// drain grace, the turn's byte budget), reporting turn errors to
/// `on_turn_error`.
pub fn executor_options(config: &HostConfig, on_turn_error: OnTurnError) -> ExecutorOptions {
    ExecutorOptions {
        default_max_steps: config.host.default_max_steps,
        default_max_tool_calls: config.host.default_max_tool_calls,
        default_timeout_ms: config.host.default_timeout_ms,
        drain_grace_ms: config.host.drain_grace_ms,
        max_turn_bytes: config.host.max_turn_bytes.unwrap_or(DEFAULT_MAX_TURN_BYTES),
        on_turn_error: Some(on_turn_error),
        ..ExecutorOptions::default()
    }
}

/// The registry of every configured runtime, each through `launcher_for`.
pub fn registry_from_config(
    config: &HostConfig,
    launcher_for: impl Fn(&RuntimeEntry) -> Result<Arc<dyn Launcher>, SeatError>,
) -> Result<RuntimeRegistry, SeatError> {
    let mut registry = RuntimeRegistry::new();
    for entry in &config.runtimes {
        let runtime = process_runtime(config, entry, launcher_for(entry)?)?;
        registry.register(process_seat(runtime))?;
    }
    Ok(registry)
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::process_runtime;
    use crate::config::HostConfig;
    use crate::process::{DirectLauncher, ProcessRuntime};

    /// The process runtime of a host.toml with one runtime entry whose
    /// last line is `extra` (empty for none).
    fn runtime(extra: &str) -> Arc<ProcessRuntime> {
        let text = format!(
            r#"
[host]
auditPath = "audit.jsonl"
filesRoot = "files"

[[runtimes]]
id = "r"
version = "1"
program = "/bin/true"
{extra}
"#
        );
        let config = HostConfig::parse(&text, "host.toml", Path::new("/tmp")).unwrap();
        process_runtime(&config, &config.runtimes[0], Arc::new(DirectLauncher)).unwrap()
    }

    #[test]
    fn the_runtime_gets_its_configured_inflight_limit() {
        let rt = runtime("maxInflightToolCalls = 200");
        assert_eq!(rt.config().max_inflight_tool_calls, 200);
        let rt = runtime("");
        assert_eq!(rt.config().max_inflight_tool_calls, 64);
    }

    #[test]
    fn a_runtime_with_affinity_gets_a_session_seat_and_one_without_does_not() {
        let rt = runtime("affinity = { ttlMs = 30000 }");
        assert_eq!(rt.config().affinity.map(|a| a.ttl_ms), Some(30_000));
        assert!(super::process_seat(rt).sessions.is_some());
        let rt = runtime("");
        assert_eq!(rt.config().affinity, None);
        assert!(super::process_seat(rt).sessions.is_none());
    }
}
