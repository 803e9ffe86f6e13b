//! Primitive conventions shared by every contract (envelope.md section 0).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize};

/// A JSON object (`JsonObject` in the contracts).
pub type JsonObject = serde_json::Map<String, serde_json::Value>;

/// Why a primitive value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrimitiveError {
    #[error("must be between {min} and {max} characters after trimming, got {len}")]
    Length { min: usize, max: usize, len: usize },
    #[error("must be an RFC 3339 timestamp with an offset")]
    Timestamp,
    #[error("must not be '.' or '..' nor contain '/', '\\' or control characters")]
    PathSegment,
}

fn char_len(s: &str) -> usize {
    s.chars().count()
}

/// Whether `s` starts and ends with an ASCII character `trim` keeps (it
/// removes `char::is_whitespace`, which for ASCII is the space and
/// `\t`..`\r`): then trimming would give `s`, and the decoding of its
/// ends is skipped.
fn ends_untrimmable(s: &str) -> bool {
    let kept = |b: &u8| b.is_ascii() && !matches!(b, b' ' | b'\t'..=b'\r');
    s.as_bytes().first().is_some_and(kept) && s.as_bytes().last().is_some_and(kept)
}

/// A trimmed string with a character count in `MIN..=MAX`.
///
/// Trimming happens on construction and on read, as the contracts do.
/// The text is immutable once checked, so it is shared rather than
/// copied: a clone (every audit record, event and check carries the turn's
/// ids) is a reference count, not an allocation.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Text<const MIN: usize, const MAX: usize>(Arc<str>);

impl<const MIN: usize, const MAX: usize> Text<MIN, MAX> {
    pub fn new(value: impl AsRef<str>) -> Result<Self, PrimitiveError> {
        let value = value.as_ref();
        let trimmed = if ends_untrimmable(value) {
            value
        } else {
            value.trim()
        };
        // A character is one to four bytes: when the byte length alone
        // puts the count within bounds, the characters need no counting.
        let bytes = trimmed.len();
        if bytes <= MAX && bytes.div_ceil(4) >= MIN {
            return Ok(Self(Arc::from(trimmed)));
        }
        let len = char_len(trimmed);
        if len < MIN || len > MAX {
            return Err(PrimitiveError::Length {
                min: MIN,
                max: MAX,
                len,
            });
        }
        Ok(Self(Arc::from(trimmed)))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    pub fn into_string(self) -> String {
        String::from(&*self.0)
    }
}

impl<const MIN: usize, const MAX: usize> Serialize for Text<MIN, MAX> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<const MIN: usize, const MAX: usize> fmt::Debug for Text<MIN, MAX> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl<const MIN: usize, const MAX: usize> fmt::Display for Text<MIN, MAX> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<const MIN: usize, const MAX: usize> AsRef<str> for Text<MIN, MAX> {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl<const MIN: usize, const MAX: usize> PartialEq<str> for Text<MIN, MAX> {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl<const MIN: usize, const MAX: usize> PartialEq<&str> for Text<MIN, MAX> {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl<'de, const MIN: usize, const MAX: usize> Deserialize<'de> for Text<MIN, MAX> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_str_with(d, |s| Self::new(s))
    }
}

impl<const MIN: usize, const MAX: usize> JsonSchema for Text<MIN, MAX> {
    fn schema_name() -> Cow<'static, str> {
        format!("Text_{MIN}_{MAX}").into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "minLength": MIN,
            "maxLength": MAX,
            "description": "Trimmed on read; the length is counted after trimming."
        })
    }
}

/// `Identifier`: a trimmed string of 1..256 characters.
pub type Identifier = Text<1, 256>;
/// A purpose string: trimmed, 1..512 characters.
pub type Purpose = Text<1, 512>;
/// A tool description: 1..8192 characters.
pub type Description = Text<1, 8192>;
/// A `ProtocolError.message`: 1..4096 characters.
pub type ErrorMessage = Text<1, 4096>;
/// An escalation reason: trimmed, 1..512 characters.
pub type Reason = Text<1, 512>;
/// An event type or capability action: 1..128 characters.
pub type ShortName = Text<1, 128>;

