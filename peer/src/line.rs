//! Outgoing lines, built on `jsonrpsee-types`' wire types (`Request`,
//! `Notification`, `Response`, `ErrorObject`). Their members come out in
//! the order every sharedos peer has always written (`jsonrpc`, `id`,
//! `method`, `params` / `result` / `error`), so the bytes are the ones the
//! Python and TypeScript SDKs expect; a test below holds them to that.

use std::borrow::Cow;

use jsonrpsee_types::{
    ErrorObject, ErrorObjectOwned, Id, Notification, Request, Response, ResponsePayload,
};
use serde::Serialize;
use serde_json::{Map, Value};
use sharedos_protocol::ErrorKind;
use sharedos_protocol::json;
use sharedos_protocol::jsonrpc::RequestId;
use sharedos_protocol::tool_json::WriteJson;

use crate::shared::Line;

/// An error object with `data.kind`, the stable machine contract
/// (protocol.md B.6): the code comes from the kind, never the other way.
pub fn error(kind: ErrorKind, message: impl Into<String>) -> ErrorObjectOwned {
    error_with(kind, message, Map::new())
}

/// [`error`] with extra members in `data` next to `kind`.
pub fn error_with(
    kind: ErrorKind,
    message: impl Into<String>,
    mut data: Map<String, Value>,
) -> ErrorObjectOwned {
    data.insert("kind".into(), Value::String(kind.as_str().into()));
    ErrorObject::owned(kind.code().code(), message, Some(Value::Object(data)))
}

pub(crate) fn id(id: &RequestId) -> Id<'_> {
    match id {
        RequestId::Number(n) => Id::Number(*n),
        RequestId::String(s) => Id::Str(Cow::Borrowed(s)),
    }
}

/// A compact request line (no trailing `\n`), as [`crate::Peer::call`]
/// sends it.
pub fn request(
    id: u64,
    method: &str,
    params: &impl Serialize,
) -> Result<String, serde_json::Error> {
    let params = serde_json::value::to_raw_value(params)?;
    serde_json::to_string(&Request::borrowed(method, Some(&params), Id::Number(id)))
}

