//! The trait pair: [`RuntimePlugin`] (the seat's occupant) and
//! [`RuntimeHost`] (what it is handed).

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use sharedos_protocol::{
    ANNOTATION_KEY_MESSAGE, ErrorKind, RuntimeEvent, RuntimeLimits, RuntimeManifest,
    RuntimeTurnOutcome, RuntimeTurnRequest, ToolCall, ToolResult, annotation_key_refused,
};

use crate::signal::Signal;

/// Why a host call was rejected: the cases where an in-process call throws.
/// Every decision about a tool call, refusals included, is a `ToolResult`
/// instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct HostCallError {
    /// The stable machine contract (`error.data.kind` on the wire).
    pub kind: ErrorKind,
    pub message: String,
}

impl HostCallError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
    /// "Runtime host is closed": a call after close or after the hard abort.
    pub fn closed() -> Self {
        Self::new(ErrorKind::TurnNotActive, "Runtime host is closed")
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidParams, message)
    }
}

/// How a runtime's turn failed without an outcome.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// The plugin threw (in process) or answered `turn/run` with an error.
    #[error("the runtime failed: {0}")]
    Failed(String),
    /// The outcome did not parse as a `RuntimeTurnOutcome`.
    #[error("the runtime's outcome does not match the contract: {0}")]
    InvalidOutcome(String),
    /// The plugin process could not be started or loaded (binary, handshake,
    /// manifest, sandbox).
    #[error("the runtime could not be loaded: {0}")]
    Load(String),
    /// The plugin broke the wire protocol, exited or closed its stdout.
    #[error("the runtime broke the protocol: {0}")]
    Protocol(String),
}

/// The seat's occupant: one agent loop.
#[async_trait]
pub trait RuntimePlugin: Send + Sync {
    /// The runtime's manifest. A standard loop reports its driver's.
    fn manifest(&self) -> RuntimeManifest;

    /// Runs one turn. `abort` is the hard signal; `host.draining()` the soft
    /// one. The returned outcome is checked by the envelope.
    async fn run(
        &self,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
    ) -> Result<RuntimeTurnOutcome, RuntimeError>;

    /// Whether this plugin, served over stdio, may be given several turns
    /// of one session one after the other in one process (it answers
    /// `initialize` with `turns: "many"`; docs/PROTOCOL.md section 4.6).
    /// Say `true` only if `run` keeps nothing of one turn that would break
    /// the next: the host, the signals and the turn id are fresh each
    /// turn. The default, `false`: one process per turn.
    fn many_turns(&self) -> bool {
        false
    }
}

/// What a runtime is handed. Exactly five members; a sixth is a decision
/// for the design, not for a pull request (a test pins the list).
#[async_trait]
pub trait RuntimeHost: Send + Sync {
    /// The turn's bounded step, tool-call and deadline limits.
    fn limits(&self) -> RuntimeLimits;

    /// The one way to have an effect. Refusals are `Ok(ToolResult)` with
    /// status `denied`; `Err` only for a call after close, a malformed
    /// call, an invalid kernel result, an audit outage on its own decision,
    /// or a call cancelled by the abort.
    async fn invoke_tool(
        &self,
        call: ToolCall,
        step: Option<u64>,
    ) -> Result<ToolResult, HostCallError>;

    /// Something that happened at a moment. Rejected after close or abort.
    fn emit(&self, event: RuntimeEvent) -> Result<(), HostCallError>;

    /// A statement about the turn, written on every ending. Rejected only
    /// for a refused key; a write after close is dropped without error.
    fn annotate(&self, key: &str, value: Value) -> Result<(), HostCallError>;

    /// The soft signal: the turn takes nothing new. It tells and cannot be
    /// asked.
    fn draining(&self) -> Signal;
}

/// The local check of an annotation: refused keys are caller bugs.
pub fn check_annotation(key: &str) -> Result<(), HostCallError> {
    if annotation_key_refused(key) {
        return Err(HostCallError::invalid(ANNOTATION_KEY_MESSAGE));
    }
    Ok(())
}

/// A shared plugin is a plugin (so `serve(Arc<dyn RuntimePlugin>)` works).
#[async_trait]
impl<T: RuntimePlugin + ?Sized> RuntimePlugin for Arc<T> {
    fn manifest(&self) -> RuntimeManifest {
        (**self).manifest()
    }
    async fn run(
        &self,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
    ) -> Result<RuntimeTurnOutcome, RuntimeError> {
        (**self).run(request, host, abort).await
    }
    fn many_turns(&self) -> bool {
        (**self).many_turns()
    }
}

#[cfg(test)]
mod tests {
    /// The guard on `RuntimeHost`: exactly five members. Adding a sixth,
    /// required or provided, fails this test; adding a required one also
    /// fails to compile `FiveMembers` below.
    #[test]
    fn runtime_host_has_exactly_five_members() {
        let src = include_str!("host.rs");
        let start = src.find("pub trait RuntimeHost").expect("trait present");
        let body = &src[start..];
        let end = body.find("\n}\n").expect("trait end");
        let members: Vec<&str> = body[..end]
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("fn ") || l.starts_with("async fn "))
            .collect();
        assert_eq!(members.len(), 5, "RuntimeHost members: {members:?}");
        for name in [
            "fn limits",
            "fn invoke_tool",
            "fn emit",
            "fn annotate",
            "fn draining",
        ] {
            assert!(members.iter().any(|m| m.contains(name)), "missing {name}");
        }
    }

    #[allow(dead_code)]
    struct FiveMembers;

    #[async_trait::async_trait]
    impl super::RuntimeHost for FiveMembers {
        fn limits(&self) -> super::RuntimeLimits {
            super::RuntimeLimits {
                max_steps: 1,
                max_tool_calls: 1,
                timeout_ms: 1,
                drain_grace_ms: None,
                drain_at_ms: None,
            }
        }
        async fn invoke_tool(
            &self,
            _: super::ToolCall,
            _: Option<u64>,
        ) -> Result<super::ToolResult, super::HostCallError> {
            Err(super::HostCallError::closed())
        }
        fn emit(&self, _: super::RuntimeEvent) -> Result<(), super::HostCallError> {
            Ok(())
        }
        fn annotate(&self, _: &str, _: serde_json::Value) -> Result<(), super::HostCallError> {
            Ok(())
        }
        fn draining(&self) -> crate::Signal {
            crate::Signal::never()
        }
    }
}
