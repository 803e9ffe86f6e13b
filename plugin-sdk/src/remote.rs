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
use sharedos_protocol::tool_json::{self, WriteJson};
use sharedos_protocol::{
    AnnotateParams, EmitParams, ErrorKind, RuntimeEvent, RuntimeLimits, ToolCall, ToolResult,
    TurnId, json,
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

/// Written by hand for every tool call: the bytes its `Serialize` writes
/// (a test holds the two to that), without serde's second pass over each
/// string.
impl WriteJson for InvokeToolRef<'_> {
    fn write_json(&self, out: &mut Vec<u8>) {
        let call = self.call;
        out.extend_from_slice(br#"{"turnId":"#);
        json::write_str(out, self.turn_id.as_str());
        out.extend_from_slice(br#","call":{"id":"#);
        json::write_str(out, call.id.as_str());
        out.extend_from_slice(br#","tool":"#);
        json::write_str(out, call.tool.as_str());
        out.extend_from_slice(br#","arguments":"#);
        tool_json::write_object(out, &call.arguments);
        out.extend_from_slice(br#","traceId":"#);
        json::write_str(out, call.trace_id.as_str());
        out.extend_from_slice(br#","requestedAt":"#);
        json::write_str(out, call.requested_at.as_str());
        out.push(b'}');
        if let Some(step) = self.step {
            out.extend_from_slice(br#","step":"#);
            json::write_u64(out, step);
        }
        out.push(b'}');
    }
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
            a = self.peer.call_written(InvokeTool::NAME, &params) => a,
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
    use sharedos_protocol::{Identifier, Timestamp, ident};

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

    /// The SDK's own work for one tool call, repeated: the request line
    /// written, the host's answer (as the host writes it) read back. A
    /// profiler runs it 100,000 times (`SHAREDOS_PROFILE_ROUNDS=100000
    /// cargo test --release -p sharedos-plugin-sdk sdk_side_of_a_call`);
    /// the suite runs a few rounds, which check the reading.
    #[test]
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
        for id in 0..profile_rounds(100) {
            let params = InvokeToolRef {
                turn_id: &turn_id,
                call: &call,
                step: Some(id),
            };
            bytes += std::hint::black_box(sharedos_peer::request_line_written(
                id,
                InvokeTool::NAME,
                &params,
            ))
            .len();
            let read = ToolResult::from_json(std::hint::black_box(&text)).unwrap();
            assert_eq!(read.status(), answer.status());
        }
        assert!(bytes > 0);
    }

    /// `SHAREDOS_PROFILE_ROUNDS`, else `default`.
    fn profile_rounds(default: u64) -> u64 {
        std::env::var("SHAREDOS_PROFILE_ROUNDS")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(default)
    }

    /// A small xorshift generator: a failure replays.
    struct Gen(u64);

    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        /// Escapes, control characters, non-ASCII, U+2028, now and then
        /// long.
        fn string(&mut self) -> String {
            const ALPHABET: [&str; 16] = [
                "a", "Z", "\"", "\\", "\n", "\r", "\t", "\u{1}", "\u{1f}", "\u{7f}", "é", "😀",
                "\u{2028}", "\u{2029}", "/", " ",
            ];
            let len = if self.below(10) == 0 {
                self.below(3000)
            } else {
                self.below(24)
            };
            (0..len)
                .map(|_| ALPHABET[self.below(ALPHABET.len())])
                .collect()
        }
        fn identifier(&mut self) -> Identifier {
            let mut s: String = format!("x{}y", self.string()).chars().take(256).collect();
            if Identifier::new(s.as_str()).is_err() {
                s = "x".into();
            }
            Identifier::new(s).unwrap()
        }
        fn value(&mut self, depth: usize) -> Value {
            let kinds = if depth == 0 { 6 } else { 8 };
            match self.below(kinds) {
                0 => Value::Null,
                1 => Value::Bool(self.below(2) == 0),
                2 => [u64::MAX, 0, self.next()][self.below(3)].into(),
                3 => [i64::MIN, -1][self.below(2)].into(),
                4 => [0.1, -1.5e-7, 1e300, self.next() as f64 / 7.0][self.below(4)].into(),
                5 => Value::String(self.string()),
                6 => Value::Array((0..self.below(4)).map(|_| self.value(depth - 1)).collect()),
                _ => Value::Object(self.object(depth - 1)),
            }
        }
        fn object(&mut self, depth: usize) -> serde_json::Map<String, Value> {
            (0..self.below(5))
                .map(|_| (self.string(), self.value(depth)))
                .collect()
        }
        fn call(&mut self) -> ToolCall {
            ToolCall {
                id: self.identifier(),
                tool: self.identifier(),
                arguments: self.object(3),
                trace_id: self.identifier(),
                requested_at: Timestamp::parse(
                    [
                        "2026-12-01T19:30:34.123Z",
                        "2026-12-01 19:30:34Z",
                        "2026-12-01T21:30:34.5+02:00",
                    ][self.below(3)],
                )
                .unwrap(),
            }
        }
    }

    /// The hand-written request line of a tool call is the one serde
    /// writes, over generated calls: escapes, unicode, long strings,
    /// arguments of every JSON type, every shape of step.
    #[test]
    fn the_written_tool_call_line_is_byte_for_byte_the_serde_one() {
        let mut generator = Gen(0x3c6e_f372_fe94_f82b);
        for n in 0..3000u64 {
            let turn_id =
                TurnId::new(["t", "turn-1", "a.b:c_d-9", &"T".repeat(128)][generator.below(4)])
                    .unwrap();
            let call = generator.call();
            let step = [None, Some(0), Some(n), Some(u64::MAX)][generator.below(4)];
            let params = InvokeToolRef {
                turn_id: &turn_id,
                call: &call,
                step,
            };
            let id = [n, u64::MAX][generator.below(2)];
            assert_eq!(
                String::from_utf8(sharedos_peer::request_line_written(
                    id,
                    InvokeTool::NAME,
                    &params
                ))
                .unwrap(),
                sharedos_peer::request_line(id, InvokeTool::NAME, &params).unwrap(),
                "for {call:?}"
            );
        }
    }
}
