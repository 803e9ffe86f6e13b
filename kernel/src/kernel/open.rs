//! [`OpenTurn`]: what one turn of the embedded kernel loaded once (its
//! authority, a snapshot of the tool registry) and the hash of the
//! catalogue it listed. The operations on it live in their own modules
//! (`turn.rs` answers the port, `invoke.rs` and `effect.rs` run the two
//! pipelines); each imports this one, none of them another.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use futures_util::FutureExt;
use futures_util::future::Shared as SharedFuture;
use sharedos_protocol::AccessContext;

use super::Shared;
use super::records::catalog_metadata;
use crate::audit::{AuditRecord, RecordIdentity, RecordMetadata};
use crate::grant::Grant;
use crate::port::{AuditEffect, KernelError, OpeningDurable};
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
    /// The commit of the opening's records when they were handed to the
    /// sink together (`TurnKernel::open_admitted`); every operation that
    /// records or acts waits for it.
    opening: OnceLock<SharedFuture<OpeningDurable>>,
    /// Set once `opening` settled `Ok`: the check every call makes after.
    opened: AtomicBool,
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
            opening: OnceLock::new(),
            opened: AtomicBool::new(false),
        }
    }

    /// Hands the opening's `records` to the sink as one group, written on
    /// a task of its own (it completes whoever waits), and answers its
    /// durability; [`OpenTurn::opened`] waits for the same commit.
    pub(super) fn hold_opening(&self, records: Vec<AuditRecord>) -> OpeningDurable {
        let sink = Arc::clone(&self.shared.recorder.audit);
        let task = tokio::spawn(async move { sink.append_all(&records).await });
        let durable: OpeningDurable = Box::pin(async move {
            let cause = match task.await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => e.to_string(),
                Err(_) => "the write of the turn's opening records did not finish".to_owned(),
            };
            Err(KernelError::AuditUnavailable {
                effect: AuditEffect::None,
                cause,
            })
        });
        let shared = durable.shared();
        let _ = self.opening.set(shared.clone());
        Box::pin(shared)
    }

    /// Waits until the opening's records are durable (at once when they
    /// were each written as the turn opened).
    pub(super) async fn opened(&self) -> Result<(), KernelError> {
        if self.opened.load(Ordering::Acquire) {
            return Ok(());
        }
        let Some(opening) = self.opening.get() else {
            return Ok(());
        };
        opening.clone().await?;
        self.opened.store(true, Ordering::Release);
        Ok(())
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
