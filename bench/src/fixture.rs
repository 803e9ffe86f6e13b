//! The benchmark fixture: a kernel with one no-op tool and the grants to
//! use it, a request for it, and the shared test plugin with the scripts
//! that time its calls and emits.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};
use sharedos_kernel::audit::per_call::LineSink;
use sharedos_kernel::{
    AuditError, Capability, ConfigGrantSource, Grant, HandlerAnswer, Kernel, Scope, ToolError,
    ToolHandler,
};
use sharedos_protocol::{
    AccessContext, Address, CapabilityRequirement, ExecutionOptions, ExecutionRequest,
    MessageEnvelope, ReadWrite, ResourceRef, RuntimeManifest, ShortName, Timestamp, ToolCall,
    ToolDefinition, ToolResult, Version, ident,
};
use sharedos_testplugin::{Script, ScriptPlugin, Step};
use tokio_util::sync::CancellationToken;

pub const NOOP_TOOL: &str = "bench.noop";

/// `bench.noop`: a read that answers `null`.
pub fn noop_definition() -> ToolDefinition {
    ToolDefinition {
        name: ident(NOOP_TOOL),
        description: sharedos_protocol::Description::new(
            "Does nothing; for measuring the envelope.",
        )
        .unwrap_or_else(|_| unreachable!()),
        namespace: ident("bench"),
        source: ident("sharedos.bench"),
        read_write: ReadWrite::Read,
        input_schema: json!({"type": "object"})
            .as_object()
            .cloned()
            .unwrap_or_default(),
        output_schema: None,
        required_capability: CapabilityRequirement {
            resource: ResourceRef {
                namespace: ident("bench"),
                path: vec![],
                owner: None,
            },
            action: ShortName::new("invoke").unwrap_or_else(|_| unreachable!()),
        },
        annotations: None,
        metadata: None,
    }
}

struct Noop;

#[async_trait]
impl ToolHandler for Noop {
    async fn invoke(
        &self,
        context: &AccessContext,
        call: &ToolCall,
        _abort: CancellationToken,
    ) -> Result<HandlerAnswer, ToolError> {
        Ok(ToolResult::succeeded(call, Value::Null, context.now.clone()).into())
    }
}

fn agent() -> Address {
    Address::Agent {
        agent_id: ident("bench-agent"),
    }
}

fn grant(id: &str, namespace: &str, path: &[&str], action: &str) -> Grant {
    Grant {
        id: ident(id),
        subject: agent(),
        issuer: Address::Service {
            service_id: ident("bench-host"),
        },
        namespace_id: ident("bench"),
        capabilities: vec![Capability {
            namespace: ident(namespace),
            path: path
                .iter()
                .map(|s| sharedos_protocol::PathSegment::new(s).unwrap_or_else(|_| unreachable!()))
                .collect(),
            owner: None,
            scope: Scope::Descendants,
            actions: vec![ShortName::new(action).unwrap_or_else(|_| unreachable!())],
        }],
        max_uses: None,
        not_before: None,
        expires_at: None,
        revoked: false,
        constraints: None,
        parent_grant_id: None,
    }
}

/// The bench's audit sink: each record serialized to one JSON line in the
/// caller's task, as the JSONL sink does before handing it to its writer
/// thread, and then let go. Keeping every record of a run in memory (as
/// `MemoryAuditSink` does) made the measurement one of a vector growing
/// through hundreds of thousands of records; the file write and `fsync`
/// are measured on their own (docs/BENCHMARKS.md, the kernel's section).
fn serializing_sink() -> LineSink<impl Fn(Vec<u8>) -> Result<(), AuditError> + Send + Sync> {
    LineSink::new(|line| {
        std::hint::black_box(line);
        Ok(())
    })
}

/// A kernel with `bench.noop` and the grants to admit the turn and call it,
/// auditing into memory (the envelope is measured, not the disk).
pub fn kernel() -> Kernel {
    let grants = vec![
        grant(
            "bench-admission",
            "sharedos.execution",
            &["agent", "bench-agent"],
            "invoke",
        ),
        grant("bench-noop", "bench", &[], "invoke"),
    ];
    let builder = Kernel::builder(
        Arc::new(ConfigGrantSource::new(grants)),
        Arc::new(serializing_sink()),
    );
    match builder.tool(noop_definition(), Arc::new(Noop)) {
        Ok(b) => b.build(),
        Err(e) => unreachable!("the bench tool registers: {e}"),
    }
}

