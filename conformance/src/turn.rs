//! The messages the scripted checks send (a complete, valid
//! `RuntimeTurnRequest` carrying the echo payload), the echo payload the
//! envelope's turns carry, and reading the answer to one request.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_protocol::Timestamp;

use super::session::{Recv, Session};

pub const TURN_ID: &str = "t-conformance-1";
pub const TRACE_ID: &str = "trace-conformance";
/// The one tool of the scripted turns' catalogue.
pub const ECHO_TOOL: &str = "conformance.echo";
/// The request id of `turn/run` (initialize is 1).
pub const RUN_ID: u64 = 2;

fn now() -> Value {
    serde_json::to_value(Timestamp::now()).unwrap_or(Value::Null)
}

/// `initialize` offering `versions`, with the given limits.
pub fn initialize(versions: &[u32], max_message_bytes: u64, max_inflight: u32) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersions": versions,
        "host": {"name": "sharedos-conformance", "version": env!("CARGO_PKG_VERSION")},
        "limits": {"maxMessageBytes": max_message_bytes,
                   "maxInflightToolCalls": max_inflight, "maxConcurrentTurns": 1},
        "capabilities": {}}})
}

/// A valid `RuntimeTurnRequest` whose message payload is `payload`.
pub fn turn_request(payload: Value) -> Value {
    let human = json!({"kind": "human", "userId": "conformance"});
    let agent = json!({"kind": "agent", "agentId": "conformance"});
    json!({
        "version": "1",
        "executionId": "exec-conformance-1",
        "agent": agent,
        "context": {"actor": human, "owner": human, "namespaceId": "conformance",
                    "purpose": "conformance", "traceId": TRACE_ID, "now": now(),
                    "reach": {"status": "unavailable", "reasonCode": "conformance"}},
        "message": {"version": "1", "id": "msg-conformance-1", "sender": human,
                    "receiver": agent, "purpose": "conformance", "payload": payload,
                    "traceId": TRACE_ID, "createdAt": now()},
        "tools": [{"name": ECHO_TOOL, "description": "Echoes its arguments.",
                   "namespace": "conformance", "source": "conformance", "readWrite": "read",
                   "inputSchema": {"type": "object"},
                   "requiredCapability": {"resource": {"namespace": "conformance", "path": []},
                                          "action": "read"}}]
    })
}

pub fn turn_run(payload: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": RUN_ID, "method": "turn/run", "params": {
        "turnId": TURN_ID, "request": turn_request(payload),
        "limits": {"maxSteps": 1000, "maxToolCalls": 10000, "timeoutMs": 60000}}})
}

/// The payload asking for `n` calls of the echo tool.
pub fn calls(n: usize, parallel: bool) -> Value {
    let calls: Vec<Value> = (0..n)
        .map(|i| json!({"tool": ECHO_TOOL, "arguments": {"n": i}}))
        .collect();
    json!({"calls": calls, "parallel": parallel})
}

/// A `succeeded` answer to the tool call request `req`, with `output`.
pub fn succeeded(req: &Value, output: Value) -> Value {
    let call = &req["params"]["call"];
    json!({"jsonrpc": "2.0", "id": req["id"], "result": {
        "status": "succeeded", "callId": call["id"], "tool": call["tool"],
        "completedAt": now(), "output": output}})
}

/// Reads until `initialize` is answered (or not), within `budget`.
pub fn await_answer(session: &mut Session, id: u64, budget: Duration) -> Result<Value, String> {
    let end = Instant::now() + budget;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("did not answer within {} ms", budget.as_millis()));
        }
        match session.recv(left) {
            Recv::Message(v) if v.get("id") == Some(&Value::from(id)) => return Ok(v),
            Recv::Message(v) => {
                return Err(format!("wrote {} before answering", short(&v)));
            }
            Recv::Invalid(why) => return Err(format!("wrote {why} on stdout")),
            Recv::Eof => {
                let status = session.wait_exit(Duration::from_secs(2));
                return Err(format!(
                    "closed stdout without answering ({})",
                    status.map_or("exit status unknown".into(), |s| s.to_string()),
                ));
            }
            Recv::Timeout => continue,
        }
    }
}

/// A message, cut for a report line.
pub fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 160 {
        let mut end = 160;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &s[..end])
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sharedos_protocol::{RuntimeTurnRequest, TurnRunParams};

    #[test]
    fn the_turn_request_is_a_valid_runtime_turn_request() {
        let req = turn_request(calls(2, false));
        let parsed: RuntimeTurnRequest = serde_json::from_value(req).expect("valid request");
        assert_eq!(parsed.context.trace_id.as_str(), TRACE_ID);
        let run: TurnRunParams =
            serde_json::from_value(turn_run(json!({}))["params"].clone()).expect("valid params");
        assert_eq!(run.turn_id.as_str(), TURN_ID);
    }
}
