//! Errors of the host-side API. Each message says what failed, with which
//! value, and (where the operator can act) what to change.

use std::path::PathBuf;

use crate::report::{MissingLayer, SandboxLevel, SandboxReport};

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("sandbox {what} path {path:?} is unusable: {reason}")]
    BadPath {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("compiling the seccomp filter failed: {0}")]
    Seccomp(String),
    #[error("{op} failed: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("spawning the sandbox helper {helper:?} failed: {source}")]
    SpawnHelper {
        helper: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the sandbox helper failed at {stage}: {message}{}", errno.map(|e| format!(" (errno {e})")).unwrap_or_default())]
    Setup {
        stage: String,
        message: String,
        errno: Option<i32>,
    },
    #[error("the sandbox helper exited before sending a report (exit status: {status})")]
    NoReport { status: String },
    #[error("the sandbox helper sent an unreadable report: {0}")]
    BadReport(String),
    #[error(
        "the sandbox reached level `{achieved}` but this runtime requires `{required}`; missing: {}",
        missing.iter().map(|m| m.to_string()).collect::<Vec<_>>().join("; ")
    )]
    BelowMinimum {
        required: SandboxLevel,
        achieved: SandboxLevel,
        missing: Vec<MissingLayer>,
    },
    #[error(
        "this runtime's policy requires the sandbox's whole tree to be bounded in memory \
         (sandbox.requireMemoryBound) but nothing bounds it here; unbounded: {}; fix: {}, or set \
         sandbox.requireMemoryBound = false", unbounded.join(", "), crate::memory::FIX
    )]
    MemoryUnbounded { unbounded: Vec<String> },
    #[error(transparent)]
    Uid(#[from] UidError),
    #[error(
        "this runtime's policy requires a uid of its own per sandbox (sandbox.uids.required) \
         but {0}; fix: run the host as root, or set sandbox.uids.required = false"
    )]
    NoOwnUid(String),
    #[error(
        "program {program:?} does not match the runtime's content pin: its sha256 is {actual}, \
         the pin (sha256 of the runtime entry) is {expected}; fix: restore the pinned file, or \
         set sha256 to the output of `sha256sum` on the file you mean to run"
    )]
    PinMismatch {
        program: PathBuf,
        expected: crate::pin::ProgramDigest,
        actual: crate::pin::ProgramDigest,
    },
    #[error("the sandbox helper did not finish its setup within {0:?}")]
    Timeout(std::time::Duration),
}

impl SandboxError {
    pub(crate) fn io(op: &'static str) -> impl FnOnce(std::io::Error) -> SandboxError {
        move |source| SandboxError::Io { op, source }
    }
}

/// Why no uid could be given, or why the range is unusable.
#[derive(Debug, thiserror::Error)]
pub enum UidError {
    #[error(
        "sandbox uid range {first}..{end} is unusable: {reason}; \
         fix: set sandbox.uids.first/count in host.toml to a range no account or host id uses"
    )]
    BadRange {
        first: u32,
        end: u64,
        reason: String,
    },
    #[error("every uid of the sandbox range {first}..{end} is held by a live sandbox")]
    Exhausted { first: u32, end: u64 },
    #[error("the host state directory {path:?} is unusable: {reason}")]
    StateDir { path: PathBuf, reason: String },
    #[error("{op} {path:?}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl SandboxReport {
    /// Fail closed when the report is below `min`: the error names every
    /// missing layer and the operator's fix.
    pub fn require(&self, min: SandboxLevel) -> Result<(), SandboxError> {
        if self.level >= min {
            return Ok(());
        }
        Err(SandboxError::BelowMinimum {
            required: min,
            achieved: self.level,
            missing: self.missing.clone(),
        })
    }

    /// Fail closed when `required` and the tree's memory is not bounded
    /// as a whole: the error names the unbounded kinds and the fix.
    pub fn require_memory_bound(&self, required: bool) -> Result<(), SandboxError> {
        if !required || self.memory.tree_bound_bytes.is_some() {
            return Ok(());
        }
        Err(SandboxError::MemoryUnbounded {
            unbounded: self.memory.unbounded.clone(),
        })
    }
}
