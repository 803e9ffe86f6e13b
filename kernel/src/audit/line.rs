//! An audit record ([`AuditEntry`], or an `AuditRecord` through its entry)
//! as one JSON line, written by hand, and the JSON of the parts a turn's
//! records share ([`RecordIdentity`], [`RecordMetadata`]), written once.
//!
//! Every tool call writes two records, and `serde_json` escapes every key
//! of every struct again, one byte at a time, and goes through serde's
//! internally-tagged machinery for each of the record's addresses. Here
//! the keys are literal bytes and the values go through
//! [`sharedos_protocol::json::write_str`]. The output is byte for byte what
//! `serde_json::to_vec(&record)` writes (the fields in declaration order,
//! each `None` left out, an address's `kind` first): `kernel/tests/
//! audit_line.rs` and `kernel/tests/audit_entry.rs` prove it over generated
//! records and shared parts, so a reader, a store or an old file cannot
//! tell them apart. In `metadata`, an arbitrary JSON
//! object, numbers, arrays and nested objects still go through `serde_json`.

use serde_json::Value;
use sharedos_protocol::json::{Fragment, write_str};
use sharedos_protocol::{AccessContext, Address, JsonObject, ResourceRef};

use super::entry::{AuditEntry, EntryId, IdentityRef, RecordIdentity, RecordMetadata};
use super::{AuditError, AuditKind, AuditOutcome, AuditSource, RECORD_LINE_BYTES};

impl AuditEntry<'_> {
    /// The record as one JSON line (newline included), written once into
    /// a buffer sized for it: what a sink writes. Byte for byte
    /// `serde_json::to_vec(&self.to_record())` and a newline.
    pub fn to_json_line(&self) -> Result<Vec<u8>, AuditError> {
        let mut line = Vec::with_capacity(RECORD_LINE_BYTES);
        write_entry(&mut line, self)?;
        line.push(b'\n');
        Ok(line)
    }
}

impl RecordIdentity {
    /// The identity of `context`'s records, its JSON written now, once.
    pub fn of(context: &AccessContext) -> Self {
        let mut identity = Self {
            trace_id: context.trace_id.as_str().to_owned(),
            namespace_id: context.namespace_id.as_str().to_owned(),
            actor: context.actor.clone(),
            authority: context.authority.clone(),
            owner: context.owner.clone(),
            purpose: context.purpose.as_str().to_owned(),
            json: Box::default(),
        };
        let mut json = Vec::new();
        write_identity_fields(&mut json, identity.view());
        identity.json = json.into_boxed_slice();
        identity
    }
}

impl RecordMetadata {
    /// `object`, with its JSON written now, once.
    pub fn new(object: JsonObject) -> Self {
        let mut json = Vec::new();
        let json = write_metadata(&mut json, &object)
            .ok()
            .map(|()| json.into_boxed_slice());
        Self { object, json }
    }
}

/// Appends `entry` as JSON (no newline) to `out`.
fn write_entry(out: &mut Vec<u8>, entry: &AuditEntry<'_>) -> Result<(), AuditError> {
    let r = entry;
    out.extend_from_slice(b"{\"id\":");
    match r.id {
        // Hex digits and hyphens: the bytes are their own JSON.
        EntryId::Fresh(id) => {
            out.push(b'"');
            out.extend_from_slice(id.bytes());
            out.push(b'"');
        }
        EntryId::Text(text) => write_str(out, text),
    }
    kind_fragment(r.kind).write(out);
    outcome_fragment(r.outcome).write(out);
    // Escaped like any string: `Timestamp::parse` takes any ASCII byte
    // between the date and the time (as `time` does), a quote included.
    write_str(out, r.at.as_str());
    match r.identity.json() {
        Some(json) => out.extend_from_slice(json),
        None => write_identity_fields(out, r.identity),
    }
    source_fragment(r.source).write(out);
    write_call_fields(out, r);
    optional_str(out, b",\"reason\":", r.reason);
    optional_str(out, b",\"cause\":", r.cause);
    optional_bool(out, b",\"failClosed\":", r.fail_closed);
    optional_bool(out, b",\"consumed\":", r.consumed);
    optional_str(out, b",\"endedBy\":", r.ended_by);
    if let Some(metadata) = r.metadata {
        out.extend_from_slice(b",\"metadata\":");
        match metadata.json() {
            Some(json) => out.extend_from_slice(json),
            None => write_metadata(out, metadata.get())?,
        }
    }
    out.push(b'}');
    Ok(())
}

/// `,"type":"<kind>","outcome":"`: the part of a line after the id.
fn kind_fragment(kind: AuditKind) -> &'static Fragment {
    macro_rules! kind {
        ($kind:ident) => {
            const {
                &Fragment::of(&[
                    ",\"type\":\"",
                    AuditKind::$kind.as_str(),
                    "\",\"outcome\":\"",
                ])
            }
        };
    }
    match kind {
        AuditKind::AuthorityResolved => kind!(AuthorityResolved),
        AuditKind::AuthorizationChecked => kind!(AuthorizationChecked),
        AuditKind::ToolCatalogListed => kind!(ToolCatalogListed),
        AuditKind::ToolInvoked => kind!(ToolInvoked),
        AuditKind::EscalationRequested => kind!(EscalationRequested),
        AuditKind::TurnEnded => kind!(TurnEnded),
        AuditKind::EffectAuthorized => kind!(EffectAuthorized),
        AuditKind::EffectCompleted => kind!(EffectCompleted),
        AuditKind::EffectSettled => kind!(EffectSettled),
        AuditKind::FileUploaded => kind!(FileUploaded),
        AuditKind::FileDownloaded => kind!(FileDownloaded),
    }
}

