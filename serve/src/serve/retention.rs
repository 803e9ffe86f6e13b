//! The retention sweep of `sharedos serve` (docs/SERVE.md, "Deletion"):
//! on the lease loop's first tick and then every [`SWEEP_EVERY`], while
//! this host holds its lease, the runs ended and the sessions closed
//! longer ago than `[serve.retention]` says are deleted, a batch at a
//! time; audit records are kept.

use std::time::{Duration, Instant};

use sharedos_store::{Store, SweepQuery};

use crate::config::retention::RetentionSection;

/// How often the sweep runs.
pub const SWEEP_EVERY: Duration = Duration::from_secs(600);
/// Rows of each kind one transaction deletes at most.
const BATCH: usize = 500;
/// Batches one sweep runs at most (the rest waits for the next one).
const MAX_BATCHES: usize = 100;

pub(super) struct Sweeper {
    policy: RetentionSection,
    last: Option<Instant>,
}

impl Sweeper {
    pub(super) fn new(policy: RetentionSection) -> Self {
        Self { policy, last: None }
    }

    /// Sweeps when one is due; a store error is reported and the sweep
    /// tried again next time.
    pub(super) async fn tick(&mut self, store: &dyn Store) {
        let due = self.last.is_none_or(|at| at.elapsed() >= SWEEP_EVERY);
        if !self.policy.sweeps() || !due {
            return;
        }
        self.last = Some(Instant::now());
        let now_ms = time::OffsetDateTime::now_utc().unix_timestamp() * 1000;
        let (runs_before, sessions_before) = self.policy.cutoffs(now_ms);
        let query = SweepQuery {
            ended_runs_before_ms: runs_before,
            closed_sessions_before_ms: sessions_before,
            limit: BATCH,
        };
        for _ in 0..MAX_BATCHES {
            match store.sweep(&query).await {
                Ok(swept) => {
                    if swept.runs > 0 || swept.sessions > 0 {
                        eprintln!(
                            "sharedos serve: retention deleted {} closed sessions and {} ended runs (audit kept)",
                            swept.sessions, swept.runs
                        );
                    }
                    if (swept.runs as usize) < BATCH && (swept.sessions as usize) < BATCH {
                        return;
                    }
                }
                Err(e) => {
                    eprintln!(
                        "sharedos serve: the retention sweep failed (tried again later): {e}"
                    );
                    return;
                }
            }
        }
    }
}
