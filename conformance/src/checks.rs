//! The battery: each check launches the plugin afresh (one process per
//! turn, as the host does), drives one situation, and says which section
//! of docs/PROTOCOL.md it enforces and what to fix.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;
use sharedos_protocol::{InitializeResult, RuntimeManifest};

use super::session::{Recv, Session};
use super::turn::{self, await_answer, short};
use sharedos_host::process::{LaunchSpec, Launcher};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pass,
    Fail,
    /// The plugin does not follow the echo payload, so the situation could
    /// not be produced (docs/PLUGINS.md).
    NotApplicable,
    /// A check it depends on failed (`blocked_by`), so it was not run.
    NotRun,
}

/// One check of the report; its JSON shape is documented in
/// docs/PLUGINS.md ("The JSON report") and pinned by a test.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub id: &'static str,
    /// The section of docs/PROTOCOL.md the check enforces.
    pub section: &'static str,
    pub status: Status,
    pub detail: String,
    /// Why it did not pass: what went wrong (`fail`), or "not run because
    /// <check> failed" (`not_run`); `None` otherwise.
    pub cause: Option<String>,
    /// The failed check this one depends on (`not_run` only).
    pub blocked_by: Option<&'static str>,
    /// What the check asks of the plugin: what to change when it failed.
    pub fix: &'static str,
    /// The plugin's last stderr lines (whole, escaped) of a failed check.
    pub stderr: Vec<String>,
}

/// What the battery needs to launch the plugin.
pub struct Battery<'a> {
    pub launcher: &'a dyn Launcher,
    pub spec: LaunchSpec,
    pub handshake: Duration,
    pub step: Duration,
    /// Processes found alive after a launch's tree was killed.
    pub leftovers: std::rc::Rc<std::cell::Cell<usize>>,
    /// The stderr lines of the last launch that ended.
    pub last_stderr: std::rc::Rc<std::cell::RefCell<Vec<String>>>,
}

/// The protocol's default frame limit, as the battery offers it.
pub(super) const DEFAULT_MAX: u64 = sharedos_protocol::DEFAULT_MAX_MESSAGE_BYTES as u64;

pub(super) fn check(id: &'static str, section: &'static str, fix: &'static str) -> Check {
    Check {
        id,
        section,
        status: Status::Pass,
        detail: String::new(),
        cause: None,
        blocked_by: None,
        fix,
        stderr: Vec::new(),
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
        self.cause = Some(self.detail.clone());
        self
    }
    /// Not run: `blocker` (a check it depends on) failed.
    pub(super) fn not_run(mut self, blocker: &'static str) -> Self {
        self.status = Status::NotRun;
        self.detail = format!("not run because {blocker} failed");
        self.cause = Some(self.detail.clone());
        self.blocked_by = Some(blocker);
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

/// The checks of the first launch, in their order.
fn handshake_checks() -> [Check; 4] {
    let starts = check(
        "starts",
        "1",
        "the program must start and keep reading stdin until initialize: fix what its stderr names (a missing module or file, a path the sandbox does not bind: --ro)",
    );
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
    [starts, silent, hs, mf]
}

/// Why a launch that ended before answering `initialize` ended: its exit
/// status (code or signal); its stderr goes with the failure.
fn ended_early(s: &mut Session) -> String {
    match s.wait_exit(Duration::from_secs(2)) {
        Some(st) => format!("the program ended before answering initialize ({st})"),
        None => "the program closed its stdout before answering initialize".into(),
    }
}

/// `silent_before_initialize`: nothing on the plugin's stdout in the
/// 300 ms before `initialize` is sent. `Err` when the program already
/// ended (the `starts` check fails instead).
fn silent_before_initialize(s: &mut Session, silent: Check) -> Result<Check, String> {
    Ok(match s.recv(Duration::from_millis(300)) {
        Recv::Timeout => silent.pass("nothing on stdout in the 300 ms before initialize"),
        Recv::Message(v) => silent.fail(format!("wrote {} before initialize", short(&v))),
        Recv::Invalid(why) => silent.fail(format!("wrote {why} before initialize")),
        Recv::Eof => return Err(ended_early(s)),
    })
}

impl Battery<'_> {
    pub(super) fn launch(&self, spec: &LaunchSpec) -> Result<Session, String> {
        Session::launch(self.launcher, spec, &self.leftovers, &self.last_stderr)
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

    /// The first launch: the program starts, is silent before
    /// `initialize`, answers it with a manifest. Each check after a failed
    /// one is not run; the manifest is returned when all passed.
    pub fn handshake(&self) -> (Vec<Check>, Option<RuntimeManifest>) {
        let [starts, silent, hs, mf] = handshake_checks();
        let blocked = |mut all: Vec<Check>, rest: Vec<Check>| {
            let id = all.last().map_or("starts", |c| c.id);
            all.extend(rest.into_iter().map(|c| c.not_run(id)));
            (all, None)
        };
        let mut s = match self.launch(&self.spec) {
            Ok(s) => s,
            Err(e) => return blocked(vec![starts.fail(e)], vec![silent, hs, mf]),
        };
        let silence = silent_before_initialize(&mut s, silent.clone());
        let silent = match silence {
            Ok(c) if c.status == Status::Fail => {
                return blocked(vec![starts.pass("started"), c], vec![hs, mf]);
            }
            Ok(c) => c,
            Err(e) => return blocked(vec![starts.fail(e)], vec![silent, hs, mf]),
        };
        let started = Instant::now();
        let answer = s
            .send(&turn::initialize(&[1], DEFAULT_MAX, 8))
            .and_then(|()| await_answer(&mut s, 1, self.handshake));
        let answer = match answer {
            Ok(a) => a,
            Err(_) if s.has_ended() => {
                let why = ended_early(&mut s);
                return blocked(vec![starts.fail(why)], vec![silent, hs, mf]);
            }
            Err(e) => {
                return blocked(vec![starts.pass("started"), silent, hs.fail(e)], vec![mf]);
            }
        };
        let starts = starts.pass("started and kept running");
        match serde_json::from_value::<InitializeResult>(answer["result"].clone()) {
            Ok(r) if r.protocol_version == 1 => {
                let level = s
                    .sandbox_report
                    .as_ref()
                    .and_then(|r| r.get("level").cloned());
                let hs = hs.pass(format!(
                    "answered in {} ms with protocol 1 (sdk {}; sandbox level {})",
                    started.elapsed().as_millis(),
                    r.sdk.as_deref().unwrap_or("not stated"),
                    level.map_or("unknown".into(), |l| l.to_string())
                ));
                let m = &r.manifest;
                let mf = mf.pass(format!(
                    "{} {} (seat it with exactly these values, docs/PLUGINS.md)",
                    m.id.as_str(),
                    m.version.as_str()
                ));
                (vec![starts, silent, hs, mf], Some(r.manifest))
            }
            Ok(r) => {
                let why = format!(
                    "chose protocol {}, which was not offered",
                    r.protocol_version
                );
                (
                    vec![starts, silent, hs.fail(why), mf.not_run("handshake")],
                    None,
                )
            }
            Err(e) => {
                let why = format!(
                    "the answer is not an InitializeResult: {e}: {}",
                    short(&answer)
                );
                (
                    vec![starts, silent, hs.fail(why), mf.not_run("handshake")],
                    None,
                )
            }
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
}
