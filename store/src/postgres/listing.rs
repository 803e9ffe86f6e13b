//! PostgreSQL pages of a scope's sessions and a session's runs (crate
//! `listing`): ordered by `sharedos_millis`, the function the migration's
//! indexes hold.

use tokio_postgres::{GenericClient, Row};

use super::{RUN_COLUMNS, corrupt, pg, run_of};
use crate::listing::{bounds, sql_limit};
use crate::{RunQuery, RunRecord, SessionQuery, SessionRecord, StoreError};

pub(super) async fn sessions(
    c: &impl GenericClient,
    q: &SessionQuery,
) -> Result<Vec<SessionRecord>, StoreError> {
    let (from, to, after_ms, after_id) = bounds(&q.created, q.after.as_ref());
    let rows = c
        .query(
            "SELECT id, agent_id, runtime_id, scope, binding, open, created_at, closed_at \
             FROM sessions WHERE scope = $1 AND ($2::boolean IS NULL OR open = $2) \
             AND sharedos_millis(created_at) > $3 AND sharedos_millis(created_at) < $4 \
             AND (sharedos_millis(created_at), id) > ($5, $6) \
             ORDER BY sharedos_millis(created_at), id LIMIT $7",
            &[
                &q.scope.to_string(),
                &q.open,
                &from,
                &to,
                &after_ms,
                &after_id,
                &sql_limit(q.limit),
            ],
        )
        .await
        .map_err(pg)?;
    rows.iter().map(session_of).collect()
}

/// The session columns this module and deletion read.
pub(super) const SESSION_COLUMNS: &str =
    "id, agent_id, runtime_id, scope, binding, open, created_at, closed_at";

/// A row of [`SESSION_COLUMNS`].
pub(super) fn session_of(row: &Row) -> Result<SessionRecord, StoreError> {
    Ok(SessionRecord {
        id: row.get(0),
        agent_id: row.get(1),
        runtime_id: row.get(2),
        scope: serde_json::from_str(row.get(3)).map_err(corrupt)?,
        binding: serde_json::from_str(row.get(4)).map_err(corrupt)?,
        open: row.get(5),
        created_at: row.get(6),
        closed_at: row.get(7),
    })
}

pub(super) async fn runs(
    c: &impl GenericClient,
    q: &RunQuery,
) -> Result<Vec<RunRecord>, StoreError> {
    let (from, to, after_ms, after_id) = bounds(&q.admitted, q.after.as_ref());
    let rows = c
        .query(
            &format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE session_id = $1 \
                 AND ($2::text IS NULL OR state = $2) \
                 AND sharedos_millis(admitted_at) > $3 AND sharedos_millis(admitted_at) < $4 \
                 AND (sharedos_millis(admitted_at), id) > ($5, $6) \
                 ORDER BY sharedos_millis(admitted_at), id LIMIT $7"
            ),
            &[
                &q.session_id,
                &q.state.map(|s| s.as_str()),
                &from,
                &to,
                &after_ms,
                &after_id,
                &sql_limit(q.limit),
            ],
        )
        .await
        .map_err(pg)?;
    rows.iter().map(run_of).collect()
}
