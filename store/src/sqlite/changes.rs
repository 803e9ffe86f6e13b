//! SQLite's change notifications, for observers and cancel watchers of
//! runs another process writes (two hosts on one file).
//!
//! SQLite cannot say what another connection committed, only that one did:
//! `PRAGMA data_version` changes when another connection commits to the
//! file. One task per store reads it every `INTERVAL` while anyone is
//! subscribed, and sends the empty string ("something changed, look
//! again") when it moved, and once at its first reading after a
//! subscription (its baseline), so no commit between a subscription and
//! that reading goes unsignalled. However many observers wait, the store reads one
//! number per interval, and each observer reads its run again only after a
//! commit.

use std::sync::Weak;
use std::time::Duration;

use tokio::sync::broadcast;

use super::unavailable;
use super::worker::Worker;

const INTERVAL: Duration = Duration::from_millis(100);

/// Starts the task; it ends once the store is gone.
pub(super) fn spawn(worker: Weak<Worker>, sender: broadcast::Sender<String>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = None;
        loop {
            tick.tick().await;
            if sender.receiver_count() == 0 {
                last = None;
                continue;
            }
            let Some(worker) = worker.upgrade() else {
                return;
            };
            let version = worker
                .run(|conn, _| {
                    conn.query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0))
                        .map_err(unavailable)
                })
                .await;
            drop(worker);
            match version {
                Ok(v) => {
                    // The first reading after someone subscribed wakes
                    // them too: a commit between their subscription and
                    // this baseline would otherwise go unsignalled.
                    if last != Some(v) {
                        let _ = sender.send(String::new());
                    }
                    last = Some(v);
                }
                // The store failing is something for the observers to see.
                Err(_) => {
                    let _ = sender.send(String::new());
                }
            }
        }
    });
}
