//! What a runtime gets on this host: its sandbox, built for real up to
//! the plugin's `execve` (the one function both `sharedos sandbox check
//! --runtime` and `GET /v1/preflight` call; the scope's half of the
//! preflight, agents and grants, is `sharedos_serve::preflight`;
//! docs/SERVE.md, "Preflight").

use std::sync::Arc;

use serde::Serialize;
use serde_json::{Value, json};
use sharedos_sandbox::{MissingLayer, SandboxLevel, SandboxReport, SpawnSpec};

use crate::config::{HostConfig, LauncherKind, RuntimeEntry};
use crate::process::gvisor::{GVISOR_LEVEL, GvisorLauncher};
use crate::process::microvm::{MICROVM_LEVEL, MicrovmLauncher};
use crate::process::{DirectLauncher, LaunchSpec};
use crate::seat::process_runtime;

/// Builds the runtime's sandbox up to the plugin's `execve` and returns
/// its report, with the root described; the plugin never runs. The helper
/// is the running binary (`sharedos`, which dispatches `__sandbox-exec`).
pub fn probe_sandbox(entry: &RuntimeEntry, spec: &LaunchSpec) -> Result<SandboxReport, String> {
    // The policy a turn's launcher gets (the egress listener, the harness
    // mode's port, and so the seccomp mode and the network rules), built by
    // the one function the seat calls too.
    let mut policy = entry.sandbox_policy();
    policy.describe = true;
    // The report must come back whatever the level; it is compared with
    // the runtime's minimum by the caller.
    policy.min_level = SandboxLevel::Minimal;
    policy.require_memory_bound = false;
    policy.warm = 0;
    let workspace = if sharedos_sandbox::needs_host_workspace(&policy) {
        Some(tempfile::tempdir().map_err(|e| format!("a probe workspace: {e}"))?)
    } else {
        None
    };
    let helper_exe =
        std::env::current_exe().map_err(|e| format!("cannot find the sharedos binary: {e}"))?;
    let prepared = sharedos_sandbox::prepare(&SpawnSpec {
        helper_exe,
        program: spec.program.clone(),
        args: spec.args.iter().map(Into::into).collect(),
        env: spec.env.clone(),
        policy,
        workspace: workspace.as_ref().map(|w| w.path().to_path_buf()),
    })
    .map_err(|e| format!("the sandbox could not be built: {e}"))?;
    let report = prepared.report().clone();
    // Discarded before its start order: killed, never executed.
    drop(prepared);
    Ok(report)
}

/// The launch spec a turn of `entry` gets (program, arguments,
/// environment and the plugin cookie), with no execution named.
pub fn launch_spec(config: &HostConfig, entry: &RuntimeEntry) -> Result<LaunchSpec, String> {
    let runtime =
        process_runtime(config, entry, Arc::new(DirectLauncher)).map_err(|e| e.to_string())?;
    Ok(runtime.launch_spec(String::new(), String::new()))
}

/// The sandbox a runtime gets on this host, and whether it meets the
/// runtime's `minLevel` and `requireMemoryBound`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeSandbox {
    pub runtime_id: String,
    /// `sandbox`, `gvisor` or `direct` (`runtimes.launcher`).
    pub engine: &'static str,
    /// The level a run reports (`metadata.runtime.sandbox.level`): `none`
    /// for a direct launch; `null` when the engine cannot run here.
    pub level: Option<String>,
    /// The whole tree's memory bound in bytes, or `"unbounded"`.
    pub memory_bound: Value,
    pub min_level: SandboxLevel,
    pub require_memory_bound: bool,
    pub meets_min_level: bool,
    pub meets_memory_bound: bool,
    /// The layers that keep the level below `strong`, each with its fix.
    pub missing: Vec<MissingLayer>,
    /// Why a run of this runtime would be refused here, and what to do;
    /// `null` when it would not.
    pub refused: Option<String>,
}

impl RuntimeSandbox {
    /// The verdict when the probe itself could not run (`why`): refused.
    pub fn probe_failed(entry: &RuntimeEntry, why: String) -> Self {
        Self {
            refused: Some(why),
            ..Self::new(entry, engine(entry.launcher))
        }
    }

    fn new(entry: &RuntimeEntry, engine: &'static str) -> Self {
        Self {
            runtime_id: entry.id.to_string(),
            engine,
            level: None,
            memory_bound: json!("unbounded"),
            min_level: entry.sandbox.min_level,
            require_memory_bound: entry.sandbox.require_memory_bound,
            meets_min_level: false,
            meets_memory_bound: !entry.sandbox.require_memory_bound,
            missing: Vec::new(),
            refused: None,
        }
    }
}

