//! Grant rows in SQLite. Writes run in `BEGIN IMMEDIATE` transactions,
//! like every other write that reads first.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use sharedos_kernel::Grant;
use sharedos_protocol::Address;

use super::{
    GrantImport, GrantOrigin, GrantRow, ImportStep, StoredGrant, grant_json, import_step,
    subject_key,
};
use crate::StoreError;

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

const COLUMNS: &str = "grant_json, origin, revoked, added_at, revoked_at";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<GrantRow> {
    Ok(GrantRow {
        grant_json: r.get(0)?,
        origin: r.get(1)?,
        revoked: r.get(2)?,
        added_at: r.get(3)?,
        revoked_at: r.get(4)?,
    })
}

fn read(conn: &Connection, id: &str) -> Result<Option<GrantRow>, StoreError> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM grants WHERE id = ?1"),
        [id],
        row,
    )
    .optional()
    .map_err(unavailable)
}

pub(crate) fn grant(conn: &Connection, id: &str) -> Result<Option<StoredGrant>, StoreError> {
    read(conn, id)?.map(GrantRow::into_stored).transpose()
}

pub(crate) fn grants_for(
    conn: &Connection,
    namespace_id: &str,
    subject: &Address,
) -> Result<Vec<Grant>, StoreError> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM grants WHERE namespace_id = ?1 AND subject = ?2 ORDER BY added_at, id"
        ))
        .map_err(unavailable)?;
    let rows = stmt
        .query_map(params![namespace_id, subject_key(subject)], row)
        .map_err(unavailable)?;
    rows.map(|r| Ok(r.map_err(unavailable)?.into_stored()?.grant))
        .collect()
}

pub(crate) fn all(conn: &Connection) -> Result<Vec<StoredGrant>, StoreError> {
    let mut stmt = conn
        .prepare(&format!(
            "SELECT {COLUMNS} FROM grants ORDER BY added_at, id"
        ))
        .map_err(unavailable)?;
    let rows = stmt.query_map([], row).map_err(unavailable)?;
    rows.map(|r| r.map_err(unavailable)?.into_stored())
        .collect()
}

fn insert(
    conn: &Connection,
    grant: &Grant,
    json: &str,
    origin: GrantOrigin,
    at: &str,
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO grants (id, namespace_id, subject, grant_json, origin, revoked, added_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            grant.id.as_str(),
            grant.namespace_id.as_str(),
            subject_key(&grant.subject),
            json,
            origin.as_str(),
            grant.revoked,
            at
        ],
    )
    .map_err(unavailable)?;
    Ok(())
}

pub(crate) fn add(
    conn: &mut Connection,
    grant: &Grant,
    origin: GrantOrigin,
    at: &str,
) -> Result<(), StoreError> {
    let json = grant_json(grant)?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(unavailable)?;
    if read(&tx, grant.id.as_str())?.is_some() {
        return Err(StoreError::GrantConflict(format!(
            "grant {:?} already exists (ids are never reused, even revoked): choose another id",
            grant.id.as_str()
        )));
    }
    insert(&tx, grant, &json, origin, at)?;
    tx.commit().map_err(unavailable)
}

pub(crate) fn revoke(conn: &mut Connection, id: &str, at: &str) -> Result<bool, StoreError> {
    let n = conn
        .execute(
            "UPDATE grants SET revoked = 1, revoked_at = ?2 WHERE id = ?1 AND revoked = 0",
            params![id, at],
        )
        .map_err(unavailable)?;
    if n == 0 && read(conn, id)?.is_none() {
        return Err(StoreError::NotFound {
            what: "grant",
            id: id.to_owned(),
        });
    }
    Ok(n == 1)
}

pub(crate) fn import(
    conn: &mut Connection,
    grants: &[Grant],
    at: &str,
) -> Result<GrantImport, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(unavailable)?;
    let mut report = GrantImport::default();
    for g in grants {
        let json = grant_json(g)?;
        let id = g.id.as_str();
        match import_step(read(&tx, id)?.as_ref(), id, &json)? {
            ImportStep::Insert => {
                insert(&tx, g, &json, GrantOrigin::Configuration, at)?;
                report.added.push(id.to_owned());
            }
            ImportStep::Update => {
                tx.execute(
                    "UPDATE grants SET namespace_id = ?2, subject = ?3, grant_json = ?4 WHERE id = ?1",
                    params![id, g.namespace_id.as_str(), subject_key(&g.subject), json],
                )
                .map_err(unavailable)?;
                report.updated.push(id.to_owned());
            }
            ImportStep::Keep => {}
            ImportStep::StillRevoked => report.still_revoked.push(id.to_owned()),
        }
    }
    let configured: Vec<&str> = grants.iter().map(|g| g.id.as_str()).collect();
    let stale: Vec<String> = {
        let mut stmt = tx
            .prepare("SELECT id FROM grants WHERE origin = 'configuration' AND revoked = 0")
            .map_err(unavailable)?;
        let ids = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(unavailable)?;
        ids.collect::<Result<Vec<String>, _>>()
            .map_err(unavailable)?
            .into_iter()
            .filter(|id| !configured.contains(&id.as_str()))
            .collect()
    };
    for id in stale {
        tx.execute(
            "UPDATE grants SET revoked = 1, revoked_at = ?2 WHERE id = ?1",
            params![id, at],
        )
        .map_err(unavailable)?;
        report.revoked.push(id);
    }
    tx.commit().map_err(unavailable)?;
    Ok(report)
}
