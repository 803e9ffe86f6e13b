//! [`OpenTurn`]: what one turn of the embedded kernel loaded once (its
//! authority, a snapshot of the tool registry) and the hash of the
//! catalogue it listed. The operations on it live in their own modules
//! (`turn.rs` answers the port, `invoke.rs` and `effect.rs` run the two
//! pipelines); each imports this one, none of them another.

use std::sync::{Arc, Mutex};

use sharedos_protocol::JsonObject;

use super::Shared;
use super::records::catalog_metadata;
use crate::grant::Grant;
use crate::registry::ToolRegistry;

/// One turn of the embedded kernel.
pub(super) struct OpenTurn {
    pub(super) shared: Arc<Shared>,
    /// The turn's grants, or why they could not be loaded
    /// (`grant_source_failed`): every operation then refuses.
    pub(super) grants: Result<Arc<Vec<Grant>>, &'static str>,
    pub(super) authority_hash: Option<String>,
    pub(super) registry: Arc<ToolRegistry>,
    /// `{"catalogHash": ..}` of the catalogue listed, made once per
    /// listing: every `tool.invoked` of the turn carries a copy.
    catalog_metadata: Mutex<Option<JsonObject>>,
}

impl OpenTurn {
    pub(super) fn new(
        shared: Arc<Shared>,
        grants: Result<Arc<Vec<Grant>>, &'static str>,
        authority_hash: Option<String>,
        registry: Arc<ToolRegistry>,
    ) -> Self {
        Self {
            shared,
            grants,
            authority_hash,
            registry,
            catalog_metadata: Mutex::new(None),
        }
    }

    /// The `metadata` of a `tool.invoked`: the hash of the catalogue
    /// `list_tools` answered, once listed.
    pub(super) fn catalog_metadata(&self) -> Option<JsonObject> {
        self.catalog_metadata.lock().ok().and_then(|m| m.clone())
    }

    /// Keeps the hash of the catalogue just listed.
    pub(super) fn set_catalog_hash(&self, hash: String) {
        if let Ok(mut m) = self.catalog_metadata.lock() {
            *m = catalog_metadata(Some(hash));
        }
    }
}
