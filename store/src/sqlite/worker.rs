//! The one thread that owns a SQLite store's connection.
//!
//! Every operation is a job sent to this thread, which runs the jobs one
//! after the other and answers each through a oneshot channel. However many
//! requests are under way, the store holds one OS thread and one
//! connection: a burst of runs queues jobs, not blocked threads (with a
//! blocking task per operation, 200 concurrent runs had the runtime's
//! blocking pool grow to hundreds of threads, each parked on the
//! connection's lock).

use std::sync::mpsc;
use std::thread::JoinHandle;

use rusqlite::Connection;

use super::{SqliteOptions, unavailable};
use crate::StoreError;

type Job = Box<dyn FnOnce(&mut Connection, &SqliteOptions) + Send>;

/// The connection's thread; it ends, closing the connection, once the
/// last handle to the store is dropped and the jobs sent before are done.
pub(super) struct Worker {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    pub(super) fn start(mut conn: Connection, options: SqliteOptions) -> Result<Self, StoreError> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("sharedos-sqlite".into())
            .spawn(move || {
                while let Ok(job) = queue.recv() {
                    job(&mut conn, &options);
                }
            })
            .map_err(|e| unavailable(format!("cannot start the store's thread: {e}")))?;
        Ok(Self {
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// Queues `f` on the connection's thread without waiting for it; an
    /// error when the thread has ended (`f` then never runs).
    pub(super) fn send(
        &self,
        f: impl FnOnce(&mut Connection, &SqliteOptions) + Send + 'static,
    ) -> Result<(), StoreError> {
        let jobs = self
            .jobs
            .as_ref()
            .ok_or_else(|| unavailable("the store is closed"))?;
        jobs.send(Box::new(f))
            .map_err(|_| unavailable("the store's thread has ended"))
    }

    /// Runs `f` on the connection's thread. A panic in `f` fails this
    /// operation only (an open transaction is rolled back as it unwinds).
    pub(super) async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection, &SqliteOptions) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |conn, options| {
            let result =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(conn, options)))
                    .unwrap_or_else(|_| Err(unavailable("a store operation panicked")));
            // The caller may have gone away (its request was dropped).
            let _ = answer.send(result);
        });
        let jobs = self
            .jobs
            .as_ref()
            .ok_or_else(|| unavailable("the store is closed"))?;
        jobs.send(job)
            .map_err(|_| unavailable("the store's thread has ended"))?;
        answered
            .await
            .map_err(|_| unavailable("the store's thread has ended"))?
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take()
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
    }
}
