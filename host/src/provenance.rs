//! What a seated runtime reports of a turn besides its outcome: how the
//! turn was isolated (the sandbox report, `metadata.runtime.sandbox`), for a
//! session turn its affinity (`metadata.runtime.affinity`), for a pinned
//! program the digest its launch checked (`metadata.runtime.programSha256`),
//! for a harness with a pinned CLI that pin (`harnessCliSha256`), the
//! messages its peer dropped and counted (`protocolViolations`),
//! and for a turn that ended without an outcome the seat's diagnosis.
//!
//! The seat hands a [`TurnReport`] back with the run of the turn
//! (`executor::SeatedTurn`) and fills it as it learns each part: the
//! sandbox report at launch, not at the end, because the envelope drops
//! the run of a turn stopped at its deadline and the result still says how
//! that turn was isolated. It belongs to the one turn; nothing is kept by
//! execution id.

use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;

/// A seat's account of a turn that ended without an outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeDiagnosis {
    /// A fixed token of the host's (never the plugin's text):
    /// `invalid_json`, `plugin_exited`, `handshake_timeout`, ...
    pub reason: &'static str,
    /// A retry would fail the same way: the ending is never retryable.
    pub deterministic: bool,
    /// `metadata.runtime.process`: the exit status and the last stderr
    /// lines, escaped and bounded.
    pub process: Value,
}

/// What the turn's program was checked against: the content pin a launch
/// verified (`metadata.runtime.programSha256`, `programPinned: true`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgramProvenance {
    pub sha256: sharedos_sandbox::ProgramDigest,
}

/// How the seat's process ended, once it has: `metadata.runtime.process`
/// (`None` while it runs or is being killed).
pub type ProcessEnd = Arc<dyn Fn() -> Option<Value> + Send + Sync>;

#[derive(Default)]
struct Parts {
    sandbox: Option<Value>,
    affinity: Option<Value>,
    program: Option<ProgramProvenance>,
    cli: Option<sharedos_sandbox::ProgramDigest>,
    diagnosis: Option<RuntimeDiagnosis>,
    process_end: Option<ProcessEnd>,
    /// How long the process may take to exit by itself after an abort
    /// before its kill (`ProcessRuntimeConfig::abort_grace`).
    abort_grace: std::time::Duration,
    violations: std::collections::BTreeMap<String, u32>,
}

impl std::fmt::Debug for Parts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parts")
            .field("sandbox", &self.sandbox)
            .field("affinity", &self.affinity)
            .field("program", &self.program)
            .field("cli", &self.cli)
            .field("diagnosis", &self.diagnosis)
            .field("violations", &self.violations)
            .finish_non_exhaustive()
    }
}

/// One turn's report, shared by the seat that fills it and the envelope
/// that reads it once the run is over (or dropped). An in-process seat's
/// stays empty.
#[derive(Debug, Clone, Default)]
pub struct TurnReport(Arc<Mutex<Parts>>);

impl TurnReport {
    /// A report that says only how the seat isolates its turns so far
    /// (`sandbox`), e.g. that no process was running yet.
    pub fn with_sandbox(sandbox: Value) -> Self {
        let report = Self::default();
        report.set_sandbox(sandbox);
        report
    }

    fn parts(&self) -> MutexGuard<'_, Parts> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The launcher's report: the isolation the turn runs in.
    pub fn set_sandbox(&self, report: Value) {
        self.parts().sandbox = Some(report);
    }

    /// The session affinity of the turn (which process served it).
    pub fn set_affinity(&self, affinity: Value) {
        self.parts().affinity = Some(affinity);
    }

    /// The pin the turn's program was launched under (set only by a
    /// launch that checked it).
    pub fn set_program(&self, program: ProgramProvenance) {
        self.parts().program = Some(program);
    }

    pub fn program(&self) -> Option<ProgramProvenance> {
        self.parts().program
    }

    /// The pin a harness holds its CLI to (`harness.sha256`): the CLI ran
    /// with exactly these bytes, or not at all.
    pub fn set_cli(&self, sha256: sharedos_sandbox::ProgramDigest) {
        self.parts().cli = Some(sha256);
    }

    pub fn cli(&self) -> Option<sharedos_sandbox::ProgramDigest> {
        self.parts().cli
    }

    /// Why the turn ended without an outcome.
    pub fn set_diagnosis(&self, diagnosis: RuntimeDiagnosis) {
        self.parts().diagnosis = Some(diagnosis);
    }

    /// How to learn how the turn's process ended (a process seat sets it
    /// at launch).
    pub fn set_process_end(&self, end: ProcessEnd) {
        self.parts().process_end = Some(end);
    }

    /// The grace the process gets to exit by itself after an abort; a
    /// stopped turn's result waits that much longer for how it ended.
    pub fn set_abort_grace(&self, grace: std::time::Duration) {
        self.parts().abort_grace = grace;
    }

    /// The protocol violations the seat's peer dropped and counted
    /// (`metadata.runtime.protocolViolations`), by name.
    pub fn set_protocol_violations(&self, counted: std::collections::BTreeMap<String, u32>) {
        self.parts().violations = counted;
    }

    /// `metadata.runtime.protocolViolations`: `None` when nothing was
    /// dropped.
    pub fn protocol_violations(&self) -> Option<Value> {
        let parts = self.parts();
        if parts.violations.is_empty() {
            return None;
        }
        Some(Value::Object(
            parts
                .violations
                .iter()
                .map(|(k, v)| (k.clone(), Value::from(*v)))
                .collect(),
        ))
    }

    /// How the turn's process ended, waiting up to `bound` for the host's
    /// kill to finish; `None` for a seat without a process or one still
    /// running at the bound.
    pub async fn process_end_within(&self, bound: std::time::Duration) -> Option<Value> {
        let (end, grace) = {
            let parts = self.parts();
            (parts.process_end.clone()?, parts.abort_grace)
        };
        let until = tokio::time::Instant::now() + bound + grace;
        loop {
            if let Some(v) = end() {
                return Some(v);
            }
            if tokio::time::Instant::now() >= until {
                return None;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    pub fn sandbox(&self) -> Option<Value> {
        self.parts().sandbox.clone()
    }

    pub fn affinity(&self) -> Option<Value> {
        self.parts().affinity.clone()
    }

    pub fn diagnosis(&self) -> Option<RuntimeDiagnosis> {
        self.parts().diagnosis.clone()
    }
}
