//! One runtime's gateway as the seat holds it: built at config load (a
//! missing secret fails the start), bound to a turn by the envelope (the
//! kernel's turn as the authority of its effects, and the turn's context) and served by the
//! process runtime on the listener its sandbox handed over.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use sharedos_protocol::EventKind;

use super::gateway::{EgressEvent, Gateway, ServeHandle, TurnBinding};

/// The kernel namespace of the gateway's effects (`egress`, path
/// `[route]` / `[host:port]`).
pub const EGRESS_NAMESPACE: &str = "egress";

/// The port the gateway listens on inside every sandbox's own network
/// namespace (each has its own loopback, so one number serves them all).
pub const EGRESS_PORT: u16 = 8787;

/// What the plugin is told: where the gateway is (`SHAREDOS_EGRESS_URL`).
pub fn egress_url() -> String {
    format!("http://127.0.0.1:{EGRESS_PORT}")
}

/// A runtime's gateway and the turns bound to it, by execution id.
pub struct EgressSeat {
    gateway: Arc<Gateway>,
    bindings: Mutex<HashMap<String, Arc<TurnBinding>>>,
}

impl std::fmt::Debug for EgressSeat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressSeat")
            .field("gateway", &self.gateway)
            .field("turns", &self.lock().len())
            .finish()
    }
}

/// Why a turn's listener could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("no turn is bound to execution {0:?} (the envelope binds each turn of an egress seat)")]
    Unbound(String),
    #[error("the gateway's listener is unusable: {0}")]
    Listener(std::io::Error),
}

impl EgressSeat {
    pub fn new(gateway: Gateway) -> Self {
        Self {
            gateway: Arc::new(gateway),
            bindings: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<TurnBinding>>> {
        self.bindings.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The envelope binds a turn before the runtime runs; the returned
    /// guard unbinds it when the turn ends.
    pub fn bind(self: &Arc<Self>, execution_id: &str, binding: Arc<TurnBinding>) -> BoundTurn {
        self.lock().insert(execution_id.to_owned(), binding);
        BoundTurn {
            seat: Arc::clone(self),
            execution_id: execution_id.to_owned(),
        }
    }

    /// Serves `listener` (the sandbox's, bound in its network namespace)
    /// for the turn bound to `execution_id`, until the handle is dropped.
    /// Must be called inside a tokio runtime.
    pub fn serve(&self, execution_id: &str, listener: OwnedFd) -> Result<ServeHandle, ServeError> {
        let binding = self
            .lock()
            .get(execution_id)
            .cloned()
            .ok_or_else(|| ServeError::Unbound(execution_id.to_owned()))?;
        let listener = listener_of(listener).map_err(ServeError::Listener)?;
        Ok(self.gateway.serve(listener, binding))
    }
}

/// `fd` as the gateway's listener: a unix listener (a microVM's channel
/// connects there) or else a TCP one (a namespace sandbox's).
fn listener_of(fd: OwnedFd) -> std::io::Result<super::gateway::Listener> {
    // A unix socket's address reads back as one; a TCP socket's does not.
    let unix = std::os::unix::net::UnixListener::from(fd);
    if unix.local_addr().is_ok() {
        unix.set_nonblocking(true)?;
        return Ok(tokio::net::UnixListener::from_std(unix)?.into());
    }
    let tcp = std::net::TcpListener::from(OwnedFd::from(unix));
    tcp.set_nonblocking(true)?;
    Ok(tokio::net::TcpListener::from_std(tcp)?.into())
}

/// Unbinds a turn from its seat when dropped.
#[derive(Debug)]
pub struct BoundTurn {
    seat: Arc<EgressSeat>,
    execution_id: String,
}

impl Drop for BoundTurn {
    fn drop(&mut self) {
        self.seat.lock().remove(&self.execution_id);
    }
}

/// An egress event as the turn's event (kind, data): counts and codes
/// only, never a payload or a key.
pub fn event_of(e: &EgressEvent) -> (EventKind, Value) {
    match e {
        EgressEvent::Request {
            route,
            status,
            code,
            request_bytes,
            response_bytes,
            duration_ms,
            usage,
            estimated_tokens,
        } => (
            EventKind::EgressRequest,
            json!({
                "route": route,
                "status": status,
                "code": code,
                "requestBytes": request_bytes,
                "responseBytes": response_bytes,
                "durationMs": duration_ms,
                "inputTokens": usage.as_ref().map(|u| u.input),
                "outputTokens": usage.as_ref().map(|u| u.output),
                "estimatedTokens": estimated_tokens,
            }),
        ),
        EgressEvent::Connection {
            destination,
            code,
            bytes_up,
            bytes_down,
            duration_ms,
        } => (
            EventKind::EgressConnection,
            json!({
                "destination": destination,
                "code": code,
                "bytesUp": bytes_up,
                "bytesDown": bytes_down,
                "durationMs": duration_ms,
            }),
        ),
        EgressEvent::BudgetExceeded { budget } => {
            (EventKind::EgressBudgetExceeded, json!({ "budget": budget }))
        }
        EgressEvent::ModelFailing {
            route,
            failures,
            status,
            code,
        } => (
            EventKind::EgressModelFailing,
            json!({"route": route, "failures": failures, "status": status, "code": code}),
        ),
    }
}
