//! The envelope: runs one turn of a seated runtime and keeps every piece of
//! authority (envelope.md B).
//!
//! In order: validate the request, check the context, open the turn's
//! authority, admit, compute the catalogue (kernel listing ∩ requested
//! names), hand the runtime a sanitized request, mediate every effect, and
//! build the result on every way out with the envelope's provenance.

mod annotations;
mod authority;
mod conclude;
mod deadline;
mod detach;
mod egress;
mod ending;
mod events;
mod finish;
mod gate;
mod ledger;
mod mediation;
mod options;
pub mod record;
mod request;
mod signals;
mod turn;

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::FutureExt;
use serde_json::{Value, json};
use sharedos_kernel::{Admitted, KernelError, KernelTurn, Opening, OpeningDurable, TurnKernel};
use sharedos_plugin_sdk::{RuntimeError, Signal};
use sharedos_protocol::{
    AccessContext, EventKind, ExecutionRequest, ExecutionResult, ExecutionStatus, ReachResult,
    RuntimeLimits, RuntimeManifest, RuntimeTurnOutcome, RuntimeTurnRequest,
};
use tracing::Instrument;

pub use crate::limits::{EVENT_OVERHEAD_BYTES, STDERR_TAIL_RESERVE_BYTES, VALUE_NODE_BYTES};
pub use mediation::EnvelopeHost;
pub use options::*;

use crate::limits::MAX_DEFAULT_TOOL_CALLS;
use crate::process::AffinityKey;
use annotations::AnnotationBounds;
use ending::*;
use request::{context_mismatch, mismatch_message, sanitize};
use turn::{Turn, TurnBudget, TurnParams};

/// Locks a mutex, recovering the data if a panicking holder poisoned it:
/// every critical section of a turn's parts leaves the state consistent.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the first steps of a turn opened with the kernel.
struct Opened {
    kernel_turn: Arc<dyn sharedos_kernel::KernelTurn>,
    context: Arc<AccessContext>,
    reach: ReachResult,
    effective: Vec<sharedos_protocol::ToolDefinition>,
    /// The commit of the opening's records, still under way.
    durable: OpeningDurable,
}

/// What the body of a turn threw.
enum Caught {
    Runtime(RuntimeError),
    Kernel(KernelError),
    Aborted,
}

/// The fixed security envelope around one seat.
pub struct Executor {
    kernel: Arc<dyn TurnKernel>,
    seat: Seat,
    options: ExecutorOptions,
}

impl Executor {
    pub fn new(
        kernel: Arc<dyn TurnKernel>,
        seat: Seat,
        options: ExecutorOptions,
    ) -> Result<Self, ExecutorError> {
        if options.drain_grace_ms > MAX_TIMEOUT_MS {
            return Err(ExecutorError(format!(
                "drainGraceMs must be between 0 and {MAX_TIMEOUT_MS}"
            )));
        }
        if !(1..=MAX_TIMEOUT_MS).contains(&options.default_timeout_ms) {
            return Err(ExecutorError(format!(
                "defaultTimeoutMs must be between 1 and {MAX_TIMEOUT_MS}"
            )));
        }
        if options.default_max_steps == 0 {
            return Err(ExecutorError(
                "defaultMaxSteps must be a positive integer".into(),
            ));
        }
        if let Some(n) = options.default_max_tool_calls
            && !(1..=MAX_DEFAULT_TOOL_CALLS).contains(&n)
        {
            return Err(ExecutorError(format!(
                "defaultMaxToolCalls must be between 1 and {MAX_DEFAULT_TOOL_CALLS}"
            )));
        }
        if options.max_events_per_turn < MIN_EVENTS_PER_TURN {
            return Err(ExecutorError(format!(
                "maxEventsPerTurn must be at least {MIN_EVENTS_PER_TURN}"
            )));
        }
        if !(MIN_TURN_BYTES..=MAX_TURN_BYTES).contains(&options.max_turn_bytes) {
            return Err(ExecutorError(format!(
                "maxTurnBytes must be between {MIN_TURN_BYTES} and {MAX_TURN_BYTES}"
            )));
        }
        Ok(Self {
            kernel,
            seat,
            options,
        })
    }

