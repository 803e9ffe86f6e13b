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
use sharedos_protocol::jsonrpc::RequestId;

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

/// A compact request line (no trailing `\n`).
pub(crate) fn request(
    id: u64,
    method: &str,
    params: &impl Serialize,
) -> Result<String, serde_json::Error> {
    let params = serde_json::value::to_raw_value(params)?;
    serde_json::to_string(&Request::borrowed(method, Some(&params), Id::Number(id)))
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
}
