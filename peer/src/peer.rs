//! [`Peer`]: the sending end of one connection and the owner of its
//! pending map.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use sharedos_protocol::ErrorKind;
use sharedos_protocol::jsonrpc::WireError;
use sharedos_protocol::method::{self, Side};
use sharedos_protocol::tool_json::WriteJson;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};

use crate::config::PeerConfig;
use crate::line;
use crate::read::Inbox;
use crate::shared::{Answer, Line, Shared, Waiter, lock};
use crate::violation::{Violation, ViolationReason};
use crate::write::write_loop;

/// One end of a connection; its incoming messages come from the [`Inbox`]
/// it was spawned with. Dropping the inbox stops the reading. The writer
/// is left to write what is already queued (a `turn/abort` queued just
/// before the end, above all): it ends when the queue is empty and every
/// sender is gone, when the other end's input closes, or at the write
/// stall timeout.
pub struct Peer {
    shared: Arc<Shared>,
    out: mpsc::Sender<Line>,
    next_id: AtomicU64,
}

impl Peer {
    /// Starts the writer task (inside a tokio runtime) and returns the
    /// reader, which its consumer pulls.
    pub fn spawn<S, R, W>(reader: R, writer: W, config: PeerConfig) -> (Peer, Inbox<S>)
    where
        S: Side,
        R: AsyncRead + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let shared = Arc::new(Shared::new(
            config.violation_budget,
            config.max_message_bytes,
        ));
        let (out_tx, out_rx) = mpsc::channel(config.write_queue.max(1));
        // Not joined: it ends on its own (see `Peer`).
        drop(tokio::spawn(write_loop(
            writer,
            out_rx,
            shared.clone(),
            config.clone(),
        )));
        let inbox = Inbox::new(Box::pin(reader), out_tx.clone(), shared.clone(), config);
        let peer = Peer {
            shared,
            out: out_tx,
            next_id: AtomicU64::new(1),
        };
        (peer, inbox)
    }

    /// Sends a request whose answer arrives as [`crate::Inbound::Response`]
    /// in wire order. Returns the id, to be passed to [`Peer::forget`] on
    /// timeout.
    pub async fn request(&self, method: &str, params: &impl Serialize) -> Result<u64, Violation> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let line = line::request(id, method, params).map_err(|e| {
            Violation::new(ViolationReason::Io, format!("cannot encode {method}: {e}"))
        })?;
        lock(&self.shared.pending).insert(id, Waiter::Inbox);
        if let Err(v) = self.send_line(line.into_bytes()).await {
            self.forget(id);
            return Err(v);
        }
        Ok(id)
    }

    /// Sends request `M` and waits for its answer, which goes straight to
    /// this caller (not through the inbox; the inbox must still be pulled,
    /// since its reader is what routes the answer here). Fails with `cancelled` when
    /// the connection stops first, and with the line limit's error
    /// (`message_too_large`) before anything is sent.
    pub async fn call<M: method::Request>(&self, params: &M::Params) -> Result<Answer, Violation> {
        self.call_raw(M::NAME, params).await
    }

    /// [`Peer::call`] with borrowed params serialized like `M::Params`.
    pub async fn call_raw(
        &self,
        method: &str,
        params: &impl Serialize,
    ) -> Result<Answer, Violation> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let line = line::request(id, method, params).map_err(|e| {
            Violation::new(ViolationReason::Io, format!("cannot encode {method}: {e}"))
        })?;
        self.call_line(id, line.into_bytes()).await
    }

    /// [`Peer::call_raw`] with params that write their own JSON text, the
    /// bytes serde would write for them.
    pub async fn call_written(
        &self,
        method: &str,
        params: &impl WriteJson,
    ) -> Result<Answer, Violation> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.call_line(id, line::request_written(id, method, params))
            .await
    }

    /// Sends request `id`, already written as `line`, and waits for its
    /// answer.
    async fn call_line(&self, id: u64, line: Line) -> Result<Answer, Violation> {
        let (tx, rx) = oneshot::channel();
        // Pending before it is queued: the answer can only come after.
        lock(&self.shared.pending).insert(id, Waiter::Call(tx));
        // Dead before the entry went in: nobody would ever answer it.
        if self.shared.dead.is_cancelled() {
            self.forget(id);
            return Err(self.stopped());
        }
        if let Err(v) = self.send_line(line).await {
            self.forget(id);
            return Err(v);
        }
        let forget_on_drop = Forget { peer: self, id };
        let result = rx.await.unwrap_or_else(|_| {
            Err(WireError::new(
                ErrorKind::Cancelled,
                "the connection stopped",
            ))
        });
        // Answered or cancelled, the entry is already out of the map (its
        // sender was taken or dropped): no second lock and lookup.
        std::mem::forget(forget_on_drop);
        Ok(result)
    }

    /// Stops waiting for a request: a late answer is an unknown id.
    pub fn forget(&self, id: u64) {
        lock(&self.shared.pending).remove(&id);
    }

    /// Answers every waiting [`Peer::call`] with `cancelled` (the turn was
    /// aborted: nothing of it waits for the other end any more).
    pub fn cancel_calls(&self, why: &str) {
        self.shared.cancel_calls(why);
    }

    /// Sends a notification (waits for queue space).
    pub async fn notify(&self, method: &str, params: &impl Serialize) -> Result<(), Violation> {
        let line = line::notification(method, params).map_err(|e| {
            Violation::new(ViolationReason::Io, format!("cannot encode {method}: {e}"))
        })?;
        self.send_line(line.into_bytes()).await
    }

    /// Queues a notification without waiting; `false` if the queue is full
    /// or the peer is gone, or it exceeds the line limit. A `turn/abort`
    /// sent right before a kill must never wait on a peer that does not
    /// read.
    pub fn try_notify(&self, method: &str, params: &impl Serialize) -> bool {
        self.notify_now(method, params).is_ok()
    }

    /// Queues a notification without waiting, for a caller that cannot
    /// wait (the SDK's `emit`): `FrameTooLarge` over the line limit, `Io`
    /// when the queue is full or the writer has stopped.
    pub fn notify_now(&self, method: &str, params: &impl Serialize) -> Result<(), Violation> {
        let line = line::notification(method, params).map_err(|e| {
            Violation::new(ViolationReason::Io, format!("cannot encode {method}: {e}"))
        })?;
        self.check_size(line.as_bytes())?;
        self.out.try_send(line.into_bytes()).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => {
                Violation::new(ViolationReason::Io, "the write queue is full")
            }
            mpsc::error::TrySendError::Closed(_) => self.stopped(),
        })
    }

    /// Sets the line limit for what this end writes from now on.
    pub fn set_max_message_bytes(&self, max: usize) {
        self.shared.max_message_bytes.store(max, Ordering::Relaxed);
    }

    /// Lets the writer end once it has written what is queued, and waits
    /// for that (at most `grace`): a process about to exit flushes first.
    pub async fn close(&self, grace: std::time::Duration) {
        self.shared.closing.cancel();
        let _ = tokio::time::timeout(grace, self.shared.written.cancelled()).await;
    }

    async fn send_line(&self, line: Line) -> Result<(), Violation> {
        self.check_size(&line)?;
        self.out.send(line).await.map_err(|_| self.stopped())
    }

    fn check_size(&self, line: &[u8]) -> Result<(), Violation> {
        if line.len() > self.shared.max_message_bytes() {
            return Err(Violation::new(
                ViolationReason::FrameTooLarge,
                format!(
                    "an outgoing message of {} bytes exceeds maxMessageBytes",
                    line.len()
                ),
            ));
        }
        Ok(())
    }

    fn stopped(&self) -> Violation {
        self.violation()
            .unwrap_or_else(|| Violation::new(ViolationReason::Io, "the peer has stopped"))
    }

    /// Counts a semantic violation found by the consumer (a bad emit, a
    /// bad annotate); `Err` once the budget is spent (then fatal).
    pub fn count_violation(&self, what: &str) -> Result<(), Violation> {
        self.shared.count(what)
    }

    /// Dropped-and-counted messages so far.
    pub fn violations_counted(&self) -> u32 {
        self.shared.counted.load(Ordering::Relaxed)
    }

    /// The dropped-and-counted messages so far, by the name they were
    /// counted under (`invalid_emit`, `unknown_notification`, ...).
    pub fn violations_by_name(&self) -> std::collections::BTreeMap<String, u32> {
        lock(&self.shared.counted_by_name).clone()
    }

    /// Marks the peer dead with a violation found by the consumer.
    pub fn fail(&self, v: Violation) -> Violation {
        self.shared.fail(v)
    }

    /// The first fatal violation, if any.
    pub fn violation(&self) -> Option<Violation> {
        lock(&self.shared.violation).clone()
    }

    /// Resolves once the peer is dead (a fatal violation in either task).
    pub async fn dead(&self) -> Violation {
        self.shared.dead.cancelled().await;
        self.stopped()
    }
}

/// Removes a [`Peer::call`]'s pending entry when its caller stops waiting
/// (the future is dropped), so a late answer counts as an unknown id.
struct Forget<'a> {
    peer: &'a Peer,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.peer.forget(self.id);
    }
}
