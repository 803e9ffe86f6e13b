//! Admission control: how many runs live at once on this host, and per
//! tenant, and what a run asked for beyond that gets (docs/SERVE.md,
//! "Admission").
//!
//! A run takes a slot before it is stored, and keeps it until its turn has
//! ended, so a run is never admitted that cannot start. With every slot
//! taken, a request waits in a bounded queue for at most `wait`; a full
//! queue, or a wait that runs out, is refused (`429 too_many_runs` with
//! `Retry-After`) and nothing is stored. The tenant is the scope's
//! `namespaceId`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Notify;

use super::SessionError;

/// The bounds, from `[serve]` of host.toml.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// Runs live on this host at once.
    pub max_live: usize,
    /// Runs of one tenant live on this host at once.
    pub max_live_per_tenant: usize,
    /// Requests waiting for a slot at once.
    pub queue: usize,
    /// How long a request waits for a slot.
    pub wait: Duration,
}

impl AdmissionLimits {
    /// No bound a test or an embedder did not ask for.
    pub fn unbounded() -> Self {
        Self {
            max_live: usize::MAX,
            max_live_per_tenant: usize::MAX,
            queue: 0,
            wait: Duration::ZERO,
        }
    }
}

/// What admission holds now, for `/v1/health`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionStatus {
    pub live: usize,
    pub queued: usize,
    /// The most runs live at once since the host started.
    pub peak_live: usize,
    /// Runs refused `too_many_runs` since the host started.
    pub refused: u64,
}

#[derive(Default)]
struct State {
    status: AdmissionStatus,
    by_tenant: HashMap<String, usize>,
}

/// The run slots of one host.
pub struct Slots {
    limits: AdmissionLimits,
    state: Mutex<State>,
    freed: Notify,
}

/// A live run's slot; given back when dropped.
pub struct Slot {
    admission: Arc<Slots>,
    tenant: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        {
            let mut state = self.admission.lock();
            state.status.live = state.status.live.saturating_sub(1);
            if let Some(n) = state.by_tenant.get_mut(&self.tenant) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    state.by_tenant.remove(&self.tenant);
                }
            }
        }
        self.admission.freed.notify_waiters();
    }
}

/// A request counted in the queue; uncounted when dropped (also when the
/// client goes away while it waits).
struct Queued<'a>(&'a Slots);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.status.queued = state.status.queued.saturating_sub(1);
    }
}

impl Slots {
    pub fn new(limits: AdmissionLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            state: Mutex::new(State::default()),
            freed: Notify::new(),
        })
    }

    pub fn status(&self) -> AdmissionStatus {
        self.lock().status
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding it cannot leave the counts half-updated.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes a slot for `tenant` under the lock, if one is free.
    fn try_take(self: &Arc<Self>, state: &mut State, tenant: &str) -> Option<Slot> {
        let of_tenant = state.by_tenant.get(tenant).copied().unwrap_or(0);
        if state.status.live >= self.limits.max_live || of_tenant >= self.limits.max_live_per_tenant
        {
            return None;
        }
        state.status.live += 1;
        state.status.peak_live = state.status.peak_live.max(state.status.live);
        *state.by_tenant.entry(tenant.to_owned()).or_default() += 1;
        Some(Slot {
            admission: Arc::clone(self),
            tenant: tenant.to_owned(),
        })
    }

    /// A slot for a run of `tenant`: at once, after waiting in the queue,
    /// or `TooManyRuns`.
    pub async fn acquire(self: &Arc<Self>, tenant: &str) -> Result<Slot, SessionError> {
        let deadline = tokio::time::Instant::now() + self.limits.wait;
        let mut queued = None;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            {
                let mut state = self.lock();
                if let Some(slot) = self.try_take(&mut state, tenant) {
                    return Ok(slot);
                }
                if queued.is_none() {
                    if state.status.queued >= self.limits.queue {
                        state.status.refused += 1;
                        return Err(self.refusal(&state, tenant, "the admission queue is full"));
                    }
                    state.status.queued += 1;
                    queued = Some(Queued(self.as_ref()));
                }
                // Registered before the lock is let go: a slot freed from
                // now on wakes this request.
                freed.as_mut().enable();
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                let mut state = self.lock();
                if let Some(slot) = self.try_take(&mut state, tenant) {
                    return Ok(slot);
                }
                state.status.refused += 1;
                let why = format!(
                    "no slot was freed within {} ms",
                    self.limits.wait.as_millis()
                );
                return Err(self.refusal(&state, tenant, &why));
            }
        }
    }

    fn refusal(&self, state: &State, tenant: &str, why: &str) -> SessionError {
        let of_tenant = state.by_tenant.get(tenant).copied().unwrap_or(0);
        let bound = if of_tenant >= self.limits.max_live_per_tenant {
            format!(
                "tenant {tenant:?} has {of_tenant} runs live, its bound ([serve] maxLiveRunsPerTenant)"
            )
        } else {
            format!(
                "{} runs are live on this host, its bound ([serve] maxLiveRuns)",
                state.status.live
            )
        };
        SessionError::TooManyRuns {
            message: format!("{bound}, and {why}: nothing was stored; retry later"),
            retry_after_s: RETRY_AFTER_S,
        }
    }
}