/// What runtime `entry` of `config` gets here: the same verdict `sharedos
/// sandbox check --runtime` prints, its sandbox built for real.
pub fn runtime_sandbox(config: &HostConfig, entry: &RuntimeEntry) -> RuntimeSandbox {
    match entry.launcher {
        LauncherKind::Direct => {
            let mut s = RuntimeSandbox::new(entry, "direct");
            s.level = Some("none".into());
            s.refused = Some(
                "launcher = \"direct\": no sandbox at all, the plugin runs as the host's uid and \
                 sees its whole filesystem: set launcher = \"sandbox\" (docs/PLUGINS.md, section 6)"
                    .into(),
            );
            s
        }
        LauncherKind::Gvisor => gvisor_sandbox(entry),
        LauncherKind::Microvm => microvm_sandbox(entry),
        LauncherKind::Sandbox => {
            let report = launch_spec(config, entry).and_then(|spec| probe_sandbox(entry, &spec));
            report.map_or_else(
                |e| RuntimeSandbox {
                    refused: Some(e),
                    ..RuntimeSandbox::new(entry, "sandbox")
                },
                |r| sandbox_verdict(entry, &r),
            )
        }
    }
}

/// The verdict on the report of `entry`'s sandbox (built with
/// [`probe_sandbox`]): its level and memory bound against the runtime's
/// `minLevel` and `requireMemoryBound`.
pub fn sandbox_verdict(entry: &RuntimeEntry, r: &SandboxReport) -> RuntimeSandbox {
    let mut s = RuntimeSandbox::new(entry, "sandbox");
    s.level = Some(r.level.to_string());
    if let Some(bytes) = r.memory.tree_bound_bytes {
        s.memory_bound = json!(bytes);
    }
    s.meets_min_level = r.level >= s.min_level;
    s.missing = r.missing.clone();
    let memory = r.require_memory_bound(s.require_memory_bound);
    s.meets_memory_bound = memory.is_ok();
    let mut why = Vec::new();
    if !s.meets_min_level {
        let fixes: Vec<String> = r.missing.iter().map(ToString::to_string).collect();
        why.push(format!(
            "the sandbox here is {}, below the runtime's minLevel {}: {}",
            r.level,
            s.min_level,
            fixes.join("; ")
        ));
    }
    if let Err(e) = memory {
        why.push(e.to_string());
    }
    if !why.is_empty() {
        s.refused = Some(why.join("; "));
    }
    s
}

fn gvisor_sandbox(entry: &RuntimeEntry) -> RuntimeSandbox {
    let mut s = RuntimeSandbox::new(entry, "gvisor");
    let runsc = entry.gvisor.as_ref().and_then(|g| g.runsc.as_deref());
    if let Err(e) = GvisorLauncher::new(entry.sandbox_policy(), runsc) {
        s.refused = Some(format!("gVisor cannot run here: {e}"));
        return s;
    }
    s.level = Some(GVISOR_LEVEL.to_string());
    s.meets_min_level = s.min_level <= GVISOR_LEVEL;
    if !s.meets_min_level || !s.meets_memory_bound {
        s.refused = Some(format!(
            "a gVisor container here is {GVISOR_LEVEL} with no memory bound (runsc \
             --ignore-cgroups): lower minLevel or requireMemoryBound, or use launcher = \"sandbox\""
        ));
    }
    s
}

/// A microVM runtime: QEMU, the kernel and an accelerator that boots must
/// be here (the launcher checks them, a probe guest included); the level
/// is the microVM's and the memory bound the VM's RAM.
fn microvm_sandbox(entry: &RuntimeEntry) -> RuntimeSandbox {
    let mut s = RuntimeSandbox::new(entry, "microvm");
    let settings = entry.microvm_settings();
    if let Err(e) = MicrovmLauncher::new(entry.sandbox_policy(), &settings) {
        s.refused = Some(format!("a microVM cannot run here: {e}"));
        return s;
    }
    s.level = Some(MICROVM_LEVEL.to_string());
    s.memory_bound = json!(settings.memory_mib.saturating_mul(1 << 20));
    s.meets_min_level = s.min_level <= MICROVM_LEVEL;
    s.meets_memory_bound = true;
    if !s.meets_min_level {
        s.refused = Some(format!(
            "a microVM is {MICROVM_LEVEL}: lower minLevel to {MICROVM_LEVEL} or below"
        ));
    }
    s
}

fn engine(launcher: LauncherKind) -> &'static str {
    match launcher {
        LauncherKind::Direct => "direct",
        LauncherKind::Gvisor => "gvisor",
        LauncherKind::Microvm => "microvm",
        LauncherKind::Sandbox => "sandbox",
    }
}
