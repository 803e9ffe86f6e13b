//! The standard loop's test doubles: a recording `RuntimeHost`, a
//! scripted driver and its sessions, and the run of one turn with them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use sharedos_plugin_sdk::protocol::{
    Identifier, RuntimeLimits, RuntimeManifest, RuntimeTurnOutcome, RuntimeTurnRequest, Timestamp,
    ToolCall, ToolResult,
};
use sharedos_plugin_sdk::{
    AgentTurnDecision, AgentTurnDriver, AgentTurnInput, AgentTurnSession, DriverError,
    HostCallError, RuntimeError, RuntimeEvent, RuntimeHost, SessionOutcome, Signal, SignalSource,
    StandardRuntimeOptions, create_standard_runtime,
};

pub const NOW: &str = "2026-09-18T10:00:00Z";
pub const HASH: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn request() -> RuntimeTurnRequest {
    serde_json::from_value(json!({
        "version": "1",
        "executionId": "exec-1",
        "agent": {"kind": "agent", "agentId": "agent-alice"},
        "context": {
            "actor": {"kind": "agent", "agentId": "agent-alice"},
            "owner": {"kind": "human", "userId": "owner-1"},
            "namespaceId": "ns-1",
            "purpose": "help the owner",
            "traceId": "trace-1",
            "now": NOW,
            "reach": {"status": "computed", "reach": []}
        },
        "message": {
            "version": "1",
            "id": "msg-1",
            "sender": {"kind": "human", "userId": "someone"},
            "receiver": {"kind": "agent", "agentId": "agent-alice"},
            "purpose": "help the owner",
            "payload": {"text": "hello"},
            "traceId": "trace-1",
            "createdAt": NOW
        },
        "tools": []
    }))
    .expect("request")
}

pub fn call(id: &str, tool: &str) -> ToolCall {
    ToolCall {
        id: Identifier::new(id).unwrap(),
        tool: Identifier::new(tool).unwrap(),
        arguments: Default::default(),
        trace_id: Identifier::new("trace-1").unwrap(),
        requested_at: Timestamp::parse(NOW).unwrap(),
    }
}

pub fn tool_call(id: &str, step: Option<u64>) -> AgentTurnDecision {
    AgentTurnDecision::ToolCall {
        call: call(id, "files.read"),
        step,
    }
}

pub fn complete(v: Value) -> AgentTurnDecision {
    AgentTurnDecision::Complete {
        output: v,
        metadata: None,
    }
}

/// One shared timeline: what the driver and the host were asked, in order.
pub type Timeline = Arc<Mutex<Vec<String>>>;

// ------------------------------------------------------------ host double

/// How the host double answers a call.
#[derive(Clone, Copy)]
pub enum Answer {
    Succeed,
    Deny,
    /// Raises `draining` while the call is "with the kernel", then succeeds:
    /// a result that lands during the drain.
    SucceedIntoDrain,
    /// Rejects, as a call after close does.
    Reject,
}

pub struct RecHost {
    pub limits: RuntimeLimits,
    pub timeline: Timeline,
    pub draining: SignalSource,
    pub answer: Answer,
    pub annotations: Mutex<Vec<(String, Value)>>,
    pub calls: Mutex<Vec<(String, Option<u64>)>>,
}

impl RecHost {
    pub fn new(max_steps: u32, answer: Answer, timeline: &Timeline) -> Arc<Self> {
        Arc::new(Self {
            limits: RuntimeLimits {
                max_steps,
                max_tool_calls: 100,
                timeout_ms: 120_000,
                drain_grace_ms: None,
                drain_at_ms: None,
            },
            timeline: timeline.clone(),
            draining: SignalSource::new(),
            answer,
            annotations: Mutex::new(Vec::new()),
            calls: Mutex::new(Vec::new()),
        })
    }
    pub fn annotation(&self, key: &str) -> Option<Value> {
        lock(&self.annotations)
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }
    pub fn calls(&self) -> Vec<(String, Option<u64>)> {
        lock(&self.calls).clone()
    }
}

#[async_trait]
impl RuntimeHost for RecHost {
    fn limits(&self) -> RuntimeLimits {
        self.limits
    }
    async fn invoke_tool(
        &self,
        call: ToolCall,
        step: Option<u64>,
    ) -> Result<ToolResult, HostCallError> {
        lock(&self.timeline).push(format!("invoke:{}@{:?}", call.id.as_str(), step));
        lock(&self.calls).push((call.id.to_string(), step));
        let at = Timestamp::parse(NOW).unwrap();
        match self.answer {
            Answer::Succeed => Ok(ToolResult::succeeded(&call, json!({"ok": true}), at)),
            Answer::Deny => Ok(ToolResult::denied(
                &call,
                "no_matching_grant",
                "The access context does not grant this tool capability",
                at,
            )),
            Answer::SucceedIntoDrain => {
                tokio::time::sleep(ms(10)).await;
                self.draining.raise();
                Ok(ToolResult::succeeded(&call, json!({"late": true}), at))
            }
            Answer::Reject => Err(HostCallError::closed()),
        }
    }
    fn emit(&self, _: RuntimeEvent) -> Result<(), HostCallError> {
        Ok(())
    }
    fn annotate(&self, key: &str, value: Value) -> Result<(), HostCallError> {
        lock(&self.timeline).push(format!("annotate:{key}"));
        lock(&self.annotations).push((key.to_owned(), value));
        Ok(())
    }
    fn draining(&self) -> Signal {
        self.draining.signal()
    }
}

// ---------------------------------------------------------- driver double

/// One answer of the scripted session's `next`.
pub enum Next {
    Decide(AgentTurnDecision),
    /// Waits this long (virtual ms), then decides.
    After(u64, AgentTurnDecision),
    Error(DriverError),
    /// Panics: how Rust code throws.
    Panic,
    /// Never answers.
    Hang,
}

