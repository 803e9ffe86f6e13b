//! Text deltas as runtime events.
//!
//! The SDK's driver seam (`AgentTurnDriver`) is handed the turn's request,
//! not its host: the host belongs to the loop. [`Streaming`] wraps the
//! standard loop and sets the turn's host as a task-local value around
//! `run`, so a model session, which the loop drives inside that same task,
//! can `emit` what the model writes while it writes it.
//!
//! [`TextDeltas`] coalesces: a model streams a token or two per event, and
//! the host's emit budgets (protocol.md section 5: 2,000 messages a second,
//! 100,000 events a turn) are for the whole turn. A delta is sent once
//! [`FLUSH_BYTES`] have gathered or [`FLUSH_EVERY`] has passed since the
//! last one, and whatever is left when the answer ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::json;
use sharedos_plugin_sdk::protocol::{RuntimeEvent, ident};
use sharedos_plugin_sdk::{RuntimeError, RuntimeHost, RuntimePlugin, Signal};
use sharedos_protocol::{RuntimeManifest, RuntimeTurnOutcome, RuntimeTurnRequest};

/// Gathered text past this many bytes is sent at once.
pub const FLUSH_BYTES: usize = 1024;
/// Gathered text older than this is sent with the next delta.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// The event type of a text delta (PROTOCOL.md 4.4).
pub const EVENT_TYPE: &str = "text_delta";

tokio::task_local! {
    static HOST: Arc<dyn RuntimeHost>;
}

/// The standard loop with its host reachable from the model sessions.
pub struct Streaming {
    pub inner: Arc<dyn RuntimePlugin>,
}

#[async_trait]
impl RuntimePlugin for Streaming {
    fn manifest(&self) -> RuntimeManifest {
        self.inner.manifest()
    }

    async fn run(
        &self,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
    ) -> Result<RuntimeTurnOutcome, RuntimeError> {
        HOST.scope(host.clone(), self.inner.run(request, host, abort))
            .await
    }
}

/// The text of one answer on its way out as `text_delta` events.
pub struct TextDeltas {
    host: Option<Arc<dyn RuntimeHost>>,
    gathered: String,
    since: Instant,
}

impl TextDeltas {
    /// Reaches the turn's host when run under [`Streaming`]; otherwise
    /// (a driver used on its own) gathers and sends nothing.
    pub fn for_this_turn() -> Self {
        Self {
            host: HOST.try_with(Arc::clone).ok(),
            gathered: String::new(),
            since: Instant::now(),
        }
    }

    pub fn push(&mut self, text: &str) {
        if self.host.is_none() || text.is_empty() {
            return;
        }
        self.gathered.push_str(text);
        if self.gathered.len() >= FLUSH_BYTES || self.since.elapsed() >= FLUSH_EVERY {
            self.flush();
        }
    }

    /// Sends what is gathered. An emit the host refuses (the turn was
    /// aborted) stops the deltas; the loop ends the turn on its own.
    pub fn flush(&mut self) {
        self.since = Instant::now();
        if self.gathered.is_empty() {
            return;
        }
        let text = std::mem::take(&mut self.gathered);
        let Some(host) = &self.host else { return };
        let event = RuntimeEvent {
            kind: ident(EVENT_TYPE),
            data: json!({ "text": text }),
        };
        if host.emit(event).is_err() {
            self.host = None;
        }
    }
}
