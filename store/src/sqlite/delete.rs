//! Deleting an ended run and its journal, or a closed session with its
//! runs and their journals (docs/STORE.md, "Deletion"); audit records are
//! kept.

use rusqlite::{Connection, TransactionBehavior, params};

use rusqlite::OptionalExtension;

use super::runs::{read_run, read_session};
use super::unavailable;
use crate::{RunRecord, RunState, SessionRecord, StoreError, SweepQuery, Swept};

pub(crate) fn run(conn: &mut Connection, id: &str) -> Result<RunRecord, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(unavailable)?;
    let run = read_run(&tx, id)?;
    if run.state == RunState::InFlight {
        return Err(StoreError::RunInFlight(id.to_owned()));
    }
    tx.execute("DELETE FROM run_events WHERE run_id = ?1", [id])
        .map_err(unavailable)?;
    tx.execute("DELETE FROM runs WHERE id = ?1", [id])
        .map_err(unavailable)?;
    tx.commit().map_err(unavailable)?;
    Ok(run)
}

pub(crate) fn session(conn: &mut Connection, id: &str) -> Result<SessionRecord, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(unavailable)?;
    let session = read_session(&tx, id)?;
    if session.open {
        return Err(StoreError::SessionOpen(id.to_owned()));
    }
    let flying: Option<String> = tx
        .query_row(
            "SELECT id FROM runs WHERE session_id = ?1 AND state = 'in_flight' LIMIT 1",
            [id],
            |r| r.get(0),
        )
        .optional()
        .map_err(unavailable)?;
    if let Some(run) = flying {
        return Err(StoreError::RunInFlight(run));
    }
    tx.execute(
        "DELETE FROM run_events WHERE run_id IN (SELECT id FROM runs WHERE session_id = ?1)",
        [id],
    )
    .map_err(unavailable)?;
    tx.execute("DELETE FROM runs WHERE session_id = ?1", [id])
        .map_err(unavailable)?;
    tx.execute("DELETE FROM sessions WHERE id = ?1", [id])
        .map_err(unavailable)?;
    tx.commit().map_err(unavailable)?;
    Ok(session)
}

/// A time column in milliseconds, as the listing indexes hold it.
fn ms(column: &str) -> String {
    format!("CAST(ROUND(unixepoch({column}, 'subsec') * 1000) AS INTEGER)")
}

pub(crate) fn sweep(conn: &mut Connection, q: &SweepQuery) -> Result<Swept, StoreError> {
    let (runs_before, sessions_before) = (q.ended_runs_before_ms, q.closed_sessions_before_ms);
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(unavailable)?;
    let limit = crate::listing::sql_limit(q.limit);
    let ids = |sql: String, before: i64| -> Result<Vec<String>, StoreError> {
        let mut stmt = tx.prepare(&sql).map_err(unavailable)?;
        let rows = stmt
            .query_map(params![before, limit], |r| r.get::<_, String>(0))
            .map_err(unavailable)?;
        rows.map(|r| r.map_err(unavailable)).collect()
    };
    let sessions = match sessions_before {
        Some(before) => ids(
            format!(
                "SELECT id FROM sessions s WHERE open = 0 AND {} < ?1 AND NOT EXISTS \
                 (SELECT 1 FROM runs r WHERE r.session_id = s.id AND r.state = 'in_flight') LIMIT ?2",
                ms("closed_at")
            ),
            before,
        )?,
        None => Vec::new(),
    };
    for id in &sessions {
        tx.execute(
            "DELETE FROM run_events WHERE run_id IN (SELECT id FROM runs WHERE session_id = ?1)",
            [id],
        )
        .map_err(unavailable)?;
        tx.execute("DELETE FROM runs WHERE session_id = ?1", [id])
            .map_err(unavailable)?;
        tx.execute("DELETE FROM sessions WHERE id = ?1", [id])
            .map_err(unavailable)?;
    }
    let runs = match runs_before {
        Some(before) => ids(
            format!(
                "SELECT id FROM runs WHERE state <> 'in_flight' AND {} < ?1 LIMIT ?2",
                ms("ended_at")
            ),
            before,
        )?,
        None => Vec::new(),
    };
    for id in &runs {
        tx.execute("DELETE FROM run_events WHERE run_id = ?1", [id])
            .map_err(unavailable)?;
        tx.execute("DELETE FROM runs WHERE id = ?1", [id])
            .map_err(unavailable)?;
    }
    tx.commit().map_err(unavailable)?;
    Ok(Swept {
        sessions: sessions.len() as u64,
        runs: runs.len() as u64,
    })
}
