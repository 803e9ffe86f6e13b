//! The sandboxed launcher: every plugin through `sharedos __sandbox-exec`,
//! the single-threaded helper that layers namespaces, a minimal root,
//! rlimits, capabilities, no_new_privs, Landlock and seccomp, and reports
//! what it enforced. The host refuses to start a plugin below the policy's
//! minimum level.

use std::ffi::OsString;
use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use sharedos_sandbox::{PreparedSandbox, SandboxError, SandboxPolicy, SandboxedChild, SpawnSpec};

use crate::process::{LaunchError, LaunchSpec, LaunchedChild, Launcher, LimitsWatch, ProcessTree};

/// Host workspaces are named `sharedos-ws-<host pid>-<random>`, so a host
/// can tell the workspaces a dead host left behind. Only a sandbox without
/// a mount namespace gets one; every other sandbox's workspace is a tmpfs
/// in its own mount namespace, which the host never sees or removes.
const WORKSPACE_PREFIX: &str = "sharedos-ws-";

/// Set once a sandbox reported that it could not have a mount namespace
/// (and so no tmpfs workspace): later launches of this process give their
/// sandbox a host workspace from the start.
static NO_PRIVATE_WORKSPACE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// What a sweep of stale workspaces did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Sweep {
    /// Workspaces of dead hosts removed.
    pub removed: Vec<PathBuf>,
    /// Workspaces that could not be removed, with the reason (also logged).
    pub failed: Vec<(PathBuf, String)>,
}

/// Removes from `dir` the workspaces of hosts that are gone (a host killed
/// with SIGKILL cannot remove its own, and older host versions kept every
/// workspace there). A workspace of a live host, or one whose name carries
/// no pid, is left alone. Each removal is iterative, holds a few fds
/// whatever the depth of the tree, and a failure is logged and reported,
/// never a panic: a tree a plugin built cannot take the host down.
pub fn sweep_stale_workspaces(dir: &std::path::Path) -> Sweep {
    let mut sweep = Sweep::default();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return sweep;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(WORKSPACE_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() || std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        // Not a symlink: remove only directories this host kind made.
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        match sharedos_sandbox::removal::remove_tree(&entry.path()) {
            Ok(_) => sweep.removed.push(entry.path()),
            Err(e) => {
                tracing::warn!(path = %entry.path().display(), error = %e, "could not remove a dead host's workspace");
                sweep.failed.push((entry.path(), e.to_string()));
            }
        }
    }
    sweep
}

/// Once per process, sweep the temp directory on a thread of its own: a
/// large tree takes a while on a slow disk, and no launch waits for it.
fn sweep_in_background() {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        let dir = std::env::temp_dir();
        let spawned = std::thread::Builder::new()
            .name("sharedos-sweep".into())
            .spawn(move || {
                sweep_stale_workspaces(&dir);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not start the stale-workspace sweep");
        }
    });
}

/// A host workspace: created in the temp directory, removed (iteratively)
/// on drop, a failure logged.
#[derive(Debug)]
struct HostWorkspace(PathBuf);

impl HostWorkspace {
    /// A host workspace when `policy` needs one, else `None` (the sandbox
    /// mounts its own).
    fn for_policy(policy: &SandboxPolicy) -> io::Result<Option<HostWorkspace>> {
        sweep_in_background();
        if !sharedos_sandbox::needs_host_workspace(policy)
            && !NO_PRIVATE_WORKSPACE.load(std::sync::atomic::Ordering::Relaxed)
        {
            return Ok(None);
        }
        HostWorkspace::create().map(Some)
    }

    fn create() -> io::Result<HostWorkspace> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("{WORKSPACE_PREFIX}{}-", std::process::id()))
            .tempdir()?;
        Ok(HostWorkspace(dir.keep()))
    }
}

impl Drop for HostWorkspace {
    fn drop(&mut self) {
        if let Err(e) = sharedos_sandbox::removal::remove_tree(&self.0) {
            tracing::warn!(path = %self.0.display(), error = %e, "could not remove a workspace");
        }
    }
}

/// Launches plugins inside the sandbox. With `policy.warm > 0` it keeps
/// that many sandboxes prepared for the spec it was last given (by
/// `prewarm`, which `ProcessRuntime::new` calls, or by a launch; see
/// [`WarmPool`]); clones share them.
#[derive(Debug, Clone)]
pub struct SandboxLauncher {
    /// The binary that serves `__sandbox-exec` (the `sharedos` binary).
    pub helper_exe: PathBuf,
    pub policy: SandboxPolicy,
    warm: Arc<WarmPool>,
}

impl SandboxLauncher {
    /// A launcher whose helper is `helper_exe`.
    pub fn new(helper_exe: PathBuf, policy: SandboxPolicy) -> Self {
        Self {
            helper_exe,
            policy,
            warm: Arc::new(WarmPool::new(WARM_WAIT, "sharedos-warm")),
        }
    }

    /// A launcher whose helper is this very binary.
    pub fn current_exe(policy: SandboxPolicy) -> io::Result<Self> {
        Ok(Self::new(std::env::current_exe()?, policy))
    }

