//! Grant rows in PostgreSQL. An add or an import locks the rows it reads
//! (`FOR UPDATE`), and an import first takes a transaction-scoped advisory
//! lock, so hosts starting together import one after the other.

use sharedos_kernel::Grant;
use sharedos_protocol::Address;
use tokio_postgres::{Client, GenericClient, Row};

use super::{
    GrantImport, GrantOrigin, GrantRow, ImportStep, StoredGrant, grant_json, import_step,
    subject_key,
};
use crate::StoreError;

/// Serializes grant imports between hosts starting together.
const IMPORT_LOCK: i64 = 0x5348_4752_4e54;

fn pg(e: tokio_postgres::Error) -> StoreError {
    StoreError::Unavailable(match e.as_db_error() {
        Some(db) => format!("PostgreSQL {}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    })
}

const COLUMNS: &str = "grant_json, origin, revoked, added_at, revoked_at";

fn row(r: &Row) -> GrantRow {
    GrantRow {
        grant_json: r.get(0),
        origin: r.get(1),
        revoked: r.get(2),
        added_at: r.get(3),
        revoked_at: r.get(4),
    }
}

async fn read(
    c: &impl GenericClient,
    id: &str,
    lock: bool,
) -> Result<Option<GrantRow>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM grants WHERE id = $1{}",
        if lock { " FOR UPDATE" } else { "" }
    );
    Ok(c.query_opt(&sql, &[&id])
        .await
        .map_err(pg)?
        .as_ref()
        .map(row))
}

pub(crate) async fn grant(c: &Client, id: &str) -> Result<Option<StoredGrant>, StoreError> {
    read(c, id, false)
        .await?
        .map(GrantRow::into_stored)
        .transpose()
}

pub(crate) async fn grants_for(
    c: &Client,
    namespace_id: &str,
    subject: &Address,
) -> Result<Vec<Grant>, StoreError> {
    let rows = c
        .query(
            &format!(
                "SELECT {COLUMNS} FROM grants WHERE namespace_id = $1 AND subject = $2 ORDER BY added_at, id"
            ),
            &[&namespace_id, &subject_key(subject)],
        )
        .await
        .map_err(pg)?;
    rows.iter()
        .map(|r| Ok(row(r).into_stored()?.grant))
        .collect()
}

pub(crate) async fn all(c: &Client) -> Result<Vec<StoredGrant>, StoreError> {
    let rows = c
        .query(
            &format!("SELECT {COLUMNS} FROM grants ORDER BY added_at, id"),
            &[],
        )
        .await
        .map_err(pg)?;
    rows.iter().map(|r| row(r).into_stored()).collect()
}

async fn insert(
    c: &impl GenericClient,
    grant: &Grant,
    json: &str,
    origin: GrantOrigin,
    at: &str,
) -> Result<(), StoreError> {
    c.execute(
        "INSERT INTO grants (id, namespace_id, subject, grant_json, origin, revoked, added_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        &[
            &grant.id.as_str(),
            &grant.namespace_id.as_str(),
            &subject_key(&grant.subject),
            &json,
            &origin.as_str(),
            &grant.revoked,
            &at,
        ],
    )
    .await
    .map_err(|e| match e.code() {
        Some(code) if *code == tokio_postgres::error::SqlState::UNIQUE_VIOLATION => {
            StoreError::GrantConflict(format!(
                "grant {:?} already exists (ids are never reused, even revoked): choose another id",
                grant.id.as_str()
            ))
        }
        _ => pg(e),
    })?;
    Ok(())
}

pub(crate) async fn add(
    c: &mut Client,
    grant: &Grant,
    origin: GrantOrigin,
    at: &str,
) -> Result<(), StoreError> {
    // One statement: the primary key decides between two hosts adding the
    // same id at once.
    insert(&*c, grant, &grant_json(grant)?, origin, at).await
}

pub(crate) async fn revoke(c: &mut Client, id: &str, at: &str) -> Result<bool, StoreError> {
    let n = c
        .execute(
            "UPDATE grants SET revoked = TRUE, revoked_at = $2 WHERE id = $1 AND NOT revoked",
            &[&id, &at],
        )
        .await
        .map_err(pg)?;
    if n == 0 && read(&*c, id, false).await?.is_none() {
        return Err(StoreError::NotFound {
            what: "grant",
            id: id.to_owned(),
        });
    }
    Ok(n == 1)
}

pub(crate) async fn import(
    c: &mut Client,
    grants: &[Grant],
    at: &str,
) -> Result<GrantImport, StoreError> {
    let tx = c.transaction().await.map_err(pg)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&IMPORT_LOCK])
        .await
        .map_err(pg)?;
    let mut report = GrantImport::default();
    for g in grants {
        let json = grant_json(g)?;
        let id = g.id.as_str();
        match import_step(read(&tx, id, true).await?.as_ref(), id, &json)? {
            ImportStep::Insert => {
                insert(&tx, g, &json, GrantOrigin::Configuration, at).await?;
                report.added.push(id.to_owned());
            }
            ImportStep::Update => {
                tx.execute(
                    "UPDATE grants SET namespace_id = $2, subject = $3, grant_json = $4 WHERE id = $1",
                    &[&id, &g.namespace_id.as_str(), &subject_key(&g.subject), &json],
                )
                .await
                .map_err(pg)?;
                report.updated.push(id.to_owned());
            }
            ImportStep::Keep => {}
            ImportStep::StillRevoked => report.still_revoked.push(id.to_owned()),
        }
    }
    let configured: Vec<&str> = grants.iter().map(|g| g.id.as_str()).collect();
    let live = tx
        .query(
            "SELECT id FROM grants WHERE origin = 'configuration' AND NOT revoked FOR UPDATE",
            &[],
        )
        .await
        .map_err(pg)?;
    for r in live {
        let id: String = r.get(0);
        if configured.contains(&id.as_str()) {
            continue;
        }
        tx.execute(
            "UPDATE grants SET revoked = TRUE, revoked_at = $2 WHERE id = $1",
            &[&id, &at],
        )
        .await
        .map_err(pg)?;
        report.revoked.push(id);
    }
    tx.commit().await.map_err(pg)?;
    Ok(report)
}
