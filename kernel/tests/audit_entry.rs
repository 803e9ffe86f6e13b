//! The kernel writes its records as [`AuditEntry`]s that borrow a turn's
//! shared identity and catalogue metadata, with their JSON written once.
//! These prove an entry is the same record as the owned one it stands for:
//! its line is byte for byte what `serde_json` writes for
//! [`AuditEntry::to_record`], with the shared parts and without them; and
//! that a call whose context is not the turn's is recorded with its own
//! context, never with the turn's.

mod common;
mod strategies;

use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use serde_json::{Value, json};
use sharedos_kernel::{
    AuditEntry, AuditKind, AuditOutcome, AuditRecord, AuditSource, ConfigGrantSource,
    JsonlAuditSink, Kernel, MetadataRef, RecordId, RecordIdentity, RecordMetadata, Scope,
    TurnKernel,
};
use sharedos_protocol::{
    AccessContext, Identifier, JsonObject, PathSegment, Purpose, ReadWrite, ResourceRef, Timestamp,
};
use strategies::*;
use tokio_util::sync::CancellationToken;

fn access_context() -> impl Strategy<Value = AccessContext> {
    (
        (identifier(), identifier()),
        (address(), address(), address()),
        text(30).prop_filter_map("a valid purpose", |s| Purpose::new(s).ok()),
    )
        .prop_map(
            |((trace_id, namespace_id), (actor, authority, owner), purpose)| AccessContext {
                namespace_id,
                actor,
                authority,
                owner,
                purpose,
                trace_id,
                enabled_tool_namespaces: Vec::new(),
                now: Timestamp::parse("2026-12-01T19:30:34.123Z").expect("a valid timestamp"),
            },
        )
}

fn metadata() -> impl Strategy<Value = JsonObject> {
    let value = prop_oneof![
        text(70).prop_map(Value::String),
        any::<i64>().prop_map(|n| json!(n)),
        Just(Value::Null),
        Just(json!({"nested": [1, "\u{2028}", true]})),
    ];
    prop::collection::vec((text(12), value), 0..3).prop_map(|e| e.into_iter().collect())
}

/// The optional fields an entry borrows, each present or absent.
type Optional = (
    Option<ResourceRef>,
    (Option<String>, Option<String>, Option<String>),
    (Option<String>, Option<bool>, Option<bool>),
);

fn optional() -> impl Strategy<Value = Optional> {
    let resource =
        (identifier(), prop::option::of(address())).prop_map(|(namespace, owner)| ResourceRef {
            namespace,
            path: vec![PathSegment::new("a\"b").expect("a segment")],
            owner,
        });
    (
        prop::option::of(resource),
        (
            prop::option::of(text(20)),
            prop::option::of(text(40)),
            prop::option::of(text(12)),
        ),
        (
            prop::option::of(text(20)),
            prop::option::of(any::<bool>()),
            prop::option::of(any::<bool>()),
        ),
    )
}

/// Any kind, outcome and source: each is written from a constant of its
/// own, with a fresh id in front of it.
fn kinds() -> impl Strategy<Value = (AuditKind, AuditOutcome, AuditSource)> {
    (
        prop::sample::select(vec![
            AuditKind::AuthorityResolved,
            AuditKind::AuthorizationChecked,
            AuditKind::ToolCatalogListed,
            AuditKind::ToolInvoked,
            AuditKind::EscalationRequested,
            AuditKind::TurnEnded,
            AuditKind::EffectAuthorized,
            AuditKind::EffectCompleted,
            AuditKind::EffectSettled,
            AuditKind::FileUploaded,
            AuditKind::FileDownloaded,
        ]),
        prop::sample::select(vec![
            AuditOutcome::Allowed,
            AuditOutcome::Denied,
            AuditOutcome::Succeeded,
            AuditOutcome::Failed,
            AuditOutcome::Escalated,
            AuditOutcome::Interrupted,
        ]),
        prop::sample::select(vec![AuditSource::Kernel, AuditSource::Envelope]),
    )
}

/// The line an owned record gets from the derive: the reference.
fn serde_line(record: &AuditRecord) -> Vec<u8> {
    let mut line = serde_json::to_vec(record).expect("a record serializes");
    line.push(b'\n');
    line
}

