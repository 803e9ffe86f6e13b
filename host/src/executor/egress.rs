//! A turn of a seat with an egress gateway: bound to the gateway for as
//! long as the seat runs, with the kernel as the authority of each request
//! and connection; what the gateway reports becomes the turn's events, and
//! a spent budget ends the turn `egress_budget_exceeded`, a model failing
//! its route's `maxFailures` answers in a row `model_unavailable` (or
//! `model_access_refused`).

use std::sync::Arc;

use sharedos_kernel::KernelTurn;
use sharedos_protocol::AccessContext;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Executor;
use super::turn::Turn;
use crate::egress::seat::event_of;
use crate::egress::{BoundTurn, EgressEvent, TurnBinding};

/// The binding and the task turning egress events into turn events; both
/// end when this is dropped.
pub(super) struct EgressTurn {
    _bound: BoundTurn,
    binding: Arc<TurnBinding>,
    events: tokio::task::JoinHandle<()>,
    stop: CancellationToken,
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
    }
}

impl Drop for EgressTurn {
    fn drop(&mut self) {
        self.events.abort();
    }
}

fn record(turn: &Turn, e: &EgressEvent) {
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
        let turn = Arc::clone(turn);
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let events = tokio::spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    e = rx.recv() => match e {
                        Some(e) => record(&turn, &e),
                        None => return,
                    },
                    _ = stopped.cancelled() => {
                        while let Ok(e) = rx.try_recv() {
                            record(&turn, &e);
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
        })
    }
}
