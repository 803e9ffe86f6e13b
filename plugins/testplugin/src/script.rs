//! The steps of a test scenario and their JSON form, shared by the
//! in-process runner and the binary.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sharedos_protocol::{RuntimeManifest, RuntimeTurnOutcome};

/// The test plugin's runtime id, in process and from the binary.
pub const ID: &str = "sharedos-testplugin";
/// Its version.
pub const VERSION: &str = "0.1.0";

/// The manifest of the in-process test plugin: the binary's id and version,
/// plus metadata the envelope must carry into `metadata.runtime`.
pub fn manifest() -> RuntimeManifest {
    let mut m = RuntimeManifest::new(ID, VERSION).unwrap_or_else(|_| unreachable!("a valid id"));
    m.metadata = json!({"package": ID}).as_object().cloned();
    m
}

/// One step of a scenario. The JSON form is `{"op": "<snake_case name>",
/// ...fields}`; missing optional fields take the defaults below.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Step {
    /// Calls `tool` and waits for the answer, which goes into the results.
    /// `id` defaults to `call-<n>`; `step` is the declared step. With
    /// `throw`, an error answer ends the turn with an error (an uncaught
    /// rejection); without, the script goes on.
    Call {
        tool: String,
        #[serde(default)]
        arguments: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<u64>,
        #[serde(default, skip_serializing_if = "is_false")]
        throw: bool,
    },
    /// `host/emit` of one event.
    Emit {
        #[serde(rename = "type")]
        kind: String,
        #[serde(default)]
        data: Value,
    },
    /// `host/annotate`.
    Annotate {
        key: String,
        #[serde(default)]
        value: Value,
    },
    /// Sleeps `ms` (tokio's clock in process: a paused clock skips it).
    Sleep {
        #[serde(default = "default_sleep_ms")]
        ms: u64,
    },
    /// Never returns and ignores the drain (the abort still ends a binary).
    Stall,
    /// Waits until the host says the turn is draining.
    WaitDraining,
    /// Ends the turn with an error if it is draining (the standard loop's
    /// check between model rounds).
    ThrowIfDraining,
    /// Ends the turn with an error carrying `message`.
    Throw { message: String },
    /// Ends the turn with `outcome`.
    Return { outcome: RuntimeTurnOutcome },
    /// Waits for the hard abort, annotates `key`, then ends with an error.
    CatchAbortAndAnnotate { key: String, value: Value },
    /// Keeps the turn's host for use after the turn (in process only: the
    /// binary ends the turn with an error saying so).
    CaptureHost,
    /// `n` calls of `tool` with `arguments` (default none), one after the
    /// other; reports each call's nanoseconds as `callNs`.
    TimedCalls {
        tool: String,
        n: u64,
        #[serde(default, skip_serializing_if = "Value::is_null")]
        arguments: Value,
    },
    /// `n` calls of `tool` with `arguments` (default none; over the wire
    /// each `{n}` in them is the call's number), `inflight` at a time;
    /// reports the nanoseconds they took in all as `parallelNs`.
    ParallelCalls {
        tool: String,
        n: u64,
        #[serde(default = "one")]
        inflight: u64,
        #[serde(default, skip_serializing_if = "Value::is_null")]
        arguments: Value,
    },
    /// `n` events of `type` (data: their index); reports `emits` and the
    /// nanoseconds they took as `emitNs`.
    TimedEmits {
        #[serde(rename = "type", default = "tick")]
        kind: String,
        n: u64,
    },
}

fn is_false(b: &bool) -> bool {
    !*b
}
fn default_sleep_ms() -> u64 {
    100
}
fn one() -> u64 {
    1
}
fn tick() -> String {
    "tick".to_owned()
}

