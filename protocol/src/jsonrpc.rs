//! The JSON-RPC 2.0 envelope, strict: classification of one incoming line
//! and builders for outgoing ones (protocol.md B.4, C.2, D).
//!
//! ```
//! use sharedos_protocol::jsonrpc::{classify, Incoming};
//! let m = classify(r#"{"jsonrpc":"2.0","method":"host\/emit","params":{}}"#).unwrap();
//! assert!(matches!(m, Incoming::Notification { ref method, .. } if method == "host/emit"));
//! ```
//!
//! One parser decides both the kind of a message and what is dispatched:
//! the borrowed envelope (`jsonrpc/envelope.rs`) is the only view of the
//! line, it rejects duplicate keys, and `params`/`result` stay as
//! `RawValue` for the typed parse. Classifying with `serde_json::Value`
//! (last key wins) and dispatching with another parser would let a
//! hostile peer show each a different message. [`classify_call`] reads a
//! `host/invokeTool` request's params in that same pass, into their type,
//! and falls back to [`classify`] for anything it does not take.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::errors::ErrorKind;

mod call;
mod envelope;

pub use envelope::Params;
use envelope::{OnePass, Parts, RawEnvelope};

/// Longest string id accepted from a peer, in bytes.
pub const MAX_STRING_ID_BYTES: usize = 64;
/// Largest integer id accepted from a peer (2^53 − 1, safe in every JSON
/// implementation).
pub const MAX_INTEGER_ID: u64 = (1 << 53) - 1;
/// Longest error message kept from a peer's error object, in bytes.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 4096;

/// A request id as the peer wrote it. Ids compare by JSON type and value:
/// `"2"` is not `2`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RequestId {
    Number(u64),
    String(String),
}

impl Serialize for RequestId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RequestId::Number(n) => s.serialize_u64(*n),
            RequestId::String(v) => s.serialize_str(v),
        }
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestId::Number(n) => write!(f, "{n}"),
            RequestId::String(s) => write!(f, "{s:?}"),
        }
    }
}

/// An error object as received. Parsed leniently: a malformed one becomes
/// `internal "malformed error object"` instead of failing the call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WireError {
    pub code: i64,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl WireError {
    /// An error object with `data.kind` (the stable machine contract) and
    /// extra members merged into `data`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        let mut data = Map::new();
        data.insert("kind".into(), Value::String(kind.as_str().into()));
        Self {
            code: i64::from(kind.code().code()),
            message: message.into(),
            data: Some(Value::Object(data)),
        }
    }
    /// Adds a member to `data`.
    pub fn with(mut self, key: &str, value: Value) -> Self {
        if let Some(Value::Object(m)) = &mut self.data {
            m.insert(key.into(), value);
        }
        self
    }
    /// `data.kind`, when present and known.
    pub fn kind(&self) -> Option<ErrorKind> {
        let kind = self.data.as_ref()?.get("kind")?.as_str()?;
        ErrorKind::from_str(kind)
    }
    fn malformed() -> Self {
        Self::new(ErrorKind::Internal, "malformed error object")
    }
}

/// One classified incoming line. Borrowed from the line where possible;
/// `P` is how the params are held ([`classify`]: raw, [`classify_call`]:
/// [`Params`]).
#[derive(Debug)]
pub enum Incoming<'a, P = &'a RawValue> {
    Request {
        id: RequestId,
        method: Cow<'a, str>,
        params: Option<P>,
    },
    Notification {
        method: Cow<'a, str>,
        params: Option<P>,
    },
    Response {
        id: RequestId,
        result: Result<&'a RawValue, WireError>,
    },
}

/// Why a line is not a JSON-RPC 2.0 message we accept. All of these are
/// stream-integrity violations: fatal on the host side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvelopeError {
    /// Not JSON at all (syntax, trailing characters, BOM, `NaN`).
    InvalidJson,
    /// A top-level array.
    Batch,
    /// JSON, but not an acceptable JSON-RPC 2.0 object.
    InvalidEnvelope(&'static str),
}

impl EnvelopeError {
    /// The host-side violation reason (protocol.md B.6).
    pub fn reason(self) -> &'static str {
        match self {
            EnvelopeError::InvalidJson => "invalid_json",
            EnvelopeError::Batch => "batch_not_supported",
            EnvelopeError::InvalidEnvelope(_) => "invalid_envelope",
        }
    }
}

impl fmt::Display for EnvelopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvelopeError::InvalidJson => f.write_str("the line is not JSON"),
            EnvelopeError::Batch => f.write_str("batches are not supported"),
            EnvelopeError::InvalidEnvelope(why) => write!(f, "not a JSON-RPC 2.0 message: {why}"),
        }
    }
}

impl std::error::Error for EnvelopeError {}