/// Builds an [`Identifier`] from a literal known to be valid.
///
/// # Panics
/// Panics when the literal is not a valid identifier; use only with
/// constants written in code, never with input.
pub fn ident(value: &str) -> Identifier {
    match Identifier::new(value) {
        Ok(id) => id,
        Err(e) => panic!("identifier literal {value:?} is invalid: {e}"),
    }
}

/// An RFC 3339 datetime with an offset. The text is shared: a copy (every
/// event, context and result of a call carries the time) costs a count,
/// not an allocation.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(Arc<str>);

impl Timestamp {
    pub fn parse(value: impl AsRef<str>) -> Result<Self, PrimitiveError> {
        let v = value.as_ref();
        // The common shape is checked by hand; `time` decides the rest.
        if !crate::rfc3339::surely_valid(v.as_bytes()) {
            time::OffsetDateTime::parse(v, &time::format_description::well_known::Rfc3339)
                .map_err(|_| PrimitiveError::Timestamp)?;
        }
        Ok(Self(Arc::from(v)))
    }
    /// The current time, in UTC with millisecond precision. Formatted once
    /// per millisecond and thread: a tool call takes the time several
    /// times (its context, its events, its result), and within one
    /// millisecond the text is the same, so a repeat shares the last text
    /// instead of a new formatting. The text is written by hand
    /// ([`crate::rfc3339`]), the same as `time` writes it.
    pub fn now() -> Self {
        thread_local! {
            static LAST: std::cell::RefCell<Option<(u64, Timestamp)>> =
                const { std::cell::RefCell::new(None) };
        }
        let wall = std::time::SystemTime::now();
        let Ok(since) = wall.duration_since(std::time::UNIX_EPOCH) else {
            return Self::from_offset(time::OffsetDateTime::from(wall));
        };
        let millis = since
            .as_secs()
            .saturating_mul(1000)
            .saturating_add(u64::from(since.subsec_millis()));
        LAST.with(|last| {
            let mut last = last.borrow_mut();
            if let Some((at_ms, text)) = last.as_ref()
                && *at_ms == millis
            {
                return text.clone();
            }
            let mut out = [0u8; crate::rfc3339::MAX_LEN];
            let text = crate::rfc3339::utc_millis(millis, &mut out)
                .and_then(|len| std::str::from_utf8(&out[..len]).ok())
                .map(|s| Self(Arc::from(s)))
                .unwrap_or_else(|| Self::from_offset(time::OffsetDateTime::from(wall)));
            *last = Some((millis, text.clone()));
            text
        })
    }
    pub fn from_offset(at: time::OffsetDateTime) -> Self {
        let at = at
            .replace_nanosecond((at.nanosecond() / 1_000_000) * 1_000_000)
            .unwrap_or(at);
        let s = at
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_owned());
        Self(Arc::from(s))
    }
    pub fn to_offset(&self) -> time::OffsetDateTime {
        time::OffsetDateTime::parse(&self.0, &time::format_description::well_known::Rfc3339)
            .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_str_with(d, |s| Self::parse(s))
    }
}

impl JsonSchema for Timestamp {
    fn schema_name() -> Cow<'static, str> {
        "Timestamp".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "format": "date-time"})
    }
}

/// A resource path segment: 1..256 characters, trimmed, not `.` or `..`,
/// without `/`, `\` or control characters.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct PathSegment(String);

