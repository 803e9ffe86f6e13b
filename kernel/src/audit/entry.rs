//! [`AuditEntry`]: one audit record as the kernel hands it to a sink,
//! borrowed, with what every record of a turn repeats shared.
//!
//! Every record of a turn carries the same trace, namespace, actor,
//! authority, owner and purpose, and every `tool.invoked` the same
//! catalogue hash. An owned [`AuditRecord`] copies each of them, and the
//! call's id, tool, grant and resource, into every record. The kernel
//! makes a [`RecordIdentity`] and a [`RecordMetadata`] once per turn, with
//! their JSON written once (`line.rs`), and each entry borrows them and
//! its other fields from where they already are; a sink that writes lines
//! copies the identity's bytes instead of escaping six strings again.
//!
//! An entry is the same record: its line is byte for byte the line of
//! [`AuditEntry::to_record`] (`kernel/tests/audit_entry.rs`), and a sink
//! that keeps owned records gets exactly that record
//! ([`super::AuditSink::append_entry`]'s default).

use sharedos_protocol::{AccessContext, Address, JsonObject, ResourceRef, Timestamp};

use super::{AuditKind, AuditOutcome, AuditRecord, AuditSource};

/// The identity fields every record of a turn carries, taken once from
/// its context, with their JSON (`,"traceId":..,"purpose":..`) written
/// once by [`RecordIdentity::of`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordIdentity {
    pub(super) trace_id: String,
    pub(super) namespace_id: String,
    pub(super) actor: Address,
    pub(super) authority: Address,
    pub(super) owner: Address,
    pub(super) purpose: String,
    /// The fields as a line carries them, from the comma before `traceId`
    /// to the quote after the purpose.
    pub(super) json: Box<[u8]>,
}

impl RecordIdentity {
    /// Whether `context` has exactly these identity fields (its `now` may
    /// differ: a record's time is its own).
    pub fn matches(&self, context: &AccessContext) -> bool {
        self.trace_id == context.trace_id.as_str()
            && self.namespace_id == context.namespace_id.as_str()
            && self.actor == context.actor
            && self.authority == context.authority
            && self.owner == context.owner
            && self.purpose == context.purpose.as_str()
    }

    /// The identity as an entry borrows it, with its written JSON.
    pub fn view(&self) -> IdentityRef<'_> {
        IdentityRef {
            trace_id: &self.trace_id,
            namespace_id: &self.namespace_id,
            actor: &self.actor,
            authority: &self.authority,
            owner: &self.owner,
            purpose: &self.purpose,
            json: Some(&self.json),
        }
    }
}

/// A record's identity fields, borrowed: from a [`RecordIdentity`] (with
/// their JSON) or from an [`AuditRecord`] (written field by field). The
/// fields and the JSON always agree: only those two make one.
#[derive(Debug, Clone, Copy)]
pub struct IdentityRef<'a> {
    trace_id: &'a str,
    namespace_id: &'a str,
    actor: &'a Address,
    authority: &'a Address,
    owner: &'a Address,
    purpose: &'a str,
    json: Option<&'a [u8]>,
}

impl<'a> IdentityRef<'a> {
    /// A context's identity fields, without written JSON.
    pub fn of_context(context: &'a AccessContext) -> Self {
        Self {
            trace_id: context.trace_id.as_str(),
            namespace_id: context.namespace_id.as_str(),
            actor: &context.actor,
            authority: &context.authority,
            owner: &context.owner,
            purpose: context.purpose.as_str(),
            json: None,
        }
    }

    /// An owned record's fields, without written JSON.
    pub(super) fn of_record(record: &'a AuditRecord) -> Self {
        Self {
            trace_id: &record.trace_id,
            namespace_id: &record.namespace_id,
            actor: &record.actor,
            authority: &record.authority,
            owner: &record.owner,
            purpose: &record.purpose,
            json: None,
        }
    }
    pub fn trace_id(&self) -> &'a str {
        self.trace_id
    }
    pub fn namespace_id(&self) -> &'a str {
        self.namespace_id
    }
    pub fn actor(&self) -> &'a Address {
        self.actor
    }
    pub fn authority(&self) -> &'a Address {
        self.authority
    }
    pub fn owner(&self) -> &'a Address {
        self.owner
    }
    pub fn purpose(&self) -> &'a str {
        self.purpose
    }
    /// The fields' JSON, when written once for the turn.
    pub(super) fn json(&self) -> Option<&'a [u8]> {
        self.json
    }
}