/// Classifies one line (without its `\n`), every member kept raw.
pub fn classify(line: &str) -> Result<Incoming<'_>, EnvelopeError> {
    object_first(line)?;
    let env: RawEnvelope<'_> = serde_json::from_str(line).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => {
            EnvelopeError::InvalidEnvelope("a member has the wrong type or appears twice")
        }
        _ => EnvelopeError::InvalidJson,
    })?;
    sort(Parts::from(env))
}

/// [`classify`], with a `host/invokeTool` request's params parsed in the
/// same pass over the line: [`Params::InvokeTool`]. A line of the plain
/// shape the SDKs write (no escapes, no unknown members, members in any
/// order) is read by hand; else, when its `id` and `method` come before
/// its params, through serde in one pass. Any other line, and any line
/// neither takes (bad params included), is read by [`classify`], so the
/// outcome is [`classify`]'s for every line; its params are then
/// [`Params::Raw`].
pub fn classify_call(line: &str) -> Result<Incoming<'_, Params<'_>>, EnvelopeError> {
    if let Some(call) = call::read(line) {
        return Ok(call);
    }
    if object_first(line).is_ok()
        && let Ok(OnePass(parts)) = serde_json::from_str::<OnePass<'_>>(line)
    {
        return sort(parts);
    }
    Ok(match classify(line)? {
        Incoming::Request { id, method, params } => Incoming::Request {
            id,
            method,
            params: params.map(Params::Raw),
        },
        Incoming::Notification { method, params } => Incoming::Notification {
            method,
            params: params.map(Params::Raw),
        },
        Incoming::Response { id, result } => Incoming::Response { id, result },
    })
}

/// The hand reading of [`classify_call`] alone: `Some` for the lines it
/// takes. Public for the differential tests, which check it against
/// [`classify`] and the consumer's parse; not an interface.
#[doc(hidden)]
pub fn classify_call_by_hand(line: &str) -> Option<Incoming<'_, Params<'_>>> {
    call::read(line)
}

/// Only an object is a message. A struct derive also accepts a sequence
/// (positional fields), so the top-level shape is checked first.
fn object_first(line: &str) -> Result<(), EnvelopeError> {
    match line
        .trim_start_matches([' ', '\t', '\r', '\n'])
        .as_bytes()
        .first()
    {
        Some(b'{') => Ok(()),
        Some(b'[') => Err(if serde_json::from_str::<&RawValue>(line).is_ok() {
            EnvelopeError::Batch
        } else {
            EnvelopeError::InvalidJson
        }),
        _ => Err(if serde_json::from_str::<&RawValue>(line).is_ok() {
            EnvelopeError::InvalidEnvelope("the message is not an object")
        } else {
            EnvelopeError::InvalidJson
        }),
    }
}

/// What a well-formed object is: request, notification or response.
fn sort<P>(env: Parts<'_, P>) -> Result<Incoming<'_, P>, EnvelopeError> {
    if env.jsonrpc.as_deref() != Some("2.0") {
        return Err(EnvelopeError::InvalidEnvelope(
            "\"jsonrpc\":\"2.0\" is required",
        ));
    }
    if let Some(method) = env.method {
        if env.result.is_some() || env.error.is_some() {
            return Err(EnvelopeError::InvalidEnvelope(
                "a request cannot carry result or error",
            ));
        }
        return Ok(match env.id {
            Some(id) => Incoming::Request {
                id: parse_id(id)?,
                method,
                params: env.params,
            },
            None => Incoming::Notification {
                method,
                params: env.params,
            },
        });
    }
    let id = parse_id(
        env.id
            .ok_or(EnvelopeError::InvalidEnvelope("neither method nor id"))?,
    )?;
    let result = match (env.result, env.error) {
        (Some(r), None) => Ok(r),
        (None, Some(e)) => Err(parse_error_object(e)),
        (Some(_), Some(_)) => return Err(EnvelopeError::InvalidEnvelope("both result and error")),
        (None, None) => {
            return Err(EnvelopeError::InvalidEnvelope(
                "a response needs result or error",
            ));
        }
    };
    Ok(Incoming::Response { id, result })
}

fn parse_id(raw: &RawValue) -> Result<RequestId, EnvelopeError> {
    let text = raw.get();
    if text.starts_with('"') {
        let s: Cow<'_, str> = serde_json::from_str(text)
            .map_err(|_| EnvelopeError::InvalidEnvelope("the id is not a valid string"))?;
        if s.len() > MAX_STRING_ID_BYTES {
            return Err(EnvelopeError::InvalidEnvelope(
                "a string id is longer than 64 bytes",
            ));
        }
        return Ok(RequestId::String(s.into_owned()));
    }
    match text.parse::<u64>() {
        Ok(n) if n <= MAX_INTEGER_ID => Ok(RequestId::Number(n)),
        _ => Err(EnvelopeError::InvalidEnvelope(
            "the id must be a string of at most 64 bytes or an integer 0..2^53-1",
        )),
    }
}

/// Lenient parse of an error object: `code` integer, `message` string
/// (truncated), optional `data`. Anything else is `malformed error object`.
fn parse_error_object(raw: &RawValue) -> WireError {
    #[derive(Deserialize)]
    struct Lenient<'a> {
        code: i64,
        #[serde(borrow)]
        message: Cow<'a, str>,
        #[serde(default)]
        data: Option<Value>,
    }
    match serde_json::from_str::<Lenient<'_>>(raw.get()) {
        Ok(e) => WireError {
            code: e.code,
            message: truncate(&e.message, MAX_ERROR_MESSAGE_BYTES),
            data: e.data,
        },
        Err(_) => WireError::malformed(),
    }
}

