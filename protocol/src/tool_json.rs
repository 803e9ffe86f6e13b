//! A [`ToolResult`] written as JSON text by hand, byte for byte as
//! `serde_json` writes it through the serde derive: the answer to every
//! `host/invokeTool` is one of these, and the derive escapes each struct
//! key again on every call. Constant keys are literal bytes here, strings
//! go through [`json::write_str`]. The derives stay for everything else
//! (reading, schemas, other writers); the tests below hold the two
//! writers to the same bytes over generated results.
//!
//! Reading goes the other way: [`ToolResult::from_json`] takes the shape
//! the host writes (`status` first) without serde's buffering of a tagged
//! enum, and hands anything else to the derive.

use std::fmt;

use serde::de::value::MapAccessDeserializer;
use serde::de::{self, DeserializeSeed, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::contract::{ProtocolError, ToolResult, ToolStatus};
use crate::json::{self, Fragment};
use crate::primitives::{Identifier, JsonObject, Timestamp};

/// A value that can write its own JSON text, exactly as its `Serialize`
/// impl through `serde_json` would.
pub trait WriteJson {
    /// Appends the compact JSON text of `self` to `out`.
    fn write_json(&self, out: &mut Vec<u8>);
}

impl WriteJson for ToolResult {
    fn write_json(&self, out: &mut Vec<u8>) {
        let (head, call_id, tool, completed_at, metadata) = match self {
            ToolResult::Succeeded {
                call_id,
                tool,
                completed_at,
                metadata,
                ..
            } => (
                const { &Fragment::of(&["{\"status\":\"succeeded\",\"callId\":"]) },
                call_id,
                tool,
                completed_at,
                metadata,
            ),
            ToolResult::Denied {
                call_id,
                tool,
                completed_at,
                metadata,
                ..
            } => (
                const { &Fragment::of(&["{\"status\":\"denied\",\"callId\":"]) },
                call_id,
                tool,
                completed_at,
                metadata,
            ),
            ToolResult::Failed {
                call_id,
                tool,
                completed_at,
                metadata,
                ..
            } => (
                const { &Fragment::of(&["{\"status\":\"failed\",\"callId\":"]) },
                call_id,
                tool,
                completed_at,
                metadata,
            ),
        };
        head.write(out);
        json::write_str(out, call_id.as_str());
        out.extend_from_slice(b",\"tool\":");
        json::write_str(out, tool.as_str());
        out.extend_from_slice(b",\"completedAt\":");
        json::write_str(out, completed_at.as_str());
        if let Some(metadata) = metadata {
            out.extend_from_slice(b",\"metadata\":");
            write_object(out, metadata);
        }
        match self {
            ToolResult::Succeeded { output, .. } => {
                out.extend_from_slice(b",\"output\":");
                write_value(out, output);
            }
            ToolResult::Denied { error, .. } | ToolResult::Failed { error, .. } => {
                out.extend_from_slice(b",\"error\":");
                error.write_json(out);
            }
        }
        out.push(b'}');
    }
}

impl WriteJson for ProtocolError {
    fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"code\":");
        json::write_str(out, self.code.as_str());
        out.extend_from_slice(b",\"message\":");
        json::write_str(out, self.message.as_str());
        if let Some(retryable) = self.retryable {
            out.extend_from_slice(if retryable {
                b",\"retryable\":true"
            } else {
                b",\"retryable\":false"
            });
        }
        if let Some(details) = &self.details {
            out.extend_from_slice(b",\"details\":");
            write_object(out, details);
        }
        out.push(b'}');
    }
}

impl WriteJson for Value {
    fn write_json(&self, out: &mut Vec<u8>) {
        write_value(out, self);
    }
}

/// A JSON value, members in the map's own order (as serde_json iterates
/// it). Nested as deep as the value is, like serde_json's writer.
pub fn write_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => json::write_str(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, item);
            }
            out.push(b']');
        }
        Value::Object(map) => write_object(out, map),
    }
}

/// A JSON object, members in the map's own order.
pub fn write_object(out: &mut Vec<u8>, map: &JsonObject) {
    out.push(b'{');
    for (i, (key, value)) in map.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        json::write_str(out, key);
        out.push(b':');
        write_value(out, value);
    }
    out.push(b'}');
}

