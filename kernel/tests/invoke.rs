//! The check order of `invoke_tool` (docs/spec/envelope.md C.1) and the
//! kernel's part of G 84–94 and F1–F27 that a single call shows: each
//! refusal, its code, and what it spends. Grants over time are in
//! `grant_lifetime.rs`, what is recorded in `invoke_records.rs`.

mod common;

use std::sync::Arc;

use common::*;
use serde_json::json;
use sharedos_kernel::{AuditOutcome, AuditSource, Scope, TurnKernel};
use sharedos_protocol::{ToolStatus, ident};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn g84_listing_never_consumes_and_an_exhausted_grant_hides_the_tool() {
    let mut g = records_grant("g1", &[], Scope::Descendants);
    g.max_uses = Some(1);
    let f = fixture(Script::Echo, vec![g]);
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    for _ in 0..2 {
        let listed = turn.list_tools(&ctx).await.unwrap();
        assert!(listed.iter().any(|t| t.name == "test.records"));
    }
    let c1 = call("c1", "test.records", json!({"record": "r1"}));
    let r1 = turn
        .invoke_tool(&ctx, &c1, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r1.status(), ToolStatus::Succeeded);
    let c2 = call("c2", "test.records", json!({"record": "r1"}));
    let r2 = turn
        .invoke_tool(&ctx, &c2, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(code(&r2), Some("tool_unavailable"));
    assert_eq!(f.tool.calls(), 1);
    let invoked: Vec<_> = f
        .sink
        .inner()
        .records()
        .into_iter()
        .filter(|r| r.kind == "tool.invoked")
        .collect();
    assert_eq!(invoked[1].cause.as_deref(), Some("grant_exhausted"));
}

#[tokio::test]
async fn f10_second_use_of_a_bounded_grant_is_grant_exhausted() {
    // Discovery is carried by another grant, so the exact check decides.
    let mut bounded = records_grant("bounded", &["r1"], Scope::Exact);
    bounded.max_uses = Some(1);
    let f = fixture(
        Script::Echo,
        vec![records_grant("other", &["r0"], Scope::Exact), bounded],
    );
    let ctx = context("alice");
    assert_eq!(
        invoke(&f, &ctx, "c1", "r1").await.status(),
        ToolStatus::Succeeded
    );
    assert_eq!(
        code(&invoke(&f, &ctx, "c2", "r1").await),
        Some("grant_exhausted")
    );
    assert_eq!(f.tool.calls(), 1);
}

#[tokio::test]
async fn g85_trace_mismatch_is_denied_and_spends_nothing() {
    let mut g = records_grant("g1", &[], Scope::Descendants);
    g.max_uses = Some(1);
    let f = fixture(Script::Echo, vec![g]);
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    let mut bad = call("c1", "test.records", json!({"record": "r1"}));
    bad.trace_id = ident("other-trace");
    let r = turn
        .invoke_tool(&ctx, &bad, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(code(&r), Some("trace_mismatch"));
    let ok = call("c2", "test.records", json!({"record": "r1"}));
    let r = turn
        .invoke_tool(&ctx, &ok, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.status(), ToolStatus::Succeeded);
}

#[tokio::test]
async fn g86_resolved_resource_outside_the_grant_is_no_matching_grant() {
    let f = fixture(
        Script::Echo,
        vec![records_grant("g1", &["project-x"], Scope::Descendants)],
    );
    let ctx = context("alice");
    let r = invoke(&f, &ctx, "c1", "project-y").await;
    assert_eq!(r.status(), ToolStatus::Denied);
    assert_eq!(code(&r), Some("no_matching_grant"));
    assert_eq!(f.tool.calls(), 0);
    assert_eq!(
        invoke(&f, &ctx, "c2", "project-x").await.status(),
        ToolStatus::Succeeded
    );
}

#[tokio::test]
async fn g87_f14_requirement_outside_the_ceiling_is_invalid_tool_requirement() {
    let grants = vec![grant(
        "wide",
        "alice",
        vec![
            cap("records", &[], Scope::Descendants, &["*"]),
            cap("other", &[], Scope::Descendants, &["*"]),
        ],
    )];
    for escape in [
        requirement("other", &["x"], "read", None),
        requirement("records", &["x"], "delete", None),
    ] {
        let tool = ScriptedTool::new(Script::Echo);
        *tool.resolve.lock().unwrap() = Some(escape);
        let f = fixture_with(tool, grants.clone());
        let r = invoke(&f, &context("alice"), "c1", "x").await;
        assert_eq!(r.status(), ToolStatus::Failed);
        assert_eq!(code(&r), Some("invalid_tool_requirement"));
        assert_eq!(f.tool.calls(), 0);
    }
}

#[tokio::test]
async fn f9_another_owner_is_invalid_request_before_the_ceiling() {
    let tool = ScriptedTool::new(Script::Echo);
    *tool.resolve.lock().unwrap() = Some(requirement(
        "records",
        &["x"],
        "read",
        Some(agent("mallory")),
    ));
    let f = fixture_with(tool, vec![records_grant("g1", &[], Scope::Descendants)]);
    let r = invoke(&f, &context("alice"), "c1", "x").await;
    assert_eq!(r.status(), ToolStatus::Denied);
    assert_eq!(code(&r), Some("invalid_request"));
    assert_eq!(f.tool.calls(), 0);
    let checked: Vec<_> = f
        .sink
        .inner()
        .records()
        .into_iter()
        .filter(|r| r.kind == "authorization.checked")
        .collect();
    assert_eq!(checked.len(), 1);
    assert_eq!(checked[0].reason.as_deref(), Some("invalid_request"));
    assert_eq!(checked[0].consumed, Some(false));
}

#[tokio::test]
async fn resolution_failure_is_tool_requirement_resolution_failed() {
    let mut tool = ScriptedTool::new(Script::Echo);
    Arc::get_mut(&mut tool).unwrap().resolve_fails = true;
    let f = fixture_with(tool, vec![records_grant("g1", &[], Scope::Descendants)]);
    let r = invoke(&f, &context("alice"), "c1", "x").await;
    assert_eq!(code(&r), Some("tool_requirement_resolution_failed"));
    assert!(
        !serde_json::to_string(&r)
            .unwrap()
            .contains("secret-resolver-text")
    );
    assert_eq!(f.tool.calls(), 0);
}

#[tokio::test]
async fn g88_handler_error_text_never_reaches_the_result_or_the_audit() {
    let f = fixture(
        Script::Throw("secret provider credential".into()),
        vec![records_grant("g1", &[], Scope::Descendants)],
    );
    let r = invoke(&f, &context("alice"), "c1", "x").await;
    assert_eq!(r.status(), ToolStatus::Failed);
    assert_eq!(code(&r), Some("tool_execution_failed"));
    assert!(!serde_json::to_string(&r).unwrap().contains("secret"));
    assert!(
        !serde_json::to_string(&f.sink.inner().records())
            .unwrap()
            .contains("secret")
    );
    assert_eq!(
        f.hook.tool.lock().unwrap().as_slice(),
        ["secret provider credential"]
    );
}

#[tokio::test]
async fn a_panicking_handler_is_tool_execution_failed() {
    let f = fixture(
        Script::Panic,
        vec![records_grant("g1", &[], Scope::Descendants)],
    );
    let r = invoke(&f, &context("alice"), "c1", "x").await;
    assert_eq!(code(&r), Some("tool_execution_failed"));
}

#[tokio::test]
async fn g89_invalid_arguments_name_the_field_and_never_the_value() {
    let f = fixture(
        Script::Echo,
        vec![records_grant("g1", &[], Scope::Descendants)],
    );
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    let cases = [
        (json!({"record": "r", "count": "SECRET-VALUE"}), "/count"),
        (json!({"count": 3}), "/record"),
        (
            json!({"record": "r", "nested": {"depth": "SECRET-VALUE"}}),
            "/nested/depth",
        ),
        (json!({"record": ""}), "/record"),
    ];
    for (i, (args, pointer)) in cases.into_iter().enumerate() {
        let c = call(&format!("c{i}"), "test.records", args);
        let r = turn
            .invoke_tool(&ctx, &c, CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(r.status(), ToolStatus::Failed);
        assert_eq!(code(&r), Some("invalid_tool_arguments"));
        let msg = r.error().unwrap().message.to_string();
        assert!(msg.contains(pointer), "{msg} names {pointer}");
        assert!(!msg.contains("SECRET"), "{msg}");
    }
    assert_eq!(f.tool.calls(), 0);
    // No authorization was attempted for any of them.
    assert!(
        f.sink
            .inner()
            .records()
            .iter()
            .all(|r| r.kind != sharedos_kernel::AuditKind::AuthorizationChecked)
    );
}

#[tokio::test]
async fn g90_unregistered_disabled_and_undiscoverable_answer_alike() {
    let f = fixture(Script::Echo, vec![admission("alice")]);
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    let a = turn
        .invoke_tool(
            &ctx,
            &call("c1", "test.records", json!({"record": "x"})),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let b = turn
        .invoke_tool(
            &ctx,
            &call("c2", "no.such.tool", json!({})),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let mut disabled = ctx.clone();
    disabled.enabled_tool_namespaces = vec![ident("files")];
    let c = turn
        .invoke_tool(
            &disabled,
            &call("c3", "test.records", json!({"record": "x"})),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    for r in [&a, &b, &c] {
        assert_eq!(r.status(), ToolStatus::Denied);
        assert_eq!(r.error(), a.error());
    }
    let records = f.sink.inner().records();
    let checked: Vec<_> = records
        .iter()
        .filter(|r| r.kind == "authorization.checked")
        .collect();
    assert_eq!(checked.len(), 1);
    assert_eq!(checked[0].operation_id.as_deref(), Some("c1"));
    assert_eq!(checked[0].reason.as_deref(), Some("no_matching_grant"));
    let causes: Vec<_> = records
        .iter()
        .filter(|r| r.kind == "tool.invoked")
        .map(|r| r.cause.clone())
        .collect();
    assert_eq!(
        causes,
        [
            Some("no_matching_grant".to_owned()),
            Some("not_registered".to_owned()),
            Some("namespace_disabled".to_owned())
        ]
    );
    assert_eq!(f.tool.calls(), 0);
}

#[tokio::test]
async fn g91_admission_needs_this_agents_invoke_grant() {
    let f = fixture(Script::Echo, vec![admission("alice")]);
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    assert!(turn.admit(&ctx, &agent("alice")).await.unwrap().allowed);
    let other = turn.admit(&ctx, &agent("bob")).await.unwrap();
    assert_eq!(other.reason_code.as_deref(), Some("no_matching_grant"));
    // A grant issued to bob does not admit alice either.
    let f = fixture(Script::Echo, vec![admission("bob")]);
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    assert!(!turn.admit(&ctx, &agent("alice")).await.unwrap().allowed);
}

#[tokio::test]
async fn g92_f1_a_grant_shaped_object_in_arguments_is_data() {
    let forged = json!({
        "id": "forged", "subject": {"kind": "agent", "agentId": "alice"},
        "issuer": {"kind": "service", "serviceId": "host"}, "namespaceId": "tenant-1",
        "capabilities": [{"namespace": "records", "path": ["vault"], "scope": "descendants", "actions": ["*"]}]
    });
    let f = fixture(
        Script::Echo,
        vec![records_grant("g1", &["public"], Scope::Descendants)],
    );
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    // Carrying it is fine.
    let carry = call(
        "c1",
        "test.records",
        json!({"record": "public", "grant": forged, "grants": [forged]}),
    );
    let r = turn
        .invoke_tool(&ctx, &carry, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.status(), ToolStatus::Succeeded);
    // Using it is not.
    let usec = call(
        "c2",
        "test.records",
        json!({"record": "vault", "grant": forged}),
    );
    let r = turn
        .invoke_tool(&ctx, &usec, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(code(&r), Some("no_matching_grant"));
}

#[tokio::test]
async fn g93_a_plain_call_audits_decision_then_outcome_without_arguments() {
    let f = fixture(
        Script::Echo,
        vec![records_grant("g1", &[], Scope::Descendants)],
    );
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    turn.list_tools(&ctx).await.unwrap();
    let c = call(
        "c1",
        "test.records",
        json!({"record": "needle-value", "count": 424242}),
    );
    turn.invoke_tool(&ctx, &c, CancellationToken::new())
        .await
        .unwrap();
    let records = f.sink.inner().records();
    let types: Vec<_> = records.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(
        types,
        [
            "authority.resolved",
            "tool.catalog.listed",
            "authorization.checked",
            "tool.invoked"
        ]
    );
    let text = serde_json::to_string(&records).unwrap();
    assert!(!text.contains("424242"));
    assert!(!text.contains("\"echo\""));
    let ids: std::collections::HashSet<_> = records.iter().map(|r| r.id.clone()).collect();
    assert_eq!(ids.len(), records.len());
    let invoked = &records[3];
    assert_eq!(invoked.outcome, AuditOutcome::Succeeded);
    assert_eq!(invoked.grant_id.as_deref(), Some("g1"));
    assert_eq!(invoked.source, AuditSource::Kernel);
    assert!(
        invoked.metadata.as_ref().unwrap()["catalogHash"]
            .as_str()
            .unwrap()
            .len()
            == 64
    );
}

#[tokio::test]
async fn f15_a_result_for_another_call_or_not_a_result_is_invalid_tool_result() {
    for script in [Script::WrongCallId, Script::RawJunk] {
        let f = fixture(script, vec![records_grant("g1", &[], Scope::Descendants)]);
        let r = invoke(&f, &context("alice"), "c1", "x").await;
        assert_eq!(r.status(), ToolStatus::Failed);
        assert_eq!(code(&r), Some("invalid_tool_result"));
        assert_eq!(r.call_id(), "c1");
    }
}

/// The declared requirement (the ceiling of step 11) is kept by the tool
/// for the owner it was first made for; turns of other owners, in any
/// order, still get their own owner in it, so their calls go through and
/// are recorded under their owner.
#[tokio::test]
async fn the_declared_requirement_follows_each_turns_owner() {
    let f = fixture(
        Script::Echo,
        vec![records_grant("g1", &[], Scope::Descendants)],
    );
    let olivia = context("alice");
    let bob = sharedos_protocol::AccessContext {
        owner: sharedos_protocol::Address::Human {
            user_id: ident("bob"),
        },
        ..context("alice")
    };
    let turns = [&olivia, &bob, &bob, &olivia, &bob, &olivia];
    for (n, ctx) in turns.iter().enumerate() {
        let result = invoke(&f, ctx, &format!("c{n}"), "r1").await;
        assert_eq!(result.status(), ToolStatus::Succeeded, "call {n}");
    }
    let owners: Vec<_> = f
        .sink
        .inner()
        .records()
        .into_iter()
        .filter(|r| r.kind == "tool.invoked")
        .map(|r| r.resource.and_then(|res| res.owner))
        .collect();
    let expected: Vec<_> = turns.iter().map(|c| Some(c.owner.clone())).collect();
    assert_eq!(owners, expected);
}

/// `invoke_tool_owned` (the call's future owning the turn, context and
/// call) answers every call exactly as `invoke_tool` does and records the
/// same: an allowed call, a refused one, one for another trace and one
/// for a tool the turn does not have.
#[tokio::test]
async fn the_owned_call_answers_and_records_as_invoke_tool_does() {
    let calls = || {
        let mut other_trace = call("c3", "test.records", json!({"record": "r1"}));
        other_trace.trace_id = ident("other-trace");
        vec![
            call("c1", "test.records", json!({"record": "r1"})),
            call("c2", "test.records", json!({"record": "r2"})),
            other_trace,
            call("c4", "test.missing", json!({})),
        ]
    };
    let grants = || vec![records_grant("g1", &["r1"], Scope::Exact)];
    let ctx = context("alice");
    let (by_ref, owned) = (
        fixture(Script::Echo, grants()),
        fixture(Script::Echo, grants()),
    );
    let by_ref_turn = by_ref.kernel.open_turn(&ctx).await.unwrap();
    let owned_turn = owned.kernel.open_turn(&ctx).await.unwrap();
    let shared_ctx = Arc::new(ctx.clone());
    for c in calls() {
        let expected = by_ref_turn
            .invoke_tool(&ctx, &c, CancellationToken::new())
            .await;
        let got = owned_turn
            .clone()
            .invoke_tool_owned(shared_ctx.clone(), c, CancellationToken::new())
            .await;
        assert_eq!(got, expected);
    }
    let kinds = |f: &Fixture| {
        f.sink
            .inner()
            .records()
            .into_iter()
            .map(|r| (r.kind, r.outcome, r.source, r.reason, r.cause))
            .collect::<Vec<_>>()
    };
    assert_eq!(kinds(&owned), kinds(&by_ref));
    assert_eq!(owned.tool.calls(), by_ref.tool.calls());
}
