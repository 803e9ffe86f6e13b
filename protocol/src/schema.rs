//! The JSON Schema bundle of the protocol, generated from the types.
//!
//! The bundle is checked in at `schema/sharedos-protocol-v1.schema.json`;
//! a test fails when the types and the file drift. Regenerate it with
//! `SHAREDOS_BLESS=1 cargo test -p sharedos-protocol schema`.

use schemars::{SchemaGenerator, generate::SchemaSettings};
use serde_json::{Value, json};

use crate::*;

/// The bundle: every contract and message type under `$defs`, plus a
/// `methods` index naming each method's params and result.
pub fn bundle() -> Value {
    let settings = SchemaSettings::draft2020_12();
    let mut generator = SchemaGenerator::new(settings);
    // Registering each method's types puts them, and every type they use,
    // under `$defs`; the `methods` index refers to them there.
    let mut methods = serde_json::Map::new();
    for m in method::TABLE {
        let mut entry = serde_json::Map::new();
        entry.insert("direction".into(), json!(m.direction.as_str()));
        entry.insert("kind".into(), json!(m.kind()));
        entry.insert("params".into(), schema_value((m.params)(&mut generator)));
        if let Some(result) = m.result {
            entry.insert("result".into(), schema_value(result(&mut generator)));
        }
        methods.insert(m.name.into(), Value::Object(entry));
    }
    // The request and result of the host's own API, in the same bundle.
    generator.subschema_for::<ExecutionRequest>();
    generator.subschema_for::<ExecutionResult>();
    let mut defs = serde_json::Map::new();
    for (name, def) in generator.take_definitions(true) {
        defs.insert(name, def);
    }
    let errors: Vec<Value> = [
        ErrorKind::InvalidRequest,
        ErrorKind::MethodNotFound,
        ErrorKind::InvalidParams,
        ErrorKind::Internal,
        ErrorKind::AuditUnavailable,
        ErrorKind::Cancelled,
        ErrorKind::UnsupportedProtocolVersion,
        ErrorKind::NotInitialized,
        ErrorKind::TurnNotActive,
        ErrorKind::Overloaded,
        ErrorKind::MessageTooLarge,
    ]
    .iter()
    .map(|k| json!({"kind": k.as_str(), "code": k.code().code()}))
    .collect();
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://sharedos.dev/schema/sharedos-protocol-v1.schema.json",
        "title": "sharedos protocol v1",
        "description": "Messages between a sharedos host and a runtime plugin: JSON-RPC 2.0, one compact object per line on the plugin's stdin/stdout.",
        "protocolVersions": PROTOCOL_VERSIONS,
        "contractVersion": CONTRACT_VERSION,
        "maxMessageBytes": DEFAULT_MAX_MESSAGE_BYTES,
        "methods": methods,
        "errors": errors,
        "$defs": defs,
    })
}

fn schema_value(schema: schemars::Schema) -> Value {
    schema.to_value()
}

/// The bundle as the checked-in file holds it (pretty, trailing newline).
pub fn bundle_text() -> String {
    let mut s = serde_json::to_string_pretty(&bundle()).unwrap_or_default();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_bundle_matches_checked_in_file() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../schema/sharedos-protocol-v1.schema.json");
        let text = bundle_text();
        if std::env::var_os("SHAREDOS_BLESS").is_some() {
            std::fs::write(&path, &text).unwrap();
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == text,
            "schema/sharedos-protocol-v1.schema.json drifted from the types; regenerate with \
             SHAREDOS_BLESS=1 cargo test -p sharedos-protocol schema"
        );
    }

    #[test]
    fn bundle_resolves_every_method_ref() {
        let b = bundle();
        let defs = b["$defs"].as_object().unwrap();
        for (_, m) in b["methods"].as_object().unwrap() {
            for key in ["params", "result"] {
                if let Some(r) = m.get(key).and_then(|v| v["$ref"].as_str()) {
                    let name = r.trim_start_matches("#/$defs/");
                    assert!(defs.contains_key(name), "missing def {name}");
                }
            }
        }
    }
}
