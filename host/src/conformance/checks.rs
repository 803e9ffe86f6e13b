//! The battery: each check launches the plugin afresh (one process per
//! turn, as the host does), drives one situation, and says which section
//! of docs/PROTOCOL.md it enforces and what to fix.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use sharedos_protocol::{InitializeResult, RuntimeTurnOutcome};

use super::session::{Recv, Session};
use super::turn::{self, Transcript, await_answer, drive, short};
use crate::process::{LaunchSpec, Launcher};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pass,
    Fail,
    /// The plugin does not follow the echo payload, so the situation could
    /// not be produced (docs/PLUGINS.md).
    NotApplicable,
    /// An earlier failure (the handshake) made the check meaningless.
    NotRun,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub id: &'static str,
    /// The section of docs/PROTOCOL.md the check enforces.
    pub section: &'static str,
    pub status: Status,
    pub detail: String,
    /// What to change when it fails.
    pub fix: &'static str,
}

/// What the battery needs to launch the plugin.
pub struct Battery<'a> {
    pub launcher: &'a dyn Launcher,
    pub spec: LaunchSpec,
    pub handshake: Duration,
    pub step: Duration,
    /// Processes found alive after a launch's tree was killed.
    pub leftovers: std::rc::Rc<std::cell::Cell<usize>>,
}

pub(super) const MIB: u64 = 1 << 20;
/// The protocol's default frame limit, as the battery offers it.
pub(super) const DEFAULT_MAX: u64 = sharedos_protocol::DEFAULT_MAX_MESSAGE_BYTES as u64;

pub(super) fn check(id: &'static str, section: &'static str, fix: &'static str) -> Check {
    Check {
        id,
        section,
        status: Status::Pass,
        detail: String::new(),
        fix,
    }
}

impl Check {
    pub(super) fn pass(mut self, detail: impl Into<String>) -> Self {
        self.detail = detail.into();
        self
    }
    pub(super) fn fail(mut self, detail: impl Into<String>) -> Self {
        self.status = Status::Fail;
        self.detail = detail.into();
        self
    }
    pub(super) fn na(mut self, detail: impl Into<String>) -> Self {
        self.status = Status::NotApplicable;
        self.detail = detail.into();
        self
    }
    pub(super) fn verdict(self, r: Result<String, String>) -> Self {
        match r {
            Ok(d) => self.pass(d),
            Err(d) => self.fail(d),
        }
    }
}

/// The outcome in a `turn/run` response, checked strictly.
pub(super) fn outcome_of(resp: &Value) -> Result<RuntimeTurnOutcome, String> {
    if let Some(e) = resp.get("error") {
        return Err(format!(
            "answered turn/run with a JSON-RPC error (the turn ends failed runtime_failed): {}",
            short(e)
        ));
    }
    serde_json::from_value(resp.get("result").cloned().unwrap_or(Value::Null)).map_err(|e| {
        format!("the outcome is not a valid RuntimeTurnOutcome (invalid_runtime_outcome): {e}")
    })
}

pub(super) fn outcome_or_fault(t: &Transcript) -> Result<RuntimeTurnOutcome, String> {
    if let Some(p) = t.fault() {
        return Err(p);
    }
    t.outcome
        .as_ref()
        .ok_or_else(|| "no outcome".to_owned())
        .and_then(outcome_of)
}

pub(super) fn kind(o: &RuntimeTurnOutcome) -> &'static str {
    match o {
        RuntimeTurnOutcome::Complete { .. } => "complete",
        RuntimeTurnOutcome::Fail { .. } => "fail",
        RuntimeTurnOutcome::Escalate { .. } => "escalate",
    }
}