impl PathSegment {
    pub fn new(value: impl AsRef<str>) -> Result<Self, PrimitiveError> {
        let t = value.as_ref().trim();
        let len = char_len(t);
        if !(1..=256).contains(&len) {
            return Err(PrimitiveError::Length {
                min: 1,
                max: 256,
                len,
            });
        }
        if t == "." || t == ".." || t.chars().any(|c| c == '/' || c == '\\' || c.is_control()) {
            return Err(PrimitiveError::PathSegment);
        }
        Ok(Self(t.to_owned()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for PathSegment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl<'de> Deserialize<'de> for PathSegment {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        from_str_with(d, |s| Self::new(s))
    }
}

impl JsonSchema for PathSegment {
    fn schema_name() -> Cow<'static, str> {
        "PathSegment".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string", "minLength": 1, "maxLength": 256,
            "not": {"enum": [".", ".."]},
            "pattern": "^[^/\\\\\\u0000-\\u001f\\u007f]+$"
        })
    }
}

/// Who sends, receives, owns or acts (`Address`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Address {
    Human {
        #[serde(rename = "userId")]
        user_id: Identifier,
    },
    Agent {
        #[serde(rename = "agentId")]
        agent_id: Identifier,
    },
    Group {
        #[serde(rename = "conversationId")]
        conversation_id: Identifier,
    },
    Service {
        #[serde(rename = "serviceId")]
        service_id: Identifier,
    },
}

impl Address {
    /// The resource path naming this address (`["agent", id]`, ...).
    pub fn path(&self) -> [String; 2] {
        match self {
            Address::Human { user_id } => ["human".into(), user_id.as_str().into()],
            Address::Agent { agent_id } => ["agent".into(), agent_id.as_str().into()],
            Address::Group { conversation_id } => ["group".into(), conversation_id.as_str().into()],
            Address::Service { service_id } => ["service".into(), service_id.as_str().into()],
        }
    }
    pub fn agent(id: &str) -> Result<Self, PrimitiveError> {
        Ok(Address::Agent {
            agent_id: Identifier::new(id)?,
        })
    }
    pub fn human(id: &str) -> Result<Self, PrimitiveError> {
        Ok(Address::Human {
            user_id: Identifier::new(id)?,
        })
    }
}

/// A deserializer for a required `JsonValue` field that may be `null`.
///
/// With `#[serde(default)]`, an absent key gives `None` and a present `null`
/// gives `Some(Value::Null)`, so "missing" and "null" stay distinct.
pub fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

/// JSON canonical form: object keys sorted, compact. Addresses and catalogues
/// are compared and hashed in this form.
pub fn canonical_json(value: &serde_json::Value) -> String {
    fn sort(v: &serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(map) => {
                let mut keys: Vec<_> = map.keys().collect();
                keys.sort();
                let mut out = serde_json::Map::new();
                for k in keys {
                    out.insert(k.clone(), sort(&map[k]));
                }
                serde_json::Value::Object(out)
            }
            serde_json::Value::Array(items) => {
                serde_json::Value::Array(items.iter().map(sort).collect())
            }
            other => other.clone(),
        }
    }
    // serde_json's Map keeps insertion order only with `preserve_order`; this
    // crate does not enable it, so the sorted insert above is also the order
    // of serialization.
    serde_json::to_string(&sort(value)).unwrap_or_default()
}

