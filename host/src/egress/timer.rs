//! The timer of a plugin connection's server: each request's header
//! deadline on one tokio timer entry per connection, moved forward,
//! instead of a new entry per request.
//!
//! Why: hyper asks its timer for a new sleep each time it starts reading a
//! request head. A new tokio entry whose deadline comes before the one the
//! runtime last parked for (on a kept-alive connection, the 120 s wait for
//! the upstream's answer) makes tokio unpark its driver: an eventfd write
//! and one more `epoll_wait` after every answer, on the thread that has
//! just written it. Moving an entry that is still registered to a later
//! deadline is only a store: tokio leaves it in its wheel, where it fires
//! early once and is put back at its real deadline.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

type Entry = Pin<Box<tokio::time::Sleep>>;

/// One connection's timer; its entry waits in `spare` between heads.
#[derive(Clone, Default)]
pub(super) struct ConnTimer {
    spare: Arc<Mutex<Option<Entry>>>,
}

impl ConnTimer {
    fn take_spare(&self) -> Option<Entry> {
        self.spare.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl hyper::rt::Timer for ConnTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep_until(Instant::now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        let at = tokio::time::Instant::from_std(deadline);
        let entry = match self.take_spare() {
            Some(mut entry) => {
                entry.as_mut().reset(at);
                entry
            }
            // The first head of the connection, or a second sleep while
            // one is out: an entry of its own.
            None => Box::pin(tokio::time::sleep_until(at)),
        };
        Box::pin(Deadline {
            entry: Some(entry),
            home: Arc::clone(&self.spare),
        })
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, deadline: Instant) {
        match sleep.as_mut().downcast_mut_pin::<Deadline>() {
            Some(mut ours) => {
                if let Some(entry) = &mut ours.entry {
                    entry
                        .as_mut()
                        .reset(tokio::time::Instant::from_std(deadline));
                }
            }
            None => *sleep = self.sleep_until(deadline),
        }
    }
}

/// A sleep hyper holds; its entry goes back to the connection when hyper
/// drops it (the head was read), still registered.
struct Deadline {
    /// `Some` until dropped.
    entry: Option<Entry>,
    home: Arc<Mutex<Option<Entry>>>,
}

impl Future for Deadline {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.entry {
            Some(entry) => entry.as_mut().poll(cx),
            None => Poll::Ready(()),
        }
    }
}

impl hyper::rt::Sleep for Deadline {}

impl Drop for Deadline {
    fn drop(&mut self) {
        if let Some(entry) = self.entry.take() {
            *self.home.lock().unwrap_or_else(|p| p.into_inner()) = Some(entry);
        }
    }
}