/// A `metadata` object many records carry alike (a turn's
/// `{"catalogHash": ..}`), with its JSON written once by
/// [`RecordMetadata::new`].
#[derive(Debug, Clone, PartialEq)]
pub struct RecordMetadata {
    pub(super) object: JsonObject,
    /// `None` when the object could not be written; each line then writes
    /// it and reports the failure as an unshared object would.
    pub(super) json: Option<Box<[u8]>>,
}

impl RecordMetadata {
    pub fn object(&self) -> &JsonObject {
        &self.object
    }
    pub fn view(&self) -> MetadataRef<'_> {
        MetadataRef {
            object: &self.object,
            json: self.json.as_deref(),
        }
    }
}

/// A record's `metadata`, borrowed, with its JSON when written once.
#[derive(Debug, Clone, Copy)]
pub struct MetadataRef<'a> {
    object: &'a JsonObject,
    json: Option<&'a [u8]>,
}

impl<'a> MetadataRef<'a> {
    /// An object written on each line.
    pub fn object(object: &'a JsonObject) -> Self {
        Self { object, json: None }
    }
    pub fn get(&self) -> &'a JsonObject {
        self.object
    }
    pub(super) fn json(&self) -> Option<&'a [u8]> {
        self.json
    }
}

/// A record's id as an entry borrows it.
#[derive(Debug, Clone, Copy)]
pub enum EntryId<'a> {
    /// Made by the kernel for this record: a UUID, written as its bytes
    /// (it never needs escaping).
    Fresh(&'a RecordId),
    /// An owned record's, escaped like any string.
    Text(&'a str),
}

impl<'a> EntryId<'a> {
    pub fn as_str(&self) -> &'a str {
        match self {
            Self::Fresh(id) => id.as_str(),
            Self::Text(text) => text,
        }
    }
}

/// One audit record, borrowed: the fields of [`AuditRecord`] in the same
/// order, each from where it already is.
#[derive(Debug, Clone, Copy)]
pub struct AuditEntry<'a> {
    pub id: EntryId<'a>,
    pub kind: AuditKind,
    pub outcome: AuditOutcome,
    pub at: &'a Timestamp,
    pub identity: IdentityRef<'a>,
    pub source: AuditSource,
    pub resource: Option<&'a ResourceRef>,
    pub action: Option<&'a str>,
    pub grant_id: Option<&'a str>,
    pub authority_hash: Option<&'a str>,
    pub operation_id: Option<&'a str>,
    pub tool: Option<&'a str>,
    pub reason: Option<&'a str>,
    pub cause: Option<&'a str>,
    pub fail_closed: Option<bool>,
    pub consumed: Option<bool>,
    pub ended_by: Option<&'a str>,
    pub metadata: Option<MetadataRef<'a>>,
}

impl<'a> AuditEntry<'a> {
    /// An entry with a fresh id, its identity and no optional field.
    pub fn new(
        id: &'a RecordId,
        (kind, outcome, source): (AuditKind, AuditOutcome, AuditSource),
        at: &'a Timestamp,
        identity: IdentityRef<'a>,
    ) -> Self {
        Self {
            id: EntryId::Fresh(id),
            kind,
            outcome,
            at,
            identity,
            source,
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
        }
    }

    /// The same record, owned (what a sink that keeps records stores).
    pub fn to_record(&self) -> AuditRecord {
        let identity = &self.identity;
        let owned = |s: Option<&str>| s.map(str::to_owned);
        AuditRecord {
            id: self.id.as_str().to_owned(),
            kind: self.kind,
            outcome: self.outcome,
            at: self.at.clone(),
            trace_id: identity.trace_id.to_owned(),
            namespace_id: identity.namespace_id.to_owned(),
            actor: identity.actor.clone(),
            authority: identity.authority.clone(),
            owner: identity.owner.clone(),
            purpose: identity.purpose.to_owned(),
            source: self.source,
            resource: self.resource.cloned(),
            action: owned(self.action),
            grant_id: owned(self.grant_id),
            authority_hash: owned(self.authority_hash),
            operation_id: owned(self.operation_id),
            tool: owned(self.tool),
            reason: owned(self.reason),
            cause: owned(self.cause),
            fail_closed: self.fail_closed,
            consumed: self.consumed,
            ended_by: owned(self.ended_by),
            metadata: self.metadata.map(|m| m.object.clone()),
        }
    }
}

