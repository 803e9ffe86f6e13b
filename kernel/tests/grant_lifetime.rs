//! The grant model at the ports (docs/spec/envelope.md C.2) over time:
//! expiry at each operation's `now`, purposes, revocation, a down usage
//! store or grant source, the registry a turn started with, scope,
//! subjects and delegation chains.

mod common;

use std::sync::Arc;

use common::*;
use serde_json::json;
use sharedos_kernel::{
    AuditOutcome, GrantSource, Kernel, MemoryAuditSink, Scope, TurnKernel, UsageStore,
};
use sharedos_protocol::{AccessContext, ReachResult, ToolStatus, ident};
use tokio_util::sync::CancellationToken;

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
            .inner()
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