fn assert_same(entry: &AuditEntry<'_>) {
    let ours = entry.to_json_line().expect("an entry is written");
    let record = entry.to_record();
    assert_eq!(
        String::from_utf8_lossy(&ours),
        String::from_utf8_lossy(&serde_line(&record)),
        "for {entry:?}"
    );
    assert_eq!(ours, record.to_json_line().expect("a record is written"));
    let back: AuditRecord = serde_json::from_slice(&ours).expect("the line parses");
    assert_eq!(back, record);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// With the turn's identity and metadata written once, and with the
    /// same fields written per line, the line is the owned record's.
    #[test]
    fn an_entry_with_shared_parts_is_written_as_serde_json_writes_its_record(
        context in access_context(),
        object in metadata(),
        shared_metadata in any::<bool>(),
        (resource, (action, grant_id, tool), (reason, fail_closed, consumed)) in optional(),
        kinds in kinds(),
    ) {
        let identity = RecordIdentity::of(&context);
        prop_assert!(identity.matches(&context));
        let metadata = RecordMetadata::new(object.clone());
        let id = RecordId::new();
        let mut entry = AuditEntry::new(&id, kinds, &context.now, identity.view());
        entry.resource = resource.as_ref();
        entry.action = action.as_deref();
        entry.grant_id = grant_id.as_deref();
        entry.tool = tool.as_deref();
        entry.reason = reason.as_deref();
        entry.fail_closed = fail_closed;
        entry.consumed = consumed;
        entry.metadata = Some(if shared_metadata {
            metadata.view()
        } else {
            MetadataRef::object(&object)
        });
        assert_same(&entry);
        // The same record, owned, written field by field.
        let record = entry.to_record();
        prop_assert_eq!(&record.trace_id, context.trace_id.as_str());
        prop_assert_eq!(&record.purpose, context.purpose.as_str());
        prop_assert_eq!(&record.owner, &context.owner);
        assert_same(&record.entry());
    }
}

/// A turn's identity stands only for contexts with exactly its fields;
/// the time is each record's own.
#[test]
fn an_identity_matches_only_a_context_with_the_same_identity_fields() {
    let ctx = context("alice");
    let identity = RecordIdentity::of(&ctx);
    assert!(identity.matches(&ctx));
    assert!(identity.matches(&at(&ctx, "2026-10-01T12:00:05Z")));
    let changes: [fn(&mut AccessContext); 6] = [
        |c| c.trace_id = Identifier::new("trace-2").unwrap(),
        |c| c.namespace_id = Identifier::new("tenant-2").unwrap(),
        |c| c.actor = agent("bob"),
        |c| c.authority = agent("alice"),
        |c| c.owner = host(),
        |c| c.purpose = Purpose::new("other").unwrap(),
    ];
    for change in changes {
        let mut other = ctx.clone();
        change(&mut other);
        assert!(!identity.matches(&other), "{other:?}");
    }
}

/// A call made with a context other than the one its turn opened with
/// (another purpose) is recorded with the call's own identity, in the
/// file the JSONL sink writes from entries as in the sink that keeps
/// owned records.
#[tokio::test]
async fn a_call_under_another_context_is_recorded_with_its_own_identity() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let file_sink = Arc::new(JsonlAuditSink::open(&path).unwrap());
    let grants = vec![
        records_grant("g1", &[], Scope::Descendants),
        admission("alice"),
    ];
    let by_file = Kernel::builder(Arc::new(ConfigGrantSource::new(grants.clone())), file_sink)
        .tool(
            scripted_definition("test.records", ReadWrite::Read),
            ScriptedTool::new(Script::Echo),
        )
        .unwrap()
        .build();
    let f = fixture(Script::Echo, grants);
    let ctx = context("alice");
    let mut other = ctx.clone();
    other.purpose = Purpose::new("another purpose").unwrap();
    for kernel in [&by_file, &f.kernel] {
        let turn = kernel.open_turn(&ctx).await.unwrap();
        let call = call("c1", "test.records", json!({"record": "x"}));
        let result = turn
            .invoke_tool(&other, &call, CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(code(&result), None);
    }
    let from_file = sharedos_kernel::audit::read_jsonl(&path).unwrap();
    for records in [from_file, f.sink.inner().records()] {
        let purposes: Vec<(String, &str)> = records
            .iter()
            .map(|r| (r.kind.to_string(), r.purpose.as_str()))
            .collect();
        assert_eq!(
            purposes,
            [
                ("authority.resolved".to_owned(), "testing"),
                ("authorization.checked".to_owned(), "another purpose"),
                ("tool.invoked".to_owned(), "another purpose"),
            ]
        );
    }
}
