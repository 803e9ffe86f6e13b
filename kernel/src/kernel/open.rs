//! [`OpenTurn`]: what one turn of the embedded kernel loaded once (its
//! authority, a snapshot of the tool registry) and the hash of the
//! catalogue it listed. The operations on it live in their own modules
//! (`turn.rs` answers the port, `invoke.rs` and `effect.rs` run the two
//! pipelines); each imports this one, none of them another.

use std::sync::{Arc, Mutex};

use super::Shared;
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
    catalog_hash: Mutex<Option<String>>,
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
            catalog_hash: Mutex::new(None),
        }
    }

    /// The hash of the catalogue `list_tools` answered, once listed.
    pub(super) fn catalog_hash(&self) -> Option<String> {
        self.catalog_hash.lock().ok().and_then(|h| h.clone())
    }

    /// Keeps the hash of the catalogue just listed.
    pub(super) fn set_catalog_hash(&self, hash: String) {
        if let Ok(mut h) = self.catalog_hash.lock() {
            *h = Some(hash);
        }
    }
}