    pub fn manifest(&self) -> &RuntimeManifest {
        &self.seat.manifest
    }

    /// Parses a request from JSON, then runs it.
    pub async fn execute_json(
        &self,
        json: &str,
        opts: ExecuteOptions,
    ) -> Result<ExecutionResult, ExecuteError> {
        let request: ExecutionRequest =
            serde_json::from_str(json).map_err(|e| ExecuteError::InvalidRequest(e.to_string()))?;
        self.execute(request, opts).await
    }

    fn runtime_ref(&self) -> Value {
        let m = &self.seat.manifest;
        json!({"id": m.id, "version": m.version, "protocolVersion": m.protocol_version})
    }

    fn limits(&self, request: &ExecutionRequest) -> RuntimeLimits {
        let o = request.options.unwrap_or_default();
        let max_steps = o.max_steps.unwrap_or(self.options.default_max_steps);
        let timeout_ms = o.timeout_ms.unwrap_or(self.options.default_timeout_ms);
        // The plugin is told the drain point, so it can plan its work.
        let grace = self.options.drain_grace_ms;
        let (drain_grace_ms, drain_at_ms) = if grace > 0 {
            (Some(grace), Some(timeout_ms.saturating_sub(grace)))
        } else {
            (None, None)
        };
        RuntimeLimits {
            max_steps,
            max_tool_calls: o
                .max_tool_calls
                .or(self.options.default_max_tool_calls)
                .unwrap_or(max_steps),
            timeout_ms,
            drain_grace_ms,
            drain_at_ms,
        }
    }

    /// A grace no smaller than the turn's limit leaves it no working time:
    /// it drains from its first instant and every call is refused. ADR 0007
    /// leaves that choice to the host, so it is not clamped; it is said, in
    /// the log and in `metadata.runtime.warnings`.
    fn no_working_time(&self, timeout_ms: u64) -> Option<String> {
        let grace = self.options.drain_grace_ms;
        (grace > 0 && grace >= timeout_ms).then(|| {
            format!(
                "timeoutMs {timeout_ms} is not above drainGraceMs {grace}: the turn drained from its first instant and every tool call was refused"
            )
        })
    }

    fn report_turn_error(&self, turn: &Turn, error: TurnError) {
        if let Some(cb) = &self.options.on_turn_error {
            let ids = TurnIds {
                execution_id: turn.execution_id().to_string(),
                trace_id: turn.trace_id().to_string(),
            };
            let _ = std::panic::catch_unwind(AssertUnwindSafe(|| cb(&error, &ids)));
        }
    }

    /// Runs one turn. `Err` only for a request that does not match the
    /// contract; every other ending is an `ExecutionResult`.
    pub async fn execute(
        &self,
        request: ExecutionRequest,
        opts: ExecuteOptions,
    ) -> Result<ExecutionResult, ExecuteError> {
        self.execute_recorded(request, opts, None).await
    }

    /// [`Executor::execute`] for a host that keeps its own record of the
    /// turn: raising `outage` is an audit outage (B.10).
    pub async fn execute_recorded(
        &self,
        request: ExecutionRequest,
        opts: ExecuteOptions,
        outage: Option<RecordOutage>,
    ) -> Result<ExecutionResult, ExecuteError> {
        self.execute_turn(request, opts, outage, None).await
    }

    /// [`Executor::execute_recorded`] for a turn of the session
    /// `session`: with session affinity configured, it may run on the
    /// process the session's previous turn left parked under the same
    /// session and the same trusted fingerprint (agent, namespace,
    /// authority, owner, purpose, enabled tool namespaces). For a host's
    /// session layer (`Sessions`); a bare `execute` never reuses.
    pub async fn execute_in_session(
        &self,
        request: ExecutionRequest,
        opts: ExecuteOptions,
        outage: Option<RecordOutage>,
        session: &str,
    ) -> Result<ExecutionResult, ExecuteError> {
        self.execute_turn(request, opts, outage, Some(session))
            .await
    }

    /// Kills the processes parked for `session` (it was closed).
    pub fn release_session(&self, session: &str) {
        if let Some(s) = &self.seat.sessions {
            s.release_session(session);
        }
    }

