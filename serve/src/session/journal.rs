//! Running one admitted turn and journaling its events.
//!
//! The executor hands each event to `on_event` in sequence order. Each
//! goes through a channel to one writer, which stores it and only then
//! publishes its sequence to observers: nothing an observer sees is
//! missing from the store. After `execute` returns, a marker through the
//! same channel waits for every earlier event to be stored before the run
//! is ended in the store.
//!
//! A journal write that fails is an audit outage for the turn (no event
//! may be published unstored, and the run's record is the host's audit of
//! it): the envelope drains the turn and ends it `audit_unavailable`
//! (docs/spec/envelope.md B.10); the run ends with that result and
//! `journalError`. A failed end-of-run write is retried while the host
//! runs (the store may come back: a disk freed, a server restarted).

use std::sync::Arc;

use serde_json::{Value, json};
use sharedos_protocol::{ExecutionEvent, ExecutionRequest, Timestamp};
use sharedos_store::Store;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::LiveRun;
use super::metrics::Metrics;
use sharedos_host::executor::{ExecuteOptions, Executor, OnEvent, RecordOutage};

/// How often, and how many times, a failed end-of-run write is retried
/// before the run is left in flight for the next start to reconcile.
const END_RETRY: std::time::Duration = std::time::Duration::from_millis(500);
const END_ATTEMPTS: u32 = 120;

enum Entry {
    Event(ExecutionEvent),
    Flushed(oneshot::Sender<Option<String>>),
}

/// Runs the turn, journals it, ends the run in the store.
pub(super) async fn drive(
    store: &Arc<dyn Store>,
    executor: Arc<Executor>,
    (session_id, request): (&str, ExecutionRequest),
    live: &Arc<LiveRun>,
    closing: &CancellationToken,
    metrics: &Arc<Metrics>,
) {
    let started = std::time::Instant::now();
    let run_id = request.execution_id.to_string();
    let (tx, rx) = mpsc::unbounded_channel::<Entry>();
    let outage = RecordOutage::new();
    let writer = tokio::spawn(write(
        Arc::clone(store),
        Arc::clone(live),
        outage.clone(),
        (run_id.clone(), Arc::clone(metrics)),
        rx,
    ));
    let events = tx.clone();
    let on_event: OnEvent = Arc::new(move |e: &ExecutionEvent| {
        let _ = events.send(Entry::Event(e.clone()));
    });
    let opts = ExecuteOptions {
        cancel: Some(live.cancel.clone()),
        on_event: Some(on_event),
    };
    let outcome = executor
        .execute_in_session(request, opts, Some(outage), session_id)
        .await;
    let (done, flushed) = oneshot::channel();
    let _ = tx.send(Entry::Flushed(done));
    let journal_error = flushed
        .await
        .unwrap_or_else(|_| Some("the journal writer stopped".into()));
    drop(tx);
    let _ = writer.await;
    let mut result = match outcome {
        Ok(mut result) => {
            // The events live in the journal (under its retention).
            result.events.clear();
            serde_json::to_value(&result).unwrap_or_else(|e| json!({"error": e.to_string()}))
        }
        Err(e) => json!({"error": e.to_string()}),
    };
    if let (Some(error), Value::Object(map)) = (journal_error, &mut result) {
        map.insert("journalError".into(), Value::String(error));
    }
    // Counted before the end is stored: whoever sees the run ended sees
    // it counted.
    metrics.ended(&result, started.elapsed());
    end(store, closing, &run_id, &result, metrics).await;
}

/// Stores the run's end, retrying while the store is unavailable. If it
/// never succeeds, the run stays in flight in the store and the next
/// start of this host reconciles it as interrupted.
async fn end(
    store: &Arc<dyn Store>,
    closing: &CancellationToken,
    run_id: &str,
    result: &Value,
    metrics: &Metrics,
) {
    for attempt in 1..=END_ATTEMPTS {
        let asked = std::time::Instant::now();
        let ended = store
            .end_run(run_id, result, Timestamp::now().as_str())
            .await;
        metrics.store_op("end_run", asked.elapsed());
        match ended {
            Ok(_) => return,
            Err(e @ sharedos_store::StoreError::Unavailable(_)) if attempt < END_ATTEMPTS => {
                tracing::warn!(run_id, "could not record the end of the run, retrying: {e}");
                if closing.is_cancelled() {
                    break;
                }
                tokio::select! {
                    _ = tokio::time::sleep(END_RETRY) => {}
                    _ = closing.cancelled() => {}
                }
            }
            Err(e) => {
                tracing::error!(run_id, "could not record the end of the run: {e}");
                return;
            }
        }
    }
    tracing::error!(
        run_id,
        "the end of the run was not recorded; the next start reconciles it"
    );
}

/// The single writer of a run's journal.
async fn write(
    store: Arc<dyn Store>,
    live: Arc<LiveRun>,
    outage: RecordOutage,
    (run_id, metrics): (String, Arc<Metrics>),
    mut rx: mpsc::UnboundedReceiver<Entry>,
) {
    let mut error: Option<String> = None;
    while let Some(entry) = rx.recv().await {
        match entry {
            Entry::Event(event) if error.is_none() => {
                let asked = std::time::Instant::now();
                let stored = store.append_event(&run_id, &event).await;
                metrics.store_op("append_event", asked.elapsed());
                match stored {
                    Ok(()) => {
                        metrics.event(&event);
                        live.progress
                            .send_modify(|p| p.last_sequence = Some(event.sequence));
                    }
                    Err(e) => {
                        tracing::error!(run_id, "journal write failed, an audit outage: {e}");
                        error = Some(e.to_string());
                        outage.raise(format!("the run's journal could not be written: {e}"));
                    }
                }
            }
            Entry::Event(_) => {}
            Entry::Flushed(reply) => {
                let _ = reply.send(error.clone());
            }
        }
    }
}
