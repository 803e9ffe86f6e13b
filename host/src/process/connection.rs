//! One plugin process and its connection: launched, its stderr drained,
//! `initialize` answered, then one turn (or, with session affinity, several
//! turns one after the other), and the kill of its whole tree at the end.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use serde_json::{Value, json};
use sharedos_plugin_sdk::{RuntimeError, RuntimeHost, Signal};
use sharedos_protocol::jsonrpc::truncate;
use sharedos_protocol::text::escape_text;
use sharedos_protocol::{
    CAPABILITY_TURNS, ConnectionLimits, JsonObject, RuntimeTurnOutcome, RuntimeTurnRequest,
    TURNS_MANY, TurnId, methods, offers_many_turns,
};
use tokio::net::unix::pipe;

use super::driver::{
    Inbox, Peer, PeerConfig, drive_turn, handshake_offering, host_peer_config, turn_run_params,
};
use super::guard::{EXIT_STATUS_WAIT, TreeGuard};
use super::launcher::{LaunchError, LaunchedChild};
use super::{ProcessRuntime, diagnosis, stamp, stderr};
use crate::provenance::TurnReport;

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How long the host waits, at most, for the stderr drain to reach the end
/// of a plugin's stderr once the plugin has exited, so the tail a result
/// quotes holds its last lines. The drain reads at most its byte budget
/// (`StderrLimits`) and drops the rest, so the bound is the time only.
pub(super) const STDERR_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// A launched plugin process with its open connection. Dropped anywhere,
/// its [`TreeGuard`] kills the whole tree.
pub(crate) struct Connection {
    pub(super) peer: Peer,
    pub(super) inbound: Inbox,
    pub(super) guard: TreeGuard,
    /// The stderr drain, aborted with the connection.
    stderr: AbortOnDrop,
    tail: stderr::SharedTail,
    /// The launcher's report: the isolation this process was started
    /// under, the provenance of every turn it serves.
    pub(super) report: Option<Value>,
    /// The plugin answered `initialize` with `turns: "many"`.
    pub(super) many: bool,
    /// The execution id of the first turn this process served.
    pub(super) first_execution_id: String,
    /// Turns this process has been given so far.
    pub(super) turns: u32,
    /// The launched process, as the host sees it.
    pub(super) pid: u32,
}

impl Connection {
    /// `metadata.runtime.affinity` of the turn about to run on it.
    pub(super) fn affinity_provenance(&self) -> Value {
        json!({
            "reused": self.turns > 1,
            "firstExecutionId": self.first_execution_id,
            "turn": self.turns,
            "pid": self.pid,
        })
    }

    /// How the process ended (waiting up to `bound` for it to), and its
    /// last stderr lines: once it has ended, the drain is given
    /// [`STDERR_SETTLE`] to read its stderr to the end first.
    pub(super) async fn ending(
        &mut self,
        bound: std::time::Duration,
    ) -> (Option<std::process::ExitStatus>, Vec<String>) {
        let status = self.guard.status_within(bound).await;
        if status.is_some() && !self.stderr.0.is_finished() {
            let _ = tokio::time::timeout(STDERR_SETTLE, &mut self.stderr.0).await;
        }
        let lines = self.tail.lock().unwrap_or_else(|p| p.into_inner()).lines();
        (status, lines)
    }

    /// The limits the kernel enforced on the tree so far, if any was hit.
    pub(super) fn limits_hit(&self) -> Option<sharedos_sandbox::cgroup::LimitsHit> {
        self.guard
            .limits()
            .as_ref()
            .and_then(super::LimitsWatch::read)
    }

    /// Whether the process runs in the sandbox (its launcher reported).
    pub(super) fn sandboxed(&self) -> bool {
        self.report.is_some()
    }

    /// Runs one turn on the connection: `turn/run` with a fresh turn id,
    /// then the turn's messages until its outcome; `report` learns the
    /// messages the peer dropped and counted.
    pub(super) async fn turn(
        &mut self,
        turn_id: &TurnId,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
        report: &TurnReport,
    ) -> Result<RuntimeTurnOutcome, RuntimeError> {
        let params = turn_run_params(turn_id, request, host.limits());
        let run_id = self
            .peer
            .request(methods::TURN_RUN, &params)
            .await
            .map_err(|v| RuntimeError::Protocol(v.to_string()))?;
        let exited = self.guard.exited();
        let outcome = drive_turn(
            &self.peer,
            run_id,
            &mut self.inbound,
            turn_id,
            host,
            abort,
            exited,
        )
        .await;
        // A connection that counted one is never reused, so what its peer
        // counted is this turn's (and its handshake's).
        report.set_protocol_violations(self.peer.violations_by_name());
        outcome
    }

