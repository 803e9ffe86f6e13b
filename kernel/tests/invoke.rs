//! The check order of `invoke_tool` (envelope.md C.1), the grant model at
//! the ports (C.2), and the kernel's part of G 84–94 and F1–F27.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use sharedos_kernel::{
    AuditOutcome, AuditSource, GrantSource, Kernel, KernelError, MemoryAuditSink, RefusedCall,
    Scope, TurnEnd, TurnKernel, UsageStore, catalog_hash,
};
use sharedos_protocol::{AccessContext, ExecutionStatus, ReachResult, Reason, ToolStatus, ident};
use tokio_util::sync::CancellationToken;

fn code(r: &sharedos_protocol::ToolResult) -> Option<&str> {
    r.error().map(|e| e.code.as_str())
}

async fn invoke(
    f: &Fixture,
    ctx: &AccessContext,
    id: &str,
    record: &str,
) -> sharedos_protocol::ToolResult {
    let turn = f.kernel.open_turn(ctx).await.unwrap();
    turn.invoke_tool(
        ctx,
        &call(id, "test.records", json!({"record": record})),
        CancellationToken::new(),
    )
    .await
    .unwrap()
}

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
        !serde_json::to_string(&f.sink.records())
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
    assert!(f.sink.types().iter().all(|t| t != "authorization.checked"));
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
    let records = f.sink.records();
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
    let records = f.sink.records();
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

