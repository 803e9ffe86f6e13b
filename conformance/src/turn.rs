//! The host side of one conformance turn: the messages the battery sends
//! (a complete, valid `RuntimeTurnRequest` carrying the echo payload) and a
//! driver that reads the plugin's lines until its outcome, checking each
//! one as the host's turn driver would.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_protocol::{
    AnnotateParams, EmitParams, InvokeToolParams, Timestamp, annotation_key_refused,
};

use super::session::{Recv, Session};

pub const TURN_ID: &str = "t-conformance-1";
pub const TRACE_ID: &str = "trace-conformance";
/// The one tool of the scripted turns' catalogue.
pub const ECHO_TOOL: &str = "conformance.echo";
/// The request id of `turn/run` (initialize is 1).
pub const RUN_ID: u64 = 2;
/// How long the driver waits with nothing on the wire before it lets the
/// caller answer calls it held back.
const IDLE: Duration = Duration::from_millis(250);

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

pub fn notification(method: &str) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": {"turnId": TURN_ID}})
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

/// Everything one turn put on the wire.
#[derive(Debug, Default)]
pub struct Transcript {
    /// The response to `turn/run` (the whole JSON-RPC object).
    pub outcome: Option<Value>,
    pub calls: Vec<Value>,
    pub emits: usize,
    pub annotations: Vec<(String, Value)>,
    /// Protocol faults the host would end the turn over, or drop silently.
    pub problems: Vec<String>,
    pub longest_line: usize,
}

impl Transcript {
    /// The first problem, or why no outcome arrived.
    pub fn fault(&self) -> Option<String> {
        self.problems.first().cloned()
    }
}

/// Reads until the outcome. `on_call(session, Some(request))` is told of
/// every tool call (valid or not) and answers it or holds it;
/// `on_call(session, None)` runs when the wire is idle, to answer held ones.
pub fn drive(
    session: &mut Session,
    budget: Duration,
    max_bytes: u64,
    on_call: &mut dyn FnMut(&mut Session, Option<&Value>),
) -> Transcript {
    let mut t = Transcript::default();
    let mut inflight: HashSet<String> = HashSet::new();
    let mut last = Instant::now();
    loop {
        let msg = match session.recv(IDLE) {
            Recv::Message(v, n) => {
                t.longest_line = t.longest_line.max(n);
                if n as u64 > max_bytes {
                    t.problems.push(format!(
                        "wrote a {n} byte line, over the maxMessageBytes {max_bytes} it was given (frame_too_large)"
                    ));
                    return t;
                }
                v
            }
            Recv::Invalid(why) => {
                t.problems.push(format!("wrote {why} on stdout"));
                return t;
            }
            Recv::Eof => {
                let status = session.wait_exit(Duration::from_secs(2));
                t.problems.push(format!(
                    "closed stdout before answering turn/run ({})",
                    status.map_or("exit status unknown".into(), |s| s.to_string()),
                ));
                return t;
            }
            Recv::Timeout => {
                on_call(session, None);
                if last.elapsed() > budget {
                    t.problems.push(format!(
                        "did not answer turn/run within {} ms of its last message",
                        budget.as_millis()
                    ));
                    return t;
                }
                continue;
            }
        };
        last = Instant::now();
        if msg.get("method").is_none() && msg.get("id") == Some(&Value::from(RUN_ID)) {
            t.outcome = Some(msg);
            return t;
        }
        check_message(&mut t, &mut inflight, &msg);
        if msg.get("method") == Some(&Value::from("host/invokeTool")) && msg.get("id").is_some() {
            on_call(session, Some(&msg));
        }
    }
}

/// Checks one plugin → host message as the host's turn driver would.
fn check_message(t: &mut Transcript, inflight: &mut HashSet<String>, msg: &Value) {
    let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
    let params = msg.get("params").cloned().unwrap_or(Value::Null);
    let turn_ok = params.get("turnId") == Some(&Value::from(TURN_ID));
    match (method, msg.get("id")) {
        ("host/invokeTool", Some(id)) => {
            t.calls.push(msg.clone());
            if !inflight.insert(id.to_string()) {
                t.problems.push(format!(
                    "reused the request id {id} (duplicate_inflight_id)"
                ));
            }
            match serde_json::from_value::<InvokeToolParams>(params.clone()) {
                Err(e) => t
                    .problems
                    .push(format!("sent invalid host/invokeTool params: {e}")),
                Ok(p) if p.call.tool.as_str() != ECHO_TOOL => t.problems.push(format!(
                    "called {:?}, which is not in the turn's catalogue [{ECHO_TOOL}] (denied tool_unavailable)",
                    p.call.tool.as_str()
                )),
                Ok(p) if p.call.trace_id.as_str() != TRACE_ID => t.problems.push(format!(
                    "sent call.traceId {:?}, not the turn's {TRACE_ID:?} (trace_mismatch)",
                    p.call.trace_id.as_str()
                )),
                Ok(_) if !turn_ok => t
                    .problems
                    .push("sent a tool call for another turnId".into()),
                Ok(_) => {}
            }
        }
        ("host/invokeTool", None) => t
            .problems
            .push("sent host/invokeTool without an id (a notification is dropped)".into()),
        ("host/emit", None) => {
            t.emits += 1;
            if let Err(e) = serde_json::from_value::<EmitParams>(params) {
                t.problems
                    .push(format!("sent invalid host/emit params: {e}"));
            } else if !turn_ok {
                t.problems.push("sent host/emit for another turnId".into());
            }
        }
        ("host/annotate", None) => match serde_json::from_value::<AnnotateParams>(params) {
            Ok(p) if annotation_key_refused(&p.key) || !turn_ok => t.problems.push(format!(
                "sent an annotation the host drops (key {:?}, or another turnId)",
                p.key
            )),
            Ok(p) => t.annotations.push((p.key, p.value)),
            Err(e) => t
                .problems
                .push(format!("sent invalid host/annotate params: {e}")),
        },
        ("", Some(id)) => t.problems.push(format!(
            "answered id {id}, which the host never asked (dropped and counted)"
        )),
        (other, _) => t.problems.push(format!(
            "sent {other:?}, which is not a plugin → host method of protocol v1"
        )),
    }
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
            Recv::Message(v, _) if v.get("id") == Some(&Value::from(id)) => return Ok(v),
            Recv::Message(v, _) => {
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
