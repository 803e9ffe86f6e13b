//! An observe-only signal: a plugin can test it and wait on it, never raise
//! it. The raising half, [`SignalSource`], stays with whoever owns the turn.

use tokio::sync::watch;

/// The raising half. Held by the envelope (in process) or by the SDK's
/// transport (out of process); never handed to a plugin.
#[derive(Debug)]
pub struct SignalSource {
    tx: watch::Sender<bool>,
}

impl Default for SignalSource {
    fn default() -> Self {
        Self::new()
    }
}

impl SignalSource {
    pub fn new() -> Self {
        let (tx, _) = watch::channel(false);
        Self { tx }
    }
    /// Raises the signal; later calls do nothing.
    pub fn raise(&self) {
        self.tx.send_if_modified(|v| {
            let changed = !*v;
            *v = true;
            changed
        });
    }
    pub fn is_raised(&self) -> bool {
        *self.tx.borrow()
    }
    /// A new observing half.
    pub fn signal(&self) -> Signal {
        Signal {
            rx: self.tx.subscribe(),
        }
    }
}

/// The observing half: `is_raised` and `raised().await`.
#[derive(Debug, Clone)]
pub struct Signal {
    rx: watch::Receiver<bool>,
}

impl Signal {
    /// A signal that is never raised.
    pub fn never() -> Self {
        let (tx, rx) = watch::channel(false);
        // The sender is leaked into the receiver's shared state only; with
        // it dropped, `raised()` would resolve, so keep it alive forever.
        std::mem::forget(tx);
        Self { rx }
    }
    pub fn is_raised(&self) -> bool {
        *self.rx.borrow()
    }
    /// Resolves once the signal is raised (at once if it already is). If the
    /// source is dropped unraised, this never resolves.
    pub async fn raised(&self) {
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
}
