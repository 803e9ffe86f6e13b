//! Test doubles for the envelope: fixtures, the scripted kernel
//! (`kernel.rs`, implementing `TurnKernel`) and the harness; the plugin is
//! the shared scriptable test plugin
//! (`sharedos_testplugin::ScriptPlugin`), or a closure where a script
//! cannot say it.
//!
//! Every test runs on tokio's paused clock; times below are virtual
//! milliseconds since the kernel was built (which is the turn's start in
//! every test).

#![allow(dead_code)]

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use sharedos_host::executor::{
    ExecuteOptions, Executor, ExecutorOptions, Seat, TurnError, TurnIds,
};
use sharedos_plugin_sdk::{RuntimeError, RuntimeHost, RuntimePlugin, Signal};
use sharedos_protocol::{
    Address, ExecutionRequest, ExecutionResult, Identifier, RuntimeManifest, RuntimeTurnOutcome,
    RuntimeTurnRequest, Timestamp, ToolCall, ToolDefinition,
};
use tokio::time::Instant;

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

mod kernel;

pub use kernel::*;

// ---------------------------------------------------------------- fixtures

pub const EXEC_ID: &str = "exec-1";
pub const TRACE: &str = "trace-1";
pub const AGENT: &str = "agent-alice";
pub const BASE_TIME: &str = "2026-09-18T10:00:00Z";

pub fn tool_def(name: &str, namespace: &str, rw: &str, idempotent: Option<bool>) -> ToolDefinition {
    let mut v = json!({
        "name": name,
        "description": format!("kernel description of {name}"),
        "namespace": namespace,
        "source": "test-kernel",
        "readWrite": rw,
        "inputSchema": {"type": "object"},
        "requiredCapability": {"resource": {"namespace": namespace, "path": ["p"]}, "action": if rw == "read" { "read" } else { "write" }},
    });
    if let Some(i) = idempotent {
        v["annotations"] = json!({"idempotent": i});
    }
    serde_json::from_value(v).expect("tool definition")
}

pub fn read_tool(name: &str) -> ToolDefinition {
    tool_def(name, "files", "read", None)
}
pub fn write_tool(name: &str) -> ToolDefinition {
    tool_def(name, "bank", "write", None)
}
pub fn idempotent_write(name: &str) -> ToolDefinition {
    tool_def(name, "bank", "write", Some(true))
}
pub fn escalate_tool() -> ToolDefinition {
    tool_def("sharedos.escalate", "sharedos", "write", None)
}

/// A valid request as JSON; `tools` names the given tools with a caller's
/// own (different) description.
pub fn request_json(tools: &[&str]) -> Value {
    let tools: Vec<Value> = tools
        .iter()
        .map(|n| {
            let mut v = serde_json::to_value(read_tool(n)).unwrap();
            v["description"] = json!("caller-supplied description");
            v
        })
        .collect();
    json!({
        "version": "1",
        "executionId": EXEC_ID,
        "agent": {"kind": "agent", "agentId": AGENT},
        "context": {
            "namespaceId": "ns-1",
            "actor": {"kind": "agent", "agentId": AGENT},
            "authority": {"kind": "human", "userId": "issuer"},
            "owner": {"kind": "human", "userId": "owner-1"},
            "purpose": "help the owner",
            "traceId": TRACE,
            "enabledToolNamespaces": ["files", "bank", "sharedos"],
            "now": BASE_TIME
        },
        "message": {
            "version": "1",
            "id": "msg-1",
            "sender": {"kind": "human", "userId": "someone"},
            "receiver": {"kind": "agent", "agentId": AGENT},
            "purpose": "help the owner",
            "payload": {"text": "hello"},
            "traceId": TRACE,
            "createdAt": BASE_TIME
        },
        "tools": tools
    })
}

pub fn request(tools: &[&str]) -> ExecutionRequest {
    serde_json::from_value(request_json(tools)).expect("request")
}

pub fn request_with(tools: &[&str], f: impl FnOnce(&mut Value)) -> ExecutionRequest {
    let mut v = request_json(tools);
    f(&mut v);
    serde_json::from_value(v).expect("request")
}

pub fn owner() -> Address {
    Address::human("owner-1").unwrap()
}

pub fn call(id: &str, tool: &str) -> ToolCall {
    ToolCall {
        id: Identifier::new(id).unwrap(),
        tool: Identifier::new(tool).unwrap(),
        arguments: Default::default(),
        trace_id: Identifier::new(TRACE).unwrap(),
        requested_at: Timestamp::parse(BASE_TIME).unwrap(),
    }
}

pub fn manifest() -> RuntimeManifest {
    sharedos_testplugin::manifest()
}

