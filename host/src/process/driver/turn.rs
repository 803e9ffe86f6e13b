//! The host side of one turn on an initialized connection (protocol.md
//! B.3): sends nothing itself but the drain and the abort, serves the
//! plugin's `host/invokeTool` concurrently and `host/emit` /
//! `host/annotate` in wire order with a [`RuntimeHost`], and ends at the
//! `turn/run` answer (or when the turn cannot go on).

use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use serde_json::value::RawValue;
use sharedos_peer::{
    ErrorObjectOwned, HostInbound as Inbound, HostInbox as Inbox, Peer, Replier, RequestParams,
    Violation, ViolationReason,
};
use sharedos_plugin_sdk::{HostCallError, RuntimeError, RuntimeHost, Signal};
use sharedos_protocol::jsonrpc::{WireError, truncate};
use sharedos_protocol::method::{
    Annotate, Emit, InvokeTool, Method, TurnAbort, TurnDraining, to_host,
};
use sharedos_protocol::{
    ErrorKind, InvokeToolParams, RuntimeLimits, RuntimeTurnOutcome, RuntimeTurnRequest, ToolResult,
    TurnAbortParams, TurnDrainingParams, TurnId, TurnRunParams,
};
use tokio::time::{Instant, Sleep};

use super::calls::Calls;

/// After the process exits, how long the reader may still deliver what the
/// plugin wrote before it died (its outcome, typically).
pub const EXIT_DRAIN_GRACE: Duration = Duration::from_millis(250);

/// After this many answers in a row the driver yields once, so the writer
/// sends them while the rest of the calls are served: the plugin works on
/// the first answers while the host works on the next calls. Without it a
/// burst of 64 calls was answered in one write after all 64 were served,
/// host and plugin taking turns instead of working at once
/// (docs/BENCHMARKS.md, calls in flight).
const ANSWER_BATCH: usize = 16;

/// What a tool call being served gives back, tagged with its slot in
/// `pending`.
type Served = (usize, Result<ToolResult, HostCallError>);

/// One tool call being served: the host's call, with the host it runs on
/// (kept alive by the future itself, so what is left at the end of the
/// turn can be spawned). `calls` holds these futures by their own type, not
/// boxed, in slots kept from call to call.
/// The params stay boxed (as the reader made them) until the first poll,
/// so the future moved into its slot is a few words, not the whole call.
async fn serve_call(
    host: Arc<dyn RuntimeHost>,
    slot: usize,
    params: Box<InvokeToolParams>,
) -> Served {
    let InvokeToolParams { call, step, .. } = *params;
    (slot, host.invoke_tool(call, step).await)
}

/// The answer slots of the calls being served, by slot number: a call
/// takes a free slot and gives it back when it is answered, so the
/// bookkeeping of a call is an index, not a hashed key.
#[derive(Default)]
struct Pending {
    slots: Vec<Option<Replier>>,
    free: Vec<usize>,
}

impl Pending {
    fn insert(&mut self, reply: Replier) -> usize {
        match self.free.pop() {
            Some(slot) => {
                self.slots[slot] = Some(reply);
                slot
            }
            None => {
                self.slots.push(Some(reply));
                self.slots.len() - 1
            }
        }
    }

    fn remove(&mut self, slot: usize) -> Option<Replier> {
        let reply = self.slots.get_mut(slot)?.take()?;
        self.free.push(slot);
        Some(reply)
    }

    /// Every call still waiting for its answer; the slots are gone after.
    fn drain(&mut self) -> impl Iterator<Item = Replier> + '_ {
        self.free.clear();
        self.slots.drain(..).flatten()
    }
}

type Ending = Result<RuntimeTurnOutcome, RuntimeError>;

/// What one event of the turn decided: go on, or end the turn so.
type Step = ControlFlow<Ending>;

/// The state of one turn being driven. `C` is the type of
/// [`serve_call`]'s future (named by inference, as it has no name).
struct TurnDriver<'a, C> {
    peer: &'a Peer,
    run_id: u64,
    turn_id: &'a TurnId,
    host: Arc<dyn RuntimeHost>,
    abort: &'a Signal,
    /// The calls run inside the driver's task (no spawn, no cross-thread
    /// wake-up per call); whatever still runs at the end is spawned then.
    calls: Calls<C>,
    serve: fn(Arc<dyn RuntimeHost>, usize, Box<InvokeToolParams>) -> C,
    pending: Pending,
    /// Set once the plugin is gone: when the grace ends, and how it went.
    exit_deadline: Option<(Instant, String)>,
}

