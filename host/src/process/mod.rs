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

mod diagnosis;
mod direct;
pub mod launcher;
mod reaper;
pub mod stderr;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sharedos_plugin_sdk::{RuntimeError, RuntimeHost, RuntimePlugin, Signal};
use sharedos_protocol::jsonrpc::truncate;
use sharedos_protocol::text::escape_text;
use sharedos_protocol::{
    ConnectionLimits, DEFAULT_MAX_MESSAGE_BYTES, PLUGIN_COOKIE_ENV, RuntimeManifest,
    RuntimeTurnOutcome, RuntimeTurnRequest, TurnId, methods,
};
use tokio::net::unix::pipe;

pub use diagnosis::{Diagnosis, is_deterministic};
pub use direct::DirectLauncher;
pub use launcher::{LaunchError, LaunchSpec, LaunchedChild, Launcher, ProcessTree};
pub use reaper::{adopt_orphans, reap_orphans};
pub use stderr::StderrLimits;

use crate::broker::turn::{drive_turn, handshake, host_peer_config, turn_run_params};
use crate::broker::{Peer, PeerConfig};

/// How to run one configured runtime.
#[derive(Debug, Clone)]
pub struct ProcessRuntimeConfig {
    pub program: PathBuf,
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
    /// Where each turn stamps the end of its stages (`sharedos bench`'s
    /// per-turn breakdown); `None`, the default, stamps nothing.
    pub stages: Option<StageLog>,
    /// The runtime's egress gateway (a `network` policy): each turn's
    /// sandbox hands over its listener, served for the turn's length.
    pub egress: Option<Arc<crate::egress::EgressSeat>>,
}