/// `silent_before_initialize`: nothing on the plugin's stdout in the
/// 300 ms before `initialize` is sent.
fn silent_before_initialize(s: &mut Session, silent: Check) -> Check {
    match s.recv(Duration::from_millis(300)) {
        Recv::Timeout => silent.pass("nothing on stdout in the 300 ms before initialize"),
        Recv::Message(v, _) => silent.fail(format!("wrote {} before initialize", short(&v))),
        Recv::Invalid(why) => silent.fail(format!("wrote {why} before initialize")),
        Recv::Eof => silent.fail(format!(
            "closed stdout before initialize (exit status {}; stderr: {})",
            s.wait_exit(Duration::from_secs(2))
                .map_or("unknown".into(), |st| st.to_string()),
            s.stderr_tail()
        )),
    }
}

impl Battery<'_> {
    pub(super) fn launch(&self, spec: &LaunchSpec) -> Result<Session, String> {
        Session::launch(self.launcher, spec, &self.leftovers)
            .map_err(|e| format!("cannot launch: {e}"))
    }

    pub fn nothing_left(&self, subreaper: Result<(), String>) -> Check {
        let c = check(
            "nothing_left_behind",
            "1",
            "start no process that outlives the turn (no daemon, no double fork); the sandbox's pid namespace and the direct launcher's cgroup kill them",
        );
        match (self.leftovers.get(), subreaper) {
            (0, Ok(())) => c.pass("no process outlived any launch"),
            (0, Err(e)) => c.pass(format!("none found ({e}: an escaped daemon would not be)")),
            (n, _) => c.fail(format!(
                "{n} process(es) outlived their launch's tree kill (killed by conformance)"
            )),
        }
    }

    /// Launched and initialized with protocol 1.
    pub(super) fn ready(&self, max_bytes: u64, inflight: u32) -> Result<Session, String> {
        let mut s = self.launch(&self.spec)?;
        s.send(&turn::initialize(&[1], max_bytes, inflight))?;
        let answer = await_answer(&mut s, 1, self.handshake)?;
        match answer["result"]["protocolVersion"].as_u64() {
            Some(1) => Ok(s),
            _ => Err(format!("initialize was answered with {}", short(&answer))),
        }
    }

    /// One turn with `payload`; `on_call` answers the plugin's tool calls.
    pub(super) fn turn(
        &self,
        max_bytes: u64,
        payload: Value,
        on_call: &mut dyn FnMut(&mut Session, Option<&Value>),
    ) -> Result<(Session, Transcript), String> {
        let mut s = self.ready(max_bytes, 64)?;
        s.send(&turn::turn_run(payload))?;
        let t = drive(&mut s, self.step, on_call);
        Ok((s, t))
    }

    /// The first launch: silence before `initialize`, the handshake and the
    /// manifest. `None` when the plugin cannot be spoken to at all.
    pub fn handshake(&self) -> (Vec<Check>, bool) {
        let silent = check(
            "silent_before_initialize",
            "1, 4.1",
            "write nothing on stdout before the answer to initialize; log to stderr",
        );
        let hs = check(
            "handshake",
            "4.1",
            "answer initialize within the handshake timeout with protocolVersion 1 and a manifest",
        );
        let mf = check(
            "manifest",
            "4.1",
            "return {id, version, protocolVersion: \"1\"} (and optional metadata) from manifest()",
        );
        let mut s = match self.launch(&self.spec) {
            Ok(s) => s,
            Err(e) => return (vec![hs.fail(e)], false),
        };
        let silent = silent_before_initialize(&mut s, silent);
        let started = Instant::now();
        let answer = s
            .send(&turn::initialize(&[1], DEFAULT_MAX, 8))
            .and_then(|()| await_answer(&mut s, 1, self.handshake));
        let answer = match answer {
            Ok(a) => a,
            Err(e) => return (vec![silent, hs.fail(e), mf.fail("no manifest")], false),
        };
        let parsed = serde_json::from_value::<InitializeResult>(answer["result"].clone());
        match parsed {
            Ok(r) if r.protocol_version == 1 => {
                let ms = started.elapsed().as_millis();
                let level = s
                    .sandbox_report
                    .as_ref()
                    .and_then(|r| r.get("level").cloned());
                let hs = hs.pass(format!(
                    "answered in {ms} ms with protocol 1 (sdk {}; sandbox level {})",
                    r.sdk.as_deref().unwrap_or("not stated"),
                    level.map_or("unknown".into(), |l| l.to_string())
                ));
                let m = &r.manifest;
                let mf = mf.pass(format!(
                    "{} {} (seat it with exactly these values, docs/PLUGINS.md)",
                    m.id.as_str(),
                    m.version.as_str()
                ));
                (vec![silent, hs, mf], true)
            }
            Ok(r) => (
                vec![
                    silent,
                    hs.fail(format!(
                        "chose protocol {}, which was not offered",
                        r.protocol_version
                    )),
                    mf,
                ],
                false,
            ),
            Err(e) => (
                vec![
                    silent,
                    hs.fail(format!(
                        "the answer is not an InitializeResult: {e}: {}",
                        short(&answer)
                    )),
                    mf.fail("no valid manifest"),
                ],
                false,
            ),
        }
    }

    pub fn versions(&self) -> Vec<Check> {
        let newer = check(
            "version_newer_host",
            "4.1",
            "choose your highest version from protocolVersions; ignore the ones you do not know",
        );
        let newer = newer.verdict(self.launch(&self.spec).and_then(|mut s| {
            s.send(&turn::initialize(&[1, 2], DEFAULT_MAX, 8))?;
            let a = await_answer(&mut s, 1, self.handshake)?;
            match a["result"]["protocolVersion"].as_u64() {
                Some(1) => Ok("offered [1, 2], chose 1".into()),
                _ => Err(format!("offered [1, 2], answered {}", short(&a))),
            }
        }));
        let none = check(
            "version_unsupported",
            "4.1, 6",
            "when no offered version is yours, answer error -32050 with data {kind: \"unsupported_protocol_version\", supported: [1]}",
        );
        let none = none.verdict(self.launch(&self.spec).and_then(|mut s| {
            s.send(&turn::initialize(&[99], DEFAULT_MAX, 8))?;
            let a = await_answer(&mut s, 1, self.handshake)?;
            let e = &a["error"];
            if e["code"] == json!(-32050)
                && e["data"]["kind"] == json!("unsupported_protocol_version")
            {
                Ok("offered [99], answered -32050 unsupported_protocol_version".into())
            } else {
                Err(format!("offered [99], answered {}", short(&a)))
            }
        }));
        vec![newer, none]
    }

    pub fn round_trip(&self) -> Vec<Check> {
        let rt = check(
            "tool_call_round_trip",
            "4.2, 4.3",
            "send host/invokeTool with a strict ToolCall (call.traceId = request.context.traceId) and answer turn/run with a valid outcome",
        );
        let notes = check(
            "emit_annotate",
            "4.4, 5",
            "send host/emit {turnId, event: {type, data}} and host/annotate {turnId, key, value} with a key other than \"\", runtime, __proto__",
        );
        let mut answer = |s: &mut Session, req: Option<&Value>| {
            if let Some(r) = req {
                let _ = s.send(&turn::succeeded(
                    r,
                    r["params"]["call"]["arguments"].clone(),
                ));
            }
        };
        let (_s, t) = match self.turn(DEFAULT_MAX, turn::calls(2, false), &mut answer) {
            Ok(x) => x,
            Err(e) => return vec![rt.fail(e.clone()), notes.fail(e)],
        };
        let rt = match outcome_or_fault(&t) {
            Err(e) => rt.fail(e),
            Ok(_) if t.calls.is_empty() => {
                rt.na("made no tool call for the echo payload {\"calls\": [...]}")
            }
            Ok(o) => rt.pass(format!(
                "{} tool calls, then a {} outcome",
                t.calls.len(),
                kind(&o)
            )),
        };
        let notes = match t.fault() {
            Some(e) => notes.fail(e),
            None if t.emits == 0 && t.annotations.is_empty() => {
                notes.na("sent no host/emit or host/annotate")
            }
            None => notes.pass(format!(
                "{} events and {} annotations, all valid, within the budgets (10,000 burst, 2,000/s)",
                t.emits,
                t.annotations.len()
            )),
        };
        vec![rt, notes]
    }
}