/// Runs one turn: returns when the `turn/run` response (id `run_id`)
/// arrives or the turn cannot go on. `exited` resolves when the plugin
/// process is gone; what it wrote before dying is still delivered for
/// [`EXIT_DRAIN_GRACE`].
pub async fn drive_turn(
    peer: &Peer,
    run_id: u64,
    inbound: &mut Inbox,
    turn_id: &TurnId,
    host: Arc<dyn RuntimeHost>,
    abort: Signal,
    exited: impl Future<Output = String>,
) -> Ending {
    let draining = host.draining();
    let mut turn = TurnDriver {
        peer,
        run_id,
        turn_id,
        host,
        abort: &abort,
        calls: Calls::default(),
        serve: serve_call,
        pending: Pending::default(),
        exit_deadline: None,
    };
    let (mut drain_sent, mut dead_seen) = (false, false);
    let mut answered = 0usize;
    let dead = peer.dead();
    // The two signals are waited on by one future each for the whole turn,
    // not one made per event: each is a watch receiver registered with its
    // sender, and making and dropping two per event cost about 600
    // instructions per tool call. A raised signal is seen by the
    // kept future as by a new one (`raised` is level-triggered).
    let aborted = abort.raised();
    let drain_asked = draining.raised();
    tokio::pin!(dead);
    tokio::pin!(exited);
    tokio::pin!(aborted);
    tokio::pin!(drain_asked);
    // The grace's timer, made once the plugin is gone (the select takes a
    // reference to it, not a timer made and moved on every event).
    let mut exit_sleep: Option<Pin<Box<Sleep>>> = None;
    let ending = loop {
        if exit_sleep.is_none()
            && let Some((at, _)) = &turn.exit_deadline
        {
            exit_sleep = Some(Box::pin(tokio::time::sleep_until(*at)));
        }
        let step = tokio::select! {
            biased;
            _ = &mut aborted => turn.aborted(),
            item = inbound.recv() => turn.inbound(item).await,
            Some((n, result)) = turn.calls.next(), if !turn.calls.is_empty() => {
                let step = turn.call_done(n, result).await;
                answered += 1;
                if answered >= ANSWER_BATCH {
                    answered = 0;
                    tokio::task::yield_now().await;
                }
                step
            }
            _ = &mut drain_asked, if !drain_sent => {
                drain_sent = true;
                turn.drain().await
            }
            v = &mut dead, if !dead_seen => {
                dead_seen = true;
                turn.dead(v)
            }
            how = &mut exited, if turn.exit_deadline.is_none() => turn.exited(how),
            _ = grace_over(&mut exit_sleep) => turn.exit_grace_over(),
        };
        if let ControlFlow::Break(ending) = step {
            break ending;
        }
    };
    turn.finish();
    ending
}

impl<C: Future<Output = Served> + Send + 'static> TurnDriver<'_, C> {
    fn aborted(&mut self) -> Step {
        let params = TurnAbortParams {
            turn_id: self.turn_id.clone(),
            reason: Some("aborted".into()),
        };
        self.peer.try_notify(TurnAbort::NAME, &params);
        let cancelled = sharedos_peer::error(ErrorKind::Cancelled, "the turn was aborted");
        for reply in self.pending.drain() {
            reply.try_error(&cancelled);
        }
        ControlFlow::Break(Err(RuntimeError::Failed(
            "the turn was aborted by the host".into(),
        )))
    }

    async fn inbound(&mut self, item: Option<Inbound>) -> Step {
        let Some(item) = item else {
            return ControlFlow::Break(Err(RuntimeError::Protocol(
                "the plugin connection stopped".into(),
            )));
        };
        match item {
            Inbound::Response { id, result } if id == self.run_id => {
                ControlFlow::Break(outcome(result))
            }
            Inbound::Response { .. } => ControlFlow::Continue(()),
            Inbound::Closed(v) => ControlFlow::Break(Err(protocol_error(&v))),
            Inbound::Notification { method, params } => fatal_on(apply_notification(
                self.peer,
                self.turn_id,
                self.host.as_ref(),
                method,
                params.as_deref(),
            )),
            Inbound::Request {
                method,
                params,
                reply,
            } => match method {
                to_host::Request::InvokeTool => self.invoke(params, reply).await,
            },
        }
    }

    /// A `host/invokeTool`: checked here, then run alongside the reading.
    async fn invoke(&mut self, params: Option<RequestParams>, reply: Replier) -> Step {
        match check_invoke(self.turn_id, self.abort, params) {
            Err(err) => {
                if let Err(v) = self.peer.count_violation("invalid_invoke_tool") {
                    return ControlFlow::Break(Err(protocol_error(&v)));
                }
                fatal_on(reply.error(&err).await)
            }
            Ok(p) => {
                let slot = self.pending.insert(reply);
                let served = (self.serve)(self.host.clone(), slot, p);
                self.calls.push(served);
                ControlFlow::Continue(())
            }
        }
    }

    async fn call_done(&mut self, n: usize, result: Result<ToolResult, HostCallError>) -> Step {
        let Some(reply) = self.pending.remove(n) else {
            return ControlFlow::Continue(());
        };
        fatal_on(match result {
            // A ToolResult is always a result, refusals included.
            Ok(tool_result) => reply.result_written(&tool_result).await,
            Err(e) => reply.error(&host_call_error(&e)).await,
        })
    }

    async fn drain(&mut self) -> Step {
        let params = TurnDrainingParams {
            turn_id: self.turn_id.clone(),
        };
        fatal_on(self.peer.notify(TurnDraining::NAME, &params).await)
    }

