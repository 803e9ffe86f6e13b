//! Plugins prepared ahead of turns (`warm = N`), for any launcher: the
//! namespace sandbox's prepared sandboxes (host/src/sandboxed.rs), gVisor's
//! prepared containers (host/src/process/gvisor/warm.rs) and the microVM's
//! booted VMs (host/src/process/microvm/warm.rs).
//!
//! Each is made by a thread of its own, off the turn's path, for the key
//! (the spec) last given; a launch takes a live one (or waits for one being
//! made rather than making a second) and orders a replacement. A key change
//! discards the old ones; a failing preparation stops the refills until a
//! launch made in the turn's path succeeds (which reports the real error
//! otherwise). Dropping the pool kills what it holds on a thread of its
//! own that `process::settle_kills` waits for.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sharedos_sandbox::ProgramDigest;

use super::launcher::{LaunchSpec, LaunchedChild};

/// A plugin prepared ahead; dropping it kills it and removes what it had.
pub(crate) trait WarmSpare: Send + 'static {
    fn alive(&mut self) -> bool;
}

/// A whole launch done ahead (a gVisor container, a microVM): alive while
/// its tree has not exited.
impl WarmSpare for LaunchedChild {
    fn alive(&mut self) -> bool {
        matches!(self.tree.try_wait(), Ok(None))
    }
}

/// What a launch prepared ahead serves: a launch of the same program,
/// arguments, environment and pin (the spec's, else the policy's).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LaunchKey {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    pin: Option<ProgramDigest>,
}

impl LaunchKey {
    pub(crate) fn of(spec: &LaunchSpec, policy_pin: Option<ProgramDigest>) -> Self {
        Self {
            program: spec.program.clone(),
            args: spec.args.clone(),
            env: spec.env.clone(),
            pin: spec.program_sha256.or(policy_pin),
        }
    }
}

/// The prepared plugins of one launcher, for one key at a time.
#[derive(Debug)]
pub(crate) struct WarmPool<K, S: WarmSpare> {
    state: Mutex<WarmState<K, S>>,
    changed: Condvar,
    /// The longest a launch waits for one being prepared.
    wait: Duration,
    /// The name of the threads that prepare them.
    thread: &'static str,
}

#[derive(Debug)]
pub(crate) struct WarmState<K, S> {
    key: Option<K>,
    pub(crate) ready: Vec<S>,
    pub(crate) preparing: usize,
    failing: bool,
}

impl<K: Clone + PartialEq + Send + 'static, S: WarmSpare> WarmPool<K, S> {
    pub(crate) fn new(wait: Duration, thread: &'static str) -> Self {
        Self {
            state: Mutex::new(WarmState {
                key: None,
                ready: Vec::new(),
                preparing: 0,
                failing: false,
            }),
            changed: Condvar::new(),
            wait,
            thread,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, WarmState<K, S>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Make `key` the one to prepare for; spares of another go.
    pub(crate) fn adopt(&self, key: &K) {
        let stale = {
            let mut st = self.lock();
            if st.key.as_ref() == Some(key) {
                return;
            }
            st.key = Some(key.clone());
            st.failing = false;
            std::mem::take(&mut st.ready)
        };
        drop(stale); // killed and reaped outside the lock
    }

    /// A live spare for `key`, waiting for one in preparation if there is
    /// no ready one.
    pub(crate) fn take(&self, key: &K) -> Option<S> {
        self.adopt(key);
        let mut dead = Vec::new();
        let end = Instant::now() + self.wait;
        let mut st = self.lock();
        let found = loop {
            if let Some(mut spare) = st.ready.pop() {
                if spare.alive() {
                    break Some(spare);
                }
                dead.push(spare);
                continue;
            }
            let left = end.saturating_duration_since(Instant::now());
            if st.preparing == 0 || st.failing || left.is_zero() {
                break None;
            }
            st = self
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        };
        drop(st);
        drop(dead);
        found
    }

    /// Order preparations (each `make()` on a thread of its own) until
    /// `target` are ready or being made.
    pub(crate) fn refill<F>(self: &Arc<Self>, key: &K, target: usize, make: F)
    where
        F: Fn() -> Result<S, String> + Clone + Send + 'static,
    {
        let need = {
            let mut st = self.lock();
            if st.key.as_ref() != Some(key) || st.failing {
                return;
            }
            let need = target.saturating_sub(st.ready.len() + st.preparing);
            st.preparing += need;
            need
        };
        for _ in 0..need {
            let (pool, k, make) = (Arc::clone(self), key.clone(), make.clone());
            let started = std::thread::Builder::new()
                .name(self.thread.into())
                .spawn(move || pool.prepared(k, make()));
            match started {
                // The thread may end up owning the last reference to the
                // pool, and so the kill of its spares: the host waits for
                // it in `settle_kills` before it exits.
                Ok(handle) => crate::process::track_thread(handle),
                Err(e) => {
                    tracing::warn!(error = %e, thread = self.thread, "could not start preparing ahead");
                    self.lock().preparing -= 1;
                    self.changed.notify_all();
                }
            }
        }
    }

    fn prepared(&self, key: K, made: Result<S, String>) {
        let stale = {
            let mut st = self.lock();
            st.preparing -= 1;
            let stale = match made {
                Ok(spare) if st.key.as_ref() == Some(&key) => {
                    st.ready.push(spare);
                    None
                }
                Ok(spare) => Some(spare),
                Err(e) => {
                    tracing::warn!(error = %e, thread = self.thread, "preparing a plugin ahead of its turn failed; turns make theirs until one succeeds");
                    st.failing = true;
                    None
                }
            };
            self.changed.notify_all();
            stale
        };
        drop(stale);
    }

    pub(crate) fn succeeded(&self) {
        self.lock().failing = false;
    }

    /// Waits up to `timeout` until no preparation is in flight; how many
    /// are ready then.
    pub(crate) fn wait_idle(&self, timeout: Duration) -> usize {
        let end = Instant::now() + timeout;
        let mut st = self.lock();
        while st.preparing > 0 {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = self
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        st.ready.len()
    }
}

impl<K, S: WarmSpare> Drop for WarmPool<K, S> {
    /// Killing and reaping a spare blocks for a moment, and the last
    /// launcher may be dropped on an async worker: the spares go on a
    /// thread of their own, which `settle_kills` waits for (or here, on a
    /// preparing thread, which it already waits for).
    fn drop(&mut self) {
        let spares = std::mem::take(
            &mut self
                .state
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .ready,
        );
        if spares.is_empty() {
            return;
        }
        if std::thread::current().name() == Some(self.thread) {
            drop(spares);
            return;
        }
        crate::process::drop_off_path(spares, "sharedos-warm-drop");
    }
}
