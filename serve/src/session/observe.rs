//! Following one run's journal: stored history first, then each event as
//! it is stored, until the run ends.
//!
//! Every event comes from the store, read after the sequence last handed
//! out, so the stream has no gap and no duplicate whether an event was
//! stored before the observer started or while it waited. A live run's
//! writer wakes the observer; for a run not live in this process (another
//! host's, or one left by a crash) the store's change notifications wake
//! it (PostgreSQL `LISTEN/NOTIFY` naming the run; SQLite's "another
//! connection committed"), and without them it looks again every `POLL`
//! (and at least every `POLL_NOTIFIED` as a safety net).

use std::collections::VecDeque;
use std::sync::Arc;

use sharedos_protocol::ExecutionEvent;
use sharedos_store::{RunState, Store};
use tokio::sync::{broadcast, watch};

use super::{POLL, Progress, SessionError};

const BATCH: usize = 256;
/// With change notifications, still look every so often: a notification
/// lost with a dropped connection must not stall an observer.
const POLL_NOTIFIED: std::time::Duration = std::time::Duration::from_secs(1);

/// One observer of one run.
pub struct Observer {
    store: Arc<dyn Store>,
    run_id: String,
    after: Option<u64>,
    progress: Option<watch::Receiver<Progress>>,
    changes: Option<broadcast::Receiver<String>>,
    buffer: VecDeque<ExecutionEvent>,
}

impl Observer {
    /// Checks `after` against the journal (beyond its end, or dropped by
    /// retention, is an error naming both) and reads the first batch.
    pub(super) async fn start(
        store: Arc<dyn Store>,
        run_id: &str,
        after: Option<u64>,
        mut progress: Option<watch::Receiver<Progress>>,
    ) -> Result<Self, SessionError> {
        if let Some(p) = progress.as_mut() {
            p.borrow_and_update();
        }
        // Subscribed before the first read: a change committed after it
        // is never missed.
        let changes = store.changes();
        let first = store.events_after(run_id, after, BATCH).await?;
        Ok(Self {
            store,
            run_id: run_id.to_owned(),
            after,
            progress,
            changes,
            buffer: first.into(),
        })
    }

    /// The sequence of the last event handed out.
    pub fn last_sequence(&self) -> Option<u64> {
        self.after
    }

    /// The next event, or `None` once the run has ended and every stored
    /// event was handed out.
    pub async fn next(&mut self) -> Result<Option<ExecutionEvent>, SessionError> {
        loop {
            if let Some(event) = self.buffer.pop_front() {
                self.after = Some(event.sequence);
                return Ok(Some(event));
            }
            // Whether the run had ended is read before the store: an
            // event stored before the end is then always read below.
            let ended = self.ended().await?;
            let batch = self
                .store
                .events_after(&self.run_id, self.after, BATCH)
                .await?;
            if !batch.is_empty() {
                self.buffer.extend(batch);
                continue;
            }
            if ended {
                return Ok(None);
            }
            self.wait().await;
        }
    }

    async fn ended(&mut self) -> Result<bool, SessionError> {
        if let Some(p) = self.progress.as_mut() {
            let now = *p.borrow_and_update();
            if now.ended {
                return Ok(true);
            }
            if p.has_changed().is_ok() {
                return Ok(false);
            }
            // The writer is gone: the run is over in this process.
            self.progress = None;
        }
        Ok(self.store.run(&self.run_id).await?.state != RunState::InFlight)
    }

    async fn wait(&mut self) {
        match self.progress.as_mut() {
            Some(p) => {
                if p.changed().await.is_err() {
                    self.progress = None;
                }
            }
            None => match self.changes.as_mut() {
                Some(rx) => {
                    let run_id = &self.run_id;
                    let woken = tokio::time::timeout(POLL_NOTIFIED, async {
                        loop {
                            match rx.recv().await {
                                // Empty: something changed (SQLite).
                                Ok(id) if &id == run_id || id.is_empty() => return true,
                                Ok(_) => {}
                                Err(broadcast::error::RecvError::Lagged(_)) => return true,
                                Err(broadcast::error::RecvError::Closed) => return false,
                            }
                        }
                    })
                    .await;
                    if woken == Ok(false) {
                        self.changes = None;
                    }
                }
                None => tokio::time::sleep(POLL).await,
            },
        }
    }
}
