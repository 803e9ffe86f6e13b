//! How a plugin process comes to exist, and how its whole tree goes away.
//!
//! [`Launcher`] is the seam the sandbox plugs into: a blocking function
//! that returns the child's three pipe ends as `OwnedFd`s, a handle that
//! kills and reaps the whole tree, and the sandbox report. [`DirectLauncher`]
//! starts the plugin unsandboxed, in its own process group.

use std::ffi::OsString;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};

/// What to start. `env` is the complete environment of the child (the host
/// has already applied its allowlist and added `SHAREDOS_PLUGIN=1`).
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// For logs and for a sandbox's workspace naming.
    pub runtime_id: String,
    pub execution_id: String,
    pub turn_id: String,
}

/// The live process tree of one turn.
pub trait ProcessTree: Send {
    /// The pid of the process the launcher started (the helper or the
    /// plugin itself).
    fn pid(&self) -> u32;
    /// Non-blocking: `Some` once that process has exited (and was reaped).
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>>;
    /// Sends SIGKILL to the whole tree without waiting. Idempotent; must
    /// not block (it runs in `Drop` on an async thread).
    fn start_kill(&mut self);
    /// Kills the whole tree and reaps it. May block briefly.
    fn kill_tree(&mut self) -> io::Result<()>;
}

/// A started plugin: its stdio, its tree, and the sandbox report.
pub struct LaunchedChild {
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub tree: Box<dyn ProcessTree>,
    /// What the sandbox applied (`None` for an unsandboxed launch).
    pub report: Option<serde_json::Value>,
    /// The egress gateway's listener in the sandbox's network namespace
    /// (a runtime with a network policy, sandboxed); `None` otherwise.
    pub egress_listener: Option<OwnedFd>,
}

impl std::fmt::Debug for LaunchedChild {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchedChild")
            .field("pid", &self.tree.pid())
            .field("report", &self.report)
            .finish()
    }
}

/// Why a launch failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("cannot start {program}: {source}")]
    Spawn { program: PathBuf, source: io::Error },
    /// The launcher refused (e.g. the sandbox is below the required level).
    /// `report` says what the isolation reached before the refusal; it
    /// becomes the turn's provenance.
    #[error("refused to start {program}: {reason}")]
    Refused {
        program: PathBuf,
        reason: String,
        report: Option<serde_json::Value>,
    },
}

/// Starts plugins. Blocking; the process code calls it on a blocking
/// thread.
pub trait Launcher: Send + Sync {
    fn launch(&self, spec: &LaunchSpec) -> Result<LaunchedChild, LaunchError>;

    /// Get ready for launches of `spec` (its per-turn ids aside): a
    /// launcher that keeps sandboxes prepared starts building them now.
    /// Returns at once; the default does nothing.
    fn prewarm(&self, _spec: &LaunchSpec) {}
}

/// An unsandboxed launch: cleared environment plus the spec's, its own
/// process group, piped stdio, no `pre_exec` (any `pre_exec` forces a
/// `fork()` of the whole host instead of `posix_spawn`/`vfork`).
///
/// Limit: the kill is a process-group kill (one `kill(-pgid)`, so killing
/// a turn's tree costs the same whatever runs on the machine), so a
/// descendant that left the group (`setsid`, `setpgid`) escapes it. Only
/// the sandbox's pid namespace and cgroup close that hole.
#[derive(Debug, Clone, Copy, Default)]
pub struct DirectLauncher;

impl Launcher for DirectLauncher {
    fn launch(&self, spec: &LaunchSpec) -> Result<LaunchedChild, LaunchError> {
        let spawn_err = |source| LaunchError::Spawn {
            program: spec.program.clone(),
            source,
        };
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .env_clear()
            .envs(
                spec.env
                    .iter()
                    .map(|(k, v)| (OsString::from(k), OsString::from(v))),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = cmd.spawn().map_err(spawn_err)?;
        let pid = child.id();
        let pipes = (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let mut tree = GroupTree {
            child: Some(child),
            pgid: pid,
            reaped: false,
        };
        let (Some(stdin), Some(stdout), Some(stderr)) = pipes else {
            tree.start_kill();
            return Err(spawn_err(io::Error::other("stdio was not piped")));
        };
        Ok(LaunchedChild {
            stdin: stdin.into(),
            stdout: stdout.into(),
            stderr: stderr.into(),
            tree: Box::new(tree),
            // Said explicitly, so a result never leaves its isolation unsaid.
            report: Some(
                serde_json::json!({"level": "none", "reason": "launched without a sandbox"}),
            ),
            egress_listener: None,
        })
    }
}

/// The direct launch's tree: the plugin leads its own process group.
struct GroupTree {
    child: Option<Child>,
    pgid: u32,
    /// The leader was reaped (by `try_wait`): its pid may be reused.
    reaped: bool,
}

impl GroupTree {
    /// SIGKILLs the process group: one syscall, whatever the number of
    /// processes on the machine (no walk of `/proc`). A descendant that
    /// left the group (`setsid`, `setpgid`) is out of its reach: only the
    /// sandbox's pid namespace and cgroup catch that.
    fn killpg(&self) {
        if let Some(pid) = i32::try_from(self.pgid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            // ESRCH once everything in the group is gone: nothing to do.
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

impl ProcessTree for GroupTree {
    fn pid(&self) -> u32 {
        self.pgid
    }
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        let status = match &mut self.child {
            Some(c) => c.try_wait()?,
            None => None,
        };
        self.reaped |= status.is_some();
        Ok(status)
    }
    fn start_kill(&mut self) {
        self.killpg();
    }
    fn kill_tree(&mut self) -> io::Result<()> {
        self.killpg();
        if let Some(mut c) = self.child.take() {
            c.wait()?;
        }
        // Members that were mid-fork when the first signal landed.
        self.killpg();
        Ok(())
    }
}

impl Drop for GroupTree {
    fn drop(&mut self) {
        self.killpg();
        if let Some(mut c) = self.child.take()
            && !matches!(c.try_wait(), Ok(Some(_)))
        {
            // SIGKILL is on its way; reap off the async thread.
            std::thread::spawn(move || {
                let _ = c.wait();
            });
        }
    }
}
