//! [`ProcessRuntime`]: a [`RuntimePlugin`] whose turns run in a child
//! process, one process per turn, spoken to over its stdin/stdout.
//!
//! Per turn: launch (through a [`Launcher`]) → drain stderr → `initialize`
//! (version and manifest checked) → `turn/run` → serve the plugin's
//! `host/*` messages → outcome, or abort → **kill the whole tree, whatever
//! the ending**. The kill signal is sent before `run` returns; the reaping
//! and the removal of the workspace and cgroup happen off the caller's
//! path ([`reaper`]), and [`settle_kills`] waits for them. The `run`
//! future may be dropped at any await point (the executor races it against
//! the hard deadline): a guard then kills the tree and reaps it off-thread.

pub mod affinity;
mod connection;
mod dead_hosts;
mod diagnosis;
pub(crate) mod direct;
pub mod driver;
mod engine_tool;
mod guard;
pub mod gvisor;
mod into_cgroup;
pub mod launcher;
pub mod microvm;
mod pinned;
mod reaper;
mod shim;
pub mod stderr;
pub(crate) mod warm;

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sharedos_plugin_sdk::{RuntimeError, RuntimeHost, RuntimePlugin, Signal};
use sharedos_protocol::text::escape_text;
use sharedos_protocol::{
    DEFAULT_MAX_MESSAGE_BYTES, PLUGIN_COOKIE_ENV, RuntimeManifest, RuntimeTurnOutcome,
    RuntimeTurnRequest, TurnId,
};

pub use affinity::{AffinityConfig, AffinityKey, MAX_AFFINITY_TTL_MS};
pub use diagnosis::is_deterministic;
pub use direct::DirectLauncher;
pub use gvisor::{GvisorError, GvisorLauncher};
pub use launcher::{LaunchError, LaunchSpec, LaunchedChild, Launcher, LimitsWatch, ProcessTree};
pub use microvm::{MicrovmError, MicrovmLauncher};
pub use reaper::{adopt_orphans, reap_orphans};
pub use stderr::StderrLimits;

use crate::provenance::{RuntimeDiagnosis, TurnReport};
use guard::PENDING_KILLS;

/// How to run one configured runtime.
#[derive(Debug, Clone)]
pub struct ProcessRuntimeConfig {
    pub program: PathBuf,
    /// The content pin (`sha256` of the entry): checked at seating and
    /// at every launch; `None`, the default, runs the program unpinned.
    pub program_sha256: Option<sharedos_sandbox::ProgramDigest>,
    /// A harness runtime's CLI pin (`harness.sha256`): the harness executes
    /// the CLI only with these bytes (refusing any other), and each turn's
    /// result states it (`metadata.runtime.harnessCliSha256`). `None`: no
    /// harness, or an unpinned CLI.
    pub cli_sha256: Option<sharedos_sandbox::ProgramDigest>,
    pub args: Vec<String>,
    /// The environment allowlist the host passes; `SHAREDOS_PLUGIN=1` is
    /// always added. Nothing else of the host's environment is inherited.
    pub env: Vec<(String, String)>,
    /// The trusted registry entry; the plugin's reported manifest must
    /// equal it.
    pub manifest: RuntimeManifest,
    pub handshake_timeout: Duration,
    pub max_message_bytes: usize,
    pub max_inflight_tool_calls: usize,
    pub stderr: StderrLimits,
    pub write_stall_timeout: Duration,
    /// Where each turn stamps the end of its stages (`sharedos-bench`'s
    /// per-turn breakdown); `None`, the default, stamps nothing.
    pub stages: Option<StageLog>,
    /// The runtime's egress gateway (a `network` policy): each turn's
    /// sandbox hands over its listener, served for the turn's length.
    pub egress: Option<Arc<sharedos_egress::EgressSeat>>,
    /// Session affinity (`affinity` of the entry): a process whose plugin
    /// accepts `turns: "many"` may serve consecutive turns of one session
    /// ([`affinity`]). `None`, the default: one process per turn. Ignored
    /// for a runtime with a network policy (its gateway serves one turn).
    pub affinity: Option<affinity::AffinityConfig>,
    /// How long a plugin gets to exit on its own once its `turn/abort` has
    /// reached it, before its tree is killed. Zero, the default: the kill
    /// follows the abort's delivery at once (the turn is over; the host
    /// does not wait for the plugin). `sharedos conformance` sets it so
    /// that a plugin that honours the abort is seen to exit by itself.
    pub abort_grace: Duration,
}