impl AuditRecord {
    /// The record as an entry borrowing its fields.
    pub fn entry(&self) -> AuditEntry<'_> {
        AuditEntry {
            id: EntryId::Text(&self.id),
            kind: self.kind,
            outcome: self.outcome,
            at: &self.at,
            identity: IdentityRef::of_record(self),
            source: self.source,
            resource: self.resource.as_ref(),
            action: self.action.as_deref(),
            grant_id: self.grant_id.as_deref(),
            authority_hash: self.authority_hash.as_deref(),
            operation_id: self.operation_id.as_deref(),
            tool: self.tool.as_deref(),
            reason: self.reason.as_deref(),
            cause: self.cause.as_deref(),
            fail_closed: self.fail_closed,
            consumed: self.consumed,
            ended_by: self.ended_by.as_deref(),
            metadata: self.metadata.as_ref().map(MetadataRef::object),
        }
    }
}

/// A fresh record id (a UUID v4), kept on the stack: an entry borrows it.
#[derive(Clone, Copy)]
pub struct RecordId([u8; uuid::fmt::Hyphenated::LENGTH]);

impl std::fmt::Debug for RecordId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl RecordId {
    pub fn new() -> Self {
        Self::from_u128(uuid::Uuid::new_v4().as_u128())
    }
    /// The UUID `value` in its hyphenated lowercase text, as the `uuid`
    /// crate writes it (`kernel/tests/record_id.rs` proves it), eight hex
    /// digits at a time, without a table or a per-digit loop: two ids are
    /// made on every call.
    pub fn from_u128(value: u128) -> Self {
        let [a, b] = hex_words((value >> 64) as u64);
        let [c, d] = hex_words(value as u64);
        // Digits 8-4-4-4-12: `a`, `b` in halves, `c` in halves, `d`.
        let mut text = [b'-'; uuid::fmt::Hyphenated::LENGTH];
        text[..8].copy_from_slice(&a.to_be_bytes());
        text[9..13].copy_from_slice(&((b >> 32) as u32).to_be_bytes());
        text[14..18].copy_from_slice(&(b as u32).to_be_bytes());
        text[19..23].copy_from_slice(&((c >> 32) as u32).to_be_bytes());
        text[24..28].copy_from_slice(&(c as u32).to_be_bytes());
        text[28..].copy_from_slice(&d.to_be_bytes());
        Self(text)
    }
    pub fn as_str(&self) -> &str {
        // A hyphenated UUID is ASCII.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
    /// The id's text: lowercase hex digits and hyphens.
    pub(super) fn bytes(&self) -> &[u8; uuid::fmt::Hyphenated::LENGTH] {
        &self.0
    }
}

/// The sixteen lowercase hex digits of `x`, most significant first, as
/// two words of eight (each read big-endian).
fn hex_words(x: u64) -> [u64; 2] {
    [(x >> 32) as u32, x as u32].map(|half| ascii_hex(nibbles(half)))
}

/// Each of `x`'s eight nibbles in a byte of its own, the most significant
/// in the word's most significant byte (the first, read big-endian).
fn nibbles(x: u32) -> u64 {
    let mut v = u64::from(x);
    v = (v | (v << 16)) & 0x0000_FFFF_0000_FFFF;
    v = (v | (v << 8)) & 0x00FF_00FF_00FF_00FF;
    (v | (v << 4)) & 0x0F0F_0F0F_0F0F_0F0F
}

/// Every byte of `nibbles` (each 0..=15) as its lowercase hex digit: `0`
/// plus the value, plus the 39 between `9`+1 and `a` for 10 and above
/// (`n + 6` reaches 16 exactly then). No byte carries into the next: the
/// largest sum is 15 + 6, or 15 + 48 + 39.
fn ascii_hex(nibbles: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let letters = ((nibbles + 6 * ONES) >> 4) & ONES;
    nibbles + u64::from(b'0') * ONES + letters * u64::from(b'a' - b'9' - 1)
}

impl Default for RecordId {
    fn default() -> Self {
        Self::new()
    }
}