/// Cuts a string at a char boundary at most `max` bytes long.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[derive(Serialize)]
struct OutRequest<'a, P: Serialize> {
    jsonrpc: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a RequestId>,
    method: &'a str,
    params: &'a P,
}

#[derive(Serialize)]
struct OutResponse<'a, R: Serialize> {
    jsonrpc: &'static str,
    id: &'a RequestId,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a R>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a WireError>,
}

/// A compact request line (no trailing `\n`).
pub fn request(
    id: &RequestId,
    method: &str,
    params: &impl Serialize,
) -> Result<String, serde_json::Error> {
    serde_json::to_string(&OutRequest {
        jsonrpc: "2.0",
        id: Some(id),
        method,
        params,
    })
}

/// A compact notification line.
pub fn notification(method: &str, params: &impl Serialize) -> Result<String, serde_json::Error> {
    serde_json::to_string(&OutRequest {
        jsonrpc: "2.0",
        id: None,
        method,
        params,
    })
}

/// A compact success response line.
pub fn response(id: &RequestId, result: &impl Serialize) -> Result<String, serde_json::Error> {
    serde_json::to_string(&OutResponse::<_> {
        jsonrpc: "2.0",
        id,
        result: Some(result),
        error: None,
    })
}

/// A compact error response line.
pub fn error_response(id: &RequestId, error: &WireError) -> String {
    let line = serde_json::to_string(&OutResponse::<()> {
        jsonrpc: "2.0",
        id,
        result: None,
        error: Some(error),
    });
    // A `WireError` holds only strings, integers and a JSON value: it
    // always serializes. Keep a fixed fallback rather than a panic.
    line.unwrap_or_else(|_| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{},"error":{{"code":-32603,"message":"internal","data":{{"kind":"internal"}}}}}}"#,
            serde_json::to_string(id).unwrap_or_else(|_| "0".into())
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(line: &str) -> Result<&'static str, EnvelopeError> {
        classify(line).map(|m| match m {
            Incoming::Request { .. } => "request",
            Incoming::Notification { .. } => "notification",
            Incoming::Response { result: Ok(_), .. } => "result",
            Incoming::Response { result: Err(_), .. } => "error",
        })
    }

    #[test]
    fn classifies_the_four_shapes() {
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","id":1,"method":"host/invokeTool","params":{}}"#),
            Ok("request")
        );
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","method":"host/emit","params":{}}"#),
            Ok("notification")
        );
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","id":"a","result":null}"#),
            Ok("result")
        );
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","id":2,"error":{"code":-1,"message":"x"}}"#),
            Ok("error")
        );
        // unknown members are ignored
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","id":2,"result":1,"extra":{"a":[1]}}"#),
            Ok("result")
        );
    }

    #[test]
    fn rejects_hostile_envelopes() {
        use EnvelopeError::*;
        assert_eq!(kind("hello from println"), Err(InvalidJson));
        assert_eq!(
            kind("\u{feff}{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":1}"),
            Err(InvalidJson)
        );
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","id":1,"result":1} {}"#),
            Err(InvalidJson)
        );
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","id":1,"result":NaN}"#),
            Err(InvalidJson)
        );
        assert_eq!(kind(r#"[{"jsonrpc":"2.0","method":"a"}]"#), Err(Batch));
        assert_eq!(kind(r#"["2.0",1,"m"]"#), Err(Batch));
        for bad in [
            r#"1"#,
            r#""s""#,
            r#"null"#,
            r#"{"id":1,"result":1}"#,
            r#"{"jsonrpc":"1.0","id":1,"result":1}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"a"}"#,
            r#"{"jsonrpc":"2.0","id":null,"result":1}"#,
            r#"{"jsonrpc":"2.0","id":-1,"method":"a"}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"method":"a"}"#,
            r#"{"jsonrpc":"2.0","id":{},"method":"a"}"#,
            r#"{"jsonrpc":"2.0","id":9007199254740992,"method":"a"}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1,"message":"m"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"a","result":1}"#,
            r#"{"jsonrpc":"2.0","id":1,"id":2,"result":1}"#,
            r#"{"jsonrpc":"2.0","method":"a","method":"b"}"#,
            r#"{"jsonrpc":"2.0","id":1}"#,
            r#"{"jsonrpc":"2.0"}"#,
            r#"{"jsonrpc":"2.0","method":5}"#,
        ] {
            assert!(matches!(kind(bad), Err(InvalidEnvelope(_))), "{bad}");
        }
        let long = format!(
            r#"{{"jsonrpc":"2.0","id":"{}","method":"a"}}"#,
            "x".repeat(65)
        );
        assert!(matches!(kind(&long), Err(InvalidEnvelope(_))));
        let ok = format!(
            r#"{{"jsonrpc":"2.0","id":"{}","method":"a"}}"#,
            "x".repeat(64)
        );
        assert_eq!(kind(&ok), Ok("request"));
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","id":9007199254740991,"method":"a"}"#),
            Ok("request")
        );
    }

    #[test]
    fn method_escapes_are_decoded() {
        for line in [
            r#"{"jsonrpc":"2.0","method":"host\/emit"}"#,
            r#"{"jsonrpc":"2.0","method":"\u0068ost/emit"}"#,
        ] {
            match classify(line) {
                Ok(Incoming::Notification { method, .. }) => assert_eq!(method, "host/emit"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn deep_nesting_is_classified_without_recursion() {
        let nested = |depth: usize| {
            format!(
                r#"{{"jsonrpc":"2.0","method":"host/emit","params":{{"a":{}{}}}}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            )
        };
        // On a 128 KiB stack: a parser that recursed once per level would
        // overflow long before 100 000 levels (and abort the test binary).
        // The envelope keeps `params` raw (its typed parse, later, stops at
        // serde_json's depth limit), so both are notifications whose params
        // are the bytes sent.
        let params_len = std::thread::Builder::new()
            .stack_size(128 << 10)
            .spawn(move || {
                [100, 100_000].map(|depth| match classify(&nested(depth)) {
                    Ok(Incoming::Notification { method, params }) if method == "host/emit" => {
                        params.map(|p| p.get().len())
                    }
                    _ => None,
                })
            })
            .unwrap()
            .join()
            .expect("classified without overflowing a small stack");
        assert_eq!(params_len, [Some(206), Some(200_006)]);
    }

    #[test]
    fn ids_compare_by_type() {
        let a = match classify(r#"{"jsonrpc":"2.0","id":"2","result":1}"#) {
            Ok(Incoming::Response { id, .. }) => id,
            other => panic!("{other:?}"),
        };
        assert_ne!(a, RequestId::Number(2));
    }

    #[test]
    fn error_objects_are_parsed_leniently() {
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":1,"error":{{"code":-1,"message":"{}","x":1}}}}"#,
            "m".repeat(10_000)
        );
        match classify(&line) {
            Ok(Incoming::Response { result: Err(e), .. }) => {
                assert_eq!(e.code, -1);
                assert!(e.message.len() <= MAX_ERROR_MESSAGE_BYTES + 4);
            }
            other => panic!("{other:?}"),
        }
        match classify(r#"{"jsonrpc":"2.0","id":1,"error":{"code":"x"}}"#) {
            Ok(Incoming::Response { result: Err(e), .. }) => {
                assert_eq!(e.kind(), Some(ErrorKind::Internal))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn builders_round_trip() {
        let id = RequestId::String("p-1".into());
        let line = response(&id, &serde_json::json!({"a":1})).unwrap();
        assert_eq!(line, r#"{"jsonrpc":"2.0","id":"p-1","result":{"a":1}}"#);
        let line = error_response(
            &RequestId::Number(3),
            &WireError::new(ErrorKind::Overloaded, "busy"),
        );
        assert_eq!(
            line,
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32055,"message":"busy","data":{"kind":"overloaded"}}}"#
        );
        let line = notification("turn/draining", &serde_json::json!({"turnId":"t"})).unwrap();
        assert_eq!(
            line,
            r#"{"jsonrpc":"2.0","method":"turn/draining","params":{"turnId":"t"}}"#
        );
        match classify(
            &request(&RequestId::Number(1), "initialize", &serde_json::json!({})).unwrap(),
        ) {
            Ok(Incoming::Request { id, method, .. }) => {
                assert_eq!(id, RequestId::Number(1));
                assert_eq!(method, "initialize");
            }
            other => panic!("{other:?}"),
        }
    }
}