    /// Kills every process parked for this seat (the host is stopping).
    pub fn release_parked(&self) {
        if let Some(s) = &self.seat.sessions {
            s.release_all();
        }
    }

    fn new_turn(&self, request: &ExecutionRequest, opts: &ExecuteOptions) -> Arc<Turn> {
        let limits = self.limits(request);
        let turn = Turn::new(TurnParams {
            execution_id: request.execution_id.clone(),
            context: request.context.clone(),
            limits,
            drain_grace_ms: self.options.drain_grace_ms,
            runtime_ref: self.runtime_ref(),
            clock: self.options.clock.clone(),
            ids: self.options.ids.clone(),
            on_event: opts.on_event.clone(),
            budget: TurnBudget {
                max_events: self.options.max_events_per_turn,
                max_turn_bytes: self.options.max_turn_bytes,
                annotations: AnnotationBounds {
                    max_keys: self.options.max_annotation_keys,
                    max_bytes: self.options.max_annotation_bytes,
                },
            },
        });
        turn.events().plan_calls(limits.max_tool_calls);
        turn
    }

    /// The tasks that stop the turn on the caller's cancel and on an
    /// outage of the caller's record.
    fn spawn_watchers(
        &self,
        turn: &Arc<Turn>,
        opts: &ExecuteOptions,
        outage: Option<RecordOutage>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let cancel_watch = opts.cancel.clone().map(|c| {
            let t = Arc::downgrade(turn);
            tokio::spawn(async move {
                c.cancelled().await;
                if let Some(t) = t.upgrade() {
                    let signals = t.signals();
                    signals.note_cause("caller");
                    if !signals.hard_raised() {
                        tracing::info!(execution_id = %t.execution_id(), "the caller cancelled the turn");
                    }
                    signals.raise_hard();
                }
            })
        });
        let outage_watch = outage.map(|o| {
            let t = Arc::downgrade(turn);
            tokio::spawn(async move {
                o.raised().await;
                if let Some(t) = t.upgrade() {
                    t.note_audit_outage(&KernelError::AuditUnavailable {
                        effect: sharedos_kernel::AuditEffect::None,
                        cause: o.cause().unwrap_or_default(),
                    });
                    t.drain_for_outage();
                }
            })
        });
        [cancel_watch, outage_watch].into_iter().flatten().collect()
    }

    /// One turn inside its span (`sharedos.turn`, host/src/telemetry.rs).
    async fn execute_turn(
        &self,
        request: ExecutionRequest,
        opts: ExecuteOptions,
        outage: Option<RecordOutage>,
        session: Option<&str>,
    ) -> Result<ExecutionResult, ExecuteError> {
        let span = crate::telemetry::turn_span(&request, session);
        let result = self
            .execute_in_span(request, opts, outage, session)
            .instrument(span.clone())
            .await;
        crate::telemetry::record_end(&span, &result);
        result
    }

    async fn execute_in_span(
        &self,
        request: ExecutionRequest,
        opts: ExecuteOptions,
        outage: Option<RecordOutage>,
        session: Option<&str>,
    ) -> Result<ExecutionResult, ExecuteError> {
        request.check()?;
        let started_at = (self.options.clock)();
        let turn = self.new_turn(&request, &opts);

        // Context checks, before any kernel call.
        if let Some(code) = context_mismatch(&request) {
            let ending = Ending::denied(code, mismatch_message(code));
            return Ok(self.finish(&turn, ending, started_at, None).await);
        }

        // The deadline machinery starts now.
        if let Some(w) = self.no_working_time(turn.limits().timeout_ms) {
            tracing::warn!(execution_id = %turn.execution_id(), "{w}");
        }
        turn.arm_deadline();
        let watchers = self.spawn_watchers(&turn, &opts, outage);
        if opts.cancel.as_ref().is_some_and(|c| c.is_cancelled()) {
            watchers.iter().for_each(|w| w.abort());
            let ending = Ending::cancelled(true, "caller").unannounced();
            return Ok(self.finish(&turn, ending, started_at, None).await);
        }

        let key = session.map(|s| AffinityKey::new(s, &request.agent, &request.context));
        let affine = key.is_some() && self.seat.sessions.is_some();
        let (body, report) = self.body(&turn, request, key).await;
        if affine {
            // Only a turn that completed, with no drain, leaves its process
            // for the session's next turn; decided before anything else
            // can await (a parked process is killed at its TTL regardless).
            let keep = matches!(&body, Ok(e) if e.status == ExecutionStatus::Succeeded)
                && !turn.signals().soft_raised();
            if let Some(s) = &self.seat.sessions {
                s.turn_ended(turn.execution_id().as_str(), keep);
            }
        }
        let ending = match body {
            Ok(ending) => ending,
            Err(caught) => {
                let diagnosis = report.diagnosis();
                self.catch(&turn, caught, diagnosis.as_ref()).await
            }
        };
        watchers.iter().for_each(|w| w.abort());
        Ok(self.finish(&turn, ending, started_at, Some(&report)).await)
    }

