//! Cancel across hosts (docs/SERVE.md, "Control across hosts").
//!
//! A cancel sent to a host that does not run the run is recorded in the
//! store (`Store::request_cancel`). The host that runs it watches for such
//! requests: PostgreSQL wakes it at once (`cancel:<run id>` on the changes
//! channel), SQLite when another connection commits, and it looks at the
//! store's requests for its live runs every `LOOK_AGAIN` besides, so a
//! notification lost with a dropped connection delays a cancel, never
//! loses it.

use std::sync::Arc;
use std::time::Duration;

use sharedos_store::CANCEL_PREFIX;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::{POLL, Sessions};

/// With notifications, the store's requests are still read this often.
const LOOK_AGAIN: Duration = Duration::from_secs(1);

/// What woke the watcher.
enum Woken {
    /// A cancel of this run was asked.
    Run(String),
    /// Something changed, or it is time: read the store's requests.
    Look,
    /// Stop watching.
    Stop,
}

impl Sessions {
    /// Watches for cancels other hosts recorded for the runs live here,
    /// until `stop`.
    pub fn watch_cancels(self: &Arc<Self>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut changes = this.store.changes();
            loop {
                let woken = tokio::select! {
                    _ = stop.cancelled() => Woken::Stop,
                    w = next(&mut changes) => w,
                };
                match woken {
                    Woken::Stop => return,
                    Woken::Run(id) => {
                        if !this.cancel_live(&id) {
                            this.look().await;
                        }
                    }
                    Woken::Look => this.look().await,
                }
            }
        })
    }

    /// Cancels the run if it is live here; whether it was.
    pub(super) fn cancel_live(&self, run_id: &str) -> bool {
        match self.lock_live().get(run_id) {
            Some(live) => {
                live.cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// Reads the store's cancel requests for this host's runs, and cancels
    /// those live here.
    async fn look(&self) {
        if self.lock_live().is_empty() {
            return;
        }
        match self.store.cancel_requests(&self.host_id).await {
            Ok(ids) => {
                for id in ids {
                    if self.cancel_live(&id) {
                        tracing::info!(run_id = %id, "a run was cancelled from another host");
                    }
                }
            }
            Err(e) => tracing::warn!("cannot read the store's cancel requests: {e}"),
        }
    }
}

/// The next wake-up: a notification that names a run's cancel, another
/// change, or the time to look again.
async fn next(changes: &mut Option<broadcast::Receiver<String>>) -> Woken {
    let Some(rx) = changes.as_mut() else {
        tokio::time::sleep(POLL).await;
        return Woken::Look;
    };
    let woken = tokio::time::timeout(LOOK_AGAIN, async {
        loop {
            match rx.recv().await {
                Ok(message) => {
                    if let Some(id) = message.strip_prefix(CANCEL_PREFIX) {
                        return Some(Woken::Run(id.to_owned()));
                    }
                    if message.is_empty() {
                        return Some(Woken::Look);
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => return Some(Woken::Look),
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
    .await;
    match woken {
        Ok(Some(w)) => w,
        Ok(None) => {
            *changes = None;
            Woken::Look
        }
        Err(_) => Woken::Look,
    }
}