    /// The process may serve another turn: it accepted `turns: "many"`,
    /// broke no rule of the connection (not even a counted one), and is
    /// still running.
    pub(super) fn reusable(&self) -> bool {
        self.many
            && self.peer.violation().is_none()
            && self.peer.violations_counted() == 0
            && self.guard.status_now().is_none()
    }

    /// Kills the tree now and reaps it off the caller's path.
    pub(super) fn close(self, aborted: bool) {
        self.guard.finish(aborted);
    }
}

impl ProcessRuntime {
    /// The plugin's stdio as the pipes the peer and the stderr drain read.
    fn stdio_pipes(
        &self,
        stdin: OwnedFd,
        stdout: OwnedFd,
        stderr: OwnedFd,
    ) -> Result<(pipe::Sender, pipe::Receiver, pipe::Receiver), RuntimeError> {
        match (sender(stdin), receiver(stdout), receiver(stderr)) {
            (Ok(i), Ok(o), Ok(e)) => Ok((i, o, e)),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                Err(self.load_error(format!("a plugin stdio fd is not a pipe: {e}")))
            }
        }
    }
}

/// What the turn's report learns at launch: the sandbox report, and how
/// to learn how the process ended (with the stderr tail it returns).
fn report_launch(
    turn_report: &TurnReport,
    guard: &TreeGuard,
    report: Option<&Value>,
) -> stderr::SharedTail {
    if let Some(report) = report {
        turn_report.set_sandbox(report.clone());
    }
    let tail = stderr::SharedTail::default();
    turn_report.set_process_end(process_end(
        guard.status_slot(),
        tail.clone(),
        report.is_some(),
        guard.limits(),
    ));
    turn_report.set_abort_grace(guard.abort_grace());
    tail
}

/// The report's view of how the process ended: its status once the guard
/// (or the deferred kill) recorded one, with the stderr tail.
fn process_end(
    status: std::sync::Arc<std::sync::Mutex<Option<std::process::ExitStatus>>>,
    tail: stderr::SharedTail,
    sandboxed: bool,
    limits: Option<super::LimitsWatch>,
) -> crate::provenance::ProcessEnd {
    std::sync::Arc::new(move || {
        let status = (*status.lock().unwrap_or_else(|p| p.into_inner()))?;
        let lines = tail.lock().unwrap_or_else(|p| p.into_inner()).lines();
        let hit = limits.as_ref().and_then(super::LimitsWatch::read);
        Some(diagnosis::process_json(Some(status), lines, sandboxed, hit))
    })
}

fn receiver(fd: OwnedFd) -> std::io::Result<pipe::Receiver> {
    pipe::Receiver::from_owned_fd(fd)
}

fn sender(fd: OwnedFd) -> std::io::Result<pipe::Sender> {
    pipe::Sender::from_owned_fd(fd)
}

