//! How a plugin process comes to exist, and how its whole tree goes away.
//!
//! [`Launcher`] is the seam the sandbox plugs into: a blocking function
//! that returns the child's three pipe ends as `OwnedFd`s, a handle that
//! kills and reaps the whole tree, and the sandbox report.
//! [`DirectLauncher`](super::DirectLauncher) starts the plugin unsandboxed
//! (development only), contained by a cgroup.

use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::{Arc, OnceLock};

use sharedos_sandbox::cgroup::LimitsHit;

/// What to start. `env` is the complete environment of the child (the host
/// has already applied its allowlist and added `SHAREDOS_PLUGIN=1`).
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// The content pin of `program` (the runtime entry's `sha256`): the
    /// launcher runs only a staged copy whose bytes hash to it, executed
    /// through the descriptor it hashed (docs/SECURITY.md, "Content pin").
    pub program_sha256: Option<sharedos_sandbox::ProgramDigest>,
    /// For logs and for a sandbox's workspace naming.
    pub runtime_id: String,
    pub execution_id: String,
    pub turn_id: String,
}

/// What the kernel's bounds refused or killed in a tree (its cgroups'
/// event counters), read live while the cgroups exist and kept from the
/// moment the tree's process is seen exited or is killed, so the result
/// can tell it after the cgroups are gone.
#[derive(Clone)]
pub struct LimitsWatch {
    live: Arc<dyn Fn() -> LimitsHit + Send + Sync>,
    kept: Arc<OnceLock<LimitsHit>>,
}

impl LimitsWatch {
    pub fn new(live: impl Fn() -> LimitsHit + Send + Sync + 'static) -> Self {
        Self {
            live: Arc::new(live),
            kept: Arc::new(OnceLock::new()),
        }
    }

    /// Keeps what the counters say now (the first call wins).
    pub fn keep(&self) {
        let _ = self.kept.get_or_init(|| (self.live)());
    }

    /// The limits hit, kept or live; `None` when none was.
    pub fn read(&self) -> Option<LimitsHit> {
        let hit = self.kept.get().copied().unwrap_or_else(|| (self.live)());
        (!hit.is_empty()).then_some(hit)
    }
}

impl std::fmt::Debug for LimitsWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimitsWatch")
            .field("kept", &self.kept.get())
            .finish()
    }
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
    /// The limits the kernel enforced on the tree, where the launcher has
    /// counters for them (a cgroup); `None` otherwise.
    fn limits(&self) -> Option<LimitsWatch> {
        None
    }
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
