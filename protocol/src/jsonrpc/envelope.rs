//! The outer object of one incoming line, read two ways into the same
//! [`Parts`]: [`RawEnvelope`] keeps every member raw (the reference
//! reading), [`OnePass`] also reads a `host/invokeTool` request's params
//! straight into their type while it goes over the line.
//!
//! Why two: a tool call's params used to be scanned three times (skipped
//! by the envelope, copied out, parsed again by the consumer). The one
//! pass reads them once. It is at least as strict as the reference
//! reading (the same members, duplicate checks and value types, plus the
//! params' own type), and the classifier falls back to the reference
//! reading whenever it fails, so a line is accepted, refused or answered
//! exactly as before; only the work changes.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::method::{InvokeTool, Method};
use crate::wire::InvokeToolParams;

/// A message's params as the one pass left them.
#[derive(Debug)]
pub enum Params<'a> {
    /// The value as sent, to be parsed by its consumer.
    Raw(&'a RawValue),
    /// A `host/invokeTool` request's params, already parsed (the same
    /// value [`serde_json::from_str`] gives for the raw text).
    InvokeTool(Box<InvokeToolParams>),
}

/// The members the classifier looks at, whichever way they were read.
pub(super) struct Parts<'a, P> {
    pub jsonrpc: Option<Cow<'a, str>>,
    pub id: Option<&'a RawValue>,
    pub method: Option<Cow<'a, str>>,
    pub params: Option<P>,
    pub result: Option<&'a RawValue>,
    pub error: Option<&'a RawValue>,
}

/// The reference reading: unknown members are ignored (B.7); duplicate
/// known members are a serde error.
#[derive(Deserialize)]
pub(super) struct RawEnvelope<'a> {
    #[serde(borrow)]
    jsonrpc: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "present")]
    params: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    error: Option<&'a RawValue>,
}

impl<'a> From<RawEnvelope<'a>> for Parts<'a, &'a RawValue> {
    fn from(e: RawEnvelope<'a>) -> Self {
        Parts {
            jsonrpc: e.jsonrpc,
            id: e.id,
            method: e.method,
            params: e.params,
            result: e.result,
            error: e.error,
        }
    }
}

/// `Some` whenever the member is present, `null` included.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue>::deserialize(d).map(Some)
}

/// The one-pass reading. Only an object is accepted (the classifier
/// checks the shape first); a request whose `id` and `method` come before
/// its `params` (the order every SDK writes) and whose method is
/// `host/invokeTool` has its params read as [`InvokeToolParams`].
pub(super) struct OnePass<'a>(pub Parts<'a, Params<'a>>);

impl<'de> Deserialize<'de> for OnePass<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(OnePassVisitor)
    }
}

struct OnePassVisitor;

/// A member name of the envelope.
enum Member {
    Jsonrpc,
    Id,
    Method,
    Params,
    Result,
    Error,
    Other,
}

impl<'de> Deserialize<'de> for Member {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_identifier(MemberVisitor)
    }
}

struct MemberVisitor;

impl Visitor<'_> for MemberVisitor {
    type Value = Member;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }
    fn visit_str<E: de::Error>(self, name: &str) -> Result<Member, E> {
        Ok(match name {
            "jsonrpc" => Member::Jsonrpc,
            "id" => Member::Id,
            "method" => Member::Method,
            "params" => Member::Params,
            "result" => Member::Result,
            "error" => Member::Error,
            _ => Member::Other,
        })
    }
}

/// A string member, borrowed from the line unless it had escapes.
struct Str<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Str<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrVisitor)
    }
}

struct StrVisitor;

impl<'de> Visitor<'de> for StrVisitor {
    type Value = Str<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Str<'de>, E> {
        Ok(Str(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Str<'de>, E> {
        Ok(Str(Cow::Owned(v.to_owned())))
    }
}

/// Stores a member seen for the first time; a second one is an error,
/// as in the derived reading.
fn once<T, E: de::Error>(slot: &mut Option<T>, value: T, name: &'static str) -> Result<(), E> {
    if slot.is_some() {
        return Err(E::duplicate_field(name));
    }
    *slot = Some(value);
    Ok(())
}

impl<'de> Visitor<'de> for OnePassVisitor {
    type Value = OnePass<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON-RPC 2.0 object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OnePass<'de>, A::Error> {
        // `jsonrpc` and `method` may be `null` (read as absent, as the
        // derived reading does) and still count as seen for duplicates.
        let mut jsonrpc: Option<Option<Str<'de>>> = None;
        let mut method: Option<Option<Str<'de>>> = None;
        let (mut id, mut params, mut result, mut error) = (None, None, None, None);
        while let Some(member) = map.next_key::<Member>()? {
            match member {
                Member::Jsonrpc => once(&mut jsonrpc, map.next_value()?, "jsonrpc")?,
                Member::Id => once(&mut id, map.next_value::<&RawValue>()?, "id")?,
                Member::Method => once(&mut method, map.next_value()?, "method")?,
                Member::Params => {
                    let call = id.is_some()
                        && matches!(&method, Some(Some(Str(m))) if m == InvokeTool::NAME);
                    let value = if call {
                        Params::InvokeTool(map.next_value()?)
                    } else {
                        Params::Raw(map.next_value()?)
                    };
                    once(&mut params, value, "params")?;
                }
                Member::Result => once(&mut result, map.next_value::<&RawValue>()?, "result")?,
                Member::Error => once(&mut error, map.next_value::<&RawValue>()?, "error")?,
                Member::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(OnePass(Parts {
            jsonrpc: jsonrpc.flatten().map(|s| s.0),
            id,
            method: method.flatten().map(|s| s.0),
            params,
            result,
            error,
        }))
    }
}