/// Deserializes a string and builds `T` from it with `build`, reading the
/// string where the input holds it when it can (a `Cow<str>` outside a
/// derive is always an owned copy, and `build` copies again). It accepts
/// and refuses what `String`'s own deserializer does, with its messages.
pub(crate) fn from_str_with<'de, D, T, E>(
    d: D,
    build: impl FnOnce(&str) -> Result<T, E>,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    E: fmt::Display,
{
    struct Build<F>(F);
    impl<'de, T, E: fmt::Display, F: FnOnce(&str) -> Result<T, E>> serde::de::Visitor<'de>
        for Build<F>
    {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<Er: serde::de::Error>(self, v: &str) -> Result<T, Er> {
            (self.0)(v).map_err(Er::custom)
        }
        fn visit_bytes<Er: serde::de::Error>(self, v: &[u8]) -> Result<T, Er> {
            match std::str::from_utf8(v) {
                Ok(s) => self.visit_str(s),
                Err(_) => Err(Er::invalid_value(serde::de::Unexpected::Bytes(v), &self)),
            }
        }
    }
    d.deserialize_string(Build(build))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifier_trims_and_bounds() {
        assert_eq!(Identifier::new("  a ").unwrap().as_str(), "a");
        // Bounds count characters, not bytes, whether or not the byte
        // length alone settles them.
        type Two = Text<2, 3>;
        for (s, ok) in [
            ("a", false),
            ("ab", true),
            ("abc", true),
            ("abcd", false),
            ("é", false),
            ("éé", true),
            ("€€€", true),
            ("éééé", false),
            ("😀", false),
            ("😀😀", true),
            ("😀😀😀", true),
            ("😀😀😀😀", false),
        ] {
            assert_eq!(Two::new(s).is_ok(), ok, "{s:?}");
        }
        assert!(Identifier::new("é".repeat(256)).is_ok());
        assert!(Identifier::new("é".repeat(257)).is_err());
        assert!(Identifier::new("   ").is_err());
        assert!(Identifier::new("x".repeat(257)).is_err());
        assert!(serde_json::from_str::<Identifier>("\"\"").is_err());
    }

    #[test]
    fn untrimmable_ends_are_those_trim_keeps() {
        for a in 0..=0x7fu8 {
            for b in [b'x', b' ', b'\t', 0x0b, 0x1c, 0x7f] {
                for s in [
                    String::from(char::from(a)),
                    format!("{}{}", char::from(a), char::from(b)),
                    format!("{}é{}", char::from(b), char::from(a)),
                ] {
                    if ends_untrimmable(&s) {
                        assert_eq!(s.trim(), s, "{s:?}");
                    }
                }
            }
        }
        for s in ["\u{a0}x", "x\u{2003}", "\u{85}", ""] {
            assert!(!ends_untrimmable(s), "{s:?}");
        }
        assert!(ends_untrimmable("a b"));
    }

    #[test]
    fn path_segment_rules() {
        for bad in [".", "..", "a/b", "a\\b", "a\u{0}b", ""] {
            assert!(PathSegment::new(bad).is_err(), "{bad:?}");
        }
        assert!(PathSegment::new("cell-3").is_ok());
    }

    #[test]
    fn timestamps() {
        assert!(Timestamp::parse("2026-09-18T10:00:00Z").is_ok());
        assert!(Timestamp::parse("2026-09-18T10:00:00+02:00").is_ok());
        assert!(Timestamp::parse("2026-09-18 10:00").is_err());
        let now = Timestamp::now();
        assert!(Timestamp::parse(now.as_str()).is_ok());
    }

    #[test]
    fn now_follows_the_clock_past_its_cached_millisecond() {
        for _ in 0..5 {
            let first = Timestamp::now();
            std::thread::sleep(std::time::Duration::from_millis(3));
            let floor = Timestamp::from_offset(time::OffsetDateTime::now_utc());
            let later = Timestamp::now();
            assert!(
                later.to_offset() >= floor.to_offset(),
                "{later} is before {floor}"
            );
            assert!(later.to_offset() > first.to_offset());
        }
    }

    #[test]
    fn address_roundtrip_strict() {
        let a: Address = serde_json::from_str(r#"{"kind":"agent","agentId":"alice"}"#).unwrap();
        assert_eq!(a.path(), ["agent".to_string(), "alice".to_string()]);
        assert!(
            serde_json::from_str::<Address>(r#"{"kind":"agent","agentId":"a","x":1}"#).is_err()
        );
    }

    #[test]
    fn canonical_sorts_keys() {
        let v = serde_json::json!({"b":1,"a":{"d":2,"c":3}});
        assert_eq!(canonical_json(&v), r#"{"a":{"c":3,"d":2},"b":1}"#);
    }
}