/// [`request`] for params that write their own JSON text: the same bytes
/// (`{"jsonrpc":"2.0","id":…,"method":…,"params":…}`), built without serde
/// (no second pass through a `RawValue`).
pub fn request_written(id: u64, method: &str, params: &impl WriteJson) -> Line {
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    json::write_u64(&mut out, id);
    out.extend_from_slice(br#","method":"#);
    json::write_str(&mut out, method);
    out.extend_from_slice(br#","params":"#);
    params.write_json(&mut out);
    out.push(b'}');
    out
}

/// A compact notification line.
pub(crate) fn notification(
    method: &str,
    params: &impl Serialize,
) -> Result<String, serde_json::Error> {
    serde_json::to_string(&Notification::new(Cow::Borrowed(method), params))
}

/// A compact success response line.
pub(crate) fn response<R: Serialize>(
    to: &RequestId,
    result: &R,
) -> Result<String, serde_json::Error> {
    serde_json::to_string(&Response::new(ResponsePayload::success(result), id(to)))
}

/// [`response`] for a result that writes its own JSON text: the same
/// bytes (`{"jsonrpc":"2.0","id":…,"result":…}`), built without serde.
pub(crate) fn response_written(to: &RequestId, result: &impl WriteJson) -> Line {
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    match to {
        RequestId::Number(n) => json::write_u64(&mut out, *n),
        RequestId::String(s) => json::write_str(&mut out, s),
    }
    out.extend_from_slice(br#","result":"#);
    result.write_json(&mut out);
    out.push(b'}');
    out
}

/// A compact error response line.
pub(crate) fn error_response(to: &RequestId, error: &ErrorObject<'_>) -> String {
    let response = Response::<()>::new(ResponsePayload::error_borrowed(error.clone()), id(to));
    // An error object holds a code, a string and raw JSON: it always
    // serializes. Keep a fixed fallback rather than a panic.
    serde_json::to_string(&response).unwrap_or_else(|_| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{},"error":{{"code":-32603,"message":"internal","data":{{"kind":"internal"}}}}}}"#,
            serde_json::to_string(to).unwrap_or_else(|_| "0".into())
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sharedos_protocol::jsonrpc;

    /// The bytes are the ones `sharedos_protocol::jsonrpc`'s builders
    /// wrote before the peer used jsonrpsee's types (and the other SDKs
    /// still write).
    #[test]
    fn the_lines_are_byte_for_byte_the_protocol_builders() {
        let params = serde_json::json!({"turnId":"t","b":[1,"x"]});
        let string_id = RequestId::String("p-1".into());
        assert_eq!(
            request(7, "initialize", &params).unwrap(),
            jsonrpc::request(&RequestId::Number(7), "initialize", &params).unwrap()
        );
        assert_eq!(
            notification("turn/draining", &params).unwrap(),
            jsonrpc::notification("turn/draining", &params).unwrap()
        );
        for to in [RequestId::Number(3), string_id] {
            assert_eq!(
                response(&to, &params).unwrap(),
                jsonrpc::response(&to, &params).unwrap()
            );
            let mut extra = Map::new();
            extra.insert("retryAfterMs".into(), 100.into());
            assert_eq!(
                error_response(&to, &error_with(ErrorKind::Overloaded, "busy", extra)),
                jsonrpc::error_response(
                    &to,
                    &jsonrpc::WireError::new(ErrorKind::Overloaded, "busy")
                        .with("retryAfterMs", 100.into())
                )
            );
        }
        assert_eq!(
            error_response(&RequestId::Number(3), &error(ErrorKind::Overloaded, "busy")),
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32055,"message":"busy","data":{"kind":"overloaded"}}}"#
        );
    }

    /// The hand-written request line is the serde one, for ids at their
    /// edges, methods to escape and params of every JSON type.
    #[test]
    fn the_written_request_line_is_byte_for_byte_the_serde_one() {
        let params = [
            serde_json::json!({}),
            serde_json::json!({"turnId": "t", "call": {"a": [1, -2, 0.5, u64::MAX, i64::MIN]},
                "s": "\"\\\n\u{1}\u{7f}é😀\u{2028}", "n": null, "b": [true, false], "o": {"": {}}}),
            serde_json::json!([1e300, -0.0, "x".repeat(5000)]),
            serde_json::json!(null),
            serde_json::json!("\u{2029}"),
        ];
        let methods = ["host/invokeTool", "", "a\"b\\c\nd\u{1}é\u{2028}😀"];
        for id in [0, 1, 7, 1 << 53, u64::MAX] {
            for method in methods {
                for p in &params {
                    assert_eq!(
                        String::from_utf8(request_written(id, method, p)).unwrap(),
                        request(id, method, p).unwrap()
                    );
                }
            }
        }
    }

    /// The hand-written answer line is the serde one, for every id shape
    /// (escapes in string ids, the largest integer id) and results of
    /// every status (their bodies are held to serde_json over generated
    /// values in `sharedos_protocol::tool_json`).
    #[test]
    fn the_written_answer_line_is_byte_for_byte_the_serde_one() {
        use sharedos_protocol::ToolResult;
        let results: Vec<ToolResult> = [
            serde_json::json!({"status": "succeeded", "callId": "c\"1", "tool": "é\u{2028}",
                "completedAt": "2026-12-01T19:30:34.123Z", "output": {"a": [1, -2, 0.5, "\n"]}}),
            serde_json::json!({"status": "denied", "callId": "c", "tool": "t",
                "completedAt": "2026-12-01T19:30:34Z", "metadata": {"k": null},
                "error": {"code": "policy_denied", "message": "no\\", "retryable": false}}),
            serde_json::json!({"status": "failed", "callId": "c", "tool": "t",
                "completedAt": "2026-12-01T19:30:34Z",
                "error": {"code": "x", "message": "m", "details": {"d": [true]}}}),
        ]
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect();
        let ids = [
            RequestId::Number(0),
            RequestId::Number(jsonrpc::MAX_INTEGER_ID),
            RequestId::String(String::new()),
            RequestId::String("p-\"1\"\\\u{1}\u{2028}é".into()),
        ];
        for to in &ids {
            for result in &results {
                assert_eq!(
                    String::from_utf8(response_written(to, result)).unwrap(),
                    response(to, result).unwrap()
                );
            }
        }
    }
}
