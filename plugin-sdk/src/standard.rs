//! The standard loop: `create_standard_runtime(driver)` seats one
//! [`AgentTurnDriver`] and runs the bounded loop of envelope.md D.2. The
//! loop asks the driver what to do next, forwards every tool call to the
//! envelope, and stops at its own step ceiling. It reports the seated
//! driver's manifest as its own (`sharedos.standard` for a driver that
//! states none).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::FutureExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sharedos_protocol::{
    JsonObject, ProtocolError, Reason, RuntimeManifest, RuntimeTurnOutcome, RuntimeTurnRequest,
    ToolCall, ToolResult, Version,
};

use crate::host::{RuntimeError, RuntimeHost, RuntimePlugin};
use crate::signal::Signal;

/// What the loop hands the driver.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentTurnInput {
    Start,
    ToolResult(ToolResult),
}

/// What the driver decides (strict, discriminated by `type`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum AgentTurnDecision {
    ToolCall {
        call: ToolCall,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<u64>,
    },
    Complete {
        output: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metadata: Option<JsonObject>,
    },
    Fail {
        error: ProtocolError,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metadata: Option<JsonObject>,
    },
    Escalate {
        reason: Reason,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metadata: Option<JsonObject>,
    },
}

/// How a session ended, told to `close`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionOutcome {
    Succeeded,
    Failed,
    Cancelled,
    Escalated,
    Denied,
}

/// A driver failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    /// The driver produced a decision that does not match the contract.
    #[error("invalid decision: {0}")]
    InvalidDecision(String),
    /// Anything else the driver could not do.
    #[error("{0}")]
    Failed(String),
}

/// One turn's conversation with the seat.
#[async_trait]
pub trait AgentTurnSession: Send {
    /// The hash of what the seat was told, stated once `open` resolved.
    fn prompt_hash(&self) -> Option<String> {
        None
    }
    async fn next(
        &mut self,
        input: AgentTurnInput,
        signal: Signal,
    ) -> Result<AgentTurnDecision, DriverError>;
    /// Told how the turn ended; bounded by the loop's close timeout.
    async fn close(&mut self, _outcome: SessionOutcome) {}
}

/// The model/provider seam: opens a session per turn.
#[async_trait]
pub trait AgentTurnDriver: Send + Sync {
    /// The driver's manifest, reported as the runtime's.
    fn manifest(&self) -> Option<RuntimeManifest> {
        None
    }
    async fn open(
        &self,
        request: &RuntimeTurnRequest,
        signal: Signal,
    ) -> Result<Box<dyn AgentTurnSession>, DriverError>;
}

/// Hears a driver failure (`driver_failed`), with `(execution_id, trace_id)`.
pub type OnDriverError = Arc<dyn Fn(&DriverError, &str, &str) + Send + Sync>;

/// Options of the standard runtime.
#[derive(Clone)]
pub struct StandardRuntimeOptions {
    pub driver: Arc<dyn AgentTurnDriver>,
    /// How long `close` may take (default 1 s); errors and hangs are
    /// swallowed.
    pub close_timeout: Duration,
    pub on_turn_error: Option<OnDriverError>,
}

impl StandardRuntimeOptions {
    pub fn new(driver: Arc<dyn AgentTurnDriver>) -> Self {
        Self {
            driver,
            close_timeout: Duration::from_millis(1000),
            on_turn_error: None,
        }
    }
}

/// The manifest of the loop when the driver states none.
pub fn standard_runtime_manifest() -> RuntimeManifest {
    let mut metadata = JsonObject::new();
    metadata.insert("package".into(), json!("sharedos-plugin-sdk"));
    metadata.insert("executionModel".into(), json!("bounded-driver-loop"));
    RuntimeManifest {
        id: crate::protocol::ident("sharedos.standard"),
        version: crate::protocol::ident(env!("CARGO_PKG_VERSION")),
        protocol_version: Version::V1,
        metadata: Some(metadata),
    }
}

/// The standard runtime: the one way to build the loop.
pub fn create_standard_runtime(options: StandardRuntimeOptions) -> Arc<dyn RuntimePlugin> {
    Arc::new(StandardLoop { options })
}

struct StandardLoop {
    options: StandardRuntimeOptions,
}

/// A driver's decision: the turn ends, or the loop makes a tool call.
enum Next {
    Ended(RuntimeTurnOutcome, SessionOutcome),
    Call(ToolCall, Option<u64>),
}

/// What a decision that ends the turn answers (an escalation also states
/// what was asked); a tool call is handed back with its declared step.
fn settle(host: &Arc<dyn RuntimeHost>, decision: AgentTurnDecision) -> Next {
    match decision {
        AgentTurnDecision::Complete { output, metadata } => Next::Ended(
            RuntimeTurnOutcome::Complete { output, metadata },
            SessionOutcome::Succeeded,
        ),
        AgentTurnDecision::Fail { error, metadata } => Next::Ended(
            RuntimeTurnOutcome::Fail { error, metadata },
            SessionOutcome::Failed,
        ),
        AgentTurnDecision::Escalate { reason, metadata } => {
            let _ = host.annotate(
                "escalationAsked",
                json!({"tool": sharedos_protocol::ESCALATE_TOOL, "reason": reason.as_str()}),
            );
            Next::Ended(
                RuntimeTurnOutcome::Escalate { reason, metadata },
                SessionOutcome::Escalated,
            )
        }
        AgentTurnDecision::ToolCall { call, step } => Next::Call(call, step),
    }
}

