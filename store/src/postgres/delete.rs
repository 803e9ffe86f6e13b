//! Deleting an ended run and its journal, or a closed session with its
//! runs and their journals (docs/STORE.md, "Deletion"); audit records are
//! kept.

use tokio_postgres::Client;

use super::listing::{SESSION_COLUMNS, session_of};
use super::{pg, read_run};
use crate::{RunRecord, RunState, SessionRecord, StoreError, SweepQuery, Swept};

pub(super) async fn run(client: &mut Client, id: &str) -> Result<RunRecord, StoreError> {
    let tx = client.transaction().await.map_err(pg)?;
    // The row is locked first: a run cannot end, nor be deleted twice,
    // while this transaction decides.
    tx.execute("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE", &[&id])
        .await
        .map_err(pg)?;
    let run = read_run(&tx, id).await?;
    if run.state == RunState::InFlight {
        return Err(StoreError::RunInFlight(id.to_owned()));
    }
    tx.execute("DELETE FROM run_events WHERE run_id = $1", &[&id])
        .await
        .map_err(pg)?;
    tx.execute("DELETE FROM runs WHERE id = $1", &[&id])
        .await
        .map_err(pg)?;
    tx.commit().await.map_err(pg)?;
    Ok(run)
}

pub(super) async fn session(client: &mut Client, id: &str) -> Result<SessionRecord, StoreError> {
    let tx = client.transaction().await.map_err(pg)?;
    // Admission locks the session's row too: no run is admitted into it
    // while this transaction decides.
    let row = tx
        .query_opt("SELECT open FROM sessions WHERE id = $1 FOR UPDATE", &[&id])
        .await
        .map_err(pg)?
        .ok_or_else(|| StoreError::NotFound {
            what: "session",
            id: id.to_owned(),
        })?;
    if row.get::<_, bool>(0) {
        return Err(StoreError::SessionOpen(id.to_owned()));
    }
    let flying = tx
        .query_opt(
            "SELECT id FROM runs WHERE session_id = $1 AND state = 'in_flight' LIMIT 1 FOR UPDATE",
            &[&id],
        )
        .await
        .map_err(pg)?;
    if let Some(run) = flying {
        return Err(StoreError::RunInFlight(run.get(0)));
    }
    let row = tx
        .query_one(
            &format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id = $1"),
            &[&id],
        )
        .await
        .map_err(pg)?;
    let session = session_of(&row)?;
    tx.execute(
        "DELETE FROM run_events WHERE run_id IN (SELECT id FROM runs WHERE session_id = $1)",
        &[&id],
    )
    .await
    .map_err(pg)?;
    tx.execute("DELETE FROM runs WHERE session_id = $1", &[&id])
        .await
        .map_err(pg)?;
    tx.execute("DELETE FROM sessions WHERE id = $1", &[&id])
        .await
        .map_err(pg)?;
    tx.commit().await.map_err(pg)?;
    Ok(session)
}

pub(super) async fn sweep(client: &mut Client, q: &SweepQuery) -> Result<Swept, StoreError> {
    let (runs_before, sessions_before) = (q.ended_runs_before_ms, q.closed_sessions_before_ms);
    let tx = client.transaction().await.map_err(pg)?;
    let limit = crate::listing::sql_limit(q.limit);
    let mut swept = Swept::default();
    if let Some(before) = sessions_before {
        let rows = tx
            .query(
                "SELECT id FROM sessions s WHERE NOT open AND sharedos_millis(closed_at) < $1 \
                 AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.session_id = s.id AND r.state = 'in_flight') \
                 LIMIT $2 FOR UPDATE",
                &[&before, &limit],
            )
            .await
            .map_err(pg)?;
        let ids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        tx.execute(
            "DELETE FROM run_events WHERE run_id IN (SELECT id FROM runs WHERE session_id = ANY($1))",
            &[&ids],
        )
        .await
        .map_err(pg)?;
        tx.execute("DELETE FROM runs WHERE session_id = ANY($1)", &[&ids])
            .await
            .map_err(pg)?;
        tx.execute("DELETE FROM sessions WHERE id = ANY($1)", &[&ids])
            .await
            .map_err(pg)?;
        swept.sessions = ids.len() as u64;
    }
    if let Some(before) = runs_before {
        let rows = tx
            .query(
                "SELECT id FROM runs WHERE state <> 'in_flight' AND sharedos_millis(ended_at) < $1 \
                 LIMIT $2 FOR UPDATE",
                &[&before, &limit],
            )
            .await
            .map_err(pg)?;
        let ids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        tx.execute("DELETE FROM run_events WHERE run_id = ANY($1)", &[&ids])
            .await
            .map_err(pg)?;
        tx.execute("DELETE FROM runs WHERE id = ANY($1)", &[&ids])
            .await
            .map_err(pg)?;
        swept.runs = ids.len() as u64;
    }
    tx.commit().await.map_err(pg)?;
    Ok(swept)
}