/// The `Retry-After` of a refused run, in seconds.
pub const RETRY_AFTER_S: u64 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_live: usize, per_tenant: usize, queue: usize, wait_ms: u64) -> AdmissionLimits {
        AdmissionLimits {
            max_live,
            max_live_per_tenant: per_tenant,
            queue,
            wait: Duration::from_millis(wait_ms),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_host_refuses_once_its_queue_is_full_and_a_freed_slot_admits_a_waiter() {
        let a = Slots::new(limits(2, 2, 1, 60_000));
        let first = a.acquire("t").await.unwrap();
        let _second = a.acquire("t").await.unwrap();
        let waiter = {
            let a = Arc::clone(&a);
            tokio::spawn(async move { a.acquire("t").await.map(|_| ()) })
        };
        tokio::task::yield_now().await;
        assert_eq!(a.status().queued, 1);
        let refused = a.acquire("t").await.map(|_| ()).unwrap_err();
        assert!(
            matches!(refused, SessionError::TooManyRuns { .. }),
            "{refused}"
        );
        assert!(refused.to_string().contains("queue is full"), "{refused}");
        drop(first);
        waiter.await.unwrap().unwrap();
        let status = a.status();
        assert_eq!((status.queued, status.peak_live, status.refused), (0, 2, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_is_refused_when_no_slot_is_freed_in_time_and_leaves_the_queue() {
        let a = Slots::new(limits(1, 1, 4, 500));
        let _held = a.acquire("t").await.unwrap();
        let refused = a.acquire("t").await.map(|_| ()).unwrap_err();
        assert!(refused.to_string().contains("within 500 ms"), "{refused}");
        assert_eq!(a.status().queued, 0);
        assert_eq!(a.status().live, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn one_tenant_at_its_bound_does_not_hold_another_out() {
        let a = Slots::new(limits(10, 1, 0, 0));
        let _one = a.acquire("busy").await.unwrap();
        let refused = a.acquire("busy").await.map(|_| ()).unwrap_err();
        assert!(
            refused.to_string().contains("maxLiveRunsPerTenant"),
            "{refused}"
        );
        let _other = a.acquire("quiet").await.unwrap();
        assert_eq!(a.status().live, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_whose_client_went_away_leaves_the_queue() {
        let a = Slots::new(limits(1, 1, 1, 60_000));
        let held = a.acquire("t").await.unwrap();
        let gone = {
            let a = Arc::clone(&a);
            tokio::spawn(async move { a.acquire("t").await.map(|_| ()) })
        };
        tokio::task::yield_now().await;
        assert_eq!(a.status().queued, 1);
        gone.abort();
        let _ = gone.await;
        assert_eq!(a.status().queued, 0);
        drop(held);
        assert_eq!(a.status().live, 0);
        a.acquire("t").await.unwrap();
    }
}