    /// Steps 6–11 of B.1: authority, admission, reach and the effective
    /// catalogue. `Ok(None)`: the turn was denied admission.
    async fn open_catalogue(
        &self,
        turn: &Arc<Turn>,
        request: &ExecutionRequest,
        hard: &Signal,
    ) -> Result<Result<Opened, Ending>, Caught> {
        macro_rules! kernel_call {
            ($fut:expr) => {{
                tokio::select! {
                    biased;
                    _ = hard.raised() => return Err(Caught::Aborted),
                    r = $fut => match r {
                        Ok(v) => v,
                        Err(e) => {
                            turn.note_audit_outage(&e);
                            return Err(Caught::Kernel(e));
                        }
                    },
                }
            }};
        }
        let context = turn.context_now();
        // Authority, admission, reach and catalogue in one kernel call: its
        // records are committed together, and the plugin's launch (not an
        // effect) overlaps their commit (`Executor::run` waits for it).
        let opening = kernel_call!(self.kernel.open_admitted(&context, &request.agent));
        let Opening {
            turn: kernel_turn,
            admission,
            admitted,
            durable,
        } = opening;
        turn.authority().hold(Arc::clone(&kernel_turn));
        let Some(Admitted { reach, tools }) = admitted else {
            // The refusal is durable before it is answered.
            kernel_call!(durable);
            let code = admission
                .reason_code
                .unwrap_or_else(|| "no_matching_grant".to_owned());
            return Ok(Err(Ending::denied(&code, MSG_ADMISSION)));
        };

        let requested: HashSet<&str> = request.tools.iter().map(|t| t.name.as_str()).collect();
        let effective: Vec<_> = tools
            .into_iter()
            .filter(|d| requested.contains(d.name.as_str()))
            .collect();
        turn.gate().offer(effective.clone());
        Ok(Ok(Opened {
            kernel_turn,
            context,
            reach,
            effective,
            durable,
        }))
    }