#[tokio::test]
async fn f5_f8_expiry_is_checked_at_each_operations_now() {
    let mut timed = records_grant("timed", &["r1"], Scope::Exact);
    timed.expires_at = Some(sharedos_protocol::Timestamp::parse("2026-10-01T12:00:30Z").unwrap());
    let f = fixture(
        Script::Echo,
        vec![records_grant("control", &["r0"], Scope::Exact), timed],
    );
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    let first = turn
        .invoke_tool(
            &ctx,
            &call("c1", "test.records", json!({"record": "r1"})),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(first.status(), ToolStatus::Succeeded);
    let later = at(&ctx, "2026-10-01T12:01:00Z");
    let second = turn
        .invoke_tool(
            &later,
            &call("c2", "test.records", json!({"record": "r1"})),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(code(&second), Some("no_matching_grant"));
    let control = turn
        .invoke_tool(
            &later,
            &call("c3", "test.records", json!({"record": "r0"})),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(control.status(), ToolStatus::Succeeded);
    // Not yet valid.
    let mut early = records_grant("early", &["r2"], Scope::Exact);
    early.not_before = Some(sharedos_protocol::Timestamp::parse("2026-10-02T00:00:00Z").unwrap());
    let f = fixture(
        Script::Echo,
        vec![records_grant("control", &["r0"], Scope::Exact), early],
    );
    assert_eq!(
        code(&invoke(&f, &ctx, "c4", "r2").await),
        Some("no_matching_grant")
    );
}

#[tokio::test]
async fn purposes_constrain_a_grant() {
    let mut g = records_grant("g1", &["r1"], Scope::Exact);
    g.constraints = Some(sharedos_kernel::GrantConstraints {
        purposes: Some(vec![sharedos_protocol::Purpose::new("billing").unwrap()]),
    });
    let f = fixture(
        Script::Echo,
        vec![records_grant("control", &["r0"], Scope::Exact), g],
    );
    assert_eq!(
        code(&invoke(&f, &context("alice"), "c1", "r1").await),
        Some("no_matching_grant")
    );
}

#[tokio::test]
async fn f6_f7_revocation_takes_effect_at_the_next_turn() {
    let f = fixture(
        Script::Echo,
        vec![records_grant("g1", &["r1"], Scope::Descendants)],
    );
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    let c1 = call("c1", "test.records", json!({"record": "r1"}));
    assert_eq!(
        turn.invoke_tool(&ctx, &c1, CancellationToken::new())
            .await
            .unwrap()
            .status(),
        ToolStatus::Succeeded
    );
    assert!(f.grants.revoke("g1"));
    // Turn 1 holds its authority.
    let c2 = call("c2", "test.records", json!({"record": "r1"}));
    assert_eq!(
        turn.invoke_tool(&ctx, &c2, CancellationToken::new())
            .await
            .unwrap()
            .status(),
        ToolStatus::Succeeded
    );
    // Turn 2 does not.
    let turn2 = f.kernel.open_turn(&ctx).await.unwrap();
    let r = turn2
        .invoke_tool(
            &ctx,
            &call("c3", "test.records", json!({"record": "r1"})),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(r.status(), ToolStatus::Denied);
    assert!(matches!(
        code(&r),
        Some("no_matching_grant" | "tool_unavailable")
    ));
}

struct DownStore;

#[async_trait::async_trait]
impl UsageStore for DownStore {
    async fn try_consume(&self, _: &str, _: u64) -> Result<bool, String> {
        Err("counter down".into())
    }
    async fn remaining(&self, _: &str, _: u64) -> Result<u64, String> {
        Err("counter down".into())
    }
}

#[tokio::test]
async fn f11_a_down_usage_store_refuses_bounded_grants_only() {
    let mut bounded = records_grant("bounded", &["r1"], Scope::Exact);
    bounded.max_uses = Some(5);
    let sink = Arc::new(MemoryAuditSink::new());
    let tool = ScriptedTool::new(Script::Echo);
    let kernel = Kernel::builder(
        Arc::new(sharedos_kernel::ConfigGrantSource::new(vec![
            bounded,
            records_grant("free", &["r0"], Scope::Exact),
        ])),
        sink.clone(),
    )
    .usage_store(Arc::new(DownStore))
    .tool(
        scripted_definition("test.records", sharedos_protocol::ReadWrite::Read),
        tool.clone(),
    )
    .unwrap()
    .build();
    let ctx = context("alice");
    let turn = kernel.open_turn(&ctx).await.unwrap();
    let r = turn
        .invoke_tool(
            &ctx,
            &call("c1", "test.records", json!({"record": "r1"})),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(code(&r), Some("usage_store_unavailable"));
    let r = turn
        .invoke_tool(
            &ctx,
            &call("c2", "test.records", json!({"record": "r0"})),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(r.status(), ToolStatus::Succeeded);
    let checked: Vec<_> = sink
        .records()
        .into_iter()
        .filter(|r| r.kind == "authorization.checked")
        .collect();
    assert_eq!(checked[0].fail_closed, Some(true));
    assert_eq!(tool.calls(), 1);
}

struct DownSource;

#[async_trait::async_trait]
impl GrantSource for DownSource {
    async fn load(&self, _: &AccessContext) -> Result<Vec<sharedos_kernel::Grant>, String> {
        Err("store unreachable".into())
    }
}

#[tokio::test]
async fn g6_f12_a_down_grant_source_denies_the_turn_authority_unavailable() {
    let sink = Arc::new(MemoryAuditSink::new());
    let kernel = Kernel::builder(Arc::new(DownSource), sink.clone())
        .tool(
            scripted_definition("test.records", sharedos_protocol::ReadWrite::Read),
            ScriptedTool::new(Script::Echo),
        )
        .unwrap()
        .build();
    let ctx = context("alice");
    let turn = kernel.open_turn(&ctx).await.unwrap();
    let admission = turn.admit(&ctx, &agent("alice")).await.unwrap();
    assert_eq!(
        admission.reason_code.as_deref(),
        Some("authority_unavailable")
    );
    assert!(turn.list_tools(&ctx).await.unwrap().is_empty());
    assert_eq!(
        turn.reach(&ctx).await.unwrap(),
        ReachResult::Unavailable {
            reason_code: ident("authority_unavailable")
        }
    );
    let r = turn
        .invoke_tool(
            &ctx,
            &call("c1", "test.records", json!({"record": "x"})),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(code(&r), Some("authority_unavailable"));
    let records = sink.records();
    assert_eq!(records[0].kind, "authority.resolved");
    assert_eq!(records[0].cause.as_deref(), Some("grant_source_failed"));
    assert!(
        !serde_json::to_string(&records)
            .unwrap()
            .contains("store unreachable")
    );
    let listed = records
        .iter()
        .find(|r| r.kind == "tool.catalog.listed")
        .unwrap();
    assert_eq!(listed.outcome, AuditOutcome::Denied);
    assert_eq!(listed.fail_closed, Some(true));
}

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
            .any(|t| t.name == sharedos_kernel::ESCALATE_TOOL)
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
    let r = f.sink.records();
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
    let last = f.sink.records().pop().unwrap();
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
        f.sink.records().pop().unwrap().outcome,
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
    let before = f.sink.records().len();
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
    assert_eq!(f.sink.records().len(), before);
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
    let last = f.sink.records().pop().unwrap();
    assert_eq!(
        (last.outcome, last.reason.as_deref()),
        (AuditOutcome::Interrupted, Some("audit_unavailable"))
    );
}

#[tokio::test]
async fn f22_a_turn_keeps_the_registry_it_started_with() {
    let f = fixture(
        Script::Echo,
        vec![grant(
            "all",
            "alice",
            vec![cap("records", &[], Scope::Descendants, &["*"])],
        )],
    );
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    f.kernel
        .register(
            scripted_definition("test.late", sharedos_protocol::ReadWrite::Read),
            ScriptedTool::new(Script::Echo),
        )
        .unwrap();
    let c = call("c1", "test.late", json!({"record": "x"}));
    let r = turn
        .invoke_tool(&ctx, &c, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(code(&r), Some("tool_unavailable"));
    let turn2 = f.kernel.open_turn(&ctx).await.unwrap();
    let r = turn2
        .invoke_tool(&ctx, &c, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(r.status(), ToolStatus::Succeeded);
}

#[tokio::test]
async fn reach_describes_scope_without_grant_identity() {
    let f = fixture(
        Script::Echo,
        vec![records_grant("g1", &["a"], Scope::Descendants)],
    );
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    let reach = serde_json::to_value(turn.reach(&ctx).await.unwrap()).unwrap();
    assert_eq!(
        reach,
        json!({"status": "computed", "reach": [{"namespace": "records", "path": ["a"], "actions": ["read"], "scope": "descendants"}]})
    );
}

#[tokio::test]
async fn grants_of_another_subject_issuer_or_namespace_never_apply() {
    let mut other_issuer = records_grant("i", &[], Scope::Descendants);
    other_issuer.issuer = agent("alice");
    let mut other_ns = records_grant("n", &[], Scope::Descendants);
    other_ns.namespace_id = ident("tenant-2");
    let bobs = grant(
        "b",
        "bob",
        vec![cap("records", &[], Scope::Descendants, &["*"])],
    );
    let f = fixture(Script::Echo, vec![other_issuer, other_ns, bobs]);
    let r = invoke(&f, &context("alice"), "c1", "x").await;
    assert_eq!(code(&r), Some("tool_unavailable"));
}

/// A chain host -> olivia (root) -> alice (child), as the context sees it:
/// alice acts under olivia's authority.
fn delegated(
    child_caps: Vec<sharedos_kernel::Capability>,
) -> (Vec<sharedos_kernel::Grant>, AccessContext) {
    let mut root = grant(
        "root",
        "x",
        vec![cap("records", &["a"], Scope::Descendants, &["read"])],
    );
    root.subject = owner();
    let mut child = grant("child", "alice", child_caps);
    child.issuer = owner();
    child.parent_grant_id = Some(ident("root"));
    let mut ctx = context("alice");
    ctx.authority = owner();
    (vec![root, child], ctx)
}

#[tokio::test]
async fn f19_a_delegated_grant_within_its_parent_is_honoured() {
    let (grants, ctx) = delegated(vec![cap(
        "records",
        &["a", "b"],
        Scope::Descendants,
        &["read"],
    )]);
    let f = fixture(Script::Echo, grants);
    assert_eq!(
        invoke(&f, &ctx, "c1", "a").await.status(),
        ToolStatus::Denied,
        "outside the child"
    );
    let tool = ScriptedTool::new(Script::Echo);
    *tool.resolve.lock().unwrap() = Some(requirement("records", &["a", "b", "c"], "read", None));
    let (grants, ctx) = delegated(vec![cap(
        "records",
        &["a", "b"],
        Scope::Descendants,
        &["read"],
    )]);
    let f = fixture_with(tool, grants);
    assert_eq!(
        invoke(&f, &ctx, "c2", "x").await.status(),
        ToolStatus::Succeeded
    );
}

#[tokio::test]
async fn f19_a_child_claiming_more_than_its_parent_is_delegation_chain_invalid() {
    for over in [
        cap("records", &["a"], Scope::Descendants, &["read", "write"]),
        cap("records", &[], Scope::Descendants, &["read"]),
        cap("records", &["a"], Scope::Descendants, &["*"]),
    ] {
        let tool = ScriptedTool::new(Script::Echo);
        *tool.resolve.lock().unwrap() = Some(requirement("records", &["a", "z"], "read", None));
        let (grants, ctx) = delegated(vec![over]);
        let f = fixture_with(tool, grants);
        let turn = f.kernel.open_turn(&ctx).await.unwrap();
        // With a control grant keeping the tool discoverable, the exact check decides.
        let r = turn
            .invoke_tool(
                &ctx,
                &call("c1", "test.records", json!({"record": "x"})),
                CancellationToken::new(),
            )
            .await
            .unwrap();
        assert_eq!(r.status(), ToolStatus::Denied);
        assert!(
            matches!(
                code(&r),
                Some("delegation_chain_invalid" | "tool_unavailable")
            ),
            "{r:?}"
        );
        assert_eq!(f.tool.calls(), 0);
        let checked: Vec<_> = f
            .sink
            .records()
            .into_iter()
            .filter(|r| r.kind == "authorization.checked")
            .collect();
        assert_eq!(
            checked[0].reason.as_deref(),
            Some("delegation_chain_invalid")
        );
    }
}

#[tokio::test]
async fn f6_revoking_an_ancestor_denies_the_delegated_grant_from_the_next_turn() {
    let tool = ScriptedTool::new(Script::Echo);
    *tool.resolve.lock().unwrap() = Some(requirement("records", &["a", "b"], "read", None));
    let (grants, ctx) = delegated(vec![cap("records", &["a"], Scope::Descendants, &["read"])]);
    let f = fixture_with(tool, grants);
    assert_eq!(
        invoke(&f, &ctx, "c1", "x").await.status(),
        ToolStatus::Succeeded
    );
    f.grants.revoke("root");
    let r = invoke(&f, &ctx, "c2", "x").await;
    assert_eq!(r.status(), ToolStatus::Denied);
    assert!(matches!(
        code(&r),
        Some("delegation_chain_invalid" | "tool_unavailable" | "no_matching_grant")
    ));
    assert_eq!(f.tool.calls(), 1);
}

struct OrphanSource(Vec<sharedos_kernel::Grant>);

#[async_trait::async_trait]
impl GrantSource for OrphanSource {
    async fn load(&self, _: &AccessContext) -> Result<Vec<sharedos_kernel::Grant>, String> {
        Ok(self.0.clone())
    }
}

#[tokio::test]
async fn a_parent_the_source_does_not_hand_over_is_delegation_chain_unverified() {
    let (mut grants, ctx) = delegated(vec![cap("records", &["a"], Scope::Descendants, &["read"])]);
    grants.remove(0);
    let sink = Arc::new(MemoryAuditSink::new());
    let kernel = Kernel::builder(Arc::new(OrphanSource(grants)), sink.clone())
        .tool(
            scripted_definition("test.records", sharedos_protocol::ReadWrite::Read),
            ScriptedTool::new(Script::Echo),
        )
        .unwrap()
        .build();
    let turn = kernel.open_turn(&ctx).await.unwrap();
    let r = turn
        .invoke_tool(
            &ctx,
            &call("c1", "test.records", json!({"record": "a"})),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(code(&r), Some("tool_unavailable"));
    let checked: Vec<_> = sink
        .records()
        .into_iter()
        .filter(|r| r.kind == "authorization.checked")
        .collect();
    assert_eq!(
        checked[0].reason.as_deref(),
        Some("delegation_chain_unverified")
    );
    assert_eq!(checked[0].fail_closed, Some(true));
}

#[tokio::test]
async fn an_output_outside_the_declared_output_schema_is_invalid_tool_result() {
    let sink = Arc::new(MemoryAuditSink::new());
    let mut def = scripted_definition("test.records", sharedos_protocol::ReadWrite::Read);
    def.output_schema =
        Some(serde_json::from_value(json!({"type": "object", "required": ["rows"]})).unwrap());
    let kernel = Kernel::builder(
        Arc::new(sharedos_kernel::ConfigGrantSource::new(vec![
            records_grant("g1", &[], Scope::Descendants),
        ])),
        sink,
    )
    .tool(def, ScriptedTool::new(Script::Echo))
    .unwrap()
    .build();
    let ctx = context("alice");
    let turn = kernel.open_turn(&ctx).await.unwrap();
    let r = turn
        .invoke_tool(
            &ctx,
            &call("c1", "test.records", json!({"record": "x"})),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(code(&r), Some("invalid_tool_result"));
}
