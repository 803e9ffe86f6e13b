//! Shared fixtures: contexts, grants, a scriptable tool, failing sinks.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use sharedos_kernel::{
    AuditError, AuditRecord, Capability, ConfigGrantSource, ErrorHook, Grant, HandlerAnswer,
    Kernel, MemoryAuditSink, Scope, ToolError, ToolHandler,
};
use sharedos_protocol::{
    AccessContext, Address, CapabilityRequirement, JsonObject, PathSegment, Purpose, ReadWrite,
    ResourceRef, ShortName, Timestamp, ToolCall, ToolDefinition, ToolResult, ident,
};
use tokio_util::sync::CancellationToken;

pub const NOW: &str = "2026-10-01T12:00:00Z";

pub fn agent(id: &str) -> Address {
    Address::Agent {
        agent_id: ident(id),
    }
}

pub fn host() -> Address {
    Address::Service {
        service_id: ident("host"),
    }
}

pub fn owner() -> Address {
    Address::Human {
        user_id: ident("olivia"),
    }
}

pub fn context(actor: &str) -> AccessContext {
    AccessContext {
        namespace_id: ident("tenant-1"),
        actor: agent(actor),
        authority: host(),
        owner: owner(),
        purpose: Purpose::new("testing").unwrap(),
        trace_id: ident("trace-1"),
        enabled_tool_namespaces: vec![ident("files"), ident("sharedos"), ident("test")],
        now: Timestamp::parse(NOW).unwrap(),
    }
}

pub fn at(ctx: &AccessContext, now: &str) -> AccessContext {
    AccessContext {
        now: Timestamp::parse(now).unwrap(),
        ..ctx.clone()
    }
}

pub fn segs(path: &[&str]) -> Vec<PathSegment> {
    path.iter().map(|s| PathSegment::new(s).unwrap()).collect()
}

pub fn cap(namespace: &str, path: &[&str], scope: Scope, actions: &[&str]) -> Capability {
    Capability {
        namespace: ident(namespace),
        path: segs(path),
        owner: None,
        scope,
        actions: actions.iter().map(|a| ShortName::new(a).unwrap()).collect(),
    }
}

pub fn grant(id: &str, actor: &str, caps: Vec<Capability>) -> Grant {
    Grant {
        id: ident(id),
        subject: agent(actor),
        issuer: host(),
        namespace_id: ident("tenant-1"),
        capabilities: caps,
        max_uses: None,
        not_before: None,
        expires_at: None,
        revoked: false,
        constraints: None,
        parent_grant_id: None,
    }
}

pub fn admission(actor: &str) -> Grant {
    grant(
        &format!("{actor}-admission"),
        actor,
        vec![cap(
            "sharedos.execution",
            &["agent", actor],
            Scope::Exact,
            &["invoke"],
        )],
    )
}

pub fn call(id: &str, tool: &str, args: Value) -> ToolCall {
    let arguments: JsonObject = match args {
        Value::Object(o) => o,
        _ => JsonObject::new(),
    };
    ToolCall {
        id: ident(id),
        tool: ident(tool),
        arguments,
        trace_id: ident("trace-1"),
        requested_at: Timestamp::parse(NOW).unwrap(),
    }
}

/// What the scripted tool does when invoked.
#[derive(Debug, Clone)]
pub enum Script {
    Echo,
    WrongCallId,
    RawJunk,
    Throw(String),
    Panic,
    /// Sleeps, honouring the abort unless `ignore_abort`.
    Sleep {
        ms: u64,
        ignore_abort: bool,
    },
    AuditOutage,
}

/// A tool in namespace `test` whose requirement is `records/[record]` and
/// whose resolution may be scripted.
pub struct ScriptedTool {
    pub script: Script,
    pub calls: AtomicUsize,
    /// When set, resolve to this requirement instead.
    pub resolve: Mutex<Option<CapabilityRequirement>>,
    pub resolve_fails: bool,
}

impl ScriptedTool {
    pub fn new(script: Script) -> Arc<Self> {
        Arc::new(Self {
            script,
            calls: AtomicUsize::new(0),
            resolve: Mutex::new(None),
            resolve_fails: false,
        })
    }
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

pub fn requirement(
    namespace: &str,
    path: &[&str],
    action: &str,
    owner: Option<Address>,
) -> CapabilityRequirement {
    CapabilityRequirement {
        resource: ResourceRef {
            namespace: ident(namespace),
            path: segs(path),
            owner,
        },
        action: ShortName::new(action).unwrap(),
    }
}

pub fn scripted_definition(name: &str, read_write: ReadWrite) -> ToolDefinition {
    serde_json::from_value(json!({
        "name": name,
        "description": "A scripted test tool.",
        "namespace": "test",
        "source": "test",
        "readWrite": match read_write { ReadWrite::Read => "read", ReadWrite::Write => "write" },
        "inputSchema": {
            "type": "object",
            "properties": {
                "record": {"type": "string", "minLength": 1},
                "count": {"type": "integer", "minimum": 0},
                "nested": {"type": "object", "properties": {"depth": {"type": "integer"}}}
            },
            "required": ["record"]
        },
        "requiredCapability": {"resource": {"namespace": "records", "path": []}, "action": "read"}
    }))
    .unwrap()
}

#[async_trait]
impl ToolHandler for ScriptedTool {
    fn resolve_requirement(
        &self,
        _context: &AccessContext,
        call: &ToolCall,
    ) -> Result<Option<CapabilityRequirement>, String> {
        if self.resolve_fails {
            return Err("resolver exploded with secret-resolver-text".into());
        }
        if let Some(r) = self.resolve.lock().unwrap().clone() {
            return Ok(Some(r));
        }
        let record = call
            .arguments
            .get("record")
            .and_then(Value::as_str)
            .ok_or("record missing")?;
        Ok(Some(requirement("records", &[record], "read", None)))
    }