/// The stages of a process turn, as stamped into a [`StageLog`]: `run`
/// entered, `launched`, `initialized` (handshake done), `settled` (the
/// outcome or error is known), `signalled` (the tree is killed; its
/// reaping continues off the turn's path).
pub type StageLog = Arc<Mutex<Vec<(&'static str, std::time::Instant)>>>;

/// The process-wide stage log of [`record_stages`]: every turn of every
/// runtime stamps into it as well as into its own config's log.
static PROCESS_STAGES: std::sync::OnceLock<StageLog> = std::sync::OnceLock::new();

/// Makes every turn of this process stamp its stages into `log` (in
/// addition to a runtime's own [`ProcessRuntimeConfig::stages`]), and
/// lets [`stamp_stage`] add the host's own: `sharedos run`'s per-stage
/// timings (`SHAREDOS_TIMINGS`, docs/BENCHMARKS.md). Set once; a later
/// call is ignored and returns `false`.
pub fn record_stages(log: StageLog) -> bool {
    PROCESS_STAGES.set(log).is_ok()
}

/// Stamps `stage` into the process-wide log of [`record_stages`], if any.
pub fn stamp_stage(stage: &'static str) {
    stamp(PROCESS_STAGES.get(), stage);
}

fn stamp(log: Option<&StageLog>, stage: &'static str) {
    let now = std::time::Instant::now();
    for log in [log, PROCESS_STAGES.get()].into_iter().flatten() {
        log.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((stage, now));
        // The same log twice (a config handed the global one) stamps once.
        if log_is_global(log) {
            break;
        }
    }
}

fn log_is_global(log: &StageLog) -> bool {
    PROCESS_STAGES.get().is_some_and(|g| Arc::ptr_eq(g, log))
}

impl ProcessRuntimeConfig {
    /// The defaults of protocol.md B.3/B.4.
    pub fn new(program: impl Into<PathBuf>, manifest: RuntimeManifest) -> Self {
        Self {
            program: program.into(),
            program_sha256: None,
            cli_sha256: None,
            args: Vec::new(),
            env: Vec::new(),
            manifest,
            handshake_timeout: Duration::from_millis(crate::limits::DEFAULT_HANDSHAKE_TIMEOUT_MS),
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_inflight_tool_calls: crate::limits::DEFAULT_INFLIGHT_TOOL_CALLS as usize,
            stderr: StderrLimits::default(),
            write_stall_timeout: Duration::from_millis(
                crate::limits::DEFAULT_WRITE_STALL_TIMEOUT_MS,
            ),
            stages: None,
            egress: None,
            affinity: None,
            abort_grace: Duration::ZERO,
        }
    }
}

/// Why a runtime cannot be constructed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    #[error("plugin binary {program} does not exist")]
    NotFound { program: PathBuf },
    #[error("plugin binary {program} is not a regular file")]
    NotAFile { program: PathBuf },
    #[error("plugin binary {program} is not executable")]
    NotExecutable { program: PathBuf },
    #[error(
        "plugin binary {program} does not match its content pin: its sha256 is {actual}, the pin \
         (sha256 of the runtime entry) is {expected}; restore the pinned file, or set sha256 to \
         the output of `sha256sum {program}` if this file is the one to run"
    )]
    PinMismatch {
        program: PathBuf,
        expected: sharedos_sandbox::ProgramDigest,
        actual: sharedos_sandbox::ProgramDigest,
    },
    #[error(
        "plugin binary {program} is pinned but is a `#!` script: a pinned program is executed \
         through the descriptor that was hashed, which an interpreter cannot open by path; pin \
         the interpreter instead (program = the interpreter, sha256 = its digest, the script \
         in args; docs/SECURITY.md, \"Content pin\")"
    )]
    PinnedScript { program: PathBuf },
    #[error("plugin binary {program} is pinned but could not be staged and hashed: {reason}")]
    PinUnchecked { program: PathBuf, reason: String },
}

