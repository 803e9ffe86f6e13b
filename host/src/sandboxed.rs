//! The sandboxed launcher: every plugin through `sharedos __sandbox-exec`,
//! the single-threaded helper that layers namespaces, a minimal root,
//! rlimits, capabilities, no_new_privs, Landlock and seccomp, and reports
//! what it enforced. The host refuses to start a plugin below the policy's
//! minimum level.

use std::ffi::OsString;
use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;

use sharedos_sandbox::{SandboxError, SandboxPolicy, SandboxedChild, SpawnSpec};

use crate::process::{LaunchError, LaunchSpec, LaunchedChild, Launcher, ProcessTree};

/// Per-turn workspaces are named `sharedos-ws-<host pid>-<random>`, so a
/// host can tell the workspaces a dead host left behind.
const WORKSPACE_PREFIX: &str = "sharedos-ws-";

/// Removes, once per process, the workspaces of hosts that are gone (a
/// host killed with SIGKILL cannot remove its own). A workspace of a live
/// host, or one whose name carries no pid, is left alone.
fn sweep_stale_workspaces() {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(WORKSPACE_PREFIX)) else { continue };
            let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
            if pid == std::process::id() || std::path::Path::new(&format!("/proc/{pid}")).exists() {
                continue;
            }
            // Not a symlink: remove only directories this host kind made.
            if entry.file_type().is_ok_and(|t| t.is_dir())
                && let Err(e) = std::fs::remove_dir_all(entry.path())
            {
                tracing::warn!(path = %entry.path().display(), error = %e, "could not remove a dead host's workspace");
            }
        }
    });
}

/// Launches plugins inside the sandbox.
#[derive(Debug, Clone)]
pub struct SandboxLauncher {
    /// The binary that serves `__sandbox-exec` (the `sharedos` binary).
    pub helper_exe: PathBuf,
    pub policy: SandboxPolicy,
}

impl SandboxLauncher {
    /// A launcher whose helper is this very binary.
    pub fn current_exe(policy: SandboxPolicy) -> io::Result<Self> {
        Ok(Self {
            helper_exe: std::env::current_exe()?,
            policy,
        })
    }
}

/// A sandboxed tree and its per-turn workspace, removed with it.
struct SandboxTree {
    child: SandboxedChild,
    workspace: Option<tempfile::TempDir>,
}

impl ProcessTree for SandboxTree {
    fn pid(&self) -> u32 {
        self.child.pid as u32
    }
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.child.try_wait()
    }
    fn start_kill(&mut self) {
        self.child.kill_tree();
    }
    fn kill_tree(&mut self) -> io::Result<()> {
        self.child.kill_tree();
        self.child.wait()?;
        if let Some(ws) = self.workspace.take() {
            ws.close()?;
        }
        Ok(())
    }
}

impl Launcher for SandboxLauncher {
    fn launch(&self, spec: &LaunchSpec) -> Result<LaunchedChild, LaunchError> {
        let program = spec.program.clone();
        sweep_stale_workspaces();
        let workspace = tempfile::Builder::new()
            .prefix(&format!("{WORKSPACE_PREFIX}{}-", std::process::id()))
            .tempdir()
            .map_err(|source| LaunchError::Spawn {
                program: program.clone(),
                source,
            })?;
        let sandbox_spec = SpawnSpec {
            helper_exe: self.helper_exe.clone(),
            program: spec.program.clone(),
            args: spec.args.iter().map(OsString::from).collect(),
            env: spec.env.clone(),
            policy: self.policy.clone(),
            workspace: workspace.path().to_path_buf(),
        };
        let mut child = sharedos_sandbox::spawn(&sandbox_spec).map_err(|e| {
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
                program: program.clone(),
                reason,
                report,
            }
        })?;
        let report = serde_json::to_value(&child.report).ok();
        let missing = || LaunchError::Spawn {
            program: program.clone(),
            source: io::Error::other("a stdio pipe is missing"),
        };
        let stdin = child.stdin.take().ok_or_else(missing)?;
        let stdout = child.stdout.take().ok_or_else(missing)?;
        let stderr = child.stderr.take().ok_or_else(missing)?;
        Ok(LaunchedChild {
            stdin,
            stdout,
            stderr,
            tree: Box::new(SandboxTree {
                child,
                workspace: Some(workspace),
            }),
            report,
        })
    }
}
