//! The shared steps (`sharedos_testplugin::Step`) spoken over the wire: the
//! scenario a test runs in process with `ScriptPlugin`, run here by the
//! binary as raw NDJSON, with the same meaning.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_protocol::ErrorKind;
use sharedos_protocol::jsonrpc::WireError;
use sharedos_testplugin::Step;

use crate::connection::Plugin;
use crate::inflight;

/// What the script does after a shared step.
pub enum Flow {
    Next,
    /// The step answered `turn/run`: the script stops.
    End,
}

/// Runs `s` if its op is a shared step; `None` when it is not one. A shared
/// op whose fields do not parse ends the turn with an error naming them.
pub fn run(p: &mut Plugin, s: &Value) -> Option<Flow> {
    let op = s.get("op").and_then(Value::as_str)?;
    if !Step::OPS.contains(&op) {
        return None;
    }
    Some(match Step::deserialize_from(s) {
        Ok(step) => over_wire(p, &step),
        Err(e) => fail(p, &format!("testplugin: bad `{op}` step: {e}")),
    })
}

/// Answers `turn/run` with an error, as the SDK does for a plugin's
/// `RuntimeError`.
fn fail(p: &mut Plugin, message: &str) -> Flow {
    let run_id = p.run_id.clone();
    let error = WireError::new(ErrorKind::Internal, message);
    p.send(&json!({"jsonrpc": "2.0", "id": run_id, "error": error}));
    p.outcome_sent = true;
    Flow::End
}

fn over_wire(p: &mut Plugin, step: &Step) -> Flow {
    match step {
        Step::Call {
            tool,
            arguments,
            id,
            step,
            throw,
        } => {
            let answer = p.call_as(id.as_deref(), tool, arguments.clone(), *step);
            let error = answer.get("error").cloned();
            p.results.push(answer);
            if let (Some(e), true) = (error, *throw) {
                return fail(p, &format!("uncaught: {e}"));
            }
        }
        Step::Emit { kind, data } => emit(p, json!(kind), data.clone()),
        Step::Annotate { key, value } => {
            let params = json!({"turnId": p.turn_id, "key": key, "value": value});
            p.notify(sharedos_protocol::methods::HOST_ANNOTATE, params);
        }
        Step::Sleep { ms } => std::thread::sleep(Duration::from_millis(*ms)),
        Step::Stall => loop {
            std::thread::sleep(Duration::from_secs(3600));
        },
        Step::WaitDraining => {
            while !p.draining {
                let _ = p.read_one();
            }
        }
        Step::ThrowIfDraining if p.draining => return fail(p, "the turn is draining"),
        Step::ThrowIfDraining => {}
        Step::Throw { message } => return fail(p, message),
        Step::Return { outcome } => {
            let value = serde_json::to_value(outcome).unwrap_or(Value::Null);
            p.outcome(value);
            return Flow::End;
        }
        Step::CatchAbortAndAnnotate { key, value } => {
            p.ignore_abort = true;
            while !p.aborted {
                let _ = p.read_one();
            }
            let params = json!({"turnId": p.turn_id, "key": key, "value": value});
            p.notify(sharedos_protocol::methods::HOST_ANNOTATE, params);
            return fail(p, "aborted");
        }
        Step::CaptureHost => {
            return fail(
                p,
                "capture_host runs in process only: there is no host object to keep",
            );
        }
        Step::TimedCalls { tool, n, arguments } => return timed_calls(p, tool, *n, arguments),
        Step::ParallelCalls {
            tool,
            n,
            inflight,
            arguments,
        } => {
            return match inflight::parallel_calls(p, tool, *n, *inflight, arguments) {
                Ok(()) => Flow::Next,
                Err(e) => fail(p, &e),
            };
        }
        Step::TimedEmits { kind, n } => {
            let t = Instant::now();
            for i in 0..*n {
                emit(p, json!(kind), json!(i));
            }
            p.reports
                .insert("emitNs".into(), json!(t.elapsed().as_nanos() as u64));
            p.reports.insert("emits".into(), json!(n));
        }
    }
    Flow::Next
}

fn emit(p: &mut Plugin, kind: Value, data: Value) {
    let params = json!({"turnId": p.turn_id, "event": {"type": kind, "data": data}});
    p.notify("host/emit", params);
}

fn timed_calls(p: &mut Plugin, tool: &str, n: u64, arguments: &Value) -> Flow {
    let arguments = if arguments.is_null() {
        json!({})
    } else {
        arguments.clone()
    };
    let mut samples = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        let answer = p.call_as(Some(&format!("c{i}")), tool, arguments.clone(), None);
        if let Some(e) = answer.get("error") {
            return fail(p, &format!("uncaught: {e}"));
        }
        samples.push(t.elapsed().as_nanos() as u64);
    }
    p.reports.insert("callNs".into(), json!(samples));
    Flow::Next
}