/// A runtime plugin run as a child process, one process per turn.
pub struct ProcessRuntime {
    config: ProcessRuntimeConfig,
    launcher: Arc<dyn Launcher>,
    /// The parked processes, with session affinity.
    lot: Option<Arc<affinity::ParkingLot>>,
}

impl std::fmt::Debug for ProcessRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessRuntime")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl ProcessRuntime {
    /// Checks that the binary exists and is executable.
    pub fn new(
        config: ProcessRuntimeConfig,
        launcher: Arc<dyn Launcher>,
    ) -> Result<Self, LoadError> {
        let program = config.program.clone();
        let meta = std::fs::metadata(&program).map_err(|_| LoadError::NotFound {
            program: program.clone(),
        })?;
        if !meta.is_file() {
            return Err(LoadError::NotAFile { program });
        }
        if rustix::fs::access(&program, rustix::fs::Access::EXEC_OK).is_err() {
            return Err(LoadError::NotExecutable { program });
        }
        if let Some(pin) = &config.program_sha256 {
            let staged = stage_pinned(&program, pin)?;
            refuse_pinned_script(&program, &staged)?;
        }
        let lot = match (&config.affinity, &config.egress) {
            (Some(a), None) => Some(affinity::ParkingLot::new(a.ttl())),
            _ => None,
        };
        let runtime = Self {
            config,
            launcher,
            lot,
        };
        // A launcher that keeps sandboxes prepared (`warm`) builds them
        // from now on, so even the first turn finds one.
        runtime
            .launcher
            .prewarm(&runtime.launch_spec(String::new(), String::new()));
        Ok(runtime)
    }

    /// What the launcher gets for one turn: the configured program,
    /// arguments and environment, plus the plugin cookie.
    pub fn launch_spec(&self, execution_id: String, turn_id: String) -> LaunchSpec {
        let mut env = self.config.env.clone();
        env.retain(|(k, _)| k != PLUGIN_COOKIE_ENV);
        env.push((PLUGIN_COOKIE_ENV.to_owned(), "1".to_owned()));
        LaunchSpec {
            program: self.config.program.clone(),
            program_sha256: self.config.program_sha256,
            args: self.config.args.clone(),
            env,
            runtime_id: self.config.manifest.id.as_str().to_owned(),
            execution_id,
            turn_id,
        }
    }

    pub fn config(&self) -> &ProcessRuntimeConfig {
        &self.config
    }

    /// Reports why the turn ended without an outcome, and logs it with how
    /// the plugin's process ended (`diagnosis::process_json`).
    fn keep_diagnosis(
        &self,
        report: &TurnReport,
        execution_id: &str,
        reason: &'static str,
        process: serde_json::Value,
    ) {
        tracing::warn!(
            runtime = %self.config.manifest.id,
            execution_id = %escape_text(execution_id),
            reason,
            process = %process,
            "the plugin ended its turn without an outcome"
        );
        report.set_diagnosis(RuntimeDiagnosis {
            reason,
            deterministic: is_deterministic(reason),
            process,
        });
    }

    /// A launch of a pinned program succeeded: the launcher checked the
    /// bytes it executed against the pin, which the result states; and the
    /// pin the harness holds its CLI to, if any.
    fn report_program(&self, report: &TurnReport) {
        if let Some(sha256) = self.config.program_sha256 {
            report.set_program(crate::provenance::ProgramProvenance { sha256 });
        }
        if let Some(cli) = self.config.cli_sha256 {
            report.set_cli(cli);
        }
    }

    fn name(&self) -> String {
        format!(
            "runtime {} ({})",
            self.config.manifest.id,
            self.config.program.display()
        )
    }

    fn load_error(&self, what: impl std::fmt::Display) -> RuntimeError {
        RuntimeError::Load(format!("{}: {what}", self.name()))
    }
}