    /// The peer died. A writer that hit a closed pipe means the plugin is
    /// gone; what it wrote before (its outcome, say) may still be in the
    /// reader's hands, so wait like for an exit.
    fn dead(&mut self, v: Violation) -> Step {
        if v.reason != ViolationReason::PluginExited {
            return ControlFlow::Break(Err(protocol_error(&v)));
        }
        self.exited(v.detail)
    }

    fn exited(&mut self, how: String) -> Step {
        if self.exit_deadline.is_none() {
            self.exit_deadline = Some((Instant::now() + EXIT_DRAIN_GRACE, how));
        }
        ControlFlow::Continue(())
    }

    fn exit_grace_over(&mut self) -> Step {
        let how = self
            .exit_deadline
            .as_ref()
            .map(|(_, h)| h.clone())
            .unwrap_or_default();
        self.peer
            .fail(Violation::new(ViolationReason::PluginExited, how.clone()));
        ControlFlow::Break(Err(RuntimeError::Protocol(format!("plugin_exited: {how}"))))
    }

    /// Tool calls still running are left to finish on the host side: the
    /// executor accounts for the kernel's completion, not for our reply.
    fn finish(self) {
        let mut calls = self.calls;
        if !calls.is_empty() {
            tokio::spawn(async move { while calls.next().await.is_some() {} });
        }
    }
}

/// Resolves when `sleep` ends; never without one.
fn grace_over(sleep: &mut Option<Pin<Box<Sleep>>>) -> impl Future<Output = ()> + '_ {
    std::future::poll_fn(move |cx| match sleep {
        Some(sleep) => sleep.as_mut().poll(cx),
        None => Poll::Pending,
    })
}

/// The `turn/run` answer as the turn's ending.
fn outcome(result: Result<Box<RawValue>, WireError>) -> Ending {
    match result {
        Ok(raw) => serde_json::from_str::<RuntimeTurnOutcome>(raw.get())
            .map_err(|e| RuntimeError::InvalidOutcome(truncate(&e.to_string(), 500))),
        Err(e) => Err(RuntimeError::Failed(format!(
            "the plugin answered turn/run with error {}: {}",
            e.code,
            truncate(&e.message, 500)
        ))),
    }
}

fn fatal_on(sent: Result<(), Violation>) -> Step {
    match sent {
        Ok(()) => ControlFlow::Continue(()),
        Err(v) => ControlFlow::Break(Err(protocol_error(&v))),
    }
}

fn protocol_error(v: &Violation) -> RuntimeError {
    RuntimeError::Protocol(v.to_string())
}

/// The wire error for a `HostCallError` (code from its kind).
pub fn host_call_error(e: &HostCallError) -> ErrorObjectOwned {
    sharedos_peer::error(e.kind, truncate(&e.message, 1000))
}

/// The params as the contract types them: parsed by the reader already
/// (the usual case), else parsed here from the text sent.
fn check_invoke(
    turn_id: &TurnId,
    abort: &Signal,
    params: Option<RequestParams>,
) -> Result<Box<InvokeToolParams>, ErrorObjectOwned> {
    let parsed = match params {
        Some(RequestParams::InvokeTool(p)) => Some(p),
        Some(RequestParams::Raw(raw)) => {
            sharedos_peer::params::<InvokeTool>(Some(&raw)).map(Box::new)
        }
        None => None,
    };
    let Some(p) = parsed else {
        return Err(sharedos_peer::error(
            ErrorKind::InvalidParams,
            "host/invokeTool params do not match the contract",
        ));
    };
    if &p.turn_id != turn_id || abort.is_raised() {
        return Err(sharedos_peer::error(
            ErrorKind::TurnNotActive,
            "turn not active",
        ));
    }
    Ok(p)
}

/// Applies one notification; a bad one is dropped and counted.
fn apply_notification(
    peer: &Peer,
    turn_id: &TurnId,
    host: &dyn RuntimeHost,
    method: to_host::Notification,
    params: Option<&RawValue>,
) -> Result<(), Violation> {
    let applied = match method {
        to_host::Notification::Emit => match sharedos_peer::params::<Emit>(params) {
            Some(p) if &p.turn_id == turn_id => host.emit(p.event).map_err(|_| "emit_rejected"),
            Some(_) => Err("notification_for_inactive_turn"),
            None => Err("invalid_emit"),
        },
        to_host::Notification::Annotate => match sharedos_peer::params::<Annotate>(params) {
            Some(p) if &p.turn_id == turn_id => host
                .annotate(&p.key, p.value)
                .map_err(|_| "annotate_rejected"),
            Some(_) => Err("notification_for_inactive_turn"),
            None => Err("invalid_annotate"),
        },
    };
    match applied {
        Ok(()) => Ok(()),
        Err(what) => peer.count_violation(what),
    }
}

/// The `turn/run` params.
pub fn turn_run_params(
    turn_id: &TurnId,
    request: RuntimeTurnRequest,
    limits: RuntimeLimits,
) -> TurnRunParams {
    TurnRunParams {
        turn_id: turn_id.clone(),
        request,
        limits,
    }
}
