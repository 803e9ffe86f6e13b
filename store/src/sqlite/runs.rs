//! SQLite rows of sessions, runs and the journal: admission, a run's end
//! with retention, and reads from `afterSequence`.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde_json::Value;
use sharedos_protocol::ExecutionEvent;

use super::fence::check;
use crate::{Admission, Lease, NewRun, RunRecord, RunState, SessionRecord, StoreError};

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

pub(crate) const RUN_COLUMNS: &str = "id, session_id, request_id, payload_digest, input, state, host_id, \
     result, recovery, dropped_through, admitted_at, ended_at";

pub(crate) type RawRun = (
    String,
    String,
    String,
    String,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<i64>,
    String,
    Option<String>,
);

pub(crate) fn raw_run(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawRun> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
        r.get(9)?,
        r.get(10)?,
        r.get(11)?,
    ))
}

fn parse_json(text: &str) -> Result<Value, StoreError> {
    serde_json::from_str(text).map_err(corrupt)
}

pub(crate) fn run_of(raw: RawRun) -> Result<RunRecord, StoreError> {
    let (
        id,
        session_id,
        request_id,
        digest,
        input,
        state,
        host_id,
        result,
        recovery,
        dropped,
        at,
        end,
    ) = raw;
    Ok(RunRecord {
        id,
        session_id,
        request_id,
        payload_digest: digest,
        input: parse_json(&input)?,
        state: RunState::parse(&state)?,
        host_id,
        result: result.as_deref().map(parse_json).transpose()?,
        recovery: recovery.as_deref().map(parse_json).transpose()?,
        dropped_through: dropped.map(|d| d as u64),
        admitted_at: at,
        ended_at: end,
    })
}

pub(crate) fn read_run(conn: &Connection, id: &str) -> Result<RunRecord, StoreError> {
    let raw = conn
        .query_row(
            &format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"),
            [id],
            raw_run,
        )
        .optional()
        .map_err(unavailable)?
        .ok_or_else(|| StoreError::NotFound {
            what: "run",
            id: id.to_owned(),
        })?;
    run_of(raw)
}

pub(crate) fn read_session(conn: &Connection, id: &str) -> Result<SessionRecord, StoreError> {
    let row = conn
        .query_row(
            "SELECT id, agent_id, runtime_id, scope, binding, open, created_at, closed_at \
             FROM sessions WHERE id = ?1",
            [id],
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
        .optional()
        .map_err(unavailable)?
        .ok_or_else(|| StoreError::NotFound {
            what: "session",
            id: id.to_owned(),
        })?;
    Ok(SessionRecord {
        id: row.0,
        agent_id: row.1,
        runtime_id: row.2,
        scope: parse_json(&row.3)?,
        binding: parse_json(&row.4)?,
        open: row.5,
        created_at: row.6,
        closed_at: row.7,
    })
}

pub(crate) fn admit(
    conn: &mut Connection,
    lease: Option<&Lease>,
    run: &NewRun,
) -> Result<Admission, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(unavailable)?;
    check(&tx, lease)?;
    let session = read_session(&tx, &run.session_id)?;
    let existing: Option<String> = tx
        .query_row(
            "SELECT id FROM runs WHERE session_id = ?1 AND request_id = ?2",
            params![run.session_id, run.request_id],
            |r| r.get(0),
        )
        .optional()
        .map_err(unavailable)?;
    if let Some(id) = existing {
        let original = read_run(&tx, &id)?;
        if original.payload_digest != run.payload_digest {
            return Err(StoreError::RequestConflict {
                session_id: run.session_id.clone(),
                request_id: run.request_id.clone(),
                run_id: original.id,
            });
        }
        return Ok(Admission::Existing(original));
    }
    if !session.open {
        return Err(StoreError::SessionClosed(session.id));
    }
    tx.execute(
        "INSERT INTO runs (id, session_id, request_id, payload_digest, input, state, host_id, admitted_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, 'in_flight', ?6, ?7)",
        params![
            run.id,
            run.session_id,
            run.request_id,
            run.payload_digest,
            run.input.to_string(),
            run.host_id,
            run.admitted_at
        ],
    )
    .map_err(unavailable)?;
    let stored = read_run(&tx, &run.id)?;
    tx.commit().map_err(unavailable)?;
    Ok(Admission::New(stored))
}

pub(crate) fn end(
    conn: &mut Connection,
    lease: Option<&Lease>,
    keep_events_per_run: Option<u64>,
    id: &str,
    result: &Value,
    at: &str,
) -> Result<RunRecord, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(unavailable)?;
    check(&tx, lease)?;
    let run = read_run(&tx, id)?;
    if run.state != RunState::InFlight {
        return Err(StoreError::RunEnded(id.to_owned()));
    }
    tx.execute(
        "UPDATE runs SET state = 'ended', result = ?2, ended_at = ?3 WHERE id = ?1",
        params![id, result.to_string(), at],
    )
    .map_err(unavailable)?;
    if let Some(keep) = keep_events_per_run {
        let last: Option<i64> = tx
            .query_row(
                "SELECT MAX(sequence) FROM run_events WHERE run_id = ?1",
                [id],
                |r| r.get(0),
            )
            .map_err(unavailable)?;
        if let Some(last) = last
            && last + 1 > keep as i64
        {
            let through = last - keep as i64;
            tx.execute(
                "DELETE FROM run_events WHERE run_id = ?1 AND sequence <= ?2",
                params![id, through],
            )
            .map_err(unavailable)?;
            tx.execute(
                "UPDATE runs SET dropped_through = ?2 WHERE id = ?1",
                params![id, through],
            )
            .map_err(unavailable)?;
        }
    }
    let stored = read_run(&tx, id)?;
    tx.commit().map_err(unavailable)?;
    Ok(stored)
}

pub(crate) fn events(
    conn: &Connection,
    run_id: &str,
    after: Option<u64>,
    limit: usize,
) -> Result<Vec<ExecutionEvent>, StoreError> {
    let run = read_run(conn, run_id)?;
    if let Some(dropped) = run.dropped_through
        && after.is_none_or(|a| a < dropped)
    {
        return Err(StoreError::Dropped {
            run_id: run_id.to_owned(),
            requested: after.map_or_else(|| "the start".to_owned(), |a| a.to_string()),
            dropped_through: dropped,
        });
    }
    let last: Option<i64> = conn
        .query_row(
            "SELECT MAX(sequence) FROM run_events WHERE run_id = ?1",
            [run_id],
            |r| r.get(0),
        )
        .map_err(unavailable)?;
    // A sequence is never above i64::MAX: anything beyond the last stored
    // one (2^63 and more included) is past the end, never a wrapped -1.
    let from = match after {
        None => -1,
        Some(a) => match (i64::try_from(a), last) {
            (Ok(from), Some(l)) if from <= l => from,
            _ => {
                return Err(StoreError::BeyondEnd {
                    run_id: run_id.to_owned(),
                    requested: a,
                    last: last.map_or_else(|| "none".to_owned(), |l| l.to_string()),
                });
            }
        },
    };
    let mut stmt = conn
        .prepare_cached(
            "SELECT event FROM run_events WHERE run_id = ?1 AND sequence > ?2 \
             ORDER BY sequence LIMIT ?3",
        )
        .map_err(unavailable)?;
    let rows = stmt
        .query_map(params![run_id, from, limit as i64], |r| {
            r.get::<_, String>(0)
        })
        .map_err(unavailable)?;
    rows.map(|row| {
        let text = row.map_err(unavailable)?;
        serde_json::from_str(&text).map_err(corrupt)
    })
    .collect()
}
