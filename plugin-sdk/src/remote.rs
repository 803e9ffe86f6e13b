//! [`RemoteHost`]: `RuntimeHost` over the wire, for one turn of a plugin
//! served by [`crate::serve`]. A tool call is a request on the peer whose
//! answer comes straight back to the calling task.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;
use sharedos_peer::{Peer, Violation, ViolationReason};
use sharedos_protocol::method::{Annotate, Emit, InvokeTool, Method};
use sharedos_protocol::{
    AnnotateParams, EmitParams, ErrorKind, RuntimeEvent, RuntimeLimits, ToolCall, ToolResult,
    TurnId,
};

use crate::host::{HostCallError, RuntimeHost, check_annotation};
use crate::signal::Signal;

/// `InvokeToolParams`, borrowed: the same members, serialized the same way.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InvokeToolRef<'a> {
    turn_id: &'a TurnId,
    call: &'a ToolCall,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<u64>,
}

/// `RuntimeHost` over the wire, for one turn.
pub struct RemoteHost {
    peer: Arc<Peer>,
    turn_id: TurnId,
    limits: RuntimeLimits,
    draining: Signal,
    abort: Signal,
    closed: AtomicBool,
}

impl RemoteHost {
    pub(crate) fn new(
        peer: Arc<Peer>,
        turn_id: TurnId,
        limits: RuntimeLimits,
        draining: Signal,
        abort: Signal,
    ) -> Self {
        Self {
            peer,
            turn_id,
            limits,
            draining,
            abort,
            closed: AtomicBool::new(false),
        }
    }

    /// The turn answered: calls and emits are refused from now on.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
    }

    fn is_closed(&self) -> bool {
        self.abort.is_raised() || self.closed.load(Ordering::Relaxed)
    }

    fn notify(&self, method: &str, params: &impl Serialize) -> Result<(), HostCallError> {
        self.peer
            .notify_now(method, params)
            .map_err(|v| sending_failed(&v, "the message exceeds maxMessageBytes"))
    }
}

/// A message that could not be sent, as the plugin sees it.
fn sending_failed(v: &Violation, too_large: &str) -> HostCallError {
    match v.reason {
        ViolationReason::FrameTooLarge => HostCallError::new(ErrorKind::MessageTooLarge, too_large),
        _ => HostCallError::closed(),
    }
}

#[async_trait]
impl RuntimeHost for RemoteHost {
    fn limits(&self) -> RuntimeLimits {
        self.limits
    }

    async fn invoke_tool(
        &self,
        call: ToolCall,
        step: Option<u64>,
    ) -> Result<ToolResult, HostCallError> {
        if self.is_closed() {
            return Err(HostCallError::closed());
        }
        let params = InvokeToolRef {
            turn_id: &self.turn_id,
            call: &call,
            step,
        };
        // Dropping the call on abort forgets its id: a late answer is an
        // unknown id to the peer.
        let answer = tokio::select! {
            a = self.peer.call_raw(InvokeTool::NAME, &params) => a,
            _ = self.abort.raised() => {
                return Err(HostCallError::new(ErrorKind::Cancelled, "the turn was aborted"));
            }
        };
        match answer {
            Ok(Ok(raw)) => serde_json::from_str(raw.get()).map_err(|_| {
                HostCallError::new(
                    ErrorKind::Internal,
                    "the host returned an invalid tool result",
                )
            }),
            Ok(Err(e)) => Err(HostCallError::new(sharedos_peer::kind_of(&e), e.message)),
            Err(v) => Err(sending_failed(&v, "the tool call exceeds maxMessageBytes")),
        }
    }

    fn emit(&self, event: RuntimeEvent) -> Result<(), HostCallError> {
        if self.is_closed() {
            return Err(HostCallError::closed());
        }
        let params = EmitParams {
            turn_id: self.turn_id.clone(),
            event,
        };
        self.notify(Emit::NAME, &params)
    }

    fn annotate(&self, key: &str, value: Value) -> Result<(), HostCallError> {
        check_annotation(key)?;
        if self.closed.load(Ordering::Relaxed) {
            return Ok(());
        }
        let params = AnnotateParams {
            turn_id: self.turn_id.clone(),
            key: key.to_owned(),
            value,
        };
        self.notify(Annotate::NAME, &params)
    }

    fn draining(&self) -> Signal {
        self.draining.clone()
    }
}
