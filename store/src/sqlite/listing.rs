//! SQLite pages of a scope's sessions and a session's runs (crate
//! `listing`): ordered by the expression the migration's indexes hold.

use rusqlite::{Connection, params};

use super::runs::{RUN_COLUMNS, raw_run, run_of};
use super::unavailable;
use crate::listing::{bounds, sql_limit};
use crate::{RunQuery, RunRecord, SessionQuery, SessionRecord, StoreError};

/// A session's or a run's time in milliseconds, as the indexes hold it.
const CREATED_MS: &str = "CAST(ROUND(unixepoch(created_at, 'subsec') * 1000) AS INTEGER)";
const ADMITTED_MS: &str = "CAST(ROUND(unixepoch(admitted_at, 'subsec') * 1000) AS INTEGER)";

pub(crate) fn sessions(
    conn: &Connection,
    q: &SessionQuery,
) -> Result<Vec<SessionRecord>, StoreError> {
    let (from, to, after_ms, after_id) = bounds(&q.created, q.after.as_ref());
    let sql = format!(
        "SELECT id, agent_id, runtime_id, scope, binding, open, created_at, closed_at \
         FROM sessions WHERE scope = ?1 AND (?2 IS NULL OR open = ?2) \
         AND {CREATED_MS} > ?3 AND {CREATED_MS} < ?4 \
         AND ({CREATED_MS} > ?5 OR ({CREATED_MS} = ?5 AND id > ?6)) \
         ORDER BY {CREATED_MS}, id LIMIT ?7"
    );
    let mut stmt = conn.prepare_cached(&sql).map_err(unavailable)?;
    let rows = stmt
        .query_map(
            params![
                q.scope.to_string(),
                q.open,
                from,
                to,
                after_ms,
                after_id,
                sql_limit(q.limit)
            ],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, bool>(5)?,
                    r.get::<_, String>(6)?,
                    r.get::<_, Option<String>>(7)?,
                ))
            },
        )
        .map_err(unavailable)?;
    rows.map(|row| {
        let row = row.map_err(unavailable)?;
        Ok(SessionRecord {
            id: row.0,
            agent_id: row.1,
            runtime_id: row.2,
            scope: serde_json::from_str(&row.3).map_err(corrupt)?,
            binding: serde_json::from_str(&row.4).map_err(corrupt)?,
            open: row.5,
            created_at: row.6,
            closed_at: row.7,
        })
    })
    .collect()
}

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

pub(crate) fn runs(conn: &Connection, q: &RunQuery) -> Result<Vec<RunRecord>, StoreError> {
    let (from, to, after_ms, after_id) = bounds(&q.admitted, q.after.as_ref());
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE session_id = ?1 AND (?2 IS NULL OR state = ?2) \
         AND {ADMITTED_MS} > ?3 AND {ADMITTED_MS} < ?4 \
         AND ({ADMITTED_MS} > ?5 OR ({ADMITTED_MS} = ?5 AND id > ?6)) \
         ORDER BY {ADMITTED_MS}, id LIMIT ?7"
    );
    let mut stmt = conn.prepare_cached(&sql).map_err(unavailable)?;
    let rows = stmt
        .query_map(
            params![
                q.session_id,
                q.state.map(|s| s.as_str()),
                from,
                to,
                after_ms,
                after_id,
                sql_limit(q.limit)
            ],
            raw_run,
        )
        .map_err(unavailable)?;
    rows.map(|r| run_of(r.map_err(unavailable)?)).collect()
}
