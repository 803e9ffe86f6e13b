//! [`OpenTurn`]: what one turn of the embedded kernel loaded once (its
//! authority, a snapshot of the tool registry) and the hash of the
//! catalogue it listed. The operations on it live in their own modules
//! (`turn.rs` answers the port, `invoke.rs` and `effect.rs` run the two
//! pipelines); each imports this one, none of them another.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use sharedos_protocol::AccessContext;

use super::Shared;
use super::records::catalog_metadata;
use crate::audit::{RecordIdentity, RecordMetadata};
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
    /// The identity fields of the context the turn opened with, and their
    /// JSON: every record of the turn shares them.
    identity: RecordIdentity,
    /// `{"catalogHash": ..}` of the catalogue listed, made (and written)
    /// once per listing: every `tool.invoked` of the turn shares it.
    catalog_metadata: Mutex<Option<Arc<RecordMetadata>>>,
}

impl OpenTurn {
    pub(super) fn new(
        shared: Arc<Shared>,
        grants: Result<Arc<Vec<Grant>>, &'static str>,
        authority_hash: Option<String>,
        registry: Arc<ToolRegistry>,
        identity: RecordIdentity,
    ) -> Self {
        Self {
            shared,
            grants,
            authority_hash,
            registry,
            identity,
            catalog_metadata: Mutex::new(None),
        }
    }

    /// The identity of `context`'s records: the turn's own when the
    /// context is the turn's (always, from the host), else its own.
    pub(super) fn identity(&self, context: &AccessContext) -> Cow<'_, RecordIdentity> {
        if self.identity.matches(context) {
            Cow::Borrowed(&self.identity)
        } else {
            Cow::Owned(RecordIdentity::of(context))
        }
    }

    /// The `metadata` of a `tool.invoked`: the hash of the catalogue
    /// `list_tools` answered, once listed.
    pub(super) fn catalog_metadata(&self) -> Option<Arc<RecordMetadata>> {
        self.catalog_metadata.lock().ok().and_then(|m| m.clone())
    }

    /// Keeps the hash of the catalogue just listed.
    pub(super) fn set_catalog_hash(&self, hash: String) {
        if let Ok(mut m) = self.catalog_metadata.lock() {
            *m = catalog_metadata(Some(hash)).map(|m| Arc::new(RecordMetadata::new(m)));
        }
    }
}
