//! `GET /v1/sessions` and `GET /v1/sessions/{id}/runs`: the query string
//! (filters, `limit`, `cursor`) read strictly, each bad parameter a `400`
//! with a code saying which one and why (docs/SERVE.md, "Listing sessions
//! and runs").

use std::sync::Arc;

use serde_json::{Value, json};
use sharedos_protocol::Timestamp;
use sharedos_store::{Keyset, RunState, TimeRange};

use crate::session::{ListFilter, Page, Scope, SessionError, Sessions};

/// Items per page unless `limit` says otherwise, and the most it may say.
pub const DEFAULT_LIMIT: usize = 50;
pub const MAX_LIMIT: usize = 500;

/// The longest cursor read (a cursor this server issued is under 80).
const MAX_CURSOR_CHARS: usize = 160;

/// Why a listing was refused: its query (a `400` with this code), or the
/// session call.
#[derive(Debug)]
pub enum Refusal {
    Query { code: &'static str, message: String },
    Session(SessionError),
}

impl From<SessionError> for Refusal {
    fn from(e: SessionError) -> Self {
        Refusal::Session(e)
    }
}

fn bad(code: &'static str, message: impl Into<String>) -> Refusal {
    Refusal::Query {
        code,
        message: message.into(),
    }
}

/// `%XX` escapes decoded; `+` is kept as it is (a time's offset).
pub(super) fn percent_decode(text: &str) -> Result<String, Refusal> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    bad(
                        "invalid_query",
                        "a % in the query is not followed by two hex digits",
                    )
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad("invalid_query", "the query is not UTF-8"))
}

/// The query's parameters, each named at most once and each one of
/// `known`.
pub(super) fn parameters(
    query: Option<&str>,
    known: &[&str],
) -> Result<Vec<(String, String)>, Refusal> {
    let mut seen: Vec<(String, String)> = Vec::new();
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let (name, value) = (percent_decode(name)?, percent_decode(value)?);
        if !known.contains(&name.as_str()) {
            let shown: String = name.chars().take(64).collect();
            return Err(bad(
                "unknown_parameter",
                format!(
                    "unknown query parameter {shown:?}: this endpoint takes {}",
                    known.join(", ")
                ),
            ));
        }
        if seen.iter().any(|(n, _)| *n == name) {
            return Err(bad(
                "invalid_query",
                format!("{name} is given more than once"),
            ));
        }
        seen.push((name, value));
    }
    Ok(seen)
}

/// Milliseconds since the Unix epoch of an RFC 3339 time: rounded down for
/// a lower bound, up for an upper one, so the exclusive bound holds.
fn time_bound(name: &str, value: &str, up: bool) -> Result<i64, Refusal> {
    let at = Timestamp::parse(value).map_err(|_| {
        bad(
            "invalid_time",
            format!("{name} must be an RFC 3339 time with an offset, e.g. 2026-01-31T12:00:00Z (send + as %2B)"),
        )
    })?;
    let nanos = at.to_offset().unix_timestamp_nanos();
    let millis = nanos.div_euclid(1_000_000) + i128::from(up && nanos.rem_euclid(1_000_000) != 0);
    Ok(i64::try_from(millis).unwrap_or(if up { i64::MAX } else { i64::MIN }))
}

fn limit(value: &str) -> Result<usize, Refusal> {
    value
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=MAX_LIMIT).contains(n) && value.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| {
            bad(
                "invalid_limit",
                format!("limit must be a whole number from 1 to {MAX_LIMIT}"),
            )
        })
}

