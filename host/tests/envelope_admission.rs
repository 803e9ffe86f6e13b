//! envelope.md G 1–9: request validation, context checks and admission.

mod support;

use std::sync::Arc;

use serde_json::json;
use sharedos_host::executor::{ExecuteError, ExecuteOptions, Executor, Seat};
use sharedos_kernel::{Admission, KernelError};
use sharedos_protocol::ExecutionStatus;
use support::*;
use tokio_util::sync::CancellationToken;

#[tokio::test(start_paused = true)]
async fn g01_unknown_key_or_timeout_over_limit_is_invalid_request() {
    let kernel = TestKernel::new(vec![read_tool("files.read")]);
    let (plugin, log) = ScriptPlugin::new(vec![]);
    let h = executor(&kernel, plugin, 0);

    // An unknown top-level key: the strict decoder refuses it.
    let mut v = request_json(&["files.read"]);
    v["runtimeId"] = json!("sharedos.other");
    let err = h
        .executor
        .execute_json(&v.to_string(), ExecuteOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ExecuteError::InvalidRequest(_)));

    // timeoutMs over the 600000 limit: it parses, and the refinement refuses it.
    let req = request_with(&["files.read"], |v| {
        v["options"] = json!({"timeoutMs": 600_001})
    });
    let err = h
        .executor
        .execute(req, ExecuteOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, ExecuteError::InvalidRequest(ref m) if m.contains("timeoutMs")),
        "{err:?}"
    );
    // ...and over the wire as JSON too.
    let mut v = request_json(&["files.read"]);
    v["options"] = json!({"timeoutMs": 600_001});
    assert!(
        h.executor
            .execute_json(&v.to_string(), ExecuteOptions::default())
            .await
            .is_err()
    );

    // No result, no events, no turn.ended, no kernel call at all.
    assert!(kernel.calls().is_empty(), "{:?}", kernel.calls());
    assert!(kernel.audit().is_empty());
    assert!(!log.ran());
}

async fn context_denial(mutate: impl FnOnce(&mut serde_json::Value), expected: &str) {
    let kernel = TestKernel::new(vec![read_tool("files.read")]);
    let (plugin, log) = ScriptPlugin::new(vec![]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(request_with(&["files.read"], mutate)).await;
    assert_eq!(r.status, ExecutionStatus::Denied);
    assert_eq!(code(&r), expected);
    assert_eq!(r.retryable(), Some(false));
    assert_eq!(types(&r), ["turn.denied"]);
    assert_eq!(r.events[0].data, json!({"code": expected}));
    assert_eq!(r.metadata.get("runtime"), Some(&expected_runtime()));
    assert_eq!(
        kernel.count(|c| matches!(c, KernelCall::Admit | KernelCall::Open | KernelCall::List)),
        0
    );
    assert!(!log.ran());
    let ends = kernel.turn_ends();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].status, ExecutionStatus::Denied);
    assert_eq!(ends[0].reason_code.as_deref(), Some(expected));
}

