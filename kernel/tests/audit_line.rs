//! `AuditRecord::to_json_line` is written by hand (no serde on the per-call
//! path); these prove it writes exactly what `serde_json` writes for the
//! same record, plus a newline, so readers, stores and old files cannot
//! tell them apart: every kind, outcome and source, every optional field
//! present and absent, every address variant, resources of every shape,
//! nested metadata, and strings that need escaping.

mod strategies;

use proptest::prelude::*;
use serde_json::{Value, json};
use sharedos_kernel::{AuditKind, AuditOutcome, AuditRecord, AuditSource};
use sharedos_protocol::{Address, Identifier, JsonObject, PathSegment, ResourceRef, Timestamp};
use strategies::*;

const KINDS: [AuditKind; 11] = [
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
];
const OUTCOMES: [AuditOutcome; 6] = [
    AuditOutcome::Allowed,
    AuditOutcome::Denied,
    AuditOutcome::Succeeded,
    AuditOutcome::Failed,
    AuditOutcome::Escalated,
    AuditOutcome::Interrupted,
];
const SOURCES: [AuditSource; 2] = [AuditSource::Kernel, AuditSource::Envelope];

/// What the derive writes: the reference the hand-written line must match.
fn serde_line(record: &AuditRecord) -> Vec<u8> {
    let mut line = serde_json::to_vec(record).expect("a record serializes");
    line.push(b'\n');
    line
}

fn assert_same(record: &AuditRecord) {
    let ours = record.to_json_line().expect("a record is written");
    let theirs = serde_line(record);
    assert_eq!(
        String::from_utf8_lossy(&ours),
        String::from_utf8_lossy(&theirs),
        "for {record:?}"
    );
    assert_eq!(ours, theirs);
}

/// A string that is long enough to take the escaper's eight-byte path.
fn long_text() -> impl Strategy<Value = String> {
    prop_oneof![text(6), text(40)]
}

fn resource() -> impl Strategy<Value = ResourceRef> {
    (
        identifier(),
        prop::collection::vec(segment(), 0..5),
        prop::option::of(address()),
    )
        .prop_map(|(namespace, path, owner)| ResourceRef {
            namespace,
            path,
            owner,
        })
}

fn timestamp() -> impl Strategy<Value = Timestamp> {
    prop::sample::select(vec![
        "2026-12-01T19:30:34Z",
        "2026-12-01T19:30:34.123Z",
        "1970-01-01T00:00:00+02:00",
        "2099-02-28T23:59:59.999-11:30",
        "2099-02-28T23:59:59.999999999-11:30",
        "2026-12-01t19:30:34z",
        // Any ASCII byte parses between date and time, as in `time`.
        "2026-12-01\"19:30:34Z",
        "2026-12-01\\19:30:34.5Z",
        "2026-12-01\u{1}19:30:34Z",
    ])
    .prop_map(|t| Timestamp::parse(t).expect("a valid timestamp"))
}

/// Any JSON value, nested: objects, arrays, large and negative integers,
/// floats, strings that need escaping.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(|n| json!(n)),
        any::<i64>().prop_map(|n| json!(n)),
        prop::num::f64::NORMAL.prop_map(|f| json!(f)),
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        text(10).prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((text(6), inner), 0..4)
                .prop_map(|entries| Value::Object(entries.into_iter().collect())),
        ]
    })
}

fn metadata() -> impl Strategy<Value = JsonObject> {
    prop::collection::vec((text(8), value()), 0..4).prop_map(|e| e.into_iter().collect())
}

fn optional_text() -> impl Strategy<Value = Option<String>> {
    prop::option::of(long_text())
}

/// The record's identity: everything but the optional fields.
type Head = (
    (AuditKind, AuditOutcome, AuditSource),
    (String, Timestamp, String, String, String),
    (Address, Address, Address),
);

fn head() -> impl Strategy<Value = Head> {
    (
        (
            prop::sample::select(KINDS.to_vec()),
            prop::sample::select(OUTCOMES.to_vec()),
            prop::sample::select(SOURCES.to_vec()),
        ),
        (long_text(), timestamp(), text(8), text(8), long_text()),
        (address(), address(), address()),
    )
}

/// The optional fields, each present or absent.
type Tail = (
    Option<ResourceRef>,
    (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ),
    (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ),
    (Option<bool>, Option<bool>, Option<JsonObject>),
);

fn tail() -> impl Strategy<Value = Tail> {
    (
        prop::option::of(resource()),
        (
            optional_text(),
            optional_text(),
            optional_text(),
            optional_text(),
        ),
        (
            optional_text(),
            optional_text(),
            optional_text(),
            optional_text(),
        ),
        (
            prop::option::of(any::<bool>()),
            prop::option::of(any::<bool>()),
            prop::option::of(metadata()),
        ),
    )
}

