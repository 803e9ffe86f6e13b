//! What a peer reports when the other end breaks the protocol: a fatal
//! [`Violation`] (typed reason, detail, escaped sample) and the names of
//! the counted, non-fatal ones (protocol.md B.6).

use std::fmt;

use sharedos_protocol::codec::escaped_sample;

/// Bytes of a hostile line kept (escaped) in a violation.
pub const SAMPLE_BYTES: usize = 200;

/// Counted (non-fatal) semantic violations, by reason.
pub const UNKNOWN_RESPONSE_ID: &str = "unknown_response_id";
pub const UNKNOWN_NOTIFICATION: &str = "unknown_notification";
pub const UNKNOWN_METHOD: &str = "method_not_found";
pub const EMPTY_LINE: &str = "empty_line";
/// A request method sent without an id (as a notification): never served.
pub const REQUEST_WITHOUT_ID: &str = "request_without_id";

/// Violation reasons (protocol.md B.6). Never sent on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViolationReason {
    FrameTooLarge,
    InvalidUtf8,
    InvalidJson,
    InvalidEnvelope,
    BatchNotSupported,
    DuplicateInflightId,
    RateLimitExceeded,
    WriteStall,
    ViolationBudgetExceeded,
    /// A line before the answer to `initialize`.
    StdoutBeforeHandshake,
    /// EOF on the other end's output, or the process exited.
    PluginExited,
    Io,
}

impl ViolationReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ViolationReason::FrameTooLarge => "frame_too_large",
            ViolationReason::InvalidUtf8 => "invalid_utf8",
            ViolationReason::InvalidJson => "invalid_json",
            ViolationReason::InvalidEnvelope => "invalid_envelope",
            ViolationReason::BatchNotSupported => "batch_not_supported",
            ViolationReason::DuplicateInflightId => "duplicate_inflight_id",
            ViolationReason::RateLimitExceeded => "rate_limit_exceeded",
            ViolationReason::WriteStall => "write_stall",
            ViolationReason::ViolationBudgetExceeded => "violation_budget_exceeded",
            ViolationReason::StdoutBeforeHandshake => "stdout_before_handshake",
            ViolationReason::PluginExited => "plugin_exited",
            ViolationReason::Io => "io",
        }
    }
}

/// A fatal violation: the reason, what happened, and an escaped sample of
/// the offending bytes (at most [`SAMPLE_BYTES`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub reason: ViolationReason,
    pub detail: String,
    pub sample: String,
}

impl Violation {
    pub fn new(reason: ViolationReason, detail: impl Into<String>) -> Self {
        Self {
            reason,
            detail: detail.into(),
            sample: String::new(),
        }
    }
    pub(crate) fn with_sample(mut self, bytes: &[u8]) -> Self {
        self.sample = escaped_sample(bytes, SAMPLE_BYTES);
        self
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason.as_str(), self.detail)?;
        if !self.sample.is_empty() {
            write!(f, " (sample: {})", self.sample)?;
        }
        Ok(())
    }
}

impl std::error::Error for Violation {}
