//! envelope.md G 76–83, the envelope's side of an audit outage (B.10, no
//! grace). What the kernel writes to its sink is tested with the kernel.

mod support;

use std::sync::Arc;

use serde_json::json;
use sharedos_host::executor::TurnError;
use sharedos_kernel::{AuditEffect, KernelError};
use sharedos_plugin_sdk::{RuntimeError, RuntimeHost};
use sharedos_protocol::{ErrorKind, ExecutionStatus, RuntimeTurnOutcome};
use support::*;

fn bank(handler: Handler) -> Arc<TestKernel> {
    TestKernel::new(vec![write_tool("transfer_funds")]).handler("transfer_funds", handler)
}

fn transfer() -> Handler {
    Handler::Transfer {
        work_ms: 0,
        honour_abort: true,
    }
}

fn req() -> sharedos_protocol::ExecutionRequest {
    request(&["transfer_funds"])
}

#[tokio::test(start_paused = true)]
async fn g76_decision_outage_on_the_first_call() {
    let kernel = bank(transfer());
    lock(&kernel.fail_decision).insert("c1".into());
    let (plugin, log) = ScriptPlugin::new(vec![Step::call("c1", "transfer_funds")]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(req()).await;
    assert_eq!(r.status, ExecutionStatus::Failed);
    assert_eq!(code(&r), "audit_unavailable");
    assert_eq!(
        r.error.as_ref().unwrap().message.as_str(),
        "The audit sink could not record a decision, so the turn was ended."
    );
    assert_eq!(r.retryable(), Some(true), "nothing ran");
    assert!(kernel.ledger().is_empty());
    assert_eq!(
        last_event(&r),
        (
            "turn.failed".into(),
            json!({"code": "audit_unavailable", "source": "envelope"})
        )
    );
    assert_eq!(
        log.result("c1").unwrap_err().kind,
        ErrorKind::AuditUnavailable
    );
    let end = kernel.turn_ends().pop().unwrap();
    assert_eq!(
        (end.reason_code.as_deref(), end.ended_by.as_deref()),
        (Some("audit_unavailable"), Some("envelope"))
    );
    let errs = h.turn_errors();
    assert_eq!(errs.len(), 1);
    assert!(
        matches!(&errs[0].0, TurnError::AuditUnavailable { cause } if cause == "audit sink is down")
    );
    assert!(
        !serde_json::to_string(&r)
            .unwrap()
            .contains("audit sink is down")
    );
}

#[tokio::test(start_paused = true)]
async fn g77_plugin_swallowing_the_outage_still_fails() {
    let kernel = bank(transfer());
    lock(&kernel.fail_decision).insert("c1".into());
    let (plugin, _) = ScriptPlugin::new(vec![
        Step::try_call("c1", "transfer_funds"),
        Step::returns(RuntimeTurnOutcome::complete(json!("all good"))),
    ]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(req()).await;
    assert_eq!(code(&r), "audit_unavailable");
    assert!(events_of(&r, "turn.completed").is_empty());
}

/// The same with a grace: the plugin's outcome arrives while the outage
/// drains the turn, and it still does not count.
#[tokio::test(start_paused = true)]
async fn g77_plugin_swallowing_the_outage_during_a_grace_still_fails() {
    let kernel = bank(transfer());
    lock(&kernel.fail_decision).insert("c1".into());
    let (plugin, _) = ScriptPlugin::new(vec![
        Step::try_call("c1", "transfer_funds"),
        Step::returns(RuntimeTurnOutcome::complete(json!("all good"))),
    ]);
    let h = executor(&kernel, plugin, 5_000);
    let r = h.run(req()).await;
    assert_eq!(code(&r), "audit_unavailable");
    assert_eq!(r.retryable(), Some(true));
}

#[tokio::test(start_paused = true)]
async fn g78_outage_after_a_succeeded_write_is_not_retryable() {
    let kernel = bank(transfer());
    lock(&kernel.fail_decision).insert("c2".into());
    let (plugin, _) = ScriptPlugin::new(vec![
        Step::call("c1", "transfer_funds"),
        Step::call("c2", "transfer_funds"),
    ]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(req()).await;
    assert_eq!(code(&r), "audit_unavailable");
    assert_eq!(r.retryable(), Some(false));
    assert_eq!(kernel.ledger(), ["debit:c1", "credit:c1"]);
}

#[tokio::test(start_paused = true)]
async fn g79_outage_interrupts_a_running_call() {
    let kernel = bank(Handler::Transfer {
        work_ms: 10_000,
        honour_abort: true,
    });
    lock(&kernel.fail_decision).insert("c2".into());
    let plugin = FnPlugin(|_, host: Arc<dyn RuntimeHost>, _| async move {
        let c1 = host.invoke_tool(call("c1", "transfer_funds"), None);
        let c2 = async {
            tokio::time::sleep(ms(1_000)).await;
            host.invoke_tool(call("c2", "transfer_funds"), None).await
        };
        let (_r1, r2) = futures_util::future::join(c1, c2).await;
        r2.map_err(|e| RuntimeError::Failed(e.to_string()))?;
        Ok(RuntimeTurnOutcome::complete(json!(null)))
    });
    let h = executor(&kernel, Arc::new(plugin), 0);
    let r = h.run(req()).await;
    assert_eq!(code(&r), "audit_unavailable");
    assert_eq!(r.retryable(), Some(false));
    settle().await;
    let invoked = kernel.tool_invoked("c1");
    assert_eq!(invoked.len(), 1);
    assert_eq!(
        (invoked[0].outcome.as_str(), invoked[0].reason.as_deref()),
        ("interrupted", Some("operation_aborted"))
    );
    assert_eq!(kernel.ledger(), ["debit:c1"]);
}

/// G80: a kernel that rejects call-1 with the outage itself once the turn
/// was aborted. An outage reported after the abort is not "refused for an
/// outage": the call may have run.
#[tokio::test(start_paused = true)]
async fn g80_rejection_with_the_outage_after_the_abort_counts() {
    let kernel = TestKernel::new(vec![write_tool("transfer_funds"), write_tool("pay")])
        .handler("transfer_funds", Handler::OutageOnAbort)
        .handler("pay", transfer());
    lock(&kernel.fail_decision).insert("c2".into());
    let plugin = FnPlugin(|_, host: Arc<dyn RuntimeHost>, _| async move {
        let c1 = host.invoke_tool(call("c1", "transfer_funds"), None);
        let c2 = async {
            tokio::time::sleep(ms(1_000)).await;
            host.invoke_tool(call("c2", "pay"), None).await
        };
        let _ = futures_util::future::join(c1, c2).await;
        Ok(RuntimeTurnOutcome::complete(json!(null)))
    });
    let h = executor(&kernel, Arc::new(plugin), 0);
    let r = h.run(request(&["transfer_funds", "pay"])).await;
    assert_eq!(code(&r), "audit_unavailable");
    assert_eq!(r.retryable(), Some(false));
}

#[tokio::test(start_paused = true)]
async fn g81_outage_on_the_listing_never_runs_the_plugin() {
    let kernel = bank(transfer());
    *lock(&kernel.listing_error) = Some(KernelError::AuditUnavailable {
        effect: AuditEffect::None,
        cause: "catalog write failed".into(),
    });
    let (plugin, log) = ScriptPlugin::new(vec![]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(req()).await;
    assert_eq!(r.status, ExecutionStatus::Failed);
    assert_eq!(code(&r), "audit_unavailable");
    assert_eq!(r.retryable(), Some(true));
    assert!(!log.ran());
    assert_eq!(types(&r), ["turn.failed"]);
    assert_eq!(h.turn_errors().len(), 1);
}

/// Nearest equivalent of G82: an in-process plugin cannot throw the
/// kernel's `AuditUnavailableError`; the closest it can do is fail with a
/// message that names it, which is an ordinary `runtime_failed`.
#[tokio::test(start_paused = true)]
async fn g82_plugin_claiming_an_outage_is_runtime_failed() {
    let kernel = bank(transfer());
    let (plugin, _) = ScriptPlugin::new(vec![Step::throw(
        "audit_unavailable: AuditUnavailableError",
    )]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(req()).await;
    assert_eq!(code(&r), "runtime_failed");
}

/// G83: the real kernel over a sink that fails only on `tool.invoked`
/// (the write after the effect). The failure goes to the kernel's error
/// hook (`onAuditError`) with the `tool.invoked` record, the kernel hands
/// the result back, and the turn goes on and succeeds with the transfer
/// made once.
#[tokio::test]
async fn g83_outcome_path_failure_does_not_end_the_turn() {
    let (kernel, ledger, reported, _files) = outcome_failing_kernel();
    let (plugin, _) = ScriptPlugin::new(vec![Step::call("c1", "transfer_funds")]);
    let (opts, turn_errors) = options(0);
    let executor = sharedos_host::executor::Executor::new(
        kernel,
        sharedos_host::executor::Seat::in_process(plugin),
        opts,
    )
    .unwrap();
    let r = Harness {
        executor,
        turn_errors,
    }
    .run(req())
    .await;
    assert_eq!(r.status, ExecutionStatus::Succeeded, "{r:?}");
    assert_eq!(
        *lock(&ledger),
        ["transfer:c1"],
        "the transfer happened once"
    );
    assert_eq!(
        *lock(&reported),
        ["tool.invoked"],
        "the error hook got the outcome-path failure"
    );
    let completed = events_of(&r, "tool.completed");
    assert_eq!(completed.len(), 1);
    assert_eq!(completed[0]["status"], "succeeded", "{completed:?}");
}

type Shared = Arc<std::sync::Mutex<Vec<String>>>;

/// The real kernel: `transfer_funds` granted to the request's agent, an
/// audit sink whose `tool.invoked` writes fail, an error hook that records
/// what it was told.
fn outcome_failing_kernel() -> (
    Arc<sharedos_kernel::Kernel>,
    Shared,
    Shared,
    tempfile::TempDir,
) {
    use sharedos_kernel::{AuditError, AuditRecord, ErrorHook, MemoryAuditSink};

    struct Reported(Shared);
    impl ErrorHook for Reported {
        fn audit_error(&self, _: &AuditError, record: &AuditRecord) {
            lock(&self.0).push(record.kind.to_string());
        }
    }
    struct Transfer(Shared);
    #[async_trait::async_trait]
    impl sharedos_kernel::ToolHandler for Transfer {
        async fn invoke(
            &self,
            context: &sharedos_protocol::AccessContext,
            call: &sharedos_protocol::ToolCall,
            _: tokio_util::sync::CancellationToken,
        ) -> Result<sharedos_kernel::HandlerAnswer, sharedos_kernel::ToolError> {
            lock(&self.0).push(format!("transfer:{}", call.id));
            Ok(sharedos_protocol::ToolResult::succeeded(
                call,
                json!({"transferred": true}),
                context.now.clone(),
            )
            .into())
        }
    }

    let subject = json!({"kind": "agent", "agentId": AGENT});
    let issuer = json!({"kind": "human", "userId": "issuer"});
    let config: sharedos_kernel::KernelConfig = serde_json::from_value(json!({
        "namespaces": ["bank"],
        "grants": [{"id": "g", "subject": subject, "issuer": issuer, "namespaceId": "ns-1",
            "capabilities": [
                {"namespace": "sharedos.execution", "path": ["agent", AGENT], "scope": "exact", "actions": ["invoke"]},
                {"namespace": "bank", "path": [], "scope": "descendants", "actions": ["write"]}
            ]}]
    }))
    .unwrap();
    let ledger = Shared::default();
    let reported = Shared::default();
    let dir = tempfile::tempdir().unwrap();
    let kernel = sharedos_kernel::Kernel::builder_from_config(
        &config,
        dir.path(),
        Arc::new(sharedos_testkit::FaultySink::failing(
            MemoryAuditSink::new(),
            &[sharedos_kernel::AuditKind::ToolInvoked],
        )),
    )
    .unwrap()
    .error_hook(Arc::new(Reported(reported.clone())))
    .tool(
        write_tool("transfer_funds"),
        Arc::new(Transfer(ledger.clone())),
    )
    .unwrap()
    .build();
    (Arc::new(kernel), ledger, reported, dir)
}

/// B.10: an outage on any kernel call the envelope makes itself (authority,
/// admission, reach, escalation) ends the turn `audit_unavailable`.
#[tokio::test(start_paused = true)]
async fn outage_on_the_envelopes_own_kernel_calls() {
    let outage = || KernelError::AuditUnavailable {
        effect: AuditEffect::None,
        cause: "sink".into(),
    };
    // Authority load.
    let kernel = bank(transfer());
    *lock(&kernel.open_error) = Some(outage());
    let (plugin, log) = ScriptPlugin::new(vec![]);
    let r = executor(&kernel, plugin, 0).run(req()).await;
    assert_eq!((code(&r), r.retryable()), ("audit_unavailable", Some(true)));
    assert!(!log.ran());
    // Escalation recording.
    let kernel = TestKernel::new(vec![escalate_tool()]);
    *lock(&kernel.escalation_error) = Some(outage());
    let (plugin, _) = ScriptPlugin::new(vec![
        Step::annotate("k", json!(1)),
        Step::returns(RuntimeTurnOutcome::Escalate {
            reason: sharedos_protocol::Reason::new("r").unwrap(),
            metadata: None,
        }),
    ]);
    let r = executor(&kernel, plugin, 0)
        .run(request(&["sharedos.escalate"]))
        .await;
    assert_eq!(r.status, ExecutionStatus::Failed);
    assert_eq!(code(&r), "audit_unavailable");
    assert!(events_of(&r, "turn.escalated").is_empty());
    assert_eq!(r.metadata.get("k"), Some(&json!(1)));
}