fn record() -> impl Strategy<Value = AuditRecord> {
    (head(), tail()).prop_map(|(head, tail)| {
        let ((kind, outcome, source), (id, at, trace_id, namespace_id, purpose), addresses) = head;
        let (actor, authority, owner) = addresses;
        let (resource, (action, grant_id, authority_hash, operation_id), more, flags) = tail;
        let (tool, reason, cause, ended_by) = more;
        let (fail_closed, consumed, metadata) = flags;
        AuditRecord {
            id,
            kind,
            outcome,
            at,
            trace_id,
            namespace_id,
            actor,
            authority,
            owner,
            purpose,
            source,
            resource,
            action,
            grant_id,
            authority_hash,
            operation_id,
            tool,
            reason,
            cause,
            fail_closed,
            consumed,
            ended_by,
            metadata,
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn a_generated_record_is_written_as_serde_json_writes_it(record in record()) {
        assert_same(&record);
    }
}

fn id(s: &str) -> Identifier {
    Identifier::new(s).expect("a valid identifier")
}

/// A record with every field set, the shape of a call's
/// `authorization.checked`.
fn full() -> AuditRecord {
    let mut metadata = JsonObject::new();
    metadata.insert("catalogHash".into(), json!("ab12"));
    metadata.insert(
        "nested".into(),
        json!({"a": [1, -2, 3.5, null, "\u{2028}"]}),
    );
    AuditRecord {
        id: "0f0e7c3e-5d61-4f4e-9c1a-2b8c9d0e1f2a".into(),
        kind: AuditKind::AuthorizationChecked,
        outcome: AuditOutcome::Allowed,
        at: Timestamp::parse("2026-12-01T19:30:34.123Z").expect("a valid timestamp"),
        trace_id: "trace \"1\"".into(),
        namespace_id: "tenant\\1".into(),
        actor: Address::Agent {
            agent_id: id("alice"),
        },
        authority: Address::Human {
            user_id: id("bob\u{1}"),
        },
        owner: Address::Group {
            conversation_id: id("c-é"),
        },
        purpose: "line\nbreak".into(),
        source: AuditSource::Envelope,
        resource: Some(ResourceRef {
            namespace: id("records"),
            path: vec![
                PathSegment::new("a").expect("a segment"),
                PathSegment::new("😀\"").expect("a segment"),
            ],
            owner: Some(Address::Service {
                service_id: id("host"),
            }),
        }),
        action: Some("read".into()),
        grant_id: Some("g1".into()),
        authority_hash: Some("f00d".into()),
        operation_id: Some("c1".into()),
        tool: Some("test.records".into()),
        reason: Some("not_granted".into()),
        cause: Some("\u{7f}".into()),
        fail_closed: Some(true),
        consumed: Some(false),
        ended_by: Some("plugin".into()),
        metadata: Some(metadata),
    }
}

/// Every kind, outcome and source, with every optional field and with
/// none, whatever the generator happened to draw.
#[test]
fn every_variant_with_all_and_no_optional_fields_is_written_as_serde_json_writes_it() {
    for (i, kind) in KINDS.into_iter().enumerate() {
        for (j, outcome) in OUTCOMES.into_iter().enumerate() {
            let mut record = full();
            record.kind = kind;
            record.outcome = outcome;
            record.source = SOURCES[(i + j) % SOURCES.len()];
            assert_same(&record);
            let bare = AuditRecord {
                resource: None,
                action: None,
                grant_id: None,
                authority_hash: None,
                operation_id: None,
                tool: None,
                reason: None,
                cause: None,
                fail_closed: None,
                consumed: None,
                ended_by: None,
                metadata: None,
                ..record
            };
            assert_same(&bare);
        }
    }
}

#[test]
fn a_resource_without_path_or_owner_and_empty_metadata_are_written_as_serde_json_writes_them() {
    let mut record = full();
    record.resource = Some(ResourceRef {
        namespace: id("records"),
        path: Vec::new(),
        owner: None,
    });
    record.metadata = Some(JsonObject::new());
    record.id = String::new();
    record.purpose = String::new();
    assert_same(&record);
}

/// The line is one line: it ends with the only newline it holds, and it
/// reads back as the record.
#[test]
fn the_line_reads_back_as_the_record() {
    let record = full();
    let line = record.to_json_line().expect("a record is written");
    assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
    assert_eq!(line.last(), Some(&b'\n'));
    let back: AuditRecord = serde_json::from_slice(&line).expect("the line parses");
    assert_eq!(back, record);
}