impl Step {
    /// The ops of the shared steps, as the JSON form names them.
    pub const OPS: &'static [&'static str] = &[
        "call",
        "emit",
        "annotate",
        "sleep",
        "stall",
        "wait_draining",
        "throw_if_draining",
        "throw",
        "return",
        "catch_abort_and_annotate",
        "capture_host",
        "timed_calls",
        "parallel_calls",
        "timed_emits",
    ];

    /// A step from its JSON form.
    pub fn deserialize_from(value: &Value) -> Result<Self, serde_json::Error> {
        Self::deserialize(value)
    }

    /// A call with id `id` whose error answer fails the turn.
    pub fn call(id: &str, tool: &str) -> Self {
        Self::Call {
            tool: tool.to_owned(),
            arguments: json!({}),
            id: Some(id.to_owned()),
            step: None,
            throw: true,
        }
    }
    /// The same with a declared step.
    /// A call with arguments whose error answer is recorded and the script
    /// goes on.
    pub fn call_with(id: &str, tool: &str, arguments: Value, step: Option<u64>) -> Self {
        Self::Call {
            tool: tool.to_owned(),
            arguments,
            id: Some(id.to_owned()),
            step,
            throw: false,
        }
    }
    pub fn call_at(id: &str, tool: &str, step: u64) -> Self {
        Self::Call {
            tool: tool.to_owned(),
            arguments: json!({}),
            id: Some(id.to_owned()),
            step: Some(step),
            throw: true,
        }
    }
    /// A call whose error answer is recorded and the script goes on.
    pub fn try_call(id: &str, tool: &str) -> Self {
        Self::Call {
            tool: tool.to_owned(),
            arguments: json!({}),
            id: Some(id.to_owned()),
            step: None,
            throw: false,
        }
    }
    pub fn emit(kind: &str, data: Value) -> Self {
        Self::Emit {
            kind: kind.to_owned(),
            data,
        }
    }
    pub fn annotate(key: &str, value: Value) -> Self {
        Self::Annotate {
            key: key.to_owned(),
            value,
        }
    }
    pub fn sleep(ms: u64) -> Self {
        Self::Sleep { ms }
    }
    pub fn throw(message: &str) -> Self {
        Self::Throw {
            message: message.to_owned(),
        }
    }
    pub fn returns(outcome: RuntimeTurnOutcome) -> Self {
        Self::Return { outcome }
    }
    pub fn catch_abort_and_annotate(key: &str, value: Value) -> Self {
        Self::CatchAbortAndAnnotate {
            key: key.to_owned(),
            value,
        }
    }
}

/// A scenario: its steps, in order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Script(pub Vec<Step>);

impl Script {
    /// The request payload that carries this script to a payload-driven
    /// plugin (`{"script": [...]}`), in process or the binary.
    pub fn payload(&self) -> Value {
        json!({ "script": self })
    }

    /// The script a payload carries under `script`; none is empty. A
    /// malformed script is an error naming the step that is wrong.
    pub fn from_payload(payload: &Value) -> Result<Self, String> {
        match payload.get("script") {
            None => Ok(Self::default()),
            Some(steps) => Self::deserialize(steps).map_err(|e| {
                format!("the payload's script is not a list of test plugin steps: {e}")
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_round_trips_through_its_payload() {
        let script = Script(vec![
            Step::call("c1", "files.read"),
            Step::emit("progress", json!(1)),
            Step::returns(RuntimeTurnOutcome::complete(json!("done"))),
        ]);
        let back = Script::from_payload(&script.payload()).unwrap();
        assert_eq!(back, script);
        assert_eq!(script.payload()["script"][0]["op"], "call");
    }

    #[test]
    fn the_binary_form_takes_defaults_and_names_what_is_wrong() {
        let p = json!({"script": [{"op": "sleep"}, {"op": "call", "tool": "echo"}]});
        let s = Script::from_payload(&p).unwrap();
        assert_eq!(s.0[0], Step::sleep(100));
        assert!(matches!(
            &s.0[1],
            Step::Call {
                throw: false,
                id: None,
                ..
            }
        ));
        let err = Script::from_payload(&json!({"script": [{"op": "emit"}]})).unwrap_err();
        assert!(err.contains("type"), "{err}");
        for op in Step::OPS {
            let unit = serde_json::from_value::<Step>(json!({"op": op}));
            assert!(
                unit.is_ok() || !unit.unwrap_err().to_string().contains("unknown variant"),
                "{op} is not a step"
            );
        }
    }
}
