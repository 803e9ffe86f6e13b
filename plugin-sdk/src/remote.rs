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
            Ok(Ok(raw)) => ToolResult::from_json(raw.get()).map_err(|_| {
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

#[cfg(test)]
mod tests {
    use super::*;
    use sharedos_protocol::tool_json::WriteJson;
    use sharedos_protocol::{Timestamp, ident};

    fn call() -> ToolCall {
        ToolCall {
            id: ident("call-17"),
            tool: ident("echo"),
            arguments: serde_json::json!({"text": "hello world", "n": 3, "deep": {"a": [1, 2]}})
                .as_object()
                .cloned()
                .unwrap_or_default(),
            trace_id: ident("trace-4f2a"),
            requested_at: Timestamp::parse("2026-12-02T05:00:00.123Z").unwrap(),
        }
    }

    /// The SDK's own work for one tool call, 100,000 times: the request
    /// line written, the host's answer (as the host writes it) read back.
    /// For a profiler (`cargo test --release -p sharedos-plugin-sdk
    /// sdk_side_of_a_call -- --ignored`); it checks nothing but the reading.
    #[test]
    #[ignore]
    fn sdk_side_of_a_call() {
        let turn_id = TurnId::new("turn-1").unwrap();
        let call = call();
        let answer = ToolResult::succeeded(
            &call,
            serde_json::json!({"echo": {"text": "hello world"}}),
            Timestamp::parse("2026-12-02T05:00:00.456Z").unwrap(),
        );
        let mut text = Vec::new();
        answer.write_json(&mut text);
        let text = String::from_utf8(text).unwrap();
        let mut bytes = 0;
        for id in 0..100_000u64 {
            let params = InvokeToolRef {
                turn_id: &turn_id,
                call: &call,
                step: Some(id),
            };
            bytes += std::hint::black_box(
                sharedos_peer::request_line(id, InvokeTool::NAME, &params).unwrap(),
            )
            .len();
            let read = ToolResult::from_json(std::hint::black_box(&text)).unwrap();
            assert_eq!(read.status(), answer.status());
        }
        assert!(bytes > 0);
    }
}
