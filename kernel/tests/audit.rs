//! The audit trail: decision path vs outcome path (envelope.md B.10, G
//! 76–83), the JSONL sink's durability and shape.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::*;
use serde_json::json;
use sharedos_kernel::audit::read_jsonl;
use sharedos_kernel::{
    AuditEffect, AuditKind, AuditOutcome, AuditRecord, AuditSink, ConfigGrantSource, HandlerAnswer,
    JsonlAuditSink, Kernel, KernelError, Scope, ToolError, ToolHandler, TurnEnd, TurnKernel,
};
use sharedos_protocol::{
    AccessContext, ExecutionStatus, ReadWrite, ToolCall, ToolResult, ToolStatus, ident,
};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn g76_f13_a_failed_decision_write_refuses_the_call_and_nothing_runs() {
    let f = fixture(
        Script::Echo,
        vec![records_grant("g1", &[], Scope::Descendants)],
    );
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    f.sink
        .fail_on(sharedos_kernel::AuditKind::AuthorizationChecked);
    let r = turn
        .invoke_tool(
            &ctx,
            &call("c1", "test.records", json!({"record": "x"})),
            CancellationToken::new(),
        )
        .await;
    match r {
        Err(KernelError::AuditUnavailable { effect, cause }) => {
            assert_eq!(effect, AuditEffect::None);
            assert!(cause.contains("disk on fire"));
        }
        other => panic!("expected AuditUnavailable, got {other:?}"),
    }
    assert_eq!(f.tool.calls(), 0);
    assert!(
        f.hook.audit.lock().unwrap().is_empty(),
        "decision failures do not go to the hook"
    );
    // Admission is a decision too.
    let r = turn.admit(&ctx, &agent("alice")).await;
    assert!(matches!(
        r,
        Err(KernelError::AuditUnavailable {
            effect: AuditEffect::None,
            ..
        })
    ));
}

#[tokio::test]
async fn g81_a_failed_catalogue_write_refuses_the_listing() {
    let f = fixture(
        Script::Echo,
        vec![records_grant("g1", &[], Scope::Descendants)],
    );
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    f.sink
        .fail_on(sharedos_kernel::AuditKind::ToolCatalogListed);
    assert!(matches!(
        turn.list_tools(&ctx).await,
        Err(KernelError::AuditUnavailable { .. })
    ));
    f.sink
        .fail_on(sharedos_kernel::AuditKind::AuthorityResolved);
    assert!(matches!(
        f.kernel.open_turn(&ctx).await,
        Err(KernelError::AuditUnavailable { .. })
    ));
}

#[tokio::test]
async fn g83_a_failed_outcome_write_goes_to_the_hook_and_changes_nothing() {
    let f = fixture(
        Script::Echo,
        vec![records_grant("g1", &[], Scope::Descendants)],
    );
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    f.sink.fail_on(sharedos_kernel::AuditKind::ToolInvoked);
    f.sink.fail_on(sharedos_kernel::AuditKind::TurnEnded);
    f.sink
        .fail_on(sharedos_kernel::AuditKind::EscalationRequested);
    let r = turn
        .invoke_tool(
            &ctx,
            &call("c1", "test.records", json!({"record": "x"})),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(r.status(), ToolStatus::Succeeded);
    assert_eq!(f.tool.calls(), 1);
    let end = TurnEnd {
        execution_id: ident("e"),
        status: ExecutionStatus::Succeeded,
        reason_code: None,
        ended_by: None,
    };
    assert!(f.kernel.record_turn_end(&ctx, end).await.is_ok());
    let reason = sharedos_protocol::Reason::new("help").unwrap();
    assert!(
        turn.record_escalation(&ctx, &ident("e"), &reason)
            .await
            .is_ok()
    );
    let hooked: Vec<String> = f
        .hook
        .audit
        .lock()
        .unwrap()
        .iter()
        .map(|(k, _)| k.clone())
        .collect();
    assert_eq!(
        hooked,
        ["tool.invoked", "turn.ended", "escalation.requested"]
    );
}

#[tokio::test]
async fn outcome_writes_are_bounded_by_the_timeout_and_decisions_are_not() {
    let sink = Arc::new(FlakySink::default());
    let hook = Arc::new(RecordingHook::default());
    let kernel = Kernel::builder(Arc::new(ConfigGrantSource::new(vec![])), sink.clone())
        .error_hook(hook.clone())
        .audit_write_timeout(Some(Duration::from_millis(20)))
        .build();
    let ctx = context("alice");
    sink.slow_all(Some(Duration::from_millis(150)));
    // Decision path: waits for the slow sink, whatever the timeout.
    let started = Instant::now();
    kernel.open_turn(&ctx).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(150));
    // Outcome path: released at the timeout, the hook told.
    let started = Instant::now();
    let end = TurnEnd {
        execution_id: ident("e"),
        status: ExecutionStatus::Succeeded,
        reason_code: None,
        ended_by: None,
    };
    kernel.record_turn_end(&ctx, end).await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(140));
    let hooked = hook.audit.lock().unwrap().clone();
    assert_eq!(hooked.len(), 1);
    assert!(hooked[0].1.contains("20 ms"));
}