/// The stages of a process turn, as stamped into a [`StageLog`]: `run`
/// entered, `launched`, `initialized` (handshake done), `settled` (the
/// outcome or error is known), `signalled` (the tree is killed; its
/// reaping continues off the turn's path).
pub type StageLog = Arc<Mutex<Vec<(&'static str, std::time::Instant)>>>;

fn stamp(log: Option<&StageLog>, stage: &'static str) {
    if let Some(log) = log {
        log.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((stage, std::time::Instant::now()));
    }
}

impl ProcessRuntimeConfig {
    /// The defaults of protocol.md B.3/B.4.
    pub fn new(program: impl Into<PathBuf>, manifest: RuntimeManifest) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            manifest,
            handshake_timeout: Duration::from_secs(10),
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_inflight_tool_calls: crate::config::DEFAULT_INFLIGHT_TOOL_CALLS as usize,
            stderr: StderrLimits::default(),
            write_stall_timeout: Duration::from_secs(10),
            stages: None,
            egress: None,
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
}

/// Reports kept for `take_sandbox_report`; a bound so an executor that
/// never takes them cannot grow the map without end.
const MAX_KEPT_REPORTS: usize = 1024;

/// A runtime plugin run as a child process, one process per turn.
pub struct ProcessRuntime {
    config: ProcessRuntimeConfig,
    launcher: Arc<dyn Launcher>,
    reports: Mutex<HashMap<String, serde_json::Value>>,
    diagnoses: Mutex<HashMap<String, Diagnosis>>,
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
        let runtime = Self {
            config,
            launcher,
            reports: Mutex::new(HashMap::new()),
            diagnoses: Mutex::new(HashMap::new()),
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

    /// The launcher's report of the turn with this execution id (the
    /// sandbox report), once; `None` for an unsandboxed launch.
    pub fn take_sandbox_report(&self, execution_id: &str) -> Option<serde_json::Value> {
        self.reports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(execution_id)
    }

    fn keep_report(&self, execution_id: &str, report: serde_json::Value) {
        keep_bounded(&self.reports, execution_id, report);
    }

    /// Why the turn with this execution id ended without an outcome, once;
    /// `None` when it had one (or was dropped at its abort).
    pub fn take_diagnosis(&self, execution_id: &str) -> Option<Diagnosis> {
        self.diagnoses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(execution_id)
    }

    /// Keeps why the turn ended without an outcome, and logs it with the
    /// plugin's exit status and last stderr lines.
    fn keep_diagnosis(
        &self,
        execution_id: &str,
        reason: &'static str,
        status: Option<std::process::ExitStatus>,
        tail: Vec<String>,
    ) {
        let process = diagnosis::process_json(status, tail);
        tracing::warn!(
            runtime = %self.config.manifest.id,
            execution_id = %escape_text(execution_id),
            reason,
            process = %process,
            "the plugin ended its turn without an outcome"
        );
        let d = Diagnosis {
            reason,
            deterministic: is_deterministic(reason),
            process,
        };
        keep_bounded(&self.diagnoses, execution_id, d);
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
    ) -> Result<Option<crate::egress::ServeHandle>, RuntimeError> {
        match (&self.config.egress, listener) {
            (None, _) => Ok(None),
            (Some(_), None) => Err(self.load_error(
                "the runtime has a network policy but its launch gave no gateway listener \
                 (only the sandbox launcher makes one)",
            )),
            (Some(seat), Some(fd)) => seat
                .serve(execution_id, fd)
                .map(Some)
                .map_err(|e| self.load_error(e)),
        }
    }
}

/// Inserts into a map that never holds more than `MAX_KEPT_REPORTS`.
fn keep_bounded<T>(map: &Mutex<HashMap<String, T>>, key: &str, value: T) {
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    if map.len() >= MAX_KEPT_REPORTS
        && let Some(k) = map.keys().next().cloned()
    {
        map.remove(&k);
    }
    map.insert(key.to_owned(), value);
}

/// A fresh turn id: `t-` and 32 hex digits, within `[A-Za-z0-9_.:-]`.
fn new_turn_id() -> TurnId {
    let raw = format!("t-{}", uuid::Uuid::new_v4().simple());
    // Never plugin-controlled: the format above always passes the rule.
    TurnId::new(raw).unwrap_or_else(|e| unreachable!("generated turn id refused: {e}"))
}

/// Owns the tree for the whole turn. Dropped anywhere (including when the
/// `run` future is dropped), it SIGKILLs the tree at once and reaps it on
/// a background thread; [`TreeGuard::finish`] does the same and waits.
struct TreeGuard {
    tree: Arc<Mutex<Option<Box<dyn ProcessTree>>>>,
    /// How the launched process ended, once seen.
    status: Arc<Mutex<Option<std::process::ExitStatus>>>,
}

impl TreeGuard {
    fn new(tree: Box<dyn ProcessTree>) -> Self {
        Self {
            tree: Arc::new(Mutex::new(Some(tree))),
            status: Arc::new(Mutex::new(None)),
        }
    }

    /// How the launched process ended, if it has (a non-blocking look).
    fn status_now(&self) -> Option<std::process::ExitStatus> {
        let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
        if status.is_none()
            && let Some(tree) = self.tree.lock().unwrap_or_else(|p| p.into_inner()).as_mut()
            && let Ok(Some(s)) = tree.try_wait()
        {
            *status = Some(s);
        }
        *status
    }

    /// How the launched process ended, waiting up to `bound` for it to.
    async fn status_within(&self, bound: Duration) -> Option<std::process::ExitStatus> {
        let until = tokio::time::Instant::now() + bound;
        loop {
            let status = self.status_now();
            if status.is_some() || tokio::time::Instant::now() >= until {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Resolves when the launched process has exited, with how it ended.
    fn exited(&self) -> impl std::future::Future<Output = String> + use<> {
        let tree = self.tree.clone();
        let seen = self.status.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(25));
            loop {
                tick.tick().await;
                let mut slot = tree.lock().unwrap_or_else(|p| p.into_inner());
                match slot.as_mut().map(|t| t.try_wait()) {
                    Some(Ok(Some(status))) => {
                        *seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(status);
                        return format!("the plugin process exited ({status})");
                    }
                    Some(Ok(None)) => {}
                    Some(Err(e)) => return format!("the plugin process cannot be waited for: {e}"),
                    None => return "the plugin process was killed".to_owned(),
                }
            }
        }
    }

    /// The outcome is settled: the tree is signalled now and reaped off
    /// the caller's path (after `ABORT_FLUSH` when a `turn/abort` may still
    /// be on its way to the plugin).
    fn finish(self, aborted: bool) {
        let taken = self.tree.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(tree) = taken {
            if aborted {
                kill_after_flush(tree);
            } else {
                reaper::reap_later(tree);
            }
        }
    }
}

impl Drop for TreeGuard {
    /// Dropped with the `run` future: the turn was abandoned at its abort.
    /// The kill follows after `ABORT_FLUSH`, off the async threads, so the
    /// `turn/abort` queued at the abort reaches the plugin first
    /// (protocol.md B.3.4); the result never waits for it.
    fn drop(&mut self) {
        let taken = self.tree.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(tree) = taken {
            kill_after_flush(tree);
        }
    }
}

/// How long the writer gets to put a queued `turn/abort` on the wire
/// before the tree is killed.
const ABORT_FLUSH: Duration = Duration::from_millis(25);

/// How long a turn whose plugin closed its stdout waits for the plugin's
/// exit status (the kernel closes a dying process's files a moment before
/// it can be reaped), so the result says how it ended.
const EXIT_STATUS_WAIT: Duration = Duration::from_millis(500);

/// Deferred kills and sandbox preparations still running; [`settle_kills`]
/// waits for them.
static PENDING_KILLS: Mutex<Vec<std::thread::JoinHandle<()>>> = Mutex::new(Vec::new());

fn kill_after_flush(tree: Box<dyn ProcessTree>) {
    let slot = Arc::new(Mutex::new(Some(tree)));
    let deferred = slot.clone();
    let spawned = std::thread::Builder::new()
        .name("sharedos-kill".into())
        .spawn(move || {
            std::thread::sleep(ABORT_FLUSH);
            if let Some(mut tree) = deferred.lock().unwrap_or_else(|p| p.into_inner()).take() {
                tree.start_kill();
                let _ = tree.kill_tree();
            }
        });
    let mut pending = PENDING_KILLS.lock().unwrap_or_else(|p| p.into_inner());
    pending.retain(|h| !h.is_finished());
    match spawned {
        Ok(handle) => pending.push(handle),
        Err(e) => {
            // No thread to wait on: kill at once rather than not at all.
            tracing::warn!("no thread for the deferred kill ({e}); killing at once");
            if let Some(mut tree) = slot.lock().unwrap_or_else(|p| p.into_inner()).take() {
                tree.start_kill();
                let _ = tree.kill_tree();
            }
        }
    }
}

/// Keeps `handle` for [`settle_kills`] to join (a thread that may own a
/// plugin tree: a deferred kill, a sandbox being prepared ahead).
pub(crate) fn track_thread(handle: std::thread::JoinHandle<()>) {
    let mut pending = PENDING_KILLS.lock().unwrap_or_else(|p| p.into_inner());
    pending.retain(|h| !h.is_finished());
    pending.push(handle);
}

/// Waits until every plugin tree of a finished turn is killed and reaped
/// and its workspace and cgroup removed (the reaping runs off the turn's
/// path), every tree whose kill was deferred (to let a `turn/abort` reach
/// it) likewise, and every sandbox being prepared ahead is ready (or, its
/// launchers gone, killed and removed). A host process calls it before it
/// exits, so no tree outlives its host; it takes at most `ABORT_FLUSH`
/// plus the reaping.
pub fn settle_kills() {
    let pending = std::mem::take(&mut *PENDING_KILLS.lock().unwrap_or_else(|p| p.into_inner()));
    for handle in pending {
        let _ = handle.join();
    }
    reaper::settle();
}

/// Waits only for the teardown of finished turns handed off the turn's
/// path (what `sharedos bench` times as the teardown stage); see
/// [`settle_kills`] for everything.
pub fn settle_teardown() {
    reaper::settle();
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn receiver(fd: OwnedFd) -> std::io::Result<pipe::Receiver> {
    pipe::Receiver::from_owned_fd(fd)
}

fn sender(fd: OwnedFd) -> std::io::Result<pipe::Sender> {
    pipe::Sender::from_owned_fd(fd)
}

#[async_trait]
impl RuntimePlugin for ProcessRuntime {
    fn manifest(&self) -> RuntimeManifest {
        self.config.manifest.clone()
    }

    async fn run(
        &self,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
    ) -> Result<RuntimeTurnOutcome, RuntimeError> {
        if abort.is_raised() {
            return Err(RuntimeError::Failed(
                "the turn was aborted before the runtime started".into(),
            ));
        }
        let stages = self.config.stages.as_ref();
        stamp(stages, "run");
        let turn_id = new_turn_id();
        let execution_id = request.execution_id.as_str().to_owned();
        let spec = self.launch_spec(execution_id.clone(), turn_id.as_str().to_owned());
        let launcher = self.launcher.clone();
        // The reason of an ending without an outcome, where the error's
        // type says it (the launch, the handshake).
        let cause: Mutex<Option<&'static str>> = Mutex::new(None);
        let set_cause =
            |r: &'static str| *cause.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        // If this future is dropped while the launch runs, the blocking
        // thread drops the `LaunchedChild`, whose tree kills itself.
        let launched = tokio::task::spawn_blocking(move || launcher.launch(&spec))
            .await
            .map_err(|e| self.load_error(format!("the launcher panicked: {e}")))?
            .map_err(|mut e| {
                // A refusal's report is the turn's provenance: the result
                // says what the isolation reached and why it was refused.
                if let LaunchError::Refused {
                    report: report @ Some(_),
                    ..
                } = &mut e
                    && let Some(report) = report.take()
                {
                    self.keep_report(&execution_id, report);
                }
                let reason = match e {
                    LaunchError::Refused { .. } => "launch_refused",
                    LaunchError::Spawn { .. } => "launch_failed",
                };
                self.keep_diagnosis(&execution_id, reason, None, Vec::new());
                self.load_error(e)
            })?;
        let LaunchedChild {
            stdin,
            stdout,
            stderr,
            tree,
            report,
            egress_listener,
        } = launched;
        let guard = TreeGuard::new(tree);
        stamp(stages, "launched");
        if let Some(report) = report {
            self.keep_report(&execution_id, report);
        }
        // Dropped when `run` returns (or is dropped): the gateway stops
        // accepting and closes every connection of the turn.
        let _gateway = self.serve_egress(&execution_id, egress_listener)?;

        let abort_seen = abort.clone();
        let tail = stderr::SharedTail::default();
        let outcome = async {
            let stdin = sender(stdin).map_err(|e| self.load_error(format!("stdin is not a pipe: {e}")))?;
            let stdout = receiver(stdout).map_err(|e| self.load_error(format!("stdout is not a pipe: {e}")))?;
            let stderr = receiver(stderr).map_err(|e| self.load_error(format!("stderr is not a pipe: {e}")))?;
            let _stderr_task = AbortOnDrop(tokio::spawn(stderr::drain_stderr_with_tail(
                stderr,
                self.config.manifest.id.as_str().to_owned(),
                turn_id.as_str().to_owned(),
                self.config.stderr,
                tail.clone(),
            )));
            let peer_config = host_peer_config(PeerConfig {
                max_message_bytes: self.config.max_message_bytes,
                max_inflight_requests: self.config.max_inflight_tool_calls,
                write_stall_timeout: self.config.write_stall_timeout,
                ..PeerConfig::default()
            });
            let (mut peer, mut inbound) = Peer::spawn(stdout, stdin, peer_config);
            let limits = ConnectionLimits {
                max_message_bytes: self.config.max_message_bytes as u64,
                max_inflight_tool_calls: u32::try_from(self.config.max_inflight_tool_calls).unwrap_or(u32::MAX),
                max_concurrent_turns: 1,
            };
            tokio::select! {
                r = handshake(&mut peer, &mut inbound, &self.config.manifest, limits, self.config.handshake_timeout) => {
                    r.map_err(|e| {
                        set_cause(diagnosis::handshake_reason(&e));
                        self.load_error(e)
                    })?;
                    stamp(stages, "initialized");
                }
                _ = abort.raised() => {
                    return Err(RuntimeError::Failed("the turn was aborted during the handshake".into()));
                }
            }
            let params = turn_run_params(&turn_id, request, host.limits());
            let run_id = peer.request(methods::TURN_RUN, &params).await.map_err(|v| RuntimeError::Protocol(v.to_string()))?;
            drive_turn(&peer, run_id, &mut inbound, &turn_id, host, abort, guard.exited()).await
        }
        .await;
        stamp(stages, "settled");
        if let Err(e) = &outcome {
            let reason = cause.lock().unwrap_or_else(|p| p.into_inner()).take();
            let reason = reason.or(match e {
                RuntimeError::Protocol(text) => Some(diagnosis::stream_reason(text)),
                RuntimeError::Failed(_) if !abort_seen.is_raised() => Some("runtime_error"),
                _ => None,
            });
            if let Some(reason) = reason {
                let lines = tail.lock().unwrap_or_else(|p| p.into_inner()).lines();
                // A plugin that closed its stdout is exiting: its status
                // follows the EOF by moments, so wait for it (bounded).
                let status = if reason == "plugin_exited" {
                    guard.status_within(EXIT_STATUS_WAIT).await
                } else {
                    guard.status_now()
                };
                self.keep_diagnosis(&execution_id, reason, status, lines);
            }
        }
        guard.finish(abort_seen.is_raised());
        stamp(stages, "signalled");
        if let Err(e) = &outcome {
            tracing::debug!(runtime = %self.config.manifest.id, turn = %turn_id, "turn ended without an outcome: {}", escape_text(&truncate(&e.to_string(), 500)));
        }
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