#[derive(Default)]
pub struct DriverLog {
    pub inputs: Mutex<Vec<AgentTurnInput>>,
    pub closed: Mutex<Vec<SessionOutcome>>,
    pub opens: Mutex<usize>,
}

pub struct ScriptDriver {
    pub manifest: Option<RuntimeManifest>,
    pub prompt_hash: Option<String>,
    /// `open` waits this long first; `u64::MAX` never answers.
    pub open_ms: u64,
    pub open_error: Option<DriverError>,
    pub close_hangs: bool,
    pub close_panics: bool,
    pub script: Mutex<Option<VecDeque<Next>>>,
    pub log: Arc<DriverLog>,
    pub timeline: Timeline,
}

impl ScriptDriver {
    pub fn new(script: Vec<Next>, timeline: &Timeline) -> Self {
        Self {
            manifest: None,
            prompt_hash: Some(HASH.to_owned()),
            open_ms: 0,
            open_error: None,
            close_hangs: false,
            close_panics: false,
            script: Mutex::new(Some(script.into())),
            log: Arc::new(DriverLog::default()),
            timeline: timeline.clone(),
        }
    }
}

pub struct ScriptSession {
    pub prompt_hash: Option<String>,
    pub script: VecDeque<Next>,
    pub close_hangs: bool,
    pub close_panics: bool,
    pub log: Arc<DriverLog>,
    pub timeline: Timeline,
}

#[async_trait]
impl AgentTurnSession for ScriptSession {
    fn prompt_hash(&self) -> Option<String> {
        self.prompt_hash.clone()
    }
    async fn next(
        &mut self,
        input: AgentTurnInput,
        _signal: Signal,
    ) -> Result<AgentTurnDecision, DriverError> {
        lock(&self.timeline).push(format!(
            "next:{}",
            match &input {
                AgentTurnInput::Start => "start".to_owned(),
                AgentTurnInput::ToolResult(r) => r.status().as_str().to_owned(),
            }
        ));
        lock(&self.log.inputs).push(input);
        match self.script.pop_front() {
            Some(Next::Decide(d)) => Ok(d),
            Some(Next::After(n, d)) => {
                tokio::time::sleep(ms(n)).await;
                Ok(d)
            }
            Some(Next::Error(e)) => Err(e),
            Some(Next::Panic) => panic!("the driver panicked at /srv/driver.rs:12"),
            Some(Next::Hang) | None => std::future::pending().await,
        }
    }
    async fn close(&mut self, outcome: SessionOutcome) {
        lock(&self.log.closed).push(outcome);
        if self.close_panics {
            panic!("close failed");
        }
        if self.close_hangs {
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait]
impl AgentTurnDriver for ScriptDriver {
    fn manifest(&self) -> Option<RuntimeManifest> {
        self.manifest.clone()
    }
    async fn open(
        &self,
        _request: &RuntimeTurnRequest,
        _signal: Signal,
    ) -> Result<Box<dyn AgentTurnSession>, DriverError> {
        *lock(&self.log.opens) += 1;
        lock(&self.timeline).push("open".into());
        if self.open_ms == u64::MAX {
            std::future::pending::<()>().await;
        }
        if self.open_ms > 0 {
            tokio::time::sleep(ms(self.open_ms)).await;
        }
        if let Some(e) = self.open_error.clone() {
            return Err(e);
        }
        Ok(Box::new(ScriptSession {
            prompt_hash: self.prompt_hash.clone(),
            script: lock(&self.script).take().unwrap_or_default(),
            close_hangs: self.close_hangs,
            close_panics: self.close_panics,
            log: self.log.clone(),
            timeline: self.timeline.clone(),
        }))
    }
}

// --------------------------------------------------------------- running

pub type DriverErrors = Arc<Mutex<Vec<(String, String, String)>>>;

pub struct Run {
    pub outcome: Result<RuntimeTurnOutcome, RuntimeError>,
    pub log: Arc<DriverLog>,
    pub errors: DriverErrors,
}

impl Run {
    pub fn inputs(&self) -> Vec<AgentTurnInput> {
        lock(&self.log.inputs).clone()
    }
    pub fn closed(&self) -> Vec<SessionOutcome> {
        lock(&self.log.closed).clone()
    }
    pub fn failed(&self) -> (String, Option<bool>) {
        match &self.outcome {
            Ok(RuntimeTurnOutcome::Fail { error, .. }) => (error.code.to_string(), error.retryable),
            other => panic!("expected a fail outcome, got {other:?}"),
        }
    }
}

pub fn options(driver: ScriptDriver) -> (StandardRuntimeOptions, Arc<DriverLog>, DriverErrors) {
    let log = driver.log.clone();
    let errors: DriverErrors = Arc::new(Mutex::new(Vec::new()));
    let sink = errors.clone();
    let mut o = StandardRuntimeOptions::new(Arc::new(driver));
    o.on_turn_error = Some(Arc::new(move |e: &DriverError, exec: &str, trace: &str| {
        lock(&sink).push((e.to_string(), exec.to_owned(), trace.to_owned()))
    }));
    (o, log, errors)
}

pub async fn run_with(driver: ScriptDriver, host: &Arc<RecHost>, abort: Signal) -> Run {
    let (o, log, errors) = options(driver);
    let plugin = create_standard_runtime(o);
    let host: Arc<dyn RuntimeHost> = host.clone();
    let outcome = plugin.run(request(), host, abort).await;
    Run {
        outcome,
        log,
        errors,
    }
}

pub async fn run(driver: ScriptDriver, host: &Arc<RecHost>) -> Run {
    run_with(driver, host, Signal::never()).await
}