    async fn invoke(
        &self,
        context: &AccessContext,
        call: &ToolCall,
        abort: CancellationToken,
    ) -> Result<HandlerAnswer, ToolError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = context.now.clone();
        match &self.script {
            Script::Echo => {
                Ok(ToolResult::succeeded(call, json!({"echo": call.arguments}), now).into())
            }
            Script::WrongCallId => {
                let mut other = call.clone();
                other.id = ident("someone-elses-call");
                Ok(ToolResult::succeeded(&other, json!(1), now).into())
            }
            Script::RawJunk => Ok(HandlerAnswer::Raw(json!({"status": "interrupted"}))),
            Script::Throw(text) => Err(ToolError::Failed(text.clone())),
            Script::Panic => panic!("handler panicked"),
            Script::Sleep { ms, ignore_abort } => {
                if *ignore_abort {
                    tokio::time::sleep(Duration::from_millis(*ms)).await;
                } else {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(*ms)) => {}
                        _ = abort.cancelled() => return Err(ToolError::Aborted),
                    }
                }
                Ok(ToolResult::succeeded(call, json!("slept"), now).into())
            }
            Script::AuditOutage => Err(ToolError::Kernel(
                sharedos_kernel::KernelError::AuditUnavailable {
                    effect: sharedos_kernel::AuditEffect::Unknown,
                    cause: "nested decision".into(),
                },
            )),
        }
    }
}

/// A sink that can be made to fail on records of given kinds, or to hang:
/// the test kit's, over the in-memory sink.
pub type FlakySink = sharedos_testkit::FaultySink<MemoryAuditSink>;

/// A hook that keeps what it was told.
#[derive(Default)]
pub struct RecordingHook {
    pub audit: Mutex<Vec<(String, String)>>,
    pub tool: Mutex<Vec<String>>,
}

impl ErrorHook for RecordingHook {
    fn audit_error(&self, error: &AuditError, record: &AuditRecord) {
        self.audit
            .lock()
            .unwrap()
            .push((record.kind.to_string(), error.to_string()));
    }
    fn tool_error(&self, _tool: &str, _call_id: &str, error: &str) {
        self.tool.lock().unwrap().push(error.to_owned());
    }
}

pub struct Fixture {
    pub kernel: Kernel,
    pub sink: Arc<FlakySink>,
    pub hook: Arc<RecordingHook>,
    pub grants: Arc<ConfigGrantSource>,
    pub tool: Arc<ScriptedTool>,
}

/// A kernel with the scripted tool `test.records` (and `test.write`, a
/// write tool sharing the handler), the escalation tool, and `grants`.
pub fn fixture(script: Script, grants: Vec<Grant>) -> Fixture {
    fixture_with(ScriptedTool::new(script), grants)
}

pub fn fixture_with(tool: Arc<ScriptedTool>, grants: Vec<Grant>) -> Fixture {
    let sink = Arc::new(FlakySink::default());
    let hook = Arc::new(RecordingHook::default());
    let source = Arc::new(ConfigGrantSource::new(grants));
    let kernel = Kernel::builder(source.clone(), sink.clone())
        .error_hook(hook.clone())
        .tool(
            scripted_definition("test.records", ReadWrite::Read),
            tool.clone(),
        )
        .unwrap()
        .escalation_tool()
        .unwrap()
        .build();
    Fixture {
        kernel,
        sink,
        hook,
        grants: source,
        tool,
    }
}

/// A read grant on `records/[path..]`.
pub fn records_grant(id: &str, path: &[&str], scope: Scope) -> Grant {
    grant(id, "alice", vec![cap("records", path, scope, &["read"])])
}

/// The error code of a tool result, if it failed.
pub fn code(r: &sharedos_protocol::ToolResult) -> Option<&str> {
    r.error().map(|e| e.code.as_str())
}

/// One `test.records` call with `record` in a fresh turn of `ctx`.
pub async fn invoke(
    f: &Fixture,
    ctx: &AccessContext,
    id: &str,
    record: &str,
) -> sharedos_protocol::ToolResult {
    use sharedos_kernel::TurnKernel;
    let turn = f.kernel.open_turn(ctx).await.unwrap();
    turn.invoke_tool(
        ctx,
        &call(id, "test.records", json!({"record": record})),
        CancellationToken::new(),
    )
    .await
    .unwrap()
}