impl ProcessRuntime {
    /// Launches the plugin for the turn `execution_id` and answers its
    /// handshake. `offer_many`: the host offers `turns: "many"`. The
    /// gateway handle (a runtime with a network policy) is served until
    /// dropped.
    pub(super) async fn open(
        &self,
        execution_id: &str,
        turn_id: &TurnId,
        abort: &Signal,
        offer_many: bool,
        turn_report: &TurnReport,
    ) -> Result<(Connection, Option<sharedos_egress::ServeHandle>), RuntimeError> {
        let spec = self.launch_spec(execution_id.to_owned(), turn_id.as_str().to_owned());
        let launcher = self.launcher.clone();
        // If this future is dropped while the launch runs, the blocking
        // thread drops the `LaunchedChild`, whose tree kills itself.
        let launched = tokio::task::spawn_blocking(move || launcher.launch(&spec))
            .await
            .map_err(|e| self.load_error(format!("the launcher panicked: {e}")))?
            .map_err(|e| self.launch_refused(turn_report, execution_id, e))?;
        let LaunchedChild {
            stdin,
            stdout,
            stderr,
            tree,
            report,
            egress_listener,
        } = launched;
        let pid = tree.pid();
        // A failed duplicate only loses the wait for the plugin to read its
        // `turn/abort`; the kill itself never depends on it.
        let guard = TreeGuard::new(tree, stdin.try_clone().ok(), self.config.abort_grace);
        stamp(self.config.stages.as_ref(), "launched");
        let tail = report_launch(turn_report, &guard, report.as_ref());
        self.report_program(turn_report);
        // Dropped when the turn ends (or its future is dropped): the
        // gateway stops accepting and closes every connection of the turn.
        let gateway = self.serve_egress(execution_id, egress_listener)?;
        let (stdin, stdout, stderr) = self.stdio_pipes(stdin, stdout, stderr)?;
        let stderr_task = AbortOnDrop(tokio::spawn(stderr::drain_stderr_with_tail(
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
        let (peer, inbound) = Peer::spawn(stdout, stdin, peer_config);
        let mut conn = Connection {
            peer,
            inbound,
            guard,
            stderr: stderr_task,
            tail,
            report,
            many: false,
            first_execution_id: execution_id.to_owned(),
            turns: 0,
            pid,
        };
        match self.handshake_on(&mut conn, abort, offer_many).await {
            Ok(()) => {
                stamp(self.config.stages.as_ref(), "initialized");
                Ok((conn, gateway))
            }
            Err((reason, e)) => {
                if let Some(reason) = reason {
                    self.diagnose(turn_report, execution_id, reason, &mut conn)
                        .await;
                }
                conn.close(abort.is_raised());
                Err(e)
            }
        }
    }

    /// A refused or failed launch: its report (what the isolation reached
    /// and why it was refused) is the turn's provenance.
    fn launch_refused(
        &self,
        turn_report: &TurnReport,
        execution_id: &str,
        mut e: LaunchError,
    ) -> RuntimeError {
        if let LaunchError::Refused {
            report: report @ Some(_),
            ..
        } = &mut e
            && let Some(report) = report.take()
        {
            turn_report.set_sandbox(report);
        }
        let reason = match e {
            LaunchError::Refused { .. } => "launch_refused",
            LaunchError::Spawn { .. } => "launch_failed",
        };
        let process = diagnosis::process_json(None, Vec::new(), false, None);
        self.keep_diagnosis(turn_report, execution_id, reason, process);
        self.load_error(e)
    }

    async fn handshake_on(
        &self,
        conn: &mut Connection,
        abort: &Signal,
        offer_many: bool,
    ) -> Result<(), (Option<&'static str>, RuntimeError)> {
        let limits = ConnectionLimits {
            max_message_bytes: self.config.max_message_bytes as u64,
            max_inflight_tool_calls: u32::try_from(self.config.max_inflight_tool_calls)
                .unwrap_or(u32::MAX),
            max_concurrent_turns: 1,
        };
        let mut offer = JsonObject::new();
        if offer_many {
            offer.insert(CAPABILITY_TURNS.into(), Value::from(TURNS_MANY));
        }
        let answered = tokio::select! {
            r = handshake_offering(&conn.peer, &mut conn.inbound, &self.config.manifest, limits, offer, self.config.handshake_timeout) => r,
            _ = abort.raised() => {
                return Err((None, RuntimeError::Failed("the turn was aborted during the handshake".into())));
            }
        };
        let result =
            answered.map_err(|e| (Some(diagnosis::handshake_reason(&e)), self.load_error(e)))?;
        conn.many = offer_many && offers_many_turns(&result.capabilities);
        Ok(())
    }

    /// Keeps why the turn ended without an outcome, with the process's
    /// exit status and last stderr lines. A plugin that stopped talking
    /// (its stdout closed, a broken stream) is exiting, or crashed before
    /// it answered `initialize`: its status follows by moments, so it is
    /// waited for (bounded); one that is still running (a timeout, a
    /// refused answer) is not.
    pub(super) async fn diagnose(
        &self,
        report: &TurnReport,
        execution_id: &str,
        reason: &'static str,
        conn: &mut Connection,
    ) {
        let bound = match reason {
            "plugin_exited" | "io" | "write_stall" => EXIT_STATUS_WAIT,
            _ => std::time::Duration::ZERO,
        };
        let (status, lines) = conn.ending(bound).await;
        let process = diagnosis::process_json(status, lines, conn.sandboxed(), conn.limits_hit());
        self.keep_diagnosis(report, execution_id, reason, process);
    }

    /// After a turn on `conn` ended in error: its diagnosis, where the
    /// error says one (a stream violation, a runtime error not caused by
    /// the abort).
    pub(super) async fn diagnose_error(
        &self,
        report: &TurnReport,
        execution_id: &str,
        error: &RuntimeError,
        abort: &Signal,
        conn: &mut Connection,
        turn_id: &TurnId,
    ) {
        let reason = match error {
            RuntimeError::Protocol(text) => Some(diagnosis::stream_reason(text)),
            RuntimeError::Failed(_) if !abort.is_raised() => Some("runtime_error"),
            _ => None,
        };
        if let Some(reason) = reason {
            // A plugin that closed its stdout is exiting: its status
            // follows the EOF by moments, so wait for it (bounded).
            let bound = if reason == "plugin_exited" {
                EXIT_STATUS_WAIT
            } else {
                std::time::Duration::ZERO
            };
            let (status, lines) = conn.ending(bound).await;
            let process =
                diagnosis::process_json(status, lines, conn.sandboxed(), conn.limits_hit());
            self.keep_diagnosis(report, execution_id, reason, process);
        }
        tracing::debug!(runtime = %self.config.manifest.id, turn = %turn_id, "turn ended without an outcome: {}", escape_text(&truncate(&error.to_string(), 500)));
    }
}
