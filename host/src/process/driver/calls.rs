//! [`Calls`]: the tool calls one turn is serving, polled inside the
//! driver's task. It does what a `FuturesUnordered` does for the driver
//! (each call polled when it was woken, in the order they were woken,
//! new calls in the order they came), but a call takes a slot whose box
//! and waker stay for the next call: once the turn has had as many calls
//! at once as it will have, serving a call allocates nothing here (a
//! `FuturesUnordered` allocates a node for every call).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use futures_util::task::{ArcWake, AtomicWaker, waker_ref};

/// The calls being served, each in a slot of its own.
pub(super) struct Calls<F> {
    slots: Vec<Slot<F>>,
    /// Slots whose call ended, for the next calls.
    free: Vec<usize>,
    /// Calls not polled yet, in the order they came.
    fresh: VecDeque<usize>,
    queue: Arc<Queue>,
    /// Calls not ended yet.
    len: usize,
}

/// A slot: its call (none between two calls) and the waker its call is
/// polled with.
struct Slot<F> {
    call: Pin<Box<Option<F>>>,
    waker: Arc<SlotWaker>,
}

/// The slots woken since the driver last looked, and the driver's waker.
#[derive(Default)]
struct Queue {
    woken: Mutex<VecDeque<usize>>,
    driver: AtomicWaker,
}

/// Wakes the driver for one slot. A waker kept by a call that has ended
/// may still wake its slot: the slot is then polled once for nothing (or
/// its next call once more than it needed), which no future minds.
struct SlotWaker {
    slot: usize,
    /// The slot is in `woken` (a second wake before the poll adds nothing).
    queued: AtomicBool,
    queue: Arc<Queue>,
}

impl ArcWake for SlotWaker {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        if !arc_self.queued.swap(true, Ordering::AcqRel) {
            let mut woken = arc_self
                .queue
                .woken
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            woken.push_back(arc_self.slot);
        }
        arc_self.queue.driver.wake();
    }
}

impl<F: Future> Default for Calls<F> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            fresh: VecDeque::new(),
            queue: Arc::default(),
            len: 0,
        }
    }
}

impl<F: Future> Calls<F> {
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Takes `call` in; it is first polled by the next `poll_next`.
    pub(super) fn push(&mut self, call: F) {
        let at = match self.free.pop() {
            Some(at) => at,
            None => {
                let at = self.slots.len();
                self.slots.push(Slot {
                    call: Box::pin(None),
                    waker: Arc::new(SlotWaker {
                        slot: at,
                        queued: AtomicBool::new(false),
                        queue: self.queue.clone(),
                    }),
                });
                at
            }
        };
        if let Some(slot) = self.slots.get_mut(at) {
            slot.call.set(Some(call));
            self.fresh.push_back(at);
            self.len += 1;
        }
    }

