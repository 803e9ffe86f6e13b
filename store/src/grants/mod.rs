//! Grants held in the store: the trusted grant source of a served host.
//!
//! A grant row keeps the grant as the kernel reads it, where it came from
//! (`configuration`: imported from `[kernel].grants` at start; `operator`:
//! `sharedos grants add`) and whether it is revoked. Grants are immutable
//! once stored, apart from revocation, and a revoked id is never live again
//! (neither an import nor an add brings it back), so a `maxUses` counter
//! keyed by the grant id always counts uses of one grant.
//!
//! [`StoreGrants`] is the kernel's `GrantSource` over a store: each turn
//! loads the grants of its actor in its namespace, with their delegation
//! ancestors, from the database. A grant added or revoked by any host is
//! what the next turn of every host sharing the database loads.

pub(crate) mod postgres;
pub(crate) mod sqlite;

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sharedos_kernel::{Grant, GrantSource, MAX_DELEGATION_DEPTH};
use sharedos_protocol::{AccessContext, Address};

use crate::{Store, StoreError};

/// Where a stored grant came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrantOrigin {
    /// Imported from the host configuration's `[kernel].grants` at start.
    Configuration,
    /// Added by an operator (`sharedos grants add`).
    Operator,
}

impl GrantOrigin {
    pub fn as_str(self) -> &'static str {
        match self {
            GrantOrigin::Configuration => "configuration",
            GrantOrigin::Operator => "operator",
        }
    }
    pub(crate) fn parse(text: &str) -> Result<Self, StoreError> {
        match text {
            "configuration" => Ok(GrantOrigin::Configuration),
            "operator" => Ok(GrantOrigin::Operator),
            other => Err(StoreError::Corrupt(format!(
                "unknown grant origin {other:?}"
            ))),
        }
    }
}

/// A grant as the store holds it. `grant.revoked` reflects the store's
/// revocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredGrant {
    pub grant: Grant,
    pub origin: GrantOrigin,
    pub added_at: String,
    pub revoked_at: Option<String>,
}

/// What importing the configuration's grants did, by grant id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GrantImport {
    /// New in the store.
    pub added: Vec<String>,
    /// Imported before with other content; the configuration's copy
    /// replaced it (its use counter goes on).
    pub updated: Vec<String>,
    /// Imported before and no longer in the configuration: revoked.
    pub revoked: Vec<String>,
    /// In the configuration but revoked in the store: left revoked.
    pub still_revoked: Vec<String>,
}

/// The key grants are looked up by: the subject's path, `agent/alice`.
pub(crate) fn subject_key(subject: &Address) -> String {
    subject.path().join("/")
}

/// A stored row, as both backends read it.
pub(crate) struct GrantRow {
    pub grant_json: String,
    pub origin: String,
    pub revoked: bool,
    pub added_at: String,
    pub revoked_at: Option<String>,
}

impl GrantRow {
    pub(crate) fn into_stored(self) -> Result<StoredGrant, StoreError> {
        let mut grant: Grant = serde_json::from_str(&self.grant_json)
            .map_err(|e| StoreError::Corrupt(format!("a stored grant: {e}")))?;
        grant.revoked = grant.revoked || self.revoked;
        Ok(StoredGrant {
            grant,
            origin: GrantOrigin::parse(&self.origin)?,
            added_at: self.added_at,
            revoked_at: self.revoked_at,
        })
    }
}

/// The stored form of a grant (its `revoked` lives in its own column).
pub(crate) fn grant_json(grant: &Grant) -> Result<String, StoreError> {
    let mut g = grant.clone();
    g.revoked = false;
    serde_json::to_string(&g).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// What an import does with one configured grant, given the row under its
/// id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ImportStep {
    Insert,
    Update,
    Keep,
    StillRevoked,
}

pub(crate) fn import_step(
    existing: Option<&GrantRow>,
    id: &str,
    json: &str,
) -> Result<ImportStep, StoreError> {
    let Some(row) = existing else {
        return Ok(ImportStep::Insert);
    };
    if row.origin != GrantOrigin::Configuration.as_str() {
        return Err(StoreError::GrantConflict(format!(
            "the configuration names grant {id:?}, which an operator added with `sharedos grants add`: rename the grant in the configuration, or revoke the stored one and use another id"
        )));
    }
    Ok(if row.revoked {
        ImportStep::StillRevoked
    } else if row.grant_json == json {
        ImportStep::Keep
    } else {
        ImportStep::Update
    })
}

/// The kernel's grant source over a store.
pub struct StoreGrants {
    store: Arc<dyn Store>,
}

impl StoreGrants {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self { store }
    }
}

#[async_trait]
impl GrantSource for StoreGrants {
    async fn load(&self, context: &AccessContext) -> Result<Vec<Grant>, String> {
        let mut out = self
            .store
            .grants_for(context.namespace_id.as_str(), &context.actor)
            .await
            .map_err(|e| e.to_string())?;
        // The delegation ancestors, so the kernel can check each chain; a
        // chain deeper than the kernel allows is refused by the kernel.
        for _ in 0..=MAX_DELEGATION_DEPTH {
            let missing: Vec<String> = out
                .iter()
                .filter_map(|g| g.parent_grant_id.as_ref())
                .filter(|p| !out.iter().any(|g| &g.id == *p))
                .map(|p| p.as_str().to_owned())
                .collect();
            if missing.is_empty() {
                break;
            }
            for id in missing {
                if let Some(parent) = self
                    .store
                    .grant(&id)
                    .await
                    .map_err(|e| e.to_string())?
                    .filter(|p| !out.iter().any(|g| g.id == p.grant.id))
                {
                    out.push(parent.grant);
                }
            }
        }
        Ok(out)
    }
}
