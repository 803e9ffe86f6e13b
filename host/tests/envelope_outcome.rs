//! "Finish and record the outcome even when nobody waits" (envelope.md C.4,
//! G55), owned by one layer: the envelope's mediation runs each kernel call
//! in a task of its own. These tests use the real kernel and read its audit
//! sink: a seat that stops waiting for a call does not stop the call's
//! `tool.invoked` from being written.

mod support;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use sharedos_host::executor::{Executor, Seat};
use sharedos_kernel::{
    AuditKind, AuditOutcome, AuditRecord, ConfigGrantSource, Grant, HandlerAnswer, Kernel,
    MemoryAuditSink, ToolError, ToolHandler,
};
use sharedos_plugin_sdk::{RuntimeError, RuntimeHost};
use sharedos_protocol::{AccessContext, ExecutionStatus, RuntimeTurnOutcome, ToolCall, ToolResult};
use support::*;
use tokio_util::sync::CancellationToken;

const SLOW: &str = "bank.slow";

/// Answers after `work_ms` of (virtual) time, or stops at the abort.
struct Slow {
    work_ms: u64,
}

#[async_trait]
impl ToolHandler for Slow {
    async fn invoke(
        &self,
        _: &AccessContext,
        call: &ToolCall,
        abort: CancellationToken,
    ) -> Result<HandlerAnswer, ToolError> {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(self.work_ms)) => {}
            _ = abort.cancelled() => return Err(ToolError::Aborted),
        }
        Ok(ToolResult::succeeded(call, json!({"done": true}), call.requested_at.clone()).into())
    }
}

fn grants() -> Vec<Grant> {
    let grant = |id: &str, capability: serde_json::Value| -> Grant {
        serde_json::from_value(json!({
            "id": id,
            "subject": {"kind": "agent", "agentId": AGENT},
            "issuer": {"kind": "human", "userId": "issuer"},
            "namespaceId": "ns-1",
            "capabilities": [capability],
        }))
        .expect("grant")
    };
    vec![
        grant(
            "admission",
            json!({"namespace": "sharedos.execution", "path": ["agent", AGENT], "scope": "exact", "actions": ["invoke"]}),
        ),
        grant(
            "bank",
            json!({"namespace": "bank", "path": ["p"], "scope": "descendants", "actions": ["write"]}),
        ),
    ]
}

fn kernel(work_ms: u64) -> (Arc<Kernel>, MemoryAuditSink) {
    let sink = MemoryAuditSink::new();
    let kernel = Kernel::builder(
        Arc::new(ConfigGrantSource::new(grants())),
        Arc::new(sink.clone()),
    )
    .tool(write_tool(SLOW), Arc::new(Slow { work_ms }))
    .expect("tool")
    .build();
    (Arc::new(kernel), sink)
}

/// A seat that gives up on its call after `patience_ms`, then lingers for
/// `linger_ms` before it completes the turn.
fn impatient(patience_ms: u64, linger_ms: u64) -> Arc<dyn sharedos_plugin_sdk::RuntimePlugin> {
    Arc::new(FnPlugin(
        move |_, host: Arc<dyn RuntimeHost>, _| async move {
            let waited = tokio::time::timeout(
                Duration::from_millis(patience_ms),
                host.invoke_tool(call("c1", SLOW), None),
            )
            .await;
            if waited.is_ok() {
                return Err(RuntimeError::Failed(
                    "the call was expected to outlast the wait".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(linger_ms)).await;
            Ok(RuntimeTurnOutcome::complete(json!("gave up on c1")))
        },
    ))
}

fn invoked(sink: &MemoryAuditSink) -> Vec<AuditRecord> {
    sink.records()
        .into_iter()
        .filter(|r| r.kind == AuditKind::ToolInvoked && r.operation_id.as_deref() == Some("c1"))
        .collect()
}

async fn run(kernel: Arc<Kernel>, plugin: Arc<dyn sharedos_plugin_sdk::RuntimePlugin>) {
    let (opts, _) = options(0);
    let executor = Executor::new(kernel, Seat::in_process(plugin), opts).expect("executor");
    let r = executor
        .execute(request(&[SLOW]), Default::default())
        .await
        .expect("a result");
    assert_eq!(r.status, ExecutionStatus::Succeeded);
}

/// The seat stops waiting at 30 ms; the handler answers at 50 ms, while
/// the turn still runs: its success is on the record.
#[tokio::test(start_paused = true)]
async fn g55_a_call_the_seat_stopped_waiting_for_records_its_outcome() {
    let (kernel, sink) = kernel(50);
    run(kernel, impatient(30, 100)).await;
    let invoked = invoked(&sink);
    assert_eq!(invoked.len(), 1, "one outcome record: {invoked:?}");
    assert_eq!(invoked[0].outcome, AuditOutcome::Succeeded);
    assert_eq!(invoked[0].grant_id.as_deref(), Some("bank"));
}

/// The seat stops waiting and ends the turn while the handler still runs:
/// the turn's abort stops the handler, and the call is recorded
/// `interrupted` (`operation_aborted`) with its grant.
#[tokio::test(start_paused = true)]
async fn g55_a_call_abandoned_at_the_end_of_the_turn_is_recorded_interrupted() {
    let (kernel, sink) = kernel(10_000);
    run(kernel, impatient(30, 0)).await;
    settle().await;
    let invoked = invoked(&sink);
    assert_eq!(invoked.len(), 1, "one outcome record: {invoked:?}");
    assert_eq!(
        (invoked[0].outcome, invoked[0].reason.as_deref()),
        (AuditOutcome::Interrupted, Some("operation_aborted"))
    );
    assert_eq!(invoked[0].grant_id.as_deref(), Some("bank"));
}