#[tokio::test]
async fn the_jsonl_file_parses_line_by_line_with_unique_ids() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let sink = Arc::new(JsonlAuditSink::open(&path).unwrap());
    let tool = ScriptedTool::new(Script::Echo);
    let kernel = Kernel::builder(
        Arc::new(ConfigGrantSource::new(vec![
            admission("alice"),
            records_grant("g1", &[], Scope::Descendants),
        ])),
        sink,
    )
    .tool(scripted_definition("test.records", ReadWrite::Read), tool)
    .unwrap()
    .build();
    let ctx = context("alice");
    let turn = kernel.open_turn(&ctx).await.unwrap();
    turn.admit(&ctx, &agent("alice")).await.unwrap();
    turn.list_tools(&ctx).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..20 {
        let (t, c) = (turn.clone(), ctx.clone());
        tasks.push(tokio::spawn(async move {
            let call = call(
                &format!("c{i}"),
                "test.records",
                json!({"record": format!("r{i}")}),
            );
            t.invoke_tool(&c, &call, CancellationToken::new())
                .await
                .unwrap()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().status(), ToolStatus::Succeeded);
    }
    let records = read_jsonl(&path).unwrap();
    assert_eq!(records.len(), 3 + 40);
    let ids: std::collections::HashSet<_> = records.iter().map(|r| r.id.clone()).collect();
    assert_eq!(ids.len(), records.len());
    // For every call, its decision precedes its outcome in the file.
    for i in 0..20 {
        let op = format!("c{i}");
        let pos = |kind: &str| {
            records
                .iter()
                .position(|r| r.kind == kind && r.operation_id.as_deref() == Some(&op))
        };
        assert!(pos("authorization.checked").unwrap() < pos("tool.invoked").unwrap());
    }
    // Reopening (a restart) keeps everything and appends after it.
    let sink = JsonlAuditSink::open(&path).unwrap();
    sink.append(&records[0]).await.unwrap();
    assert_eq!(read_jsonl(&path).unwrap().len(), 44);
}

#[test]
fn a_torn_trailing_line_is_cut_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let rec = AuditRecord::new(
        AuditKind::TurnEnded,
        AuditOutcome::Succeeded,
        &context("alice"),
        sharedos_kernel::AuditSource::Envelope,
    );
    let line = serde_json::to_string(&rec).unwrap();
    std::fs::write(&path, format!("{line}\n{}", &line[..line.len() / 2])).unwrap();
    JsonlAuditSink::open(&path).unwrap();
    let records = read_jsonl(&path).unwrap();
    assert_eq!(records, vec![rec]);
}

/// A tool that checks, when it runs, that its decision is already on disk.
struct DiskWitness {
    path: std::path::PathBuf,
}

