//! The lease loop of `sharedos serve`: every third of the lease it renews
//! this host's lease, then takes over the runs of hosts whose lease
//! expired (docs/STORE.md, "Recovery across machines"). A renewal that
//! finds the lease taken over stops the loop for good: the host admits no
//! new run, says so on stderr and in `/v1/health`, and the store refuses
//! every write it would still make. While the lease holds, each tick also
//! gives the retention sweep its turn (retention.rs).

use std::sync::Arc;
use std::time::Duration;

use sharedos_protocol::Timestamp;
use sharedos_store::StoreError;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::retention::Sweeper;
use crate::session::Sessions;

/// Starts the loop; it ends when `stop` fires or the lease is lost.
pub(super) fn spawn(
    sessions: Arc<Sessions>,
    (lease, mut sweeper): (Duration, Sweeper),
    stop: CancellationToken,
) -> JoinHandle<()> {
    let every = lease / 3;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            if !tick(&sessions).await {
                return;
            }
            sweeper.tick(sessions.store().as_ref()).await;
        }
    })
}

/// One renewal and one takeover scan; `false` once the lease is lost.
async fn tick(sessions: &Sessions) -> bool {
    let store = sessions.store();
    match store.renew_lease().await {
        Ok(()) => {}
        Err(e @ StoreError::Fenced { .. }) => return lost(sessions, &e),
        Err(e) => {
            // Writes stay fenced by the epoch; try again next tick.
            eprintln!("sharedos serve: could not renew the lease: {e}");
            return true;
        }
    }
    match store.take_over_expired(&Timestamp::now()).await {
        Ok(runs) => {
            for run in &runs {
                eprintln!(
                    "sharedos serve: took over run {} of host {} (its lease expired): {}",
                    run.run_id,
                    run.host_id,
                    serde_json::to_string(run).unwrap_or_default()
                );
            }
            true
        }
        Err(e @ StoreError::Fenced { .. }) => lost(sessions, &e),
        Err(e) => {
            eprintln!("sharedos serve: could not take over expired hosts' runs: {e}");
            true
        }
    }
}

fn lost(sessions: &Sessions, e: &StoreError) -> bool {
    if sessions.lose_lease(e) {
        eprintln!("sharedos serve: lease lost, admitting no new run: {e}");
    }
    false
}