impl ProcessRuntime {
    /// Serves the turn's egress listener when the runtime has a gateway;
    /// a runtime with one whose launch gave no listener (a direct launch)
    /// is refused rather than run without its gateway or with the host's
    /// network.
    fn serve_egress(
        &self,
        execution_id: &str,
        listener: Option<OwnedFd>,
    ) -> Result<Option<sharedos_egress::ServeHandle>, RuntimeError> {
        match (&self.config.egress, listener) {
            (None, _) => Ok(None),
            (Some(_), None) => Err(self.load_error(
                "the runtime has a network policy but its launch gave no gateway listener \
                 (the sandbox and gVisor launchers make one)",
            )),
            (Some(seat), Some(fd)) => seat
                .serve(execution_id, fd)
                .map(Some)
                .map_err(|e| self.load_error(e)),
        }
    }
}

/// A fresh turn id: `t-` and 32 hex digits, within `[A-Za-z0-9_.:-]`.
fn new_turn_id() -> TurnId {
    let raw = format!("t-{}", uuid::Uuid::new_v4().simple());
    // Never plugin-controlled: the format above always passes the rule.
    TurnId::new(raw).unwrap_or_else(|e| unreachable!("generated turn id refused: {e}"))
}

/// Keeps `handle` for [`settle_kills`] to join (a thread that may own a
/// plugin tree: a deferred kill, a sandbox being prepared ahead).
pub(crate) fn track_thread(handle: std::thread::JoinHandle<()>) {
    let mut pending = PENDING_KILLS.lock().unwrap_or_else(|p| p.into_inner());
    pending.retain(|h| !h.is_finished());
    pending.push(handle);
}

/// Drops `items` (trees whose drop kills and reaps them) on a thread named
/// `name` that [`settle_kills`] waits for: their teardown blocks for a
/// moment, and the caller may be an async worker. With no thread to be
/// had they are dropped here rather than not at all.
pub(crate) fn drop_off_path<T: Send + 'static>(items: Vec<T>, name: &str) {
    if items.is_empty() {
        return;
    }
    let slot = std::sync::Arc::new(Mutex::new(Some(items)));
    let on_thread = std::sync::Arc::clone(&slot);
    let spawned = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || drop(on_thread.lock().unwrap_or_else(|p| p.into_inner()).take()));
    match spawned {
        Ok(handle) => track_thread(handle),
        Err(_) => drop(slot.lock().unwrap_or_else(|p| p.into_inner()).take()),
    }
}

/// Kills every parked process (session affinity), then waits until every
/// plugin tree of a finished turn is killed and reaped
/// and its workspace and cgroup removed (the reaping runs off the turn's
/// path), every tree whose kill was deferred (to let a `turn/abort` reach
/// it) likewise, and every sandbox being prepared ahead is ready (or, its
/// launchers gone, killed and removed). A host process calls it before it
/// exits, so no tree outlives its host; it takes at most `ABORT_FLUSH`
/// plus the reaping.
pub fn settle_kills() {
    affinity::release_everywhere();
    let pending = std::mem::take(&mut *PENDING_KILLS.lock().unwrap_or_else(|p| p.into_inner()));
    for handle in pending {
        let _ = handle.join();
    }
    reaper::settle();
}

/// Waits only for the teardown of finished turns handed off the turn's
/// path (what `sharedos-bench` times as the teardown stage); see
/// [`settle_kills`] for everything.
pub fn settle_teardown() {
    reaper::settle();
}

