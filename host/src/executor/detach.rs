//! [`RunToEnd`]: work that must finish once started (a mediated call with
//! the kernel and its bookkeeping), polled inside its caller's task while
//! the caller waits for it, and handed to the runtime as a task of its own
//! only if the caller stops waiting. The common path (the caller waits to
//! the end) costs no task spawn and no wake-up of another task.
//!
//! The work is `Unpin` (boxed by whoever made it, typically the kernel's
//! own future), so it can be moved into a task after it was polled without
//! a box of its own here.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The work panicked; the panic was caught at the poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Panicked;

/// A future that runs to its end even when dropped early: dropping it
/// before it finished spawns what is left on the current tokio runtime.
pub(crate) struct RunToEnd<F>
where
    F: Future + Unpin + Send + 'static,
    F::Output: Send + 'static,
{
    work: Option<F>,
}

impl<F> RunToEnd<F>
where
    F: Future + Unpin + Send + 'static,
    F::Output: Send + 'static,
{
    pub fn new(work: F) -> Self {
        Self { work: Some(work) }
    }
}

impl<F> Future for RunToEnd<F>
where
    F: Future + Unpin + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = Result<F::Output, Panicked>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(work) = self.work.as_mut() else {
            // Polled again after its end: it has nothing more to give.
            return Poll::Ready(Err(Panicked));
        };
        // A panic in the work is this call's failure, not the caller's
        // (a spawned task would have caught it the same way).
        match std::panic::catch_unwind(AssertUnwindSafe(|| Pin::new(work).poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(out)) => {
                self.work = None;
                Poll::Ready(Ok(out))
            }
            Err(_) => {
                self.work = None;
                Poll::Ready(Err(Panicked))
            }
        }
    }
}

impl<F> Drop for RunToEnd<F>
where
    F: Future + Unpin + Send + 'static,
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        let Some(work) = self.work.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(work);
            }
            // Only a caller outside any runtime can get here (the work was
            // started inside one); nothing can drive the rest then.
            Err(_) => tracing::warn!("a mediated call was dropped outside the runtime"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[tokio::test]
    async fn awaited_to_the_end_it_gives_the_output() {
        assert_eq!(RunToEnd::new(Box::pin(async { 7 })).await, Ok(7));
    }

    #[tokio::test]
    async fn dropped_early_it_still_runs_to_its_end() {
        let done = Arc::new(AtomicBool::new(false));
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let flag = done.clone();
        let work = RunToEnd::new(Box::pin(async move {
            let _ = wait.await;
            flag.store(true, Ordering::SeqCst);
        }));
        // Polled once (started), then dropped by a caller that gave up.
        tokio::select! {
            biased;
            _ = work => unreachable!("the work waits for `go`"),
            _ = std::future::ready(()) => {}
        }
        assert!(!done.load(Ordering::SeqCst));
        let _ = go.send(());
        for _ in 0..100 {
            if done.load(Ordering::SeqCst) {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the dropped work never finished");
    }

    #[tokio::test]
    async fn a_panic_in_the_work_is_its_own_failure() {
        let work = RunToEnd::new(Box::pin(async {
            if std::hint::black_box(true) {
                panic!("handler bug");
            }
        }));
        assert_eq!(work.await, Err(Panicked));
    }
}
