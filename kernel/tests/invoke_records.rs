//! What the kernel hands out and records for a call: no grant material,
//! escalations, allowed, denied and refused calls, turn ends, aborted
//! handlers and nested audit outages.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use sharedos_kernel::{
    AuditOutcome, AuditSource, KernelError, RefusedCall, Scope, TurnEnd, TurnKernel, catalog_hash,
};
use sharedos_protocol::{ExecutionStatus, ReachResult, Reason, ToolStatus, ident};
use tokio_util::sync::CancellationToken;

fn grant_keys(v: &Value, found: &mut Vec<String>) {
    const KEYS: [&str; 9] = [
        "grant",
        "grants",
        "grantId",
        "grantSource",
        "parentGrantId",
        "capabilities",
        "delegationDepth",
        "issuer",
        "revokedAt",
    ];
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                if KEYS.contains(&k.as_str()) {
                    found.push(k.clone());
                }
                grant_keys(v, found);
            }
        }
        Value::Array(a) => a.iter().for_each(|v| grant_keys(v, found)),
        _ => {}
    }
}

#[tokio::test]
async fn f18_nothing_the_kernel_hands_out_carries_grant_material() {
    let mut g = records_grant("secret-grant-id-77", &[], Scope::Descendants);
    g.max_uses = Some(10);
    let esc = grant(
        "esc-grant-id-88",
        "alice",
        vec![cap("sharedos.escalation", &[], Scope::Descendants, &["*"])],
    );
    let f = fixture(Script::Echo, vec![g, esc, admission("alice")]);
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    let tools = turn.list_tools(&ctx).await.unwrap();
    let reach = turn.reach(&ctx).await.unwrap();
    let ok = turn
        .invoke_tool(
            &ctx,
            &call("c1", "test.records", json!({"record": "x"})),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let denied = turn
        .invoke_tool(
            &ctx,
            &call("c2", "test.records", json!({})),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let escalation = turn
        .record_escalation(&ctx, &ident("exec-1"), &Reason::new("need more").unwrap())
        .await
        .unwrap();
    let handed = json!({"tools": tools, "reach": reach, "ok": ok, "denied": denied, "escalation": escalation});
    let mut found = vec![];
    grant_keys(&handed, &mut found);
    assert!(found.is_empty(), "grant material reachable: {found:?}");
    let text = handed.to_string();
    assert!(!text.contains("secret-grant-id-77") && !text.contains("esc-grant-id-88"));
    assert!(matches!(reach, ReachResult::Computed { ref reach } if !reach.is_empty()));
}

#[tokio::test]
async fn g36_f23_an_escalation_is_recorded_and_grants_nothing() {
    let f = fixture(Script::Echo, vec![admission("alice")]);
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    let e = turn
        .record_escalation(
            &ctx,
            &ident("exec-1"),
            &Reason::new("need the vault").unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(e.reviewer, owner());
    assert_eq!(e.requested_at, ctx.now);
    assert_eq!(serde_json::to_value(e.status).unwrap(), json!("pending"));
    let recs: Vec<_> = f
        .sink
        .inner()
        .records()
        .into_iter()
        .filter(|r| r.kind == "escalation.requested")
        .collect();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].outcome, AuditOutcome::Escalated);
    assert_eq!(recs[0].reason.as_deref(), Some("escalation_requested"));
    let m = recs[0].metadata.clone().unwrap();
    assert_eq!(m["reviewerAssumed"], json!(true));
    assert_eq!(m["resolution"], json!("pending"));
    assert_eq!(m["reviewer"], serde_json::to_value(owner()).unwrap());
    // Nothing was granted: a tool still needs its grant.
    let r = turn
        .invoke_tool(
            &ctx,
            &call("c1", "test.records", json!({"record": "x"})),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(code(&r), Some("tool_unavailable"));
}

#[tokio::test]
async fn g39_g104_the_escalate_affordance_is_granted_and_never_terminates_by_call() {
    let esc = grant(
        "esc",
        "alice",
        vec![cap("sharedos.escalation", &[], Scope::Exact, &["request"])],
    );
    let f = fixture(Script::Echo, vec![esc]);
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    let listed = turn.list_tools(&ctx).await.unwrap();
    assert!(
        listed
            .iter()
            .any(|t| t.name == sharedos_protocol::ESCALATE_TOOL)
    );
    let c = call("c1", "sharedos.escalate", json!({"reason": "please"}));
    let r = turn
        .invoke_tool(&ctx, &c, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.status(), ToolStatus::Failed);
    assert_eq!(code(&r), Some("escalation_not_terminated"));
    // Without the grant it is neither offered nor callable.
    let f = fixture(Script::Echo, vec![admission("alice")]);
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    assert!(
        turn.list_tools(&ctx)
            .await
            .unwrap()
            .iter()
            .all(|t| t.name != "sharedos.escalate")
    );
    let r = turn
        .invoke_tool(&ctx, &c, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(code(&r), Some("tool_unavailable"));
}

#[tokio::test]
async fn f27_allowed_kernel_denied_and_envelope_refused_calls_are_all_recorded() {
    let f = fixture(
        Script::Echo,
        vec![records_grant("g1", &["ok"], Scope::Exact)],
    );
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    let listed = turn.list_tools(&ctx).await.unwrap();
    let hash = catalog_hash(&listed);
    turn.invoke_tool(
        &ctx,
        &call("c1", "test.records", json!({"record": "ok"})),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    turn.invoke_tool(
        &ctx,
        &call("c2", "test.records", json!({"record": "no"})),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    turn.record_refused_call(
        &ctx,
        RefusedCall {
            call_id: ident("c3"),
            tool: ident("files.delete"),
            reason_code: "tool_unavailable".into(),
            cause: Some("not_offered".into()),
        },
    )
    .await
    .unwrap();
    let invoked: Vec<_> = f
        .sink
        .inner()
        .records()
        .into_iter()
        .filter(|r| r.kind == "tool.invoked")
        .collect();
    let summary: Vec<_> = invoked
        .iter()
        .map(|r| {
            (
                r.operation_id.clone().unwrap(),
                r.outcome,
                r.source,
                r.reason.clone(),
                r.cause.clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "c1".into(),
                AuditOutcome::Succeeded,
                AuditSource::Kernel,
                None,
                None
            ),
            (
                "c2".into(),
                AuditOutcome::Denied,
                AuditSource::Kernel,
                Some("no_matching_grant".into()),
                None
            ),
            (
                "c3".into(),
                AuditOutcome::Denied,
                AuditSource::Envelope,
                Some("tool_unavailable".into()),
                Some("not_offered".into())
            ),
        ]
    );
    for r in &invoked {
        assert_eq!(r.metadata.as_ref().unwrap()["catalogHash"], json!(hash));
    }
}

#[tokio::test]
async fn turn_end_records_cancelled_as_failed_turn_cancelled_and_marks_fail_closed() {
    let f = fixture(Script::Echo, vec![]);
    let ctx = context("alice");
    let end = |status, reason: Option<&str>, by: Option<&str>| TurnEnd {
        execution_id: ident("exec-1"),
        status,
        reason_code: reason.map(str::to_owned),
        ended_by: by.map(str::to_owned),
    };
    f.kernel
        .record_turn_end(&ctx, end(ExecutionStatus::Cancelled, None, None))
        .await
        .unwrap();
    f.kernel
        .record_turn_end(
            &ctx,
            end(
                ExecutionStatus::Failed,
                Some("audit_unavailable"),
                Some("envelope"),
            ),
        )
        .await
        .unwrap();
    f.kernel
        .record_turn_end(&ctx, end(ExecutionStatus::Succeeded, None, None))
        .await
        .unwrap();
    let r = f.sink.inner().records();
    assert_eq!(
        (r[0].outcome, r[0].reason.as_deref()),
        (AuditOutcome::Failed, Some("turn_cancelled"))
    );
    assert_eq!(r[0].operation_id.as_deref(), Some("exec-1"));
    assert_eq!(
        (r[1].ended_by.as_deref(), r[1].fail_closed),
        (Some("envelope"), Some(true))
    );
    assert_eq!(
        (r[2].outcome, r[2].reason.as_deref()),
        (AuditOutcome::Succeeded, None)
    );
}

#[tokio::test]
async fn an_aborted_handler_is_recorded_interrupted_and_rejects() {
    let f = fixture(
        Script::Sleep {
            ms: 10_000,
            ignore_abort: false,
        },
        vec![records_grant("g1", &[], Scope::Descendants)],
    );
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    let abort = CancellationToken::new();
    let trigger = abort.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        trigger.cancel();
    });
    let err = turn
        .invoke_tool(
            &ctx,
            &call("c1", "test.records", json!({"record": "x"})),
            abort,
        )
        .await;
    assert_eq!(err, Err(KernelError::Interrupted));
    let last = f.sink.inner().records().pop().unwrap();
    assert_eq!(
        (last.kind.as_str(), last.outcome),
        ("tool.invoked", AuditOutcome::Interrupted)
    );
    assert_eq!(last.reason.as_deref(), Some("operation_aborted"));
    assert_eq!(last.grant_id.as_deref(), Some("g1"));
}

#[tokio::test]
async fn a_handler_that_answers_despite_the_abort_keeps_its_real_outcome() {
    let f = fixture(
        Script::Sleep {
            ms: 100,
            ignore_abort: true,
        },
        vec![records_grant("g1", &[], Scope::Descendants)],
    );
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    let abort = CancellationToken::new();
    let trigger = abort.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        trigger.cancel();
    });
    let r = turn
        .invoke_tool(
            &ctx,
            &call("c1", "test.records", json!({"record": "x"})),
            abort,
        )
        .await
        .unwrap();
    assert_eq!(r.status(), ToolStatus::Succeeded);
    assert_eq!(
        f.sink.inner().records().pop().unwrap().outcome,
        AuditOutcome::Succeeded
    );
}

// G55, "the outcome is recorded even when the caller stops waiting", is
// owned by the envelope's mediation (it runs each kernel call in a task of
// its own) and tested there with this kernel: host/tests/envelope_outcome.rs.

#[tokio::test]
async fn an_abort_before_the_port_is_entered_writes_nothing() {
    let f = fixture(
        Script::Echo,
        vec![records_grant("g1", &[], Scope::Descendants)],
    );
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    let before = f.sink.inner().records().len();
    let abort = CancellationToken::new();
    abort.cancel();
    let r = turn
        .invoke_tool(
            &ctx,
            &call("c1", "test.records", json!({"record": "x"})),
            abort,
        )
        .await;
    assert_eq!(r, Err(KernelError::Aborted));
    assert_eq!(f.sink.inner().records().len(), before);
    assert_eq!(f.tool.calls(), 0);
}

#[tokio::test]
async fn a_nested_audit_outage_is_interrupted_with_effect_unknown() {
    let f = fixture(
        Script::AuditOutage,
        vec![records_grant("g1", &[], Scope::Descendants)],
    );
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    let r = turn
        .invoke_tool(
            &ctx,
            &call("c1", "test.records", json!({"record": "x"})),
            CancellationToken::new(),
        )
        .await;
    assert!(matches!(
        r,
        Err(KernelError::AuditUnavailable {
            effect: sharedos_kernel::AuditEffect::Unknown,
            ..
        })
    ));
    let last = f.sink.inner().records().pop().unwrap();
    assert_eq!(
        (last.outcome, last.reason.as_deref()),
        (AuditOutcome::Interrupted, Some("audit_unavailable"))
    );
}