/// The context of a bench turn.
pub fn context() -> AccessContext {
    AccessContext {
        namespace_id: ident("bench"),
        actor: agent(),
        authority: Address::Service {
            service_id: ident("bench-host"),
        },
        owner: Address::Human {
            user_id: ident("bench-owner"),
        },
        purpose: sharedos_protocol::Purpose::new("benchmark").unwrap_or_else(|_| unreachable!()),
        trace_id: ident("bench-trace"),
        enabled_tool_namespaces: vec![ident("bench")],
        now: Timestamp::now(),
    }
}

/// A request for one bench turn; `payload` tells the plugin what to do.
pub fn request(execution_id: &str, payload: Value) -> ExecutionRequest {
    let context = context();
    ExecutionRequest {
        version: Version::V1,
        execution_id: ident(execution_id),
        agent: agent(),
        message: MessageEnvelope {
            version: Version::V1,
            id: ident("bench-message"),
            sender: context.owner.clone(),
            receiver: agent(),
            purpose: context.purpose.clone(),
            payload,
            trace_id: context.trace_id.clone(),
            created_at: context.now.clone(),
            reply_to: None,
            provenance: None,
        },
        context,
        tools: vec![noop_definition()],
        state: None,
        options: Some(ExecutionOptions {
            max_steps: Some(1000),
            max_tool_calls: Some(10_000),
            timeout_ms: Some(600_000),
        }),
        metadata: None,
    }
}

/// The bench's plugin: the shared test plugin (`sharedos_testplugin`)
/// running each request's payload script, under the bench's manifest. The
/// same plugin is seated in process and served over stdio
/// (`sharedos-bench __bench-plugin`), so a figure in process and out of process
/// measure one scenario. It keeps nothing between turns: the host reuses it
/// only where a runtime has session affinity (`sharedos-bench --only
/// affinity`).
/// An executor seating [`plugin`] in process: the floor of every round.
pub fn in_process_executor() -> Result<sharedos_host::executor::Executor, String> {
    sharedos_host::executor::Executor::new(
        std::sync::Arc::new(kernel()),
        sharedos_host::executor::Seat::in_process(std::sync::Arc::new(plugin())),
        options(),
    )
    .map_err(|e| e.to_string())
}

pub fn plugin() -> ScriptPlugin {
    ScriptPlugin::from_payload().with_manifest(manifest())
}

/// The bench plugin's manifest.
pub fn manifest() -> RuntimeManifest {
    RuntimeManifest::new("sharedos.bench", env!("CARGO_PKG_VERSION"))
        .unwrap_or_else(|_| unreachable!())
}

/// A turn that does nothing: the envelope's own cost.
pub fn idle() -> Value {
    Script::default().payload()
}

/// `n` calls of `bench.noop` one after the other; the turn's output
/// carries each call's nanoseconds as `callNs`.
pub fn calls(n: usize) -> Value {
    let tool = NOOP_TOOL.to_owned();
    Script(vec![Step::TimedCalls {
        tool,
        n: n as u64,
        arguments: Value::Null,
    }])
    .payload()
}

/// `n` calls of `bench.noop`, `inflight` at a time; the output carries the
/// nanoseconds they took in all as `parallelNs`.
pub fn parallel(n: u64, inflight: u64) -> Value {
    let tool = NOOP_TOOL.to_owned();
    Script(vec![Step::ParallelCalls {
        tool,
        n,
        inflight,
        arguments: Value::Null,
    }])
    .payload()
}

/// `n` events `bench.tick`; the output carries `emits` and `emitNs`.
pub fn emits(n: usize) -> Value {
    let kind = "bench.tick".to_owned();
    Script(vec![Step::TimedEmits { kind, n: n as u64 }]).payload()
}

/// Executor options for measurements: the event budget raised above what
/// a measurement turn writes (a benchmark turn is not a flood).
pub fn options() -> sharedos_host::executor::ExecutorOptions {
    sharedos_host::executor::ExecutorOptions {
        max_events_per_turn: 10_000_000,
        max_turn_bytes: 1 << 30,
        ..Default::default()
    }
}