    /// How many prepared sandboxes are ready now.
    pub fn warm_ready(&self) -> usize {
        self.warm.lock().ready.len()
    }

    /// The helper pids of the prepared sandboxes ready now (for operators'
    /// process accounting).
    pub fn warm_pids(&self) -> Vec<i32> {
        self.warm
            .lock()
            .ready
            .iter()
            .map(|s| s.sandbox.pid())
            .collect()
    }

    /// Wait up to `timeout` until no preparation is in flight; returns how
    /// many prepared sandboxes are ready then.
    pub fn wait_warm(&self, timeout: Duration) -> usize {
        self.warm.wait_idle(timeout)
    }

    fn warm_target(&self) -> usize {
        self.policy.warm.min(sharedos_sandbox::MAX_WARM) as usize
    }

    fn key(&self, spec: &LaunchSpec) -> WarmKey {
        let mut policy = self.policy.clone();
        if spec.program_sha256.is_some() {
            policy.program_sha256 = spec.program_sha256;
        }
        WarmKey {
            helper_exe: self.helper_exe.clone(),
            policy,
            program: spec.program.clone(),
            args: spec.args.clone(),
            env: spec.env.clone(),
        }
    }

    /// Build a sandbox now, with a fresh workspace, and start its plugin.
    /// A sandbox that cannot have a mount namespace on this host (and so no
    /// tmpfs workspace) is built again with a host workspace, and so is
    /// every later one of this process.
    fn launch_now(&self, key: &WarmKey) -> Result<LaunchedChild, LaunchError> {
        let make = || {
            HostWorkspace::for_policy(&key.policy).map_err(|source| LaunchError::Spawn {
                program: key.program.clone(),
                source,
            })
        };
        let workspace = make()?;
        let spawned = sharedos_sandbox::spawn(&key.spawn_spec(workspace.as_ref()));
        let (child, workspace) = match spawned {
            Err(SandboxError::Setup { stage, .. })
                if stage == "workspace" && workspace.is_none() =>
            {
                tracing::warn!(
                    "this host gives sandboxes no mount namespace: their workspaces are host directories from now on"
                );
                NO_PRIVATE_WORKSPACE.store(true, std::sync::atomic::Ordering::Relaxed);
                let workspace = make()?;
                let child = sharedos_sandbox::spawn(&key.spawn_spec(workspace.as_ref()));
                (child, workspace)
            }
            other => (other, workspace),
        };
        let child = child.map_err(|e| refused(&key.program, e))?;
        launched(&key.program, child, workspace)
    }
}

/// What a prepared sandbox was built for: it serves only a launch with the
/// same helper, policy, program, arguments and environment.
#[derive(Debug, Clone, PartialEq)]
struct WarmKey {
    helper_exe: PathBuf,
    policy: SandboxPolicy,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl WarmKey {
    fn spawn_spec(&self, workspace: Option<&HostWorkspace>) -> SpawnSpec {
        SpawnSpec {
            helper_exe: self.helper_exe.clone(),
            program: self.program.clone(),
            args: self.args.iter().map(OsString::from).collect(),
            env: self.env.clone(),
            policy: self.policy.clone(),
            workspace: workspace.map(|w| w.0.clone()),
        }
    }
}

/// A prepared sandbox and the host workspace it was built around, if any.
#[derive(Debug)]
struct Spare {
    sandbox: PreparedSandbox,
    workspace: Option<HostWorkspace>,
}

/// Sandboxes prepared ahead of turns (`policy.warm`), each built by a
/// thread of its own for the spec last given (host/src/process/warm.rs
/// says how the pool fills, waits and ends).
type WarmPool = crate::process::warm::WarmPool<WarmKey, Spare>;

/// The longest a launch waits for a sandbox being prepared.
const WARM_WAIT: Duration = Duration::from_secs(30);

impl crate::process::warm::WarmSpare for Spare {
    fn alive(&mut self) -> bool {
        self.sandbox.is_alive()
    }
}

/// A sandbox prepared for `key` around a fresh workspace.
fn prepare_spare(key: &WarmKey) -> Result<Spare, String> {
    HostWorkspace::for_policy(&key.policy)
        .map_err(|e| e.to_string())
        .and_then(|workspace| {
            sharedos_sandbox::prepare(&key.spawn_spec(workspace.as_ref()))
                .map(|sandbox| Spare { sandbox, workspace })
                .map_err(|e| format!("{}: {e}", key.program.display()))
        })
}

/// What refills the pool for `key`.
fn preparer(key: &WarmKey) -> impl Fn() -> Result<Spare, String> + Clone + Send + 'static {
    let key = key.clone();
    move || prepare_spare(&key)
}

