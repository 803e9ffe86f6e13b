//! [`ScriptPlugin`]: a script run in process, as a `RuntimePlugin`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::StreamExt;
use serde_json::{Map, Value, json};
use sharedos_plugin_sdk::{HostCallError, RuntimeError, RuntimeHost, RuntimePlugin, Signal};
use sharedos_protocol::{
    Identifier, RuntimeEvent, RuntimeManifest, RuntimeTurnOutcome, RuntimeTurnRequest, ToolCall,
    ToolResult,
};

use crate::script::{Script, Step, manifest};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What an in-process script saw and got, for the test to assert on.
#[derive(Default)]
pub struct PluginLog {
    /// How many turns it ran.
    pub runs: AtomicUsize,
    /// The last turn's request.
    pub request: Mutex<Option<RuntimeTurnRequest>>,
    /// The host kept by [`Step::CaptureHost`].
    pub host: Mutex<Option<Arc<dyn RuntimeHost>>>,
    /// The last turn's abort signal.
    pub abort: Mutex<Option<Signal>>,
    /// Each call's id and answer, in order.
    pub results: Mutex<Vec<(String, Result<ToolResult, HostCallError>)>>,
}

impl PluginLog {
    /// The answer to call `id`. Panics when there was none: the test's
    /// premise is wrong.
    pub fn result(&self, id: &str) -> Result<ToolResult, HostCallError> {
        lock(&self.results)
            .iter()
            .find(|(i, _)| i == id)
            .map(|(_, r)| r.clone())
            .unwrap_or_else(|| panic!("no answer to call {id}"))
    }
    /// The error code of call `id`'s result, if it was refused or failed.
    pub fn code(&self, id: &str) -> Option<String> {
        self.result(id)
            .ok()
            .and_then(|r| r.error().map(|e| e.code.to_string()))
    }
    pub fn host(&self) -> Arc<dyn RuntimeHost> {
        lock(&self.host)
            .clone()
            .unwrap_or_else(|| panic!("no capture_host step ran"))
    }
    pub fn request(&self) -> RuntimeTurnRequest {
        lock(&self.request)
            .clone()
            .unwrap_or_else(|| panic!("the plugin never ran"))
    }
    pub fn ran(&self) -> bool {
        self.runs.load(Ordering::SeqCst) > 0
    }
}

/// Where a script's steps come from.
enum Source {
    /// Fixed by the test, logged in a [`PluginLog`].
    Fixed(Script, Arc<PluginLog>),
    /// Each turn's `message.payload.script`, as the binary reads it; not
    /// logged (what it reports goes into its outcome), so that measuring
    /// with it costs no more than the turn does.
    Payload,
}

/// A script run in process. The turn completes with the steps' reports
/// (`callNs`, `parallelNs`, `emitNs`, ...) as its output, `null` when none
/// reported, unless a step ended it first.
pub struct ScriptPlugin {
    source: Source,
    manifest: RuntimeManifest,
    many_turns: bool,
}

impl ScriptPlugin {
    /// A plugin running `steps` every turn, and its log.
    pub fn new(steps: Vec<Step>) -> (Arc<Self>, Arc<PluginLog>) {
        let (plugin, log) = Self::fixed(Script(steps));
        (Arc::new(plugin), log)
    }

    /// The same, unshared, for a builder.
    pub fn fixed(script: Script) -> (Self, Arc<PluginLog>) {
        let log = Arc::new(PluginLog::default());
        let plugin = Self {
            source: Source::Fixed(script, log.clone()),
            manifest: manifest(),
            many_turns: false,
        };
        (plugin, log)
    }

    /// A plugin running each turn's payload script; it keeps nothing
    /// between turns, so it accepts many turns per process.
    pub fn from_payload() -> Self {
        Self {
            source: Source::Payload,
            manifest: manifest(),
            many_turns: true,
        }
    }

    /// Reports `manifest` instead of the test plugin's.
    pub fn with_manifest(mut self, manifest: RuntimeManifest) -> Self {
        self.manifest = manifest;
        self
    }
}

#[async_trait]
impl RuntimePlugin for ScriptPlugin {
    fn manifest(&self) -> RuntimeManifest {
        self.manifest.clone()
    }

    fn many_turns(&self) -> bool {
        self.many_turns
    }

    async fn run(
        &self,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
    ) -> Result<RuntimeTurnOutcome, RuntimeError> {
        let payload_script;
        let (script, log) = match &self.source {
            Source::Fixed(script, log) => {
                log.runs.fetch_add(1, Ordering::SeqCst);
                *lock(&log.request) = Some(request.clone());
                *lock(&log.abort) = Some(abort.clone());
                (script, Some(log.as_ref()))
            }
            Source::Payload => {
                payload_script =
                    Script::from_payload(&request.message.payload).map_err(RuntimeError::Failed)?;
                (&payload_script, None)
            }
        };
        let mut run = Run {
            request: &request,
            host: &host,
            abort: &abort,
            log,
            reports: Map::new(),
            next_call: 0,
        };
        for step in &script.0 {
            if let Some(outcome) = run.step(step).await? {
                return Ok(outcome);
            }
        }
        let output = if run.reports.is_empty() {
            Value::Null
        } else {
            Value::Object(run.reports)
        };
        Ok(RuntimeTurnOutcome::complete(output))
    }
}

/// One turn of a script.
struct Run<'a> {
    request: &'a RuntimeTurnRequest,
    host: &'a Arc<dyn RuntimeHost>,
    abort: &'a Signal,
    log: Option<&'a PluginLog>,
    reports: Map<String, Value>,
    next_call: u64,
}