#[async_trait]
impl RuntimePlugin for ProcessRuntime {
    fn manifest(&self) -> RuntimeManifest {
        self.config.manifest.clone()
    }

    /// One turn in a fresh process, killed at the end whatever the ending
    /// ([`ProcessRuntime::run_reported`] without its report).
    async fn run(
        &self,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
    ) -> Result<RuntimeTurnOutcome, RuntimeError> {
        self.run_reported(request, host, abort, &TurnReport::default())
            .await
    }
}

impl ProcessRuntime {
    /// One turn in a fresh process, killed at the end whatever the ending;
    /// `report` gets the launcher's report at launch and, for a turn that
    /// ends without an outcome, the diagnosis.
    pub async fn run_reported(
        &self,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
        report: &TurnReport,
    ) -> Result<RuntimeTurnOutcome, RuntimeError> {
        if abort.is_raised() {
            return Err(RuntimeError::Failed(
                "the turn was aborted before the runtime started".into(),
            ));
        }
        stamp(self.config.stages.as_ref(), "run");
        let turn_id = new_turn_id();
        let execution_id = request.execution_id.as_str().to_owned();
        let (mut conn, _gateway) = self
            .open(&execution_id, &turn_id, &abort, false, report)
            .await?;
        conn.turns = 1;
        let outcome = conn
            .turn(&turn_id, request, host, abort.clone(), report)
            .await;
        stamp(self.config.stages.as_ref(), "settled");
        if let Err(e) = &outcome {
            self.diagnose_error(report, &execution_id, e, &abort, &mut conn, &turn_id)
                .await;
        }
        conn.close(abort.is_raised());
        stamp(self.config.stages.as_ref(), "signalled");
        outcome
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (every turn holds a
/// few pipe fds). The binary calls it once at start.
pub fn raise_fd_limit() -> std::io::Result<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut lim = getrlimit(Resource::Nofile);
    if lim.current != lim.maximum {
        lim.current = lim.maximum;
        setrlimit(Resource::Nofile, lim).map_err(std::io::Error::from)?;
    }
    Ok(lim.current.unwrap_or(u64::MAX))
}

/// A pinned program must be an executable the kernel loads itself: a `#!`
/// script executed through a close-on-exec descriptor would hand its
/// interpreter a `/dev/fd/N` that is already closed.
fn refuse_pinned_script(
    program: &std::path::Path,
    staged: &std::path::Path,
) -> Result<(), LoadError> {
    use std::io::Read;
    let mut head = [0u8; 2];
    let read = std::fs::File::open(staged).and_then(|mut f| f.read_exact(&mut head));
    match read {
        Ok(()) if &head == b"#!" => Err(LoadError::PinnedScript {
            program: program.to_path_buf(),
        }),
        Ok(()) => Ok(()),
        Err(e) => Err(LoadError::PinUnchecked {
            program: program.to_path_buf(),
            reason: format!("cannot read the staged copy: {e}"),
        }),
    }
}

/// The staged copy of a pinned program (made, or found unchanged): a
/// mismatch is [`LoadError::PinMismatch`] with both digests.
pub(crate) fn stage_pinned(
    program: &std::path::Path,
    pin: &sharedos_sandbox::ProgramDigest,
) -> Result<PathBuf, LoadError> {
    sharedos_sandbox::staging::stage_pinned(program, pin).map_err(|e| match e {
        sharedos_sandbox::SandboxError::PinMismatch {
            program,
            expected,
            actual,
        } => LoadError::PinMismatch {
            program,
            expected,
            actual,
        },
        other => LoadError::PinUnchecked {
            program: program.to_path_buf(),
            reason: other.to_string(),
        },
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_fd_limit_is_raised_to_the_hard_limit() {
        let soft = super::raise_fd_limit().unwrap();
        let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        assert_eq!(lim.current, lim.maximum);
        assert_eq!(Some(soft), lim.current.or(Some(u64::MAX)));
    }
}