#[tokio::test(start_paused = true)]
async fn g02_actor_not_agent_is_actor_mismatch() {
    context_denial(
        |v| v["context"]["actor"] = json!({"kind": "agent", "agentId": "agent-mallory"}),
        "actor_mismatch",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn g02_sender_is_free_actor_rule_only() {
    // The alpha.1 rule (sender must equal actor) is not carried over.
    let kernel = TestKernel::new(vec![]);
    let (plugin, _) = ScriptPlugin::new(vec![]);
    let h = executor(&kernel, plugin, 0);
    let r = h
        .run(request_with(&[], |v| {
            v["message"]["sender"] = json!({"kind": "service", "serviceId": "x"})
        }))
        .await;
    assert_eq!(r.status, ExecutionStatus::Succeeded);
}

#[tokio::test(start_paused = true)]
async fn g03_receiver_not_agent_is_receiver_mismatch() {
    context_denial(
        |v| v["message"]["receiver"] = json!({"kind": "agent", "agentId": "agent-bob"}),
        "receiver_mismatch",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn g04_message_trace_or_purpose_differs_is_message_context_mismatch() {
    context_denial(
        |v| v["message"]["traceId"] = json!("trace-other"),
        "message_context_mismatch",
    )
    .await;
    context_denial(
        |v| v["message"]["purpose"] = json!("another purpose"),
        "message_context_mismatch",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn g05_admission_refused_is_denied_with_its_code() {
    let kernel = TestKernel::new(vec![read_tool("files.read")]);
    *lock(&kernel.admission) = Admission::refused("no_matching_grant");
    let (plugin, log) = ScriptPlugin::new(vec![]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(request(&["files.read"])).await;
    assert_eq!(r.status, ExecutionStatus::Denied);
    assert_eq!(code(&r), "no_matching_grant");
    assert_eq!(r.retryable(), Some(false));
    assert_eq!(
        r.error.as_ref().unwrap().message.as_str(),
        "The access context does not grant permission to invoke this agent."
    );
    assert_eq!(types(&r), ["turn.denied"]);
    assert_eq!(r.events[0].data, json!({"code": "no_matching_grant"}));
    assert!(!log.ran());
    assert_eq!(kernel.count(|c| matches!(c, KernelCall::List)), 0);
    assert_eq!(r.metadata.get("runtime"), Some(&expected_runtime()));
    assert_eq!(
        kernel.turn_ends()[0].reason_code.as_deref(),
        Some("no_matching_grant")
    );
    assert_eq!(
        kernel.live_leases(),
        0,
        "the lease is released on a refusal"
    );
}

/// G6: the real kernel whose grant store throws. The kernel answers the
/// admission `authority_unavailable` (recorded fail-closed), the envelope
/// turns that into `denied`, and the runtime is never opened.
#[tokio::test]
async fn g06_authority_unavailable_at_admission_never_opens_the_runtime() {
    struct Throws;
    #[async_trait::async_trait]
    impl sharedos_kernel::GrantSource for Throws {
        async fn load(
            &self,
            _: &sharedos_protocol::AccessContext,
        ) -> Result<Vec<sharedos_kernel::Grant>, String> {
            Err("grant store unreachable".into())
        }
    }
    let audit = Arc::new(sharedos_kernel::MemoryAuditSink::new());
    let kernel =
        Arc::new(sharedos_kernel::Kernel::builder(Arc::new(Throws), audit.clone()).build());
    let (plugin, log) = ScriptPlugin::new(vec![]);
    let (opts, turn_errors) = options(0);
    let h = Harness {
        executor: Executor::new(kernel, Seat::in_process(plugin), opts).unwrap(),
        turn_errors,
    };
    let r = h.run(request(&["files.read"])).await;
    assert_eq!(r.status, ExecutionStatus::Denied);
    assert_eq!(code(&r), "authority_unavailable");
    assert!(!log.ran());
    let records = audit.records();
    let admission = records
        .iter()
        .find(|r| r.kind == "authorization.checked")
        .expect("the admission decision is recorded");
    assert_eq!(admission.reason.as_deref(), Some("authority_unavailable"));
    let text = serde_json::to_string(&r).unwrap();
    assert!(
        !text.contains("grant store unreachable"),
        "the cause stays in the audit"
    );
}

/// G6, the other shape: the authority load itself fails (a non-audit
/// kernel failure). The envelope fails closed without opening the runtime.
#[tokio::test(start_paused = true)]
async fn g06_authority_load_failure_fails_closed() {
    let kernel = TestKernel::new(vec![read_tool("files.read")]);
    *lock(&kernel.open_error) = Some(KernelError::Failed("grant store threw".into()));
    let (plugin, log) = ScriptPlugin::new(vec![]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(request(&["files.read"])).await;
    assert_eq!(r.status, ExecutionStatus::Failed);
    assert_eq!(code(&r), "runtime_failed");
    assert!(!log.ran());
    assert_eq!(kernel.count(|c| matches!(c, KernelCall::Admit)), 0);
    let text = serde_json::to_string(&r).unwrap();
    assert!(!text.contains("grant store threw"));
}

#[tokio::test(start_paused = true)]
async fn g07_host_signal_already_aborted_is_cancelled_without_events() {
    let kernel = TestKernel::new(vec![read_tool("files.read")]);
    let (plugin, log) = ScriptPlugin::new(vec![]);
    let h = executor(&kernel, plugin, 0);
    let cancel = CancellationToken::new();
    cancel.cancel();
    let r = h
        .executor
        .execute(
            request(&["files.read"]),
            ExecuteOptions {
                cancel: Some(cancel),
                on_event: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(code(&r), "turn_cancelled");
    assert_eq!(r.retryable(), Some(true));
    assert!(r.events.is_empty());
    assert!(!log.ran());
    assert_eq!(kernel.count(|c| matches!(c, KernelCall::Open)), 0);
    assert_eq!(r.metadata.get("runtime"), Some(&expected_runtime()));
    settle().await;
    assert_eq!(alive_tasks(), 0, "no timer outlives the turn");
}

#[tokio::test(start_paused = true)]
async fn g08_listing_never_resolves_is_cancelled_at_the_deadline() {
    let kernel = TestKernel::new(vec![read_tool("files.read")]);
    *lock(&kernel.listing_hangs) = true;
    let (plugin, log) = ScriptPlugin::new(vec![]);
    let h = executor(&kernel, plugin, 0);
    let (r, took) = timed(
        &h,
        request_with(&["files.read"], |v| v["options"] = json!({"timeoutMs": 5})),
    )
    .await;
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(code(&r), "turn_cancelled");
    assert!(took <= 5, "ended at {took} ms");
    assert!(!log.ran());
    assert_eq!(last_event(&r), ("turn.cancelled".into(), json!({})));
    assert_eq!(r.retryable(), Some(true));
    assert!(h.turn_errors().is_empty());
}

/// Nearest equivalent of G9 (the real kernel's lease and grant store are
/// tested with the kernel): a turn cancelled while its authority load is
/// pending abandons the load and holds no lease; the next turn loads again.
#[tokio::test(start_paused = true)]
async fn g09_abandoned_authority_load_is_released_and_reloaded_next_turn() {
    let kernel = TestKernel::new(vec![read_tool("files.read")]);
    *lock(&kernel.open_hangs) = true;
    let (plugin, _) = ScriptPlugin::new(vec![]);
    let h = executor(&kernel, plugin, 0);
    let cancel = CancellationToken::new();
    let run = h.executor.execute(
        request(&["files.read"]),
        ExecuteOptions {
            cancel: Some(cancel.clone()),
            on_event: None,
        },
    );
    let cancel_soon = async {
        tokio::time::sleep(ms(10)).await;
        cancel.cancel();
    };
    let (r, ()) = tokio::join!(run, cancel_soon);
    let r = r.unwrap();
    assert_eq!(r.status, ExecutionStatus::Cancelled);

    // The store is "revoked" before the next turn: the next turn is decided
    // on a fresh load.
    *lock(&kernel.open_hangs) = false;
    *lock(&kernel.admission) = Admission::refused("no_matching_grant");
    let r = h.run(request(&["files.read"])).await;
    assert_eq!(r.status, ExecutionStatus::Denied);
    assert_eq!(code(&r), "no_matching_grant");
    assert_eq!(kernel.loads.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(kernel.live_leases(), 0);
}