/// `<outcome>","at":`: the outcome's name, up to the time.
fn outcome_fragment(outcome: AuditOutcome) -> &'static Fragment {
    macro_rules! outcome {
        ($outcome:ident) => {
            const { &Fragment::of(&[AuditOutcome::$outcome.as_str(), "\",\"at\":"]) }
        };
    }
    match outcome {
        AuditOutcome::Allowed => outcome!(Allowed),
        AuditOutcome::Denied => outcome!(Denied),
        AuditOutcome::Succeeded => outcome!(Succeeded),
        AuditOutcome::Failed => outcome!(Failed),
        AuditOutcome::Escalated => outcome!(Escalated),
        AuditOutcome::Interrupted => outcome!(Interrupted),
    }
}

/// `,"source":"<source>"`.
fn source_fragment(source: AuditSource) -> &'static Fragment {
    macro_rules! source {
        ($source:ident) => {
            const { &Fragment::of(&[",\"source\":\"", AuditSource::$source.as_str(), "\""]) }
        };
    }
    match source {
        AuditSource::Kernel => source!(Kernel),
        AuditSource::Envelope => source!(Envelope),
    }
}

/// `,"resource":..,"action":..,"grantId":..,"authorityHash":..,
/// "operationId":..,"tool":..`, each left out when absent: the part of a
/// line between `source` and `reason`.
fn write_call_fields(out: &mut Vec<u8>, r: &AuditEntry<'_>) {
    if let Some(resource) = r.resource {
        out.extend_from_slice(b",\"resource\":");
        write_resource(out, resource);
    }
    optional_str(out, b",\"action\":", r.action);
    optional_str(out, b",\"grantId\":", r.grant_id);
    optional_str(out, b",\"authorityHash\":", r.authority_hash);
    optional_str(out, b",\"operationId\":", r.operation_id);
    optional_str(out, b",\"tool\":", r.tool);
}

/// `,"traceId":..,"namespaceId":..,"actor":..,"authority":..,"owner":..,
/// "purpose":..`: the part of a line between `at` and `source`.
fn write_identity_fields(out: &mut Vec<u8>, identity: IdentityRef<'_>) {
    out.extend_from_slice(b",\"traceId\":");
    write_str(out, identity.trace_id());
    out.extend_from_slice(b",\"namespaceId\":");
    write_str(out, identity.namespace_id());
    out.extend_from_slice(b",\"actor\":");
    write_address(out, identity.actor());
    out.extend_from_slice(b",\"authority\":");
    write_address(out, identity.authority());
    out.extend_from_slice(b",\"owner\":");
    write_address(out, identity.owner());
    out.extend_from_slice(b",\"purpose\":");
    write_str(out, identity.purpose());
}

fn optional_str(out: &mut Vec<u8>, key: &[u8], value: Option<&str>) {
    if let Some(value) = value {
        out.extend_from_slice(key);
        write_str(out, value);
    }
}

fn optional_bool(out: &mut Vec<u8>, key: &[u8], value: Option<bool>) {
    if let Some(value) = value {
        out.extend_from_slice(key);
        out.extend_from_slice(if value { b"true" } else { b"false" });
    }
}

/// An address as serde writes the internally tagged enum: `kind` first,
/// then the variant's one field.
fn write_address(out: &mut Vec<u8>, address: &Address) {
    let (head, id): (&[u8], &str) = match address {
        Address::Human { user_id } => (b"{\"kind\":\"human\",\"userId\":", user_id.as_str()),
        Address::Agent { agent_id } => (b"{\"kind\":\"agent\",\"agentId\":", agent_id.as_str()),
        Address::Group { conversation_id } => (
            b"{\"kind\":\"group\",\"conversationId\":",
            conversation_id.as_str(),
        ),
        Address::Service { service_id } => {
            (b"{\"kind\":\"service\",\"serviceId\":", service_id.as_str())
        }
    };
    out.extend_from_slice(head);
    write_str(out, id);
    out.push(b'}');
}

/// `{"namespace":..,"path":[..],"owner":..}`, `owner` left out when `None`.
fn write_resource(out: &mut Vec<u8>, resource: &ResourceRef) {
    out.extend_from_slice(b"{\"namespace\":");
    write_str(out, resource.namespace.as_str());
    out.extend_from_slice(b",\"path\":[");
    for (i, segment) in resource.path.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(out, segment.as_str());
    }
    out.push(b']');
    if let Some(owner) = &resource.owner {
        out.extend_from_slice(b",\"owner\":");
        write_address(out, owner);
    }
    out.push(b'}');
}

/// The object as serde_json writes a map: its entries in iteration order.
/// Keys, strings, booleans and nulls (a call's `catalogHash`) are written
/// here; numbers, arrays and objects go through `serde_json`.
fn write_metadata(out: &mut Vec<u8>, metadata: &JsonObject) -> Result<(), AuditError> {
    out.push(b'{');
    for (i, (key, value)) in metadata.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(out, key);
        out.push(b':');
        match value {
            Value::String(s) => write_str(out, s),
            Value::Bool(true) => out.extend_from_slice(b"true"),
            Value::Bool(false) => out.extend_from_slice(b"false"),
            Value::Null => out.extend_from_slice(b"null"),
            other => serde_json::to_writer(&mut *out, other)
                .map_err(|e| AuditError::Sink(e.to_string()))?,
        }
    }
    out.push(b'}');
    Ok(())
}
