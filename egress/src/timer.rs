//! The timer of the gateway's server for request heads: each head's
//! deadline on a tokio timer entry kept from an earlier head (of this
//! connection or of one that ended), moved forward, instead of a new
//! entry per head.
//!
//! Why: hyper asks its timer for a new sleep each time it starts reading a
//! request head. A new tokio entry whose deadline comes before the one the
//! runtime last parked for (on a kept-alive connection, the 120 s wait for
//! the upstream's answer) makes tokio unpark its driver: an eventfd write
//! and one more `epoll_wait` after every answer, on the thread that has
//! just written it. Moving an entry that is still registered to a later
//! deadline is only a store: tokio leaves it in its wheel, where it fires
//! early once and is put back at its real deadline. Entries are kept for
//! the whole serve, so a fresh connection's first head and the upstream
//! wait after it do not unpark the driver either (an empty wheel unparks
//! on any entry). At most one spare entry per connection slot is kept.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

type Entry = Pin<Box<tokio::time::Sleep>>;

/// One serve's timer for heads; entries wait in `spare` between heads.
#[derive(Clone)]
pub(super) struct HeadTimer {
    spare: Arc<Spare>,
}

struct Spare {
    entries: Mutex<Vec<Entry>>,
    max: usize,
}

impl Spare {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl HeadTimer {
    /// Keeps at most `max` spare entries (one per connection slot).
    pub(super) fn new(max: usize) -> Self {
        Self {
            spare: Arc::new(Spare {
                entries: Mutex::new(Vec::new()),
                max,
            }),
        }
    }
}

impl hyper::rt::Timer for HeadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep_until(Instant::now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        let at = tokio::time::Instant::from_std(deadline);
        let spare = self.spare.lock().pop();
        let entry = match spare {
            Some(mut entry) => {
                entry.as_mut().reset(at);
                entry
            }
            // Every kept entry is in use: a new one.
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

/// A sleep hyper holds; its entry goes back to the spares when hyper
/// drops it (the head was read, or the connection ended), still
/// registered.
struct Deadline {
    /// `Some` until dropped.
    entry: Option<Entry>,
    home: Arc<Spare>,
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
            let mut spare = self.home.lock();
            if spare.len() < self.home.max {
                spare.push(entry);
            }
        }
    }
}