/// A number as serde_json writes it: integers in decimal, floats in their
/// shortest round-trip form (its own formatter, so the bytes cannot
/// differ).
fn write_number(out: &mut Vec<u8>, n: &serde_json::Number) {
    if let Some(u) = n.as_u64() {
        json::write_u64(out, u);
    } else if let Err(e) = serde_json::to_writer(&mut *out, n) {
        // Writing a number into a Vec cannot fail; keep the JSON valid.
        debug_assert!(false, "writing a number failed: {e}");
        out.extend_from_slice(b"null");
    }
}

impl ToolResult {
    /// Reads a tool result from JSON text: exactly what
    /// `serde_json::from_str::<ToolResult>` reads, and the same error when
    /// it fails. The derive of an internally tagged enum buffers the
    /// whole object (every string copied once more) before it looks at
    /// the tag; an object whose first member is `status`, as the host
    /// writes it, is read here in one pass straight into its variant's
    /// fields. Anything that pass does not take goes to the derive.
    pub fn from_json(text: &str) -> serde_json::Result<ToolResult> {
        read_status_first(text).or_else(|_| serde_json::from_str(text))
    }
}

/// The one-pass reading: `Err` for anything not shaped `{"status":…,…}`,
/// and for whatever the variant's fields refuse (a second `status`
/// included), which the derive then decides.
fn read_status_first(text: &str) -> serde_json::Result<ToolResult> {
    let mut de = serde_json::Deserializer::from_str(text);
    let result = de.deserialize_map(StatusFirst)?;
    de.end()?;
    Ok(result)
}

/// The members of each variant, declared as the derive declares them on
/// `ToolResult` (names, defaults, unknown members refused), so the derive
/// reads them the same way.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SucceededFields {
    #[serde(rename = "callId")]
    call_id: Identifier,
    tool: Identifier,
    #[serde(rename = "completedAt")]
    completed_at: Timestamp,
    #[serde(default)]
    metadata: Option<JsonObject>,
    output: Value,
}

/// [`SucceededFields`] for `denied` and `failed`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RefusedFields {
    #[serde(rename = "callId")]
    call_id: Identifier,
    tool: Identifier,
    #[serde(rename = "completedAt")]
    completed_at: Timestamp,
    #[serde(default)]
    metadata: Option<JsonObject>,
    error: ProtocolError,
}

struct StatusFirst;

impl<'de> Visitor<'de> for StatusFirst {
    type Value = ToolResult;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a tool result with its status first")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ToolResult, A::Error> {
        if map.next_key_seed(StatusKey)?.is_none() {
            return Err(de::Error::custom("no status"));
        }
        let status = map.next_value_seed(StatusName)?;
        // The rest of the object, as the variant's fields.
        let rest = MapAccessDeserializer::new(map);
        Ok(match status {
            ToolStatus::Succeeded => {
                let f = SucceededFields::deserialize(rest)?;
                ToolResult::Succeeded {
                    call_id: f.call_id,
                    tool: f.tool,
                    completed_at: f.completed_at,
                    metadata: f.metadata,
                    output: f.output,
                }
            }
            ToolStatus::Denied => {
                let f = RefusedFields::deserialize(rest)?;
                ToolResult::Denied {
                    call_id: f.call_id,
                    tool: f.tool,
                    completed_at: f.completed_at,
                    metadata: f.metadata,
                    error: f.error,
                }
            }
            ToolStatus::Failed => {
                let f = RefusedFields::deserialize(rest)?;
                ToolResult::Failed {
                    call_id: f.call_id,
                    tool: f.tool,
                    completed_at: f.completed_at,
                    metadata: f.metadata,
                    error: f.error,
                }
            }
        })
    }
}

/// A member name that must be `status`.
struct StatusKey;

impl<'de> DeserializeSeed<'de> for StatusKey {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_identifier(self)
    }
}

impl<'de> Visitor<'de> for StatusKey {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("`status`")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        if v == "status" {
            Ok(())
        } else {
            Err(E::custom("status is not first"))
        }
    }
}

/// A status, as a string only.
struct StatusName;

impl<'de> DeserializeSeed<'de> for StatusName {
    type Value = ToolStatus;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<ToolStatus, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for StatusName {
    type Value = ToolStatus;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a tool status")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<ToolStatus, E> {
        match v {
            "succeeded" => Ok(ToolStatus::Succeeded),
            "denied" => Ok(ToolStatus::Denied),
            "failed" => Ok(ToolStatus::Failed),
            _ => Err(E::custom("unknown status")),
        }
    }
}

#[cfg(test)]
mod tests;