/// The cursor of the page after `key`: opaque to callers (hex of the kind
/// of listing, the time and the id).
fn cursor(kind: char, key: &Keyset) -> String {
    format!("{kind}.{}.{}", key.at_ms, key.id)
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn parse_cursor(kind: char, value: &str) -> Result<Keyset, Refusal> {
    let invalid = || {
        bad(
            "invalid_cursor",
            "cursor must be a nextCursor this listing returned, unchanged",
        )
    };
    if value.len() > MAX_CURSOR_CHARS || !value.len().is_multiple_of(2) {
        return Err(invalid());
    }
    let bytes = (0..value.len())
        .step_by(2)
        .map(|i| {
            value
                .get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        })
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(invalid)?;
    let text = String::from_utf8(bytes).map_err(|_| invalid())?;
    let mut parts = text.splitn(3, '.');
    let (Some(k), Some(ms), Some(id)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(invalid());
    };
    let issued_id = id.len() == 36 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    match (k == kind.to_string(), ms.parse::<i64>(), issued_id) {
        (true, Ok(at_ms), true) => Ok(Keyset {
            at_ms,
            id: id.to_owned(),
        }),
        _ => Err(invalid()),
    }
}

/// A listing's filter from its query: `state` read by `state`, the time
/// bounds named `after`/`before`.
fn filter<S>(
    query: Option<&str>,
    (kind, after, before): (char, &str, &str),
    state: impl Fn(&str) -> Result<S, Refusal>,
) -> Result<ListFilter<S>, Refusal> {
    let known = ["state", after, before, "limit", "cursor"];
    let mut f = ListFilter {
        state: None,
        range: TimeRange::default(),
        after: None,
        limit: DEFAULT_LIMIT,
    };
    for (name, value) in parameters(query, &known)? {
        match name.as_str() {
            "state" => f.state = Some(state(&value)?),
            "limit" => f.limit = limit(&value)?,
            "cursor" => f.after = Some(parse_cursor(kind, &value)?),
            n if n == after => f.range.after_ms = Some(time_bound(n, &value, false)?),
            n => f.range.before_ms = Some(time_bound(n, &value, true)?),
        }
    }
    Ok(f)
}

fn answer<T: serde::Serialize>(kind: char, name: &str, page: Page<T>) -> Value {
    let next = page.next.as_ref().map(|k| cursor(kind, k));
    json!({ name: page.items, "nextCursor": next })
}

/// `GET /v1/sessions`: the caller scope's sessions.
pub async fn sessions(
    sessions: &Arc<Sessions>,
    scope: &Scope,
    query: Option<&str>,
) -> Result<Value, Refusal> {
    let f = filter(query, ('s', "createdAfter", "createdBefore"), |v| match v {
        "open" => Ok(true),
        "closed" => Ok(false),
        _ => Err(bad("invalid_state", "a session's state is open or closed")),
    })?;
    Ok(answer(
        's',
        "sessions",
        sessions.list_sessions(scope, f).await?,
    ))
}

/// `GET /v1/sessions/{id}/runs`: a session's runs.
pub async fn runs(
    sessions: &Arc<Sessions>,
    scope: &Scope,
    session_id: &str,
    query: Option<&str>,
) -> Result<Value, Refusal> {
    let f = filter(
        query,
        ('r', "admittedAfter", "admittedBefore"),
        |v| match v {
            "in_flight" => Ok(RunState::InFlight),
            "ended" => Ok(RunState::Ended),
            "interrupted" => Ok(RunState::Interrupted),
            _ => Err(bad(
                "invalid_state",
                "a run's state is in_flight, ended or interrupted",
            )),
        },
    )?;
    let page = sessions.list_runs(scope, session_id, f).await?;
    Ok(answer('r', "runs", page))
}

/// `DELETE /v1/sessions/{id}`'s query: none closes the session,
/// `purge=true` deletes a closed one with its runs (docs/SERVE.md,
/// "Deletion"); anything else is refused.
pub fn purge(query: Option<&str>) -> Result<bool, Refusal> {
    let mut purge = false;
    for (_, value) in parameters(query, &["purge"])? {
        purge = match value.as_str() {
            "true" => true,
            "false" => false,
            _ => return Err(bad("invalid_query", "purge is true or false")),
        };
    }
    Ok(purge)
}
