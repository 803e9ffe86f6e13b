//! An observe-only signal: a plugin can test it and wait on it, never raise
//! it. The raising half, [`SignalSource`], stays with whoever owns the turn.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Poll, Waker};

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

/// Which waker a poll came with: its data and vtable addresses, what
/// `Waker::will_wake` compares. Taken from the caller's waker, not kept
/// as a clone: a clone may point at another copy of the same vtable (one
/// made in a generic function can be duplicated), and then `will_wake`
/// against it fails on every poll; in the inflight bench it failed on all
/// of them. Two equal ids name the same waker for as long as the watch
/// holds its clone of the first (the clone keeps its data alive).
#[derive(Clone, Copy, PartialEq, Eq)]
struct WakerId(usize, usize);

impl WakerId {
    fn of(waker: &Waker) -> Self {
        Self(
            waker.data() as usize,
            std::ptr::from_ref(waker.vtable()) as usize,
        )
    }
}

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
    ///
    /// A pending future is cheap to poll again: a turn keeps one for its
    /// whole life and polls it on every wake-up of its `select!`. A poll
    /// reads the mirror, and reaches the watch only on the first poll and
    /// when the task's waker changed (to register the new one).
    ///
    /// No wake-up is lost by skipping the watch: the watch future, pinned
    /// here, keeps its registration with the last waker it was polled with
    /// for as long as this future lives, and a skipped poll is one whose
    /// waker is that same waker (see `WakerId`). The only thing that
    /// notifies the watch is a raise (or the source's drop, after which
    /// nothing can raise), and `raise` sets the mirror before it sends, so
    /// the poll the notification causes finds the mirror set.
    pub async fn raised(&self) {
        if self.is_raised() {
            return;
        }
        let mut watch = std::pin::pin!(self.watch_raised());
        let mut registered: Option<WakerId> = None;
        std::future::poll_fn(|cx| {
            if self.is_raised() {
                return Poll::Ready(());
            }
            let now = WakerId::of(cx.waker());
            if registered == Some(now) {
                return Poll::Pending;
            }
            registered = Some(now);
            watch.as_mut().poll(cx)
        })
        .await
    }

    /// The raise as the watch tells it; what `raised` registers with.
    async fn watch_raised(&self) {
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
    use std::sync::atomic::AtomicUsize;
    use std::task::{Context, Wake};

    /// A waker that counts its wake-ups.
    #[derive(Default)]
    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counter() -> (Arc<Counter>, Waker) {
        let c = Arc::new(Counter::default());
        (c.clone(), Waker::from(c))
    }

    fn woken(c: &Counter) -> usize {
        c.0.load(Ordering::SeqCst)
    }

    fn poll_with(fut: std::pin::Pin<&mut impl Future<Output = ()>>, w: &Waker) -> Poll<()> {
        fut.poll(&mut Context::from_waker(w))
    }

    #[test]
    fn a_raise_wakes_and_resolves_a_future_polled_with_one_waker() {
        let src = SignalSource::new();
        let s = src.signal();
        let mut fut = std::pin::pin!(s.raised());
        let (c, w) = counter();
        for _ in 0..3 {
            assert!(poll_with(fut.as_mut(), &w).is_pending());
        }
        assert_eq!(woken(&c), 0);
        src.raise();
        assert_eq!(woken(&c), 1, "the raise wakes the registered waker");
        assert!(poll_with(fut.as_mut(), &w).is_ready());
    }

    #[test]
    fn a_raise_wakes_the_latest_waker() {
        let src = SignalSource::new();
        let s = src.signal();
        let mut fut = std::pin::pin!(s.raised());
        let (first, w1) = counter();
        let (second, w2) = counter();
        assert!(poll_with(fut.as_mut(), &w1).is_pending());
        assert!(poll_with(fut.as_mut(), &w2).is_pending());
        assert!(poll_with(fut.as_mut(), &w2).is_pending());
        src.raise();
        assert_eq!((woken(&first), woken(&second)), (0, 1));
        assert!(poll_with(fut.as_mut(), &w2).is_ready());
    }

    #[test]
    fn an_unraised_signal_stays_pending() {
        let (_, w) = counter();
        let never = Signal::never();
        let mut fut = std::pin::pin!(never.raised());
        for _ in 0..100 {
            assert!(poll_with(fut.as_mut(), &w).is_pending());
        }
        let src = SignalSource::new();
        let s = src.signal();
        let mut dropped = std::pin::pin!(s.raised());
        assert!(poll_with(dropped.as_mut(), &w).is_pending());
        drop(src);
        let (c2, w2) = counter();
        for w in [&w, &w2, &w, &w] {
            assert!(poll_with(dropped.as_mut(), w).is_pending());
        }
        assert!(poll_with(fut.as_mut(), &w2).is_pending());
        assert!(!s.is_raised() && woken(&c2) == 0);
    }

    /// A future kept across many wake-ups of its task (as a turn keeps
    /// one in its `select!`) sees a raise made on another thread.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_kept_future_sees_a_raise_from_another_thread() {
        for round in 0..500 {
            let src = Arc::new(SignalSource::new());
            let s = src.signal();
            let (tick_tx, mut tick_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
            let raiser = tokio::spawn({
                let src = src.clone();
                async move {
                    for _ in 0..(round % 7) {
                        let _ = tick_tx.send(());
                        tokio::task::yield_now().await;
                    }
                    src.raise();
                    // Held until the raise: the waiter's select keeps waking.
                    drop(tick_tx);
                }
            });
            let raised = s.raised();
            tokio::pin!(raised);
            let mut ticks_open = true;
            loop {
                tokio::select! {
                    biased;
                    () = &mut raised => break,
                    t = tick_rx.recv(), if ticks_open => ticks_open = t.is_some(),
                }
            }
            assert!(s.is_raised());
            raiser.await.unwrap();
        }
    }

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
