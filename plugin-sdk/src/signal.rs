//! An observe-only signal: a plugin can test it and wait on it, never raise
//! it. The raising half, [`SignalSource`], stays with whoever owns the turn.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

/// The raised state, as the synchronous tests read it: an atomic load
/// where the watch takes its lock (a host asks several times a tool call).
/// The watch stays what waiters wait on.
///
/// Ordering: `raise` sets the mirror (release) before it sends on the
/// watch, and a reader loads it with acquire. So a waiter woken by the
/// watch, and anyone who learned of the raise from it, finds the mirror
/// set; a test that finds it unset is one that ran before the raise was
/// sent, which the watch alone could tell it too. Never unset.
type Mirror = Arc<AtomicBool>;

/// The raising half. Held by the envelope (in process) or by the SDK's
/// transport (out of process); never handed to a plugin.
#[derive(Debug)]
pub struct SignalSource {
    tx: watch::Sender<bool>,
    mirror: Mirror,
}

impl Default for SignalSource {
    fn default() -> Self {
        Self::new()
    }
}

impl SignalSource {
    pub fn new() -> Self {
        let (tx, _) = watch::channel(false);
        Self {
            tx,
            mirror: Mirror::default(),
        }
    }
    /// Raises the signal; later calls do nothing.
    pub fn raise(&self) {
        // The mirror first: see `Mirror` for why.
        self.mirror.store(true, Ordering::Release);
        self.tx.send_if_modified(|v| {
            let changed = !*v;
            *v = true;
            changed
        });
    }
    pub fn is_raised(&self) -> bool {
        self.mirror.load(Ordering::Acquire)
    }
    /// A new observing half.
    pub fn signal(&self) -> Signal {
        Signal {
            rx: self.tx.subscribe(),
            mirror: self.mirror.clone(),
        }
    }
}

/// The observing half: `is_raised` and `raised().await`.
#[derive(Debug, Clone)]
pub struct Signal {
    rx: watch::Receiver<bool>,
    mirror: Mirror,
}

impl Signal {
    /// A signal that is never raised.
    pub fn never() -> Self {
        let (tx, rx) = watch::channel(false);
        // The sender is leaked into the receiver's shared state only; with
        // it dropped, `raised()` would resolve, so keep it alive forever.
        std::mem::forget(tx);
        Self {
            rx,
            mirror: Mirror::default(),
        }
    }
    pub fn is_raised(&self) -> bool {
        self.mirror.load(Ordering::Acquire)
    }
    /// Resolves once the signal is raised (at once if it already is). If the
    /// source is dropped unraised, this never resolves.
    pub async fn raised(&self) {
        if self.is_raised() {
            return;
        }
        let mut rx = self.rx.clone();
        loop {
            if *rx.borrow_and_update() {
                return;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn raise_is_observed_and_idempotent() {
        let src = SignalSource::new();
        let s = src.signal();
        assert!(!s.is_raised());
        let waiter = tokio::spawn({
            let s = s.clone();
            async move { s.raised().await }
        });
        src.raise();
        src.raise();
        waiter.await.unwrap();
        assert!(s.is_raised());
        assert!(src.signal().is_raised());
    }

    /// A waiter woken by the raise, on another thread, always finds the
    /// signal raised, and so does every signal of the source, old or new.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_woken_waiter_sees_the_raise() {
        for _ in 0..500 {
            let src = SignalSource::new();
            let s = src.signal();
            let waiter = tokio::spawn({
                let s = s.clone();
                async move {
                    s.raised().await;
                    s.is_raised()
                }
            });
            tokio::task::yield_now().await;
            assert!(!s.is_raised() && !src.is_raised());
            src.raise();
            assert!(waiter.await.unwrap(), "woken but not raised");
            assert!(s.is_raised() && src.is_raised() && src.signal().is_raised());
            src.signal().raised().await;
        }
        assert!(!Signal::never().is_raised());
    }
}
