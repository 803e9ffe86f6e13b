//! [`Replier`]: the answer slot of one incoming request.

use std::fmt;
use std::sync::Arc;

use jsonrpsee_types::ErrorObject;
use serde::Serialize;
use sharedos_protocol::ErrorKind;
use sharedos_protocol::jsonrpc::RequestId;
use sharedos_protocol::method::Request;
use sharedos_protocol::tool_json::WriteJson;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{OwnedSemaphorePermit, mpsc};

use crate::line;
use crate::shared::{Line, Shared, lock};
use crate::violation::{Violation, ViolationReason};

/// The answer slot of one incoming request. Dropping it unanswered frees
/// the id and the in-flight slot.
pub struct Replier {
    pub(crate) id: RequestId,
    pub(crate) shared: Arc<Shared>,
    pub(crate) out: mpsc::Sender<Line>,
    pub(crate) _permit: Option<OwnedSemaphorePermit>,
    pub(crate) answered: bool,
}

impl fmt::Debug for Replier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replier").field("id", &self.id).finish()
    }
}

impl Replier {
    pub fn id(&self) -> &RequestId {
        &self.id
    }

    /// Answers request `M` with its declared result type.
    pub async fn answer<M: Request>(self, result: &M::Result) -> Result<(), Violation> {
        self.result(result).await
    }

    /// Sends a result, or `-32057` if it would exceed the line limit.
    pub async fn result(mut self, value: &impl Serialize) -> Result<(), Violation> {
        let line = self.result_line(value);
        self.finish(line).await
    }

    /// [`Replier::result`] for a result that writes its own JSON text
    /// ([`WriteJson`], byte for byte what `serde_json` writes): the same
    /// line, built without serde (the answer to every tool call).
    pub async fn result_written(mut self, value: &impl WriteJson) -> Result<(), Violation> {
        let line = self.written_line(value);
        self.finish(line).await
    }

    /// [`Replier::result`] without waiting for queue space; `false` if it
    /// could not be queued.
    pub fn try_result(mut self, value: &impl Serialize) -> bool {
        let line = self.result_line(value);
        self.release();
        self.out.try_send(line).is_ok()
    }

    fn result_line(&self, value: &impl Serialize) -> Line {
        match line::response(&self.id, value) {
            Ok(l) => self.within_limit(l.into_bytes()),
            Err(_) => line::error_response(
                &self.id,
                &line::error(ErrorKind::Internal, "unserializable result"),
            )
            .into_bytes(),
        }
    }

    fn written_line(&self, value: &impl WriteJson) -> Line {
        self.within_limit(line::response_written(&self.id, value))
    }

    /// The line, or `-32057` in its place if it exceeds the line limit.
    fn within_limit(&self, line: Line) -> Line {
        let max = self.shared.max_message_bytes();
        if line.len() <= max {
            return line;
        }
        let mut data = serde_json::Map::new();
        data.insert("limit".into(), max.into());
        let too_large = line::error_with(
            ErrorKind::MessageTooLarge,
            "the response exceeds maxMessageBytes",
            data,
        );
        line::error_response(&self.id, &too_large).into_bytes()
    }

    pub async fn error(mut self, error: &ErrorObject<'_>) -> Result<(), Violation> {
        let line = line::error_response(&self.id, error);
        self.finish(line.into_bytes()).await
    }

    /// Sends an error without waiting for queue space (used right before
    /// a kill); `false` if it could not be queued.
    pub fn try_error(mut self, error: &ErrorObject<'_>) -> bool {
        self.release();
        self.out
            .try_send(line::error_response(&self.id, error).into_bytes())
            .is_ok()
    }

    async fn finish(&mut self, line: Line) -> Result<(), Violation> {
        self.release();
        // An answer nearly always finds room in the queue: queued at once,
        // without building the wait for a slot. A full queue waits as
        // before (a free slot goes to the senders already waiting first,
        // so this never overtakes them).
        let line = match self.out.try_send(line) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Full(line)) => line,
            Err(TrySendError::Closed(_)) => return Err(writer_stopped()),
        };
        self.out.send(line).await.map_err(|_| writer_stopped())
    }

    fn release(&mut self) {
        if !self.answered {
            self.answered = true;
            lock(&self.shared.inflight).remove(&self.id);
        }
    }
}

fn writer_stopped() -> Violation {
    Violation::new(ViolationReason::Io, "the writer has stopped")
}

impl Drop for Replier {
    fn drop(&mut self) {
        self.release();
    }
}
