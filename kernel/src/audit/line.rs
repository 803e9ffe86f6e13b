//! An [`AuditRecord`] as one JSON line, written by hand.
//!
//! Every tool call writes two records, and `serde_json` escapes every key
//! of every struct again, one byte at a time, and goes through serde's
//! internally-tagged machinery for each of the record's addresses. Here
//! the keys are literal bytes and the values go through
//! [`sharedos_protocol::json::write_str`]. The output is byte for byte what
//! `serde_json::to_vec(&record)` writes (the fields in declaration order,
//! each `None` left out, an address's `kind` first): `kernel/tests/
//! audit_line.rs` proves it over generated records, so a reader, a store or
//! an old file cannot tell the two apart. In `metadata`, an arbitrary JSON
//! object, numbers, arrays and nested objects still go through `serde_json`.

use serde_json::Value;
use sharedos_protocol::json::write_str;
use sharedos_protocol::{Address, JsonObject, ResourceRef};

use super::{AuditError, AuditRecord};

/// Appends `record` as JSON (no newline) to `out`.
pub(super) fn write_record(out: &mut Vec<u8>, record: &AuditRecord) -> Result<(), AuditError> {
    let r = record;
    out.extend_from_slice(b"{\"id\":");
    write_str(out, &r.id);
    out.extend_from_slice(b",\"type\":\"");
    out.extend_from_slice(r.kind.as_str().as_bytes());
    out.extend_from_slice(b"\",\"outcome\":\"");
    out.extend_from_slice(r.outcome.as_str().as_bytes());
    out.extend_from_slice(b"\",\"at\":");
    write_str(out, r.at.as_str());
    out.extend_from_slice(b",\"traceId\":");
    write_str(out, &r.trace_id);
    out.extend_from_slice(b",\"namespaceId\":");
    write_str(out, &r.namespace_id);
    out.extend_from_slice(b",\"actor\":");
    write_address(out, &r.actor);
    out.extend_from_slice(b",\"authority\":");
    write_address(out, &r.authority);
    out.extend_from_slice(b",\"owner\":");
    write_address(out, &r.owner);
    out.extend_from_slice(b",\"purpose\":");
    write_str(out, &r.purpose);
    out.extend_from_slice(b",\"source\":\"");
    out.extend_from_slice(r.source.as_str().as_bytes());
    out.push(b'"');
    if let Some(resource) = &r.resource {
        out.extend_from_slice(b",\"resource\":");
        write_resource(out, resource);
    }
    optional_str(out, b",\"action\":", r.action.as_deref());
    optional_str(out, b",\"grantId\":", r.grant_id.as_deref());
    optional_str(out, b",\"authorityHash\":", r.authority_hash.as_deref());
    optional_str(out, b",\"operationId\":", r.operation_id.as_deref());
    optional_str(out, b",\"tool\":", r.tool.as_deref());
    optional_str(out, b",\"reason\":", r.reason.as_deref());
    optional_str(out, b",\"cause\":", r.cause.as_deref());
    optional_bool(out, b",\"failClosed\":", r.fail_closed);
    optional_bool(out, b",\"consumed\":", r.consumed);
    optional_str(out, b",\"endedBy\":", r.ended_by.as_deref());
    if let Some(metadata) = &r.metadata {
        out.extend_from_slice(b",\"metadata\":");
        write_metadata(out, metadata)?;
    }
    out.push(b'}');
    Ok(())
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