#[async_trait]
impl ToolHandler for DiskWitness {
    async fn invoke(
        &self,
        context: &AccessContext,
        call: &ToolCall,
        _abort: CancellationToken,
    ) -> Result<HandlerAnswer, ToolError> {
        let records = read_jsonl(&self.path).map_err(ToolError::Failed)?;
        let decided = records.iter().any(|r| {
            r.kind == "authorization.checked"
                && r.operation_id.as_deref() == Some(call.id.as_str())
                && r.outcome == AuditOutcome::Allowed
        });
        Ok(ToolResult::succeeded(
            call,
            json!({"decisionOnDisk": decided}),
            context.now.clone(),
        )
        .into())
    }
}

#[tokio::test]
async fn the_decision_is_on_disk_before_the_effect() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let kernel = Kernel::builder(
        Arc::new(ConfigGrantSource::new(vec![records_grant(
            "g1",
            &[],
            Scope::Descendants,
        )])),
        Arc::new(JsonlAuditSink::open(&path).unwrap()),
    )
    .tool(
        scripted_definition("test.records", ReadWrite::Read),
        Arc::new(DiskWitness { path: path.clone() }),
    )
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
    assert_eq!(r.output(), Some(&json!({"decisionOnDisk": true})));
}

#[tokio::test]
async fn a_full_disk_refuses_decisions_with_audit_unavailable() {
    // /dev/full answers every write with ENOSPC.
    if !std::path::Path::new("/dev/full").exists() {
        return;
    }
    let sink = JsonlAuditSink::open("/dev/full").unwrap();
    let kernel = Kernel::builder(Arc::new(ConfigGrantSource::new(vec![])), Arc::new(sink)).build();
    match kernel.open_turn(&context("alice")).await {
        Err(KernelError::AuditUnavailable {
            effect: AuditEffect::None,
            cause,
        }) => {
            assert!(cause.to_lowercase().contains("space"), "{cause}")
        }
        other => panic!("expected AuditUnavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn g79_an_outage_on_call_2_leaves_call_1_to_be_recorded_interrupted() {
    let f = fixture(
        Script::Sleep {
            ms: 10_000,
            ignore_abort: false,
        },
        vec![records_grant("g1", &[], Scope::Descendants)],
    );
    let f = Arc::new(f);
    let ctx = context("alice");
    let turn = f.kernel.open_turn(&ctx).await.unwrap();
    let hard = CancellationToken::new();
    let (t1, c1, h1) = (turn.clone(), ctx.clone(), hard.clone());
    let call1 = tokio::spawn(async move {
        let c = call("call-1", "test.records", json!({"record": "a"}));
        t1.invoke_tool(&c1, &c, h1).await
    });
    while f.tool.calls() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    f.sink
        .fail_on(sharedos_kernel::AuditKind::AuthorizationChecked);
    let c2 = call("call-2", "test.records", json!({"record": "b"}));
    let r2 = turn.invoke_tool(&ctx, &c2, hard.clone()).await;
    assert!(matches!(
        r2,
        Err(KernelError::AuditUnavailable {
            effect: AuditEffect::None,
            ..
        })
    ));
    assert_eq!(f.tool.calls(), 1, "call-2 never ran");
    // The envelope drains with no grace: the hard signal fires.
    hard.cancel();
    assert_eq!(call1.await.unwrap(), Err(KernelError::Interrupted));
    let last = f.sink.inner().records().pop().unwrap();
    assert_eq!(last.operation_id.as_deref(), Some("call-1"));
    assert_eq!(
        (last.outcome, last.reason.as_deref()),
        (AuditOutcome::Interrupted, Some("operation_aborted"))
    );
    assert_eq!(last.grant_id.as_deref(), Some("g1"));
}

fn turn_ended_record() -> AuditRecord {
    AuditRecord::new(
        AuditKind::TurnEnded,
        AuditOutcome::Succeeded,
        &context("alice"),
        sharedos_kernel::AuditSource::Envelope,
    )
}

/// A lone writer gets one commit per record (it never waits for others),
/// and the counters the sink reports match the file.
#[tokio::test]
async fn a_sequential_writer_commits_each_record_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let sink = JsonlAuditSink::open(&path).unwrap();
    for _ in 0..10 {
        sink.append(&turn_ended_record()).await.unwrap();
    }
    assert_eq!(sink.committed(), (10, 10));
    assert_eq!(read_jsonl(&path).unwrap().len(), 10);
}

/// Concurrent writers, each appending again as soon as its last record is
/// durable (as calls do): every record is on disk once its append
/// returned, in whole lines, and commits never outnumber records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_share_commits_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let sink = Arc::new(JsonlAuditSink::open(&path).unwrap());
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let sink = sink.clone();
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..5 {
                let r = turn_ended_record();
                sink.append(&r).await.unwrap();
                ids.push(r.id);
            }
            ids
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.extend(t.await.unwrap());
    }
    let on_disk: std::collections::HashSet<String> = read_jsonl(&path)
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(on_disk.len(), 320);
    assert!(ids.iter().all(|id| on_disk.contains(id)));
    let (records, commits) = sink.committed();
    assert_eq!(records, 320);
    assert!((1..=320).contains(&commits), "{commits} commits");
}

