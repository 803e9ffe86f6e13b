//! Files in and out of a session (docs/SERVE.md, "Files in and out"): a
//! session's files are its agent's, `<filesRoot>/<namespaceId>/<agentId>/`,
//! the directory its runs' file tools work in. Every path is resolved by
//! the kernel's files root beneath that directory without following a
//! symlink; a write is atomic and owner-only; each transfer is audited
//! (`file.uploaded`, `file.downloaded`, with the path, the size and the
//! SHA-256) after it happened.

use std::sync::Arc;

use serde_json::json;
use sha2::{Digest, Sha256};
use sharedos_kernel::tools::files::{FileError, FilesRoot};
use sharedos_kernel::{AuditKind, AuditRecord};
use sharedos_protocol::{Address, Timestamp};
use sharedos_store::StoreError;

use super::{Scope, SessionError, Sessions};

/// The files root `serve` moves files in and out of, and the most bytes
/// of one upload.
pub struct SessionFiles {
    pub root: Arc<FilesRoot>,
    pub max_upload_bytes: u64,
}

/// What a transfer did: the bytes (a download's), its size and digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    pub bytes: Vec<u8>,
    pub size: u64,
    pub sha256: String,
}

impl Sessions {
    /// Serves files in and out of sessions from `files`.
    pub fn with_files(mut self, files: SessionFiles) -> Self {
        self.files = Some(Arc::new(files));
        self
    }

    /// The most bytes one upload may have; `None` when this host has no
    /// file tools (`[kernel.files] enabled = false`).
    pub fn max_upload_bytes(&self) -> Option<u64> {
        self.files.as_ref().map(|f| f.max_upload_bytes)
    }

    /// Writes `content` as the file `segments` of session `id`.
    pub async fn upload(
        &self,
        scope: &Scope,
        id: &str,
        segments: Vec<String>,
        content: Vec<u8>,
    ) -> Result<Transfer, SessionError> {
        let op = move |root: &FilesRoot, ns: &str, agent: &str, segs: &[String]| {
            root.write_file(ns, agent, segs, &content)?;
            Ok(transfer_of(content, false))
        };
        self.audited(scope, id, segments, AuditKind::FileUploaded, op)
            .await
    }

    /// Reads the file `segments` of session `id`, at most `max` bytes.
    pub async fn download(
        &self,
        scope: &Scope,
        id: &str,
        segments: Vec<String>,
        max: u64,
    ) -> Result<Transfer, SessionError> {
        let op = move |root: &FilesRoot, ns: &str, agent: &str, segs: &[String]| {
            Ok(transfer_of(root.read_file(ns, agent, segs, max)?, true))
        };
        self.audited(scope, id, segments, AuditKind::FileDownloaded, op)
            .await
    }

    /// Runs the file operation `op` of session `id` off the async
    /// threads, then appends its audit record of `kind`.
    async fn audited<F>(
        &self,
        scope: &Scope,
        id: &str,
        segments: Vec<String>,
        kind: AuditKind,
        op: F,
    ) -> Result<Transfer, SessionError>
    where
        F: FnOnce(&FilesRoot, &str, &str, &[String]) -> Result<Transfer, FileError>
            + Send
            + 'static,
    {
        let (files, agent, purpose) = self.files_of(scope, id).await?;
        let ns = scope.namespace_id.to_string();
        let (segs, agent_name) = (segments.clone(), agent.clone());
        let transfer =
            tokio::task::spawn_blocking(move || op(&files.root, &ns, &agent_name, &segs))
                .await
                .map_err(|e| {
                    SessionError::Files(FileError {
                        code: "io_error",
                        message: e.to_string(),
                    })
                })?
                .map_err(SessionError::Files)?;
        let record = record(kind, scope, (id, &agent, &purpose), &segments, &transfer)?;
        self.store
            .append(&record)
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        Ok(transfer)
    }

    /// The files root, the session's agent and purpose, once the session
    /// is one `scope` may see.
    async fn files_of(
        &self,
        scope: &Scope,
        id: &str,
    ) -> Result<(Arc<SessionFiles>, String, String), SessionError> {
        let session = self.session(scope, id).await?;
        let files = self.files.clone().ok_or(SessionError::FilesDisabled)?;
        let purpose = session.binding["purpose"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        Ok((files, session.agent_id, purpose))
    }
}

fn transfer_of(bytes: Vec<u8>, keep: bool) -> Transfer {
    let size = bytes.len() as u64;
    let sha256 = format!("{:x}", Sha256::digest(&bytes));
    Transfer {
        bytes: if keep { bytes } else { Vec::new() },
        size,
        sha256,
    }
}

/// The audit record of a transfer, under the session's scope, its agent
/// the actor; the session's id is its trace.
fn record(
    kind: AuditKind,
    scope: &Scope,
    (session_id, agent, purpose): (&str, &str, &str),
    segments: &[String],
    transfer: &Transfer,
) -> Result<AuditRecord, SessionError> {
    let actor = Address::agent(agent).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let mut resource = vec![agent.to_owned()];
    resource.extend(segments.iter().cloned());
    let action = if kind == AuditKind::FileUploaded {
        "write"
    } else {
        "read"
    };
    let value = json!({
        "id": uuid::Uuid::new_v4().to_string(), "type": kind, "outcome": "succeeded",
        "at": Timestamp::now(), "traceId": session_id, "namespaceId": scope.namespace_id,
        "actor": actor, "authority": scope.authority, "owner": scope.owner, "purpose": purpose,
        "source": "envelope", "resource": {"namespace": "files", "path": resource}, "action": action,
        "metadata": {"path": segments.join("/"), "bytes": transfer.size, "sha256": transfer.sha256},
    });
    serde_json::from_value(value)
        .map_err(|e| StoreError::Corrupt(format!("audit record: {e}")).into())
}