    /// The output of the next call to end; `None` when no call is left.
    pub(super) async fn next(&mut self) -> Option<F::Output> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        if self.len == 0 {
            return Poll::Ready(None);
        }
        // At most one poll per call, then the driver's other events have
        // their turn (a call that keeps waking itself cannot starve them).
        for _ in 0..self.len {
            let Some(at) = self.next_slot() else {
                return self.wait(cx);
            };
            let Some(slot) = self.slots.get_mut(at) else {
                continue;
            };
            let Some(call) = slot.call.as_mut().as_pin_mut() else {
                continue;
            };
            slot.waker.queued.store(false, Ordering::Release);
            let waker = waker_ref(&slot.waker);
            if let Poll::Ready(out) = call.poll(&mut Context::from_waker(&waker)) {
                slot.call.set(None);
                self.free.push(at);
                self.len -= 1;
                return Poll::Ready(Some(out));
            }
        }
        if !self.fresh.is_empty() {
            cx.waker().wake_by_ref();
        }
        self.wait(cx)
    }

    /// Pending: the driver is woken by the next call woken. Registered only
    /// now (an answer handed out needs no wake-up: the driver polls again
    /// while calls are left), so a wake between the polls above and the
    /// registration is seen in the queue here instead.
    fn wait(&mut self, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        self.queue.driver.register(cx.waker());
        if !self.woken().is_empty() {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }

    /// The next slot to poll: new calls first, then the woken ones.
    fn next_slot(&mut self) -> Option<usize> {
        match self.fresh.pop_front() {
            Some(at) => Some(at),
            None => self.woken().pop_front(),
        }
    }

    fn woken(&self) -> std::sync::MutexGuard<'_, VecDeque<usize>> {
        self.queue
            .woken
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use futures_util::FutureExt;
    use tokio::sync::oneshot;

    use super::*;

    type Boxed = Pin<Box<dyn Future<Output = usize> + Send>>;

    #[tokio::test]
    async fn calls_that_end_at_once_come_out_in_the_order_they_came() {
        let mut calls: Calls<Boxed> = Calls::default();
        for n in 0..5 {
            calls.push(Box::pin(async move { n }));
        }
        let mut out = Vec::new();
        while let Some(n) = calls.next().await {
            out.push(n);
        }
        assert_eq!(out, [0, 1, 2, 3, 4]);
        assert!(calls.is_empty());
    }

    #[tokio::test]
    async fn a_call_that_waits_is_polled_again_when_woken() {
        let mut calls: Calls<Boxed> = Calls::default();
        let (tx, rx) = oneshot::channel::<usize>();
        calls.push(Box::pin(async move { rx.await.unwrap_or(0) + 100 }));
        calls.push(Box::pin(async { 1 }));
        assert_eq!(calls.next().await, Some(1));
        // Only the waiting call is left: nothing comes out yet.
        assert_eq!(calls.next().now_or_never(), None);
        let sender = tokio::spawn(async move { tx.send(7) });
        assert_eq!(calls.next().await, Some(107));
        assert!(sender.await.is_ok());
        assert_eq!(calls.next().await, None);
    }

    #[tokio::test]
    async fn slots_are_kept_for_the_next_calls() {
        let mut calls: Calls<Boxed> = Calls::default();
        for round in 0..10 {
            for n in 0..3 {
                calls.push(Box::pin(async move { round * 10 + n }));
            }
            for n in 0..3 {
                assert_eq!(calls.next().await, Some(round * 10 + n));
            }
        }
        assert_eq!(calls.slots.len(), 3, "the three slots served every round");
    }

    #[tokio::test]
    async fn a_waker_kept_after_its_call_ended_wakes_nothing_wrong() {
        let mut calls: Calls<Boxed> = Calls::default();
        let kept = Arc::new(Mutex::new(None));
        let keep = kept.clone();
        calls.push(Box::pin(std::future::poll_fn(move |cx| {
            *keep.lock().unwrap() = Some(cx.waker().clone());
            Poll::Ready(1)
        })));
        assert_eq!(calls.next().await, Some(1));
        // The slot now serves another call, which waits.
        let polls = Arc::new(AtomicUsize::new(0));
        let counted = polls.clone();
        let (tx, rx) = oneshot::channel::<usize>();
        let mut rx = Some(rx);
        calls.push(Box::pin(std::future::poll_fn(move |cx| {
            counted.fetch_add(1, Ordering::SeqCst);
            match rx.as_mut().map(|rx| rx.poll_unpin(cx)) {
                Some(Poll::Ready(n)) => Poll::Ready(n.unwrap_or(0)),
                _ => Poll::Pending,
            }
        })));
        assert_eq!(calls.next().now_or_never(), None);
        // The old call's waker wakes the slot: one poll more, still pending.
        kept.lock().unwrap().take().unwrap().wake();
        assert_eq!(calls.next().now_or_never(), None);
        assert_eq!(polls.load(Ordering::SeqCst), 2);
        assert!(tx.send(5).is_ok());
        assert_eq!(calls.next().await, Some(5));
        assert_eq!(calls.slots.len(), 1);
    }

    #[tokio::test]
    async fn many_calls_woken_from_other_threads_all_come_out() {
        let mut calls: Calls<Boxed> = Calls::default();
        let mut senders = Vec::new();
        for n in 0..64 {
            let (tx, rx) = oneshot::channel::<usize>();
            senders.push((n, tx));
            calls.push(Box::pin(async move { rx.await.unwrap_or(usize::MAX) }));
        }
        let sending = std::thread::spawn(move || {
            for (n, tx) in senders.into_iter().rev() {
                let _ = tx.send(n);
            }
        });
        let mut out = Vec::new();
        while let Some(n) = calls.next().await {
            out.push(n);
        }
        assert!(sending.join().is_ok());
        out.sort_unstable();
        assert_eq!(out, (0..64).collect::<Vec<_>>());
    }
}
