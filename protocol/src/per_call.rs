//! The per-call readers and writers behind one face: [`fast`] (the
//! hand-written paths production takes) and [`reference`] (the serde
//! readings and writings each is held to) offer the same functions with
//! the same signatures and give the same answers on the same input, so a
//! caller that wants to compare them (the bench, docs/BENCHMARKS.md "Fast
//! paths against their references") picks one by path and names no type
//! of the fast paths (`Params::InvokeTool`, `WriteJson`).
//!
//! The fast paths themselves stay where they are read
//! (`jsonrpc/call.rs`, `tool_json.rs`, `json.rs`); the tests below and the
//! fuzz targets (`call_line`, `tool_result`, `json_text`) hold each pair
//! to the same answers.

/// The hand-written paths: one pass over a call line, a result read
/// status first and written without serde, a string escaped by hand.
pub mod fast {
    use crate::jsonrpc::{self, Incoming, Params};
    use crate::tool_json::WriteJson;
    use crate::{InvokeToolParams, ToolResult};

    /// A `host/invokeTool` request line's params (`None`: not such a
    /// request, or not read): `classify_call`, the hand reader first.
    pub fn read_call(line: &str) -> Option<InvokeToolParams> {
        match jsonrpc::classify_call(line).ok()? {
            Incoming::Request {
                params: Some(Params::InvokeTool(call)),
                ..
            } => Some(*call),
            _ => None,
        }
    }

    /// A tool result's JSON text read (`ToolResult::from_json`).
    pub fn read_tool_result(text: &str) -> serde_json::Result<ToolResult> {
        ToolResult::from_json(text)
    }

    /// A tool result's compact JSON text, written by hand.
    pub fn write_tool_result(result: &ToolResult) -> serde_json::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(256);
        result.write_json(&mut out);
        Ok(out)
    }

    /// `s` quoted and escaped as a JSON string (`json::write_str`).
    pub fn write_str(s: &str) -> serde_json::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(s.len() + 32);
        crate::json::write_str(&mut out, s);
        Ok(out)
    }
}

/// The references: `classify` then serde on the params, the derives,
/// `serde_json`'s own string writer.
pub mod reference {
    use crate::jsonrpc::{self, Incoming};
    use crate::{InvokeToolParams, ToolResult};

    /// A `host/invokeTool` request line's params (`None`: not such a
    /// request, or not read): `classify`, then serde on the raw params.
    pub fn read_call(line: &str) -> Option<InvokeToolParams> {
        match jsonrpc::classify(line).ok()? {
            Incoming::Request {
                method,
                params: Some(raw),
                ..
            } if method == crate::methods::HOST_INVOKE_TOOL => serde_json::from_str(raw.get()).ok(),
            _ => None,
        }
    }

    /// A tool result's JSON text read through the derive.
    pub fn read_tool_result(text: &str) -> serde_json::Result<ToolResult> {
        serde_json::from_str(text)
    }

    /// A tool result's compact JSON text, through the derive.
    pub fn write_tool_result(result: &ToolResult) -> serde_json::Result<Vec<u8>> {
        serde_json::to_vec(result)
    }

    /// `s` quoted and escaped as a JSON string by `serde_json`.
    pub fn write_str(s: &str) -> serde_json::Result<Vec<u8>> {
        serde_json::to_vec(s)
    }
}

#[cfg(test)]
mod tests {
    use super::{fast, reference};

    const CALL: &str = r#"{"jsonrpc":"2.0","id":42,"method":"host/invokeTool","params":{"turnId":"t-7f3a","call":{"id":"c-1","tool":"files.read","arguments":{"path":"notes/\u00e9t\u00e9 \"d\".md"},"traceId":"trace-1","requestedAt":"2026-12-05T21:14:39.123Z"},"step":3}}"#;
    const RESULT: &str = r#"{"status":"succeeded","callId":"c-1","tool":"files.read","output":{"text":"a\nb\t\"c\""},"completedAt":"2026-12-05T21:14:39.123Z","metadata":{"cache":"miss"}}"#;

    #[test]
    fn both_faces_give_the_same_answers() {
        let call = fast::read_call(CALL);
        assert!(call.is_some());
        assert_eq!(call, reference::read_call(CALL));
        // Not a call: neither reads params.
        let emit = r#"{"jsonrpc":"2.0","method":"host/emit","params":{"x":1}}"#;
        assert_eq!(fast::read_call(emit), None);
        assert_eq!(reference::read_call(emit), None);
        assert_eq!(fast::read_call("{"), reference::read_call("{"));

        let read = fast::read_tool_result(RESULT).map_err(|e| e.to_string());
        assert!(read.is_ok());
        assert_eq!(
            read,
            reference::read_tool_result(RESULT).map_err(|e| e.to_string())
        );
        let bad = r#"{"status":"succeeded"}"#;
        assert_eq!(
            fast::read_tool_result(bad).map_err(|e| e.to_string()),
            reference::read_tool_result(bad).map_err(|e| e.to_string())
        );
        if let Ok(result) = reference::read_tool_result(RESULT) {
            assert_eq!(
                fast::write_tool_result(&result).ok(),
                reference::write_tool_result(&result).ok()
            );
        }
        for s in ["", "plain", "q\"\\\n\u{1}\u{7f}é"] {
            assert_eq!(fast::write_str(s).ok(), reference::write_str(s).ok());
        }
    }
}
