//! Tenant tokens held in the store: the credentials of `sharedos serve`
//! over TCP (docs/STORE.md, "Tokens"; docs/SERVE.md, "Tenants").
//!
//! A token row binds a secret to the part of a scope its holder cannot
//! choose: the namespace and the authority. Only the SHA-256 of the secret
//! is kept; a request's secret is hashed and looked up by that hash. A
//! revoked token keeps its row (with `revoked_at`) and is never live
//! again; every host reads the row on every request, so a revocation holds
//! from the next request of every host sharing the store.

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use sharedos_protocol::Address;
use tokio_postgres::Client;

use crate::StoreError;

/// A token as stored. `secret_sha256` is never serialized: a listing
/// shows neither the secret nor its hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredToken {
    pub id: String,
    pub namespace_id: String,
    pub authority: Address,
    pub label: String,
    #[serde(skip)]
    pub secret_sha256: String,
    pub created_at: String,
    pub revoked_at: Option<String>,
}

const COLUMNS: &str =
    "id, namespace_id, authority_json, label, secret_sha256, created_at, revoked_at";

fn corrupt(e: serde_json::Error) -> StoreError {
    StoreError::Corrupt(format!("a stored token's authority: {e}"))
}

fn authority_json(token: &StoredToken) -> Result<String, StoreError> {
    serde_json::to_string(&token.authority).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn not_found(id: &str) -> StoreError {
    StoreError::NotFound {
        what: "token",
        id: id.to_owned(),
    }
}

/// The SQLite side.
pub(crate) mod sqlite {
    use super::*;

    fn unavailable(e: impl std::fmt::Display) -> StoreError {
        StoreError::Unavailable(e.to_string())
    }

    type Raw = (
        String,
        String,
        String,
        String,
        String,
        String,
        Option<String>,
    );

    fn raw(r: &rusqlite::Row<'_>) -> rusqlite::Result<Raw> {
        Ok((
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
            r.get(6)?,
        ))
    }

    fn parse(r: Raw) -> Result<StoredToken, StoreError> {
        Ok(StoredToken {
            id: r.0,
            namespace_id: r.1,
            authority: serde_json::from_str(&r.2).map_err(corrupt)?,
            label: r.3,
            secret_sha256: r.4,
            created_at: r.5,
            revoked_at: r.6,
        })
    }

    pub(crate) fn add(conn: &Connection, token: &StoredToken) -> Result<(), StoreError> {
        conn.execute(
            &format!("INSERT INTO tokens ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
            params![
                token.id,
                token.namespace_id,
                authority_json(token)?,
                token.label,
                token.secret_sha256,
                token.created_at,
                token.revoked_at
            ],
        )
        .map_err(unavailable)?;
        Ok(())
    }

    pub(crate) fn revoke(conn: &Connection, id: &str, at: &str) -> Result<bool, StoreError> {
        let n = conn
            .execute(
                "UPDATE tokens SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
                params![id, at],
            )
            .map_err(unavailable)?;
        if n == 0 {
            let known: Option<String> = conn
                .query_row("SELECT id FROM tokens WHERE id = ?1", [id], |r| r.get(0))
                .optional()
                .map_err(unavailable)?;
            if known.is_none() {
                return Err(not_found(id));
            }
        }
        Ok(n == 1)
    }

    pub(crate) fn all(conn: &Connection) -> Result<Vec<StoredToken>, StoreError> {
        let mut stmt = conn
            .prepare(&format!(
                "SELECT {COLUMNS} FROM tokens ORDER BY created_at, id"
            ))
            .map_err(unavailable)?;
        let rows = stmt.query_map([], raw).map_err(unavailable)?;
        rows.map(|r| parse(r.map_err(unavailable)?)).collect()
    }

    pub(crate) fn by_hash(
        conn: &Connection,
        hash: &str,
    ) -> Result<Option<StoredToken>, StoreError> {
        conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM tokens WHERE secret_sha256 = ?1"
        ))
        .map_err(unavailable)?
        .query_row([hash], raw)
        .optional()
        .map_err(unavailable)?
        .map(parse)
        .transpose()
    }
}

/// The PostgreSQL side.
pub(crate) mod postgres {
    use super::*;

    fn pg(e: tokio_postgres::Error) -> StoreError {
        StoreError::Unavailable(match e.as_db_error() {
            Some(db) => format!("PostgreSQL {}: {}", db.code().code(), db.message()),
            None => e.to_string(),
        })
    }

    fn parse(r: &tokio_postgres::Row) -> Result<StoredToken, StoreError> {
        Ok(StoredToken {
            id: r.get(0),
            namespace_id: r.get(1),
            authority: serde_json::from_str(r.get::<_, &str>(2)).map_err(corrupt)?,
            label: r.get(3),
            secret_sha256: r.get(4),
            created_at: r.get(5),
            revoked_at: r.get(6),
        })
    }

    pub(crate) async fn add(c: &Client, token: &StoredToken) -> Result<(), StoreError> {
        c.execute(
            &format!("INSERT INTO tokens ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)"),
            &[
                &token.id,
                &token.namespace_id,
                &authority_json(token)?,
                &token.label,
                &token.secret_sha256,
                &token.created_at,
                &token.revoked_at,
            ],
        )
        .await
        .map_err(pg)?;
        Ok(())
    }

    pub(crate) async fn revoke(c: &Client, id: &str, at: &str) -> Result<bool, StoreError> {
        let n = c
            .execute(
                "UPDATE tokens SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL",
                &[&id, &at],
            )
            .await
            .map_err(pg)?;
        if n == 0
            && c.query_opt("SELECT id FROM tokens WHERE id = $1", &[&id])
                .await
                .map_err(pg)?
                .is_none()
        {
            return Err(not_found(id));
        }
        Ok(n == 1)
    }

    pub(crate) async fn all(c: &Client) -> Result<Vec<StoredToken>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM tokens ORDER BY created_at, id");
        let rows = c.query(&sql, &[]).await.map_err(pg)?;
        rows.iter().map(parse).collect()
    }

    pub(crate) async fn by_hash(c: &Client, hash: &str) -> Result<Option<StoredToken>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM tokens WHERE secret_sha256 = $1");
        c.query_opt(&sql, &[&hash])
            .await
            .map_err(pg)?
            .as_ref()
            .map(parse)
            .transpose()
    }
}