fn failed(e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Failed(e.to_string())
}

impl Run<'_> {
    /// Runs one step; `Some` when it ends the turn.
    async fn step(&mut self, step: &Step) -> Result<Option<RuntimeTurnOutcome>, RuntimeError> {
        match step {
            Step::Call {
                tool,
                arguments,
                id,
                step,
                throw,
            } => {
                self.call(tool, arguments, id.as_deref(), *step, *throw)
                    .await?
            }
            Step::Emit { kind, data } => self.emit(kind, data.clone())?,
            Step::Annotate { key, value } => {
                self.host.annotate(key, value.clone()).map_err(failed)?
            }
            Step::Sleep { ms } => tokio::time::sleep(Duration::from_millis(*ms)).await,
            Step::Stall => std::future::pending::<()>().await,
            Step::WaitDraining => self.host.draining().raised().await,
            Step::ThrowIfDraining if self.host.draining().is_raised() => {
                return Err(failed("the turn is draining"));
            }
            Step::ThrowIfDraining => {}
            Step::Throw { message } => return Err(failed(message)),
            Step::Return { outcome } => return Ok(Some(outcome.clone())),
            Step::CatchAbortAndAnnotate { key, value } => {
                self.abort.raised().await;
                let _ = self.host.annotate(key, value.clone());
                return Err(failed("aborted"));
            }
            Step::CaptureHost => {
                if let Some(log) = self.log {
                    *lock(&log.host) = Some(self.host.clone());
                }
            }
            Step::TimedCalls { tool, n, arguments } => {
                self.timed_calls(tool, *n, arguments).await?
            }
            Step::ParallelCalls {
                tool,
                n,
                inflight,
                arguments,
            } => self.parallel_calls(tool, *n, *inflight, arguments).await?,
            Step::TimedEmits { kind, n } => self.timed_emits(kind, *n)?,
        }
        Ok(None)
    }

    fn tool_call(
        &mut self,
        id: Option<&str>,
        tool: &str,
        arguments: &Value,
    ) -> Result<ToolCall, RuntimeError> {
        let id = match id {
            Some(id) => id.to_owned(),
            None => {
                self.next_call += 1;
                format!("call-{}", self.next_call)
            }
        };
        let arguments = match arguments {
            Value::Null => Map::new(),
            Value::Object(m) => m.clone(),
            other => {
                return Err(failed(format!(
                    "call {id}: arguments must be an object, not {other}"
                )));
            }
        };
        Ok(ToolCall {
            id: Identifier::new(id).map_err(failed)?,
            tool: Identifier::new(tool).map_err(failed)?,
            arguments,
            trace_id: self.request.context.trace_id.clone(),
            requested_at: self.request.context.now.clone(),
        })
    }

    async fn call(
        &mut self,
        tool: &str,
        arguments: &Value,
        id: Option<&str>,
        step: Option<u64>,
        throw: bool,
    ) -> Result<(), RuntimeError> {
        let call = self.tool_call(id, tool, arguments)?;
        let id = call.id.to_string();
        let answer = self.host.invoke_tool(call, step).await;
        if let Some(log) = self.log {
            lock(&log.results).push((id, answer.clone()));
        }
        match answer {
            Err(e) if throw => Err(failed(format!("uncaught: {e}"))),
            _ => Ok(()),
        }
    }

    fn emit(&self, kind: &str, data: Value) -> Result<(), RuntimeError> {
        let kind = Identifier::new(kind).map_err(failed)?;
        self.host.emit(RuntimeEvent { kind, data }).map_err(failed)
    }

    async fn timed_calls(
        &mut self,
        tool: &str,
        n: u64,
        arguments: &Value,
    ) -> Result<(), RuntimeError> {
        let mut samples = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
        for i in 0..n {
            let call = self.tool_call(Some(&format!("c{i}")), tool, arguments)?;
            let t = Instant::now();
            self.host.invoke_tool(call, None).await.map_err(failed)?;
            samples.push(t.elapsed().as_nanos() as u64);
        }
        self.reports.insert("callNs".into(), json!(samples));
        Ok(())
    }

    async fn parallel_calls(
        &mut self,
        tool: &str,
        n: u64,
        inflight: u64,
        arguments: &Value,
    ) -> Result<(), RuntimeError> {
        let calls = (0..n)
            .map(|i| self.tool_call(Some(&format!("p{i}")), tool, arguments))
            .collect::<Result<Vec<_>, _>>()?;
        let t = Instant::now();
        let host = self.host;
        let mut done = futures_util::stream::iter(calls)
            .map(|call| host.invoke_tool(call, None))
            .buffer_unordered(usize::try_from(inflight.max(1)).unwrap_or(1));
        while let Some(answer) = done.next().await {
            answer.map_err(failed)?;
        }
        self.reports
            .insert("parallelNs".into(), json!(t.elapsed().as_nanos() as u64));
        Ok(())
    }

    fn timed_emits(&mut self, kind: &str, n: u64) -> Result<(), RuntimeError> {
        let kind = Identifier::new(kind).map_err(failed)?;
        let t = Instant::now();
        for i in 0..n {
            let event = RuntimeEvent {
                kind: kind.clone(),
                data: json!(i),
            };
            self.host.emit(event).map_err(failed)?;
        }
        self.reports
            .insert("emitNs".into(), json!(t.elapsed().as_nanos() as u64));
        self.reports.insert("emits".into(), json!(n));
        Ok(())
    }
}