    /// The seat's turn: on the session's parked process when the turn has
    /// a session and the seat has affinity, else a turn of its runtime.
    fn run_seat(
        &self,
        request: RuntimeTurnRequest,
        host: Arc<EnvelopeHost>,
        abort: Signal,
        key: Option<AffinityKey>,
    ) -> SeatedTurn<'_> {
        match (key, &self.seat.sessions) {
            (Some(key), Some(seat)) => seat.run_in_session(key, request, host, abort),
            _ => self.seat.runtime.turn(request, host, abort),
        }
    }

    /// Steps 6–16 of B.1: authority, admission, reach, catalogue, the run,
    /// and the outcome; with the seat's report of the turn.
    async fn body(
        &self,
        turn: &Arc<Turn>,
        request: ExecutionRequest,
        key: Option<AffinityKey>,
    ) -> (Result<Ending, Caught>, TurnReport) {
        let hard = turn.signals().hard();
        let opened = match self.open_catalogue(turn, &request, &hard).await {
            Ok(Ok(opened)) => opened,
            Ok(Err(denied)) => return (Ok(denied), self.seat.runtime.unrun()),
            Err(caught) => return (Err(caught), self.seat.runtime.unrun()),
        };
        let Opened {
            kernel_turn,
            context,
            reach,
            effective,
            durable,
        } = opened;
        let runtime_request = sanitize(&request, &context, reach, effective.clone());
        turn.events().push_envelope(
            EventKind::TurnStarted,
            json!({
                "agent": request.agent,
                "visibleTools": effective.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
                "runtime": turn.runtime_ref(),
            }),
        );
        let host = Arc::new(EnvelopeHost { turn: turn.clone() });
        let seated = self.run_seat(runtime_request, host, hard.clone(), key);
        let ended = self
            .run(
                turn,
                (seated.outcome, durable),
                &kernel_turn,
                &context,
                &hard,
            )
            .await;
        (ended, seated.report)
    }

    /// Steps 14–16: the seat's run raced against the hard signal and the
    /// commit of the opening's records, then the ending its outcome makes.
    /// The plugin starts while that commit is under way; its calls wait for
    /// it in the kernel, and the turn fails `audit_unavailable` if it fails.
    async fn run(
        &self,
        turn: &Arc<Turn>,
        (outcome, durable): (
            futures_util::future::BoxFuture<'_, Result<RuntimeTurnOutcome, RuntimeError>>,
            OpeningDurable,
        ),
        kernel_turn: &Arc<dyn KernelTurn>,
        context: &AccessContext,
        hard: &Signal,
    ) -> Result<Ending, Caught> {
        // Held until the seat's run ends: the gateway serves this turn
        // only while it runs.
        let mut egress = self.bind_egress(turn, kernel_turn, context);
        // A panic is how an in-process plugin throws: it ends the turn
        // `runtime_failed` like any throw, never unwinding through the host.
        let run = AssertUnwindSafe(outcome).catch_unwind().map(|r| {
            r.unwrap_or_else(|_| Err(RuntimeError::Failed("the runtime panicked".into())))
        });
        let mut run = std::pin::pin!(run);
        let (mut durable, mut committed) = (durable, false);
        let outcome = loop {
            tokio::select! {
                biased;
                _ = hard.raised() => {
                    // The seat gets one more poll to state what it holds
                    // before it is dropped (a plugin that annotates on its
                    // abort).
                    let _ = tokio::time::timeout(Duration::ZERO, &mut run).await;
                    // Its model requests and tunnels still open are ended
                    // before the ending, as on every other way out.
                    if let Some(egress) = &mut egress {
                        egress.settle().await;
                    }
                    return Err(Caught::Aborted);
                }
                r = &mut durable, if !committed => {
                    committed = true;
                    if let Err(e) = r {
                        return Err(opening_lost(turn, &mut egress, e).await);
                    }
                }
                r = &mut run => break r,
            }
        };
        if !committed && let Err(e) = durable.await {
            return Err(opening_lost(turn, &mut egress, e).await);
        }
        if let Some(egress) = &mut egress {
            egress.settle().await;
        }
        if let Some(outage) = turn.authority().outage() {
            return Err(Caught::Kernel(outage));
        }
        // A seat stopped for a violation does not end the turn with the
        // outcome it managed to return in the same breath.
        if turn.violation().is_some() {
            return Err(Caught::Aborted);
        }
        let outcome = match outcome {
            Ok(o) => o,
            Err(RuntimeError::InvalidOutcome(detail)) => {
                tracing::warn!(execution_id = %turn.execution_id(), detail = %sharedos_protocol::text::escape_text(&detail), "the runtime's outcome does not parse");
                return Ok(Ending::failed(
                    INVALID_RUNTIME_OUTCOME,
                    MSG_INVALID_OUTCOME,
                    false,
                ));
            }
            Err(e) => return Err(Caught::Runtime(e)),
        };
        self.ending_of(turn, kernel_turn, hard, outcome).await
    }
}

/// The commit of the turn's opening records failed: an audit outage; the
/// gateway's requests and tunnels are ended, as on every way out.
async fn opening_lost(
    turn: &Turn,
    egress: &mut Option<egress::EgressTurn>,
    e: KernelError,
) -> Caught {
    turn.note_audit_outage(&e);
    if let Some(egress) = egress {
        egress.settle().await;
    }
    Caught::Kernel(e)
}