/// `open_admitted`: the opening's three records go to the JSONL sink as one
/// commit (one `write`, one `fsync`), in their order, and the turn's calls
/// come after them in the file.
#[tokio::test]
async fn the_opening_commits_its_three_records_together() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let sink = Arc::new(JsonlAuditSink::open(&path).unwrap());
    let kernel = Kernel::builder(
        Arc::new(ConfigGrantSource::new(vec![
            admission("alice"),
            records_grant("g1", &[], Scope::Descendants),
        ])),
        sink.clone(),
    )
    .tool(
        scripted_definition("test.records", ReadWrite::Read),
        ScriptedTool::new(Script::Echo),
    )
    .unwrap()
    .build();
    let ctx = context("alice");
    let opening = kernel.open_admitted(&ctx, &agent("alice")).await.unwrap();
    assert!(opening.admission.allowed);
    let admitted = opening.admitted.as_ref().unwrap();
    assert_eq!(admitted.tools.len(), 1);
    // A call made before the commit is awaited still follows it.
    let call = call("c1", "test.records", json!({"record": "x"}));
    let result = opening
        .turn
        .invoke_tool(&ctx, &call, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(result.status(), ToolStatus::Succeeded);
    opening.durable.await.unwrap();
    let kinds: Vec<String> = read_jsonl(&path)
        .unwrap()
        .into_iter()
        .map(|r| r.kind.to_string())
        .collect();
    assert_eq!(
        kinds,
        [
            "authority.resolved",
            "authorization.checked",
            "tool.catalog.listed",
            "authorization.checked",
            "tool.invoked"
        ]
    );
    let (records, commits) = sink.committed();
    assert_eq!((records, commits), (5, 3), "the opening is one commit");
}

/// A failed commit of the opening refuses every operation of the turn with
/// `AuditUnavailable`, and no tool runs.
#[tokio::test]
async fn a_failed_opening_commit_refuses_the_turns_calls() {
    let f = fixture(
        Script::Echo,
        vec![
            admission("alice"),
            records_grant("g1", &[], Scope::Descendants),
        ],
    );
    f.sink
        .fail_on(sharedos_kernel::AuditKind::ToolCatalogListed);
    let ctx = context("alice");
    let opening = f.kernel.open_admitted(&ctx, &agent("alice")).await.unwrap();
    let turn = Arc::clone(&opening.turn);
    assert!(matches!(
        opening.durable.await,
        Err(KernelError::AuditUnavailable {
            effect: AuditEffect::None,
            ..
        })
    ));
    let c1 = call("c1", "test.records", json!({"record": "x"}));
    let r = turn.invoke_tool(&ctx, &c1, CancellationToken::new()).await;
    assert!(
        matches!(r, Err(KernelError::AuditUnavailable { .. })),
        "{r:?}"
    );
    assert!(matches!(
        turn.opened().await,
        Err(KernelError::AuditUnavailable { .. })
    ));
    assert_eq!(f.tool.calls(), 0);
}
