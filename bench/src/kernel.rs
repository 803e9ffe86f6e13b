//! Figures for `sharedos-bench`: what a decision, an audited call and a
//! file tool call cost on this machine. Each function returns a JSON object
//! with the figure, the iteration count and what was measured.
//!
//! The audited figures include an `fsync` per record, so they measure the
//! disk as much as the kernel; `bare_append_fsync_us` is the same disk's
//! cost for one durable append, measured in the same run, as a baseline.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};
use sharedos_protocol::{
    AccessContext, Address, Identifier, JsonObject, PathSegment, Purpose, ShortName, Timestamp,
    ToolCall, ToolDefinition, ToolResult, ident,
};
use tokio_util::sync::CancellationToken;

use sharedos_kernel::audit::{
    AuditKind, AuditOutcome, AuditRecord, AuditSink, AuditSource, JsonlAuditSink, MemoryAuditSink,
};
use sharedos_kernel::config::KernelConfig;
use sharedos_kernel::grant::{
    Capability, ConfigGrantSource, Grant, MemoryUsageStore, Requirement, Scope, authorize,
};
use sharedos_kernel::kernel::Kernel;
use sharedos_kernel::port::TurnKernel;
use sharedos_kernel::registry::{HandlerAnswer, ToolError, ToolHandler};

fn context() -> AccessContext {
    AccessContext {
        namespace_id: ident("bench"),
        actor: Address::Agent {
            agent_id: ident("bench-agent"),
        },
        authority: Address::Service {
            service_id: ident("host"),
        },
        owner: Address::Service {
            service_id: ident("host"),
        },
        purpose: Purpose::new("benchmark")
            .unwrap_or_else(|_| unreachable!("literal purpose is valid")),
        trace_id: ident("bench-trace"),
        enabled_tool_namespaces: vec![ident("files"), ident("bench")],
        now: Timestamp::now(),
    }
}

fn seg(s: &str) -> Vec<PathSegment> {
    PathSegment::new(s).map(|p| vec![p]).unwrap_or_default()
}

fn grant(id: &str, namespace: &str, path: Vec<PathSegment>, actions: &[&str]) -> Grant {
    let ctx = context();
    Grant {
        id: ident(id),
        subject: ctx.actor.clone(),
        issuer: ctx.authority.clone(),
        namespace_id: ctx.namespace_id.clone(),
        capabilities: vec![Capability {
            namespace: ident(namespace),
            path,
            owner: None,
            scope: Scope::Descendants,
            actions: actions
                .iter()
                .filter_map(|a| ShortName::new(a).ok())
                .collect(),
        }],
        max_uses: None,
        not_before: None,
        expires_at: None,
        revoked: false,
        constraints: None,
        parent_grant_id: None,
    }
}