/// A sandbox that could not be built (or is below the minimum) refuses the
/// launch, with the report of what was missing as provenance.
fn refused(program: &std::path::Path, e: SandboxError) -> LaunchError {
    let report = match &e {
        SandboxError::BelowMinimum {
            required,
            achieved,
            missing,
        } => Some(serde_json::json!({
            "level": achieved,
            "refused": true,
            "required": required,
            "missing": missing.iter().map(|m| m.to_string()).collect::<Vec<_>>(),
        })),
        other => Some(serde_json::json!({
            "level": "none",
            "refused": true,
            "reason": format!("the sandbox could not be built: {other}"),
        })),
    };
    let reason = match &e {
        SandboxError::BelowMinimum { .. } => e.to_string(),
        other => format!("the sandbox could not be built: {other}"),
    };
    LaunchError::Refused {
        program: program.to_path_buf(),
        reason,
        report: report.map(with_engine),
    }
}

fn launched(
    program: &std::path::Path,
    mut child: SandboxedChild,
    workspace: Option<HostWorkspace>,
) -> Result<LaunchedChild, LaunchError> {
    // What could not be checked when the configuration was loaded (a
    // key a caller passed outside the allowlist, a degraded layer) is
    // shown to the operator, not only kept in the result's metadata.
    for w in &child.report.warnings {
        tracing::warn!(program = %program.display(), "sandbox: {w}");
    }
    let report = serde_json::to_value(&child.report).ok().map(with_engine);
    let missing = || LaunchError::Spawn {
        program: program.to_path_buf(),
        source: io::Error::other("a stdio pipe is missing"),
    };
    let stdin = child.stdin.take().ok_or_else(missing)?;
    let stdout = child.stdout.take().ok_or_else(missing)?;
    let stderr = child.stderr.take().ok_or_else(missing)?;
    let egress_listener = child.egress_listener.take();
    Ok(LaunchedChild {
        stdin,
        stdout,
        stderr,
        egress_listener,
        tree: Box::new(SandboxTree {
            limits: LimitsWatch::new(child.limits_reader()),
            child,
            workspace,
        }),
        report,
    })
}

/// The report with `"engine": "namespace"` first, the common shape every
/// launcher's report has (docs/SECURITY.md, "Engines").
fn with_engine(report: serde_json::Value) -> serde_json::Value {
    match report {
        serde_json::Value::Object(fields) => {
            let mut out = serde_json::Map::new();
            out.insert("engine".into(), "namespace".into());
            out.extend(fields);
            serde_json::Value::Object(out)
        }
        other => other,
    }
}

/// A sandboxed tree and its host workspace if it has one, removed with it.
struct SandboxTree {
    child: SandboxedChild,
    workspace: Option<HostWorkspace>,
    /// Kept when the helper is first seen exited, and before a kill.
    limits: LimitsWatch,
}

impl ProcessTree for SandboxTree {
    fn pid(&self) -> u32 {
        self.child.pid as u32
    }
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        let status = self.child.try_wait()?;
        if status.is_some() {
            self.limits.keep();
        }
        Ok(status)
    }
    fn start_kill(&mut self) {
        self.limits.keep();
        self.child.kill_tree();
    }
    fn kill_tree(&mut self) -> io::Result<()> {
        self.limits.keep();
        self.child.kill_tree();
        self.child.wait()?;
        // Removed iteratively; a failure is logged, never the turn's error.
        drop(self.workspace.take());
        Ok(())
    }
    fn limits(&self) -> Option<LimitsWatch> {
        Some(self.limits.clone())
    }
}

impl Launcher for SandboxLauncher {
    /// Start preparing `policy.warm` sandboxes for `spec` now, so that even
    /// the first turn finds one ready (`ProcessRuntime::new` calls it).
    fn prewarm(&self, spec: &LaunchSpec) {
        let target = self.warm_target();
        if target == 0 {
            return;
        }
        let key = self.key(spec);
        self.warm.adopt(&key);
        self.warm.refill(&key, target, preparer(&key));
    }

    fn launch(&self, spec: &LaunchSpec) -> Result<LaunchedChild, LaunchError> {
        let key = self.key(spec);
        if let Some(pin) = &key.policy.program_sha256 {
            // A prepared sandbox holds the copy checked when it was built:
            // the program is checked again now, so a file replaced since
            // refuses this turn (found unchanged, this is one `stat`).
            crate::process::stage_pinned(&key.program, pin).map_err(|e| LaunchError::Refused {
                program: key.program.clone(),
                reason: e.to_string(),
                report: Some(serde_json::json!({
                    "level": "none",
                    "refused": true,
                    "reason": e.to_string(),
                })),
            })?;
        }
        let target = self.warm_target();
        if target == 0 {
            return self.launch_now(&key);
        }
        if let Some(spare) = self.warm.take(&key) {
            let Spare { sandbox, workspace } = spare;
            match sandbox.start() {
                Ok(child) => {
                    let out = launched(&key.program, child, workspace);
                    self.warm.refill(&key, target, preparer(&key));
                    return out;
                }
                // A prepared tree that died before its start: build one in
                // the turn's path, which reports a real error if any.
                Err(e) => {
                    tracing::warn!(error = %e, "a prepared sandbox could not start; building one now")
                }
            }
        }
        let out = self.launch_now(&key);
        if out.is_ok() {
            self.warm.succeeded();
        }
        self.warm.refill(&key, target, preparer(&key));
        out
    }
}
