//! Listing a scope's sessions and a session's runs, a page at a time.
//!
//! Pages are keyset pages in creation order (a session's `createdAt`, a
//! run's `admittedAt`, then the id): a page starts after the last row of
//! the page before, so rows added or removed meanwhile never shift a page,
//! and no row is listed twice. Times are stored as RFC 3339 text whose
//! fraction has no fixed width, so both backends order and compare by the
//! time in milliseconds since the Unix epoch, computed by the same
//! expression their index holds (migration 6).

use serde_json::Value;

use crate::RunState;

/// Where a page starts: after the row created at `at_ms` with this id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyset {
    pub at_ms: i64,
    pub id: String,
}

/// Bounds on creation time, in milliseconds since the Unix epoch, both
/// exclusive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TimeRange {
    pub after_ms: Option<i64>,
    pub before_ms: Option<i64>,
}

/// Which sessions [`crate::Store::list_sessions`] returns.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionQuery {
    /// The scope the sessions were opened under, exactly as stored.
    pub scope: Value,
    /// `Some(true)` open sessions only, `Some(false)` closed ones only.
    pub open: Option<bool>,
    pub created: TimeRange,
    pub after: Option<Keyset>,
    pub limit: usize,
}

/// Which runs [`crate::Store::list_runs`] returns.
#[derive(Debug, Clone, PartialEq)]
pub struct RunQuery {
    pub session_id: String,
    pub state: Option<RunState>,
    pub admitted: TimeRange,
    pub after: Option<Keyset>,
    pub limit: usize,
}

/// The SQL bound of a keyset page or a time range: `i64::MIN`/`i64::MAX`
/// stand for "no bound" so one statement serves every query.
pub(crate) fn bounds(range: &TimeRange, after: Option<&Keyset>) -> (i64, i64, i64, String) {
    let (after_ms, after_id) = match after {
        Some(k) => (k.at_ms, k.id.clone()),
        None => (i64::MIN, String::new()),
    };
    (
        range.after_ms.unwrap_or(i64::MIN),
        range.before_ms.unwrap_or(i64::MAX),
        after_ms,
        after_id,
    )
}

/// A page's size as SQL takes it.
pub(crate) fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}