/// The provenance the envelope must write under `metadata.runtime`.
pub fn expected_runtime() -> Value {
    json!({"id": "sharedos-testplugin", "version": "0.1.0", "protocolVersion": "1", "metadata": {"package": "sharedos-testplugin"}})
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A clock that reads tokio's (paused) virtual time.
pub fn virtual_clock() -> sharedos_host::executor::Clock {
    let base = Instant::now();
    let t0 = Timestamp::parse(BASE_TIME).unwrap().to_offset();
    Arc::new(move || Timestamp::from_offset(t0 + base.elapsed()))
}

// ---------------------------------------------------------------- plugins

// The scripted plugin is the shared test plugin (plugins/testplugin): the
// same steps run from its binary over the protocol.
#[allow(unused_imports)] // each test file uses its part
pub use sharedos_testplugin::{PluginLog, ScriptPlugin, Step};

/// A plugin written as a closure, for shapes a script does not cover and
/// that only exist in process: concurrent calls from one turn, a call
/// future dropped half way, a host kept and used from another task, a
/// forged `ToolCall` (wrong trace, ids the script's constructors refuse).
pub struct FnPlugin<F>(pub F);

#[async_trait]
impl<F, Fut> RuntimePlugin for FnPlugin<F>
where
    F: Fn(RuntimeTurnRequest, Arc<dyn RuntimeHost>, Signal) -> Fut + Send + Sync,
    Fut: Future<Output = Result<RuntimeTurnOutcome, RuntimeError>> + Send + 'static,
{
    fn manifest(&self) -> RuntimeManifest {
        manifest()
    }
    async fn run(
        &self,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
    ) -> Result<RuntimeTurnOutcome, RuntimeError> {
        (self.0)(request, host, abort).await
    }
}

// ---------------------------------------------------------------- harness

/// What `on_turn_error` heard.
pub type TurnErrors = Arc<Mutex<Vec<(TurnError, TurnIds)>>>;

pub struct Harness {
    pub executor: Executor,
    pub turn_errors: TurnErrors,
}

pub fn options(grace_ms: u64) -> (ExecutorOptions, TurnErrors) {
    let errors: TurnErrors = Arc::new(Mutex::new(Vec::new()));
    let sink = errors.clone();
    let opts = ExecutorOptions {
        clock: virtual_clock(),
        drain_grace_ms: grace_ms,
        on_turn_error: Some(Arc::new(move |e: &TurnError, ids: &TurnIds| {
            lock(&sink).push((e.clone(), ids.clone()))
        })),
        ..ExecutorOptions::default()
    };
    (opts, errors)
}

pub fn executor(
    kernel: &Arc<TestKernel>,
    plugin: Arc<dyn RuntimePlugin>,
    grace_ms: u64,
) -> Harness {
    let (opts, turn_errors) = options(grace_ms);
    executor_with(kernel, plugin, opts, turn_errors)
}

pub fn executor_with(
    kernel: &Arc<TestKernel>,
    plugin: Arc<dyn RuntimePlugin>,
    opts: ExecutorOptions,
    turn_errors: TurnErrors,
) -> Harness {
    let executor = Executor::new(kernel.clone(), Seat::in_process(plugin), opts).expect("executor");
    Harness {
        executor,
        turn_errors,
    }
}

impl Harness {
    pub async fn run(&self, request: ExecutionRequest) -> ExecutionResult {
        self.executor
            .execute(request, ExecuteOptions::default())
            .await
            .expect("a result")
    }
    pub fn turn_errors(&self) -> Vec<(TurnError, TurnIds)> {
        lock(&self.turn_errors).clone()
    }
}

/// Runs a turn and returns the result with the virtual time it took.
pub async fn timed(h: &Harness, request: ExecutionRequest) -> (ExecutionResult, u64) {
    let start = Instant::now();
    let r = h.run(request).await;
    (r, start.elapsed().as_millis() as u64)
}

pub fn types(r: &ExecutionResult) -> Vec<String> {
    r.events.iter().map(|e| e.kind.to_string()).collect()
}

pub fn last_event(r: &ExecutionResult) -> (String, Value) {
    let e = r.events.last().expect("an event");
    (e.kind.to_string(), e.data.clone().into_value())
}

pub fn events_of<'a>(r: &'a ExecutionResult, kind: &str) -> Vec<&'a Value> {
    r.events
        .iter()
        .filter(|e| e.kind == kind)
        .map(|e| &*e.data)
        .collect()
}

pub fn code(r: &ExecutionResult) -> &str {
    r.code().unwrap_or("")
}

/// Lets every spawned task that can run, run (no virtual time passes).
pub async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// The number of tasks still alive on the runtime (timers are tasks here).
pub fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}
