//! A [`ToolResult`] written as JSON text by hand, byte for byte as
//! `serde_json` writes it through the serde derive: the answer to every
//! `host/invokeTool` is one of these, and the derive escapes each struct
//! key again on every call. Constant keys are literal bytes here, strings
//! go through [`json::write_str`]. The derives stay for everything else
//! (reading, schemas, other writers); the tests below hold the two
//! writers to the same bytes over generated results.

use serde_json::Value;

use crate::contract::{ProtocolError, ToolResult};
use crate::json::{self, Fragment};
use crate::primitives::JsonObject;

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

#[cfg(test)]
mod tests;
