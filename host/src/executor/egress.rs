//! A turn of a seat with an egress gateway: bound to the gateway for as
//! long as the seat runs, with the kernel as the authority of each request
//! and connection; what the gateway reports becomes the turn's events, and
//! a spent budget ends the turn `egress_budget_exceeded`, a model failing
//! its route's `maxFailures` answers in a row `model_unavailable` (or
//! `model_access_refused`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use sharedos_kernel::KernelTurn;
use sharedos_protocol::AccessContext;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Executor;
use super::turn::Turn;
use sharedos_egress::seat::event_of;
use sharedos_egress::{BoundTurn, EgressEvent, TurnBinding};

/// The binding and the task turning egress events into turn events; both
/// end when this is dropped.
pub(super) struct EgressTurn {
    _bound: BoundTurn,
    binding: Arc<TurnBinding>,
    events: tokio::task::JoinHandle<()>,
    stop: CancellationToken,
    turn: Arc<Turn>,
    summary: Arc<Mutex<Summary>>,
}

/// The counts of a turn's egress, from its events: what the result says
/// of the model's answers when a turn fails (`metadata.runtime.egress`).
#[derive(Debug, Default)]
struct Summary {
    requests: u64,
    /// Answers by HTTP status.
    answers: BTreeMap<u16, u64>,
    /// Requests that ended without an answer, or were refused, by code.
    failed: BTreeMap<String, u64>,
    tunnels: u64,
    tunnels_failed: BTreeMap<String, u64>,
    model_failing: Option<Value>,
}

impl Summary {
    fn add(&mut self, e: &EgressEvent) {
        match e {
            EgressEvent::Request { status, code, .. } => {
                self.requests += 1;
                match (code, status) {
                    (Some(code), _) => *self.failed.entry(code.clone()).or_default() += 1,
                    (None, Some(status)) => *self.answers.entry(*status).or_default() += 1,
                    (None, None) => {}
                }
            }
            EgressEvent::Connection { code, .. } => {
                self.tunnels += 1;
                if let Some(code) = code {
                    *self.tunnels_failed.entry(code.clone()).or_default() += 1;
                }
            }
            EgressEvent::ModelFailing { .. } => self.model_failing = Some(event_of(e).1),
            EgressEvent::BudgetExceeded { .. } => {}
        }
    }

    fn to_value(&self, account: Value) -> Value {
        let answers: BTreeMap<String, u64> = self
            .answers
            .iter()
            .map(|(s, n)| (s.to_string(), *n))
            .collect();
        json!({
            "requests": self.requests,
            "answers": answers,
            "failed": self.failed,
            "tunnels": self.tunnels,
            "tunnelsFailed": self.tunnels_failed,
            "modelFailing": self.model_failing,
            "lastError": account["lastError"],
            "refused": account["refused"],
        })
    }
}

impl EgressTurn {
    /// Once the seat's run has returned: every request and tunnel still
    /// open is ended, and every event the gateway sent so far is on the
    /// turn (and a spent budget noted), before the ending is decided.
    pub(super) async fn settle(&mut self) {
        // A request or tunnel still open is ended `interrupted` now, its
        // event and record before the turn's ending.
        self.binding.close_open_effects().await;
        self.stop.cancel();
        let _ = (&mut self.events).await;
        let summary = self
            .summary
            .lock()
            .map(|s| s.to_value(self.binding.account()))
            .unwrap_or(Value::Null);
        tracing::info!(execution_id = %self.turn.execution_id(), egress = %summary, "the turn's egress");
        self.turn.set_egress(summary);
    }
}

impl Drop for EgressTurn {
    fn drop(&mut self) {
        self.events.abort();
    }
}

fn record(turn: &Turn, summary: &Mutex<Summary>, e: &EgressEvent) {
    if let Ok(mut s) = summary.lock() {
        s.add(e);
    }
    let (kind, data) = event_of(e);
    // Charged like a plugin's own action: a plugin that makes the gateway
    // report without end meets the event budget.
    turn.push_plugin_event(kind, data.into(), 0, 0);
    if let Some(reason) = e.ends_turn() {
        turn.violate(reason);
    }
}

impl Executor {
    /// `None` for a seat without a network policy.
    pub(super) fn bind_egress(
        &self,
        turn: &Arc<Turn>,
        kernel_turn: &Arc<dyn KernelTurn>,
        context: &AccessContext,
    ) -> Option<EgressTurn> {
        let seat = self.seat.egress.as_ref()?;
        let (tx, mut rx) = mpsc::unbounded_channel();
        let binding = Arc::new(TurnBinding::new(
            Arc::clone(kernel_turn),
            context.clone(),
            tx,
        ));
        let bound = seat.bind(turn.execution_id().as_str(), Arc::clone(&binding));
        let summary = Arc::new(Mutex::new(Summary::default()));
        let (for_task, counts) = (Arc::clone(turn), Arc::clone(&summary));
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let events = tokio::spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    e = rx.recv() => match e {
                        Some(e) => record(&for_task, &counts, &e),
                        None => return,
                    },
                    _ = stopped.cancelled() => {
                        while let Ok(e) = rx.try_recv() {
                            record(&for_task, &counts, &e);
                        }
                        return;
                    }
                }
            }
        });
        Some(EgressTurn {
            _bound: bound,
            binding,
            events,
            stop,
            turn: Arc::clone(turn),
            summary,
        })
    }
}