fn summary(name: &str, what: &str, mut samples: Vec<Duration>) -> Value {
    samples.sort_unstable();
    let n = samples.len().max(1);
    let total: Duration = samples.iter().sum();
    let pick = |q: f64| {
        samples
            .get(((n as f64 - 1.0) * q) as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    json!({
        "name": name,
        "measures": what,
        "iterations": samples.len(),
        "meanUs": total.as_secs_f64() * 1e6 / n as f64,
        "p50Us": pick(0.5),
        "p99Us": pick(0.99),
        "totalMs": total.as_secs_f64() * 1e3,
    })
}

/// One authorization decision against 64 grants (the covering one last),
/// no audit: the cost of the grant model itself.
pub async fn authorization_decision(iterations: usize) -> Value {
    let ctx = context();
    let mut grants: Vec<Grant> = (0..63)
        .map(|i| {
            grant(
                &format!("g{i}"),
                "records",
                seg(&format!("other-{i}")),
                &["read"],
            )
        })
        .collect();
    grants.push(grant("g63", "records", seg("target"), &["read", "write"]));
    let req = Requirement {
        namespace: "records".into(),
        path: vec!["target".into(), "a".into(), "b".into()],
        owner: ctx.owner.clone(),
        action: "write".into(),
    };
    let usage = MemoryUsageStore::new();
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let t = Instant::now();
        let d = authorize(&grants, &usage, &ctx, &req, true).await;
        samples.push(t.elapsed());
        std::hint::black_box(d);
    }
    summary(
        "kernel.authorization_decision",
        "authorize() over 64 grants, covering grant last",
        samples,
    )
}

struct Echo;

#[async_trait]
impl ToolHandler for Echo {
    async fn invoke(
        &self,
        context: &AccessContext,
        call: &ToolCall,
        _abort: CancellationToken,
    ) -> Result<HandlerAnswer, ToolError> {
        Ok(ToolResult::succeeded(call, Value::Bool(true), context.now.clone()).into())
    }
}

fn echo_definition() -> Option<ToolDefinition> {
    serde_json::from_value(json!({
        "name": "bench.echo", "description": "Answers true.", "namespace": "bench", "source": "bench",
        "readWrite": "read", "inputSchema": {"type": "object"},
        "requiredCapability": {"resource": {"namespace": "bench", "path": []}, "action": "invoke"}
    }))
    .ok()
}

fn call(i: usize, tool: &str, arguments: Value) -> ToolCall {
    ToolCall {
        id: Identifier::new(format!("call-{i}")).unwrap_or_else(|_| ident("call")),
        tool: Identifier::new(tool).unwrap_or_else(|_| ident("tool")),
        arguments: match arguments {
            Value::Object(o) => o,
            _ => JsonObject::new(),
        },
        trace_id: ident("bench-trace"),
        requested_at: Timestamp::now(),
    }
}

async fn bare_append_us(dir: &Path, iterations: usize) -> Result<f64, String> {
    let sink = JsonlAuditSink::open(dir.join("bare-audit.jsonl")).map_err(|e| e.to_string())?;
    let record = AuditRecord::new(
        AuditKind::ToolInvoked,
        AuditOutcome::Succeeded,
        &context(),
        AuditSource::Kernel,
    );
    let t = Instant::now();
    for _ in 0..iterations {
        sink.append(&record).await.map_err(|e| e.to_string())?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / iterations.max(1) as f64)
}

/// One audited tool call on the JSONL sink in `dir`: schema check,
/// authorization, `authorization.checked` write + fsync, the handler,
/// `tool.invoked` write + fsync. Also the same call on an in-memory sink.
pub async fn audited_tool_call(dir: &Path, iterations: usize) -> Value {
    let run = async {
        let def = echo_definition().ok_or("echo definition")?;
        let grants = vec![grant("bench", "bench", vec![], &["invoke"])];
        let jsonl: Arc<dyn AuditSink> = Arc::new(
            JsonlAuditSink::open(dir.join("kernel-audit.jsonl")).map_err(|e| e.to_string())?,
        );
        let mut out = Vec::new();
        for (label, sink) in [
            ("jsonl", jsonl),
            (
                "memory",
                Arc::new(MemoryAuditSink::new()) as Arc<dyn AuditSink>,
            ),
        ] {
            let kernel = Kernel::builder(Arc::new(ConfigGrantSource::new(grants.clone())), sink)
                .tool(def.clone(), Arc::new(Echo))
                .map_err(|e| e.to_string())?
                .build();
            let ctx = context();
            let turn = kernel.open_turn(&ctx).await.map_err(|e| e.to_string())?;
            let mut samples = Vec::with_capacity(iterations);
            for i in 0..iterations {
                let c = call(i, "bench.echo", json!({}));
                let t = Instant::now();
                turn.invoke_tool(&ctx, &c, CancellationToken::new())
                    .await
                    .map_err(|e| e.to_string())?;
                samples.push(t.elapsed());
            }
            out.push(summary(
                &format!("kernel.audited_tool_call.{label}"),
                "invoke_tool: decision record, handler, outcome record",
                samples,
            ));
        }
        let bare = bare_append_us(dir, iterations).await?;
        let concurrent =
            concurrent_calls(dir, &def, &grants, 16, iterations.div_ceil(16).max(1)).await?;
        Ok::<Value, String>(
            json!({"runs": out, "bareAppendFsyncUs": bare, "concurrent": concurrent}),
        )
    };
    run.await
        .unwrap_or_else(|e| json!({"name": "kernel.audited_tool_call", "error": e}))
}

/// `tasks` concurrent callers on one kernel and one JSONL sink: what the
/// group commit buys (records of concurrent calls share an `fsync`).
async fn concurrent_calls(
    dir: &Path,
    def: &ToolDefinition,
    grants: &[Grant],
    tasks: usize,
    per_task: usize,
) -> Result<Value, String> {
    let sink = JsonlAuditSink::open(dir.join("kernel-audit-concurrent.jsonl"))
        .map_err(|e| e.to_string())?;
    let kernel = Arc::new(
        Kernel::builder(
            Arc::new(ConfigGrantSource::new(grants.to_vec())),
            Arc::new(sink),
        )
        .tool(def.clone(), Arc::new(Echo))
        .map_err(|e| e.to_string())?
        .build(),
    );
    let ctx = context();
    let turn = kernel.open_turn(&ctx).await.map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (turn, ctx) = (Arc::clone(&turn), ctx.clone());
        handles.push(tokio::spawn(async move {
            for i in 0..per_task {
                let c = call(t * per_task + i, "bench.echo", json!({}));
                turn.invoke_tool(&ctx, &c, CancellationToken::new())
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        }));
    }
    for h in handles {
        h.await.map_err(|e| e.to_string())??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let calls = tasks * per_task;
    Ok(
        json!({"tasks": tasks, "calls": calls, "totalMs": elapsed * 1e3, "callsPerSecond": calls as f64 / elapsed}),
    )
}

/// 100 file tool calls through the kernel (50 `files.write`, then 50
/// `files.read`), JSONL audit with fsync, files under `dir`.
pub async fn file_tool_calls(dir: &Path) -> Value {
    let run = async {
        let ctx = context();
        let config = KernelConfig {
            grants: vec![grant("files", "files", seg("bench-agent"), &["*"])],
            ..KernelConfig::default()
        };
        let audit = Arc::new(
            JsonlAuditSink::open(dir.join("files-audit.jsonl")).map_err(|e| e.to_string())?,
        );
        let kernel =
            Kernel::from_config(&config, &dir.join("files"), audit).map_err(|e| e.to_string())?;
        let turn = kernel.open_turn(&ctx).await.map_err(|e| e.to_string())?;
        let mut samples = Vec::with_capacity(100);
        let mut failures = 0;
        for i in 0..100 {
            let c = if i < 50 {
                call(
                    i,
                    "files.write",
                    json!({"path": format!("notes/n{i}.md"), "content": "x".repeat(256)}),
                )
            } else {
                call(
                    i,
                    "files.read",
                    json!({"path": format!("notes/n{}.md", i - 50)}),
                )
            };
            let t = Instant::now();
            let r = turn
                .invoke_tool(&ctx, &c, CancellationToken::new())
                .await
                .map_err(|e| e.to_string())?;
            samples.push(t.elapsed());
            if r.status() != sharedos_protocol::ToolStatus::Succeeded {
                failures += 1;
            }
        }
        let mut v = summary(
            "kernel.file_tool_calls",
            "100 calls: 50 files.write (256 B, atomic) then 50 files.read, JSONL audit",
            samples,
        );
        v["failures"] = json!(failures);
        Ok::<Value, String>(v)
    };
    run.await
        .unwrap_or_else(|e| json!({"name": "kernel.file_tool_calls", "error": e}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_benchmarks_run_and_report() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("kernel-bench");
        std::fs::create_dir_all(&dir).unwrap();
        let a = authorization_decision(50).await;
        assert_eq!(a["iterations"], json!(50));
        let b = audited_tool_call(&dir, 5).await;
        assert!(b.get("error").is_none(), "{b}");
        let c = file_tool_calls(&dir).await;
        assert_eq!(c["failures"], json!(0), "{c}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