fn fail(code: &str, message: &str, retryable: bool) -> RuntimeTurnOutcome {
    RuntimeTurnOutcome::Fail {
        error: ProtocolError::new(code, message, Some(retryable)),
        metadata: None,
    }
}

/// A driver call whose panic (how Rust code throws) is caught by the loop
/// like any other driver failure: `driver_failed`, with the session closed.
async fn guarded<T>(
    call: impl std::future::Future<Output = Result<T, DriverError>>,
) -> Result<T, DriverError> {
    AssertUnwindSafe(call)
        .catch_unwind()
        .await
        .unwrap_or_else(|_| Err(DriverError::Failed("the driver panicked".into())))
}

/// Why the loop stopped without an outcome of its own.
enum Stop {
    Cancelled,
    Driver(DriverError),
    Host(String),
}

impl StandardLoop {
    async fn close(
        &self,
        session: &mut Option<Box<dyn AgentTurnSession>>,
        outcome: SessionOutcome,
    ) {
        if let Some(s) = session.as_mut() {
            // Errors and hangs are swallowed: a close that panics (how Rust
            // code throws) changes nothing about the turn.
            let closing = AssertUnwindSafe(s.close(outcome)).catch_unwind();
            let _ = tokio::time::timeout(self.options.close_timeout, closing).await;
        }
    }

    async fn drive(
        &self,
        request: &RuntimeTurnRequest,
        host: &Arc<dyn RuntimeHost>,
        abort: &Signal,
        session_slot: &mut Option<Box<dyn AgentTurnSession>>,
    ) -> Result<(RuntimeTurnOutcome, SessionOutcome), Stop> {
        let draining = host.draining();
        let opened = tokio::select! {
            biased;
            _ = abort.raised() => return Err(Stop::Cancelled),
            s = guarded(self.options.driver.open(request, abort.clone())) => s.map_err(Stop::Driver)?,
        };
        let session = session_slot.insert(opened);
        if let Some(hash) = session.prompt_hash() {
            let _ = host.annotate("promptHash", Value::String(hash));
        }
        let mut input = AgentTurnInput::Start;
        let max_steps = u64::from(host.limits().max_steps);
        for step in 0..max_steps {
            // Never start a new decision while draining.
            if draining.is_raised() {
                return Err(Stop::Cancelled);
            }
            let decided = tokio::select! {
                biased;
                _ = abort.raised() => return Err(Stop::Cancelled),
                d = guarded(session.next(input, abort.clone())) => d,
            };
            let decision = match decided {
                Ok(d) => d,
                Err(DriverError::InvalidDecision(_)) => {
                    return Ok((
                        fail(
                            "invalid_driver_decision",
                            "The agent turn driver returned an invalid decision.",
                            false,
                        ),
                        SessionOutcome::Failed,
                    ));
                }
                Err(e) => return Err(Stop::Driver(e)),
            };
            let (call, declared) = match settle(host, decision) {
                Next::Ended(outcome, session) => return Ok((outcome, session)),
                Next::Call(call, declared) => (call, declared),
            };
            if declared.is_some_and(|d| d < step) {
                return Ok((
                    fail(
                        "invalid_driver_decision",
                        "The agent turn driver declared a step behind the loop's own position.",
                        false,
                    ),
                    SessionOutcome::Failed,
                ));
            }
            let result = host
                .invoke_tool(call, Some(declared.unwrap_or(step)))
                .await
                .map_err(|e| Stop::Host(e.to_string()))?;
            // A result that arrives while draining ends the loop; the seat
            // is not told.
            if draining.is_raised() {
                return Err(Stop::Cancelled);
            }
            input = AgentTurnInput::ToolResult(result);
        }
        Ok((
            fail(
                "step_limit_exceeded",
                "The agent turn reached its maximum number of steps.",
                false,
            ),
            SessionOutcome::Failed,
        ))
    }
}

#[async_trait]
impl RuntimePlugin for StandardLoop {
    fn manifest(&self) -> RuntimeManifest {
        self.options
            .driver
            .manifest()
            .unwrap_or_else(standard_runtime_manifest)
    }

    async fn run(
        &self,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
    ) -> Result<RuntimeTurnOutcome, RuntimeError> {
        let mut session = None;
        let driven = self.drive(&request, &host, &abort, &mut session).await;
        match driven {
            Ok((outcome, closed)) => {
                self.close(&mut session, closed).await;
                Ok(outcome)
            }
            Err(stop) => {
                if abort.is_raised() || host.draining().is_raised() {
                    self.close(&mut session, SessionOutcome::Cancelled).await;
                    return Err(RuntimeError::Failed("the turn was cancelled".into()));
                }
                self.close(&mut session, SessionOutcome::Failed).await;
                let error = match stop {
                    Stop::Driver(e) => e,
                    Stop::Host(m) => DriverError::Failed(m),
                    Stop::Cancelled => DriverError::Failed("cancelled".into()),
                };
                if let Some(cb) = &self.options.on_turn_error {
                    let exec = request.execution_id.as_str();
                    let trace = request.context.trace_id.as_str();
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        cb(&error, exec, trace)
                    }));
                }
                Ok(fail("driver_failed", "The agent turn driver failed.", true))
            }
        }
    }
}
