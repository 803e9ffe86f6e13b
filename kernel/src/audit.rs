//! The audit trail: what was decided, before the effect, and what happened,
//! after it.
//!
//! Records never hold tool arguments, results or message payloads. A
//! [`JsonlAuditSink`] appends one JSON object per line to a file and
//! `fsync`s it before `append` returns, so a decision the kernel acted on is
//! on disk before the effect it permits.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sharedos_protocol::{AccessContext, Address, JsonObject, ResourceRef, Timestamp};
use tokio::sync::oneshot;

mod entry;
mod line;
pub mod per_call;

pub use entry::{
    AuditEntry, EntryId, IdentityRef, MetadataRef, RecordId, RecordIdentity, RecordMetadata,
};

/// `AuditOutcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditOutcome {
    Allowed,
    Denied,
    Succeeded,
    Failed,
    Escalated,
    Interrupted,
}

impl AuditOutcome {
    /// The name the audit file carries.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Escalated => "escalated",
            Self::Interrupted => "interrupted",
        }
    }
}

/// Who wrote the refusal or outcome a record describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditSource {
    Kernel,
    Envelope,
}

impl AuditSource {
    /// The name the audit file carries.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Kernel => "kernel",
            Self::Envelope => "envelope",
        }
    }
}

/// What an audit record records. Serialized as the dotted names the audit
/// file has always carried (`tool.invoked`, ...), so readers of old files and
/// the store's `kind` column see the same strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AuditKind {
    /// The turn's authority was loaded (`open_turn`).
    #[serde(rename = "authority.resolved")]
    AuthorityResolved,
    /// A decision: admission, discovery refusal, world boundary, exact
    /// re-authorization.
    #[serde(rename = "authorization.checked")]
    AuthorizationChecked,
    /// The turn's catalogue was listed.
    #[serde(rename = "tool.catalog.listed")]
    ToolCatalogListed,
    /// A tool call's outcome, or a refusal the envelope recorded.
    #[serde(rename = "tool.invoked")]
    ToolInvoked,
    /// An escalation outcome.
    #[serde(rename = "escalation.requested")]
    EscalationRequested,
    /// The end of a turn.
    #[serde(rename = "turn.ended")]
    TurnEnded,
    /// An effect outside the catalogue was decided (egress).
    #[serde(rename = "effect.authorized")]
    EffectAuthorized,
    /// An effect outside the catalogue finished.
    #[serde(rename = "effect.completed")]
    EffectCompleted,
    /// An operator recorded the outcome of a tool call a crash left
    /// unknown, as observed at its source (`sharedos serve`).
    #[serde(rename = "effect.settled")]
    EffectSettled,
    /// A host application put a file into a session's files
    /// (`sharedos serve`).
    #[serde(rename = "file.uploaded")]
    FileUploaded,
    /// A host application read a file out of a session's files.
    #[serde(rename = "file.downloaded")]
    FileDownloaded,
}

impl AuditKind {
    /// The name the audit file carries.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::AuthorityResolved => "authority.resolved",
            Self::AuthorizationChecked => "authorization.checked",
            Self::ToolCatalogListed => "tool.catalog.listed",
            Self::ToolInvoked => "tool.invoked",
            Self::EscalationRequested => "escalation.requested",
            Self::TurnEnded => "turn.ended",
            Self::EffectAuthorized => "effect.authorized",
            Self::EffectCompleted => "effect.completed",
            Self::EffectSettled => "effect.settled",
            Self::FileUploaded => "file.uploaded",
            Self::FileDownloaded => "file.downloaded",
        }
    }
}

impl std::fmt::Display for AuditKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for AuditKind {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for AuditKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// One audit record (envelope.md C.3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuditRecord {
    /// Unique per record: the only safe idempotency key.
    pub id: String,
    #[serde(rename = "type")]
    pub kind: AuditKind,
    pub outcome: AuditOutcome,
    pub at: Timestamp,
    pub trace_id: String,
    pub namespace_id: String,
    pub actor: Address,
    pub authority: Address,
    pub owner: Address,
    pub purpose: String,
    pub source: AuditSource,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<ResourceRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_closed: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumed: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<JsonObject>,
}

/// What a serialized record usually weighs: its line buffer starts at
/// this, so serializing it does not grow the buffer step by step.
const RECORD_LINE_BYTES: usize = 1024;

impl AuditRecord {
    /// The record as one JSON line (newline included), written once into
    /// a buffer sized for it: what a sink writes. Byte for byte
    /// `serde_json::to_vec(self)` and a newline, without serde's per-key
    /// escaping (`audit/line.rs`).
    pub fn to_json_line(&self) -> Result<Vec<u8>, AuditError> {
        self.entry().to_json_line()
    }

    /// A record with the context's identity fields and a fresh id.
    pub fn new(
        kind: AuditKind,
        outcome: AuditOutcome,
        context: &AccessContext,
        source: AuditSource,
    ) -> Self {
        let id = RecordId::new();
        AuditEntry::new(
            &id,
            (kind, outcome, source),
            &context.now,
            IdentityRef::of_context(context),
        )
        .to_record()
    }
}

/// Why a sink could not record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuditError {
    #[error("audit sink failed: {0}")]
    Sink(String),
    /// An outcome write outlived `audit_write_timeout`.
    #[error("audit write exceeded {timeout_ms} ms")]
    Timeout { timeout_ms: u64 },
}

/// Where audit records go. `append` returns `Ok` only once the record is
/// durable: the kernel acts on a decision right after.
#[async_trait]
pub trait AuditSink: Send + Sync {
    async fn append(&self, record: &AuditRecord) -> Result<(), AuditError>;

    /// The kernel writes every record through this. The default appends
    /// the owned record ([`AuditEntry::to_record`]); a sink that writes
    /// lines writes the entry's ([`AuditEntry::to_json_line`], the same
    /// bytes) without making one.
    async fn append_entry(&self, entry: &AuditEntry<'_>) -> Result<(), AuditError> {
        self.append(&entry.to_record()).await
    }

    /// Appends `records` in order and returns once all are durable. The
    /// default appends them one by one; a sink that commits in groups
    /// commits them together (the JSONL sink: one `write`, one `fsync`).
    async fn append_all(&self, records: &[AuditRecord]) -> Result<(), AuditError> {
        for r in records {
            self.append(r).await?;
        }
        Ok(())
    }
}

/// The embedded sink: an append-only JSONL file, one record per line.
///
/// One writer thread owns the `O_APPEND` descriptor. It takes every record
/// waiting, writes them with one `write` (whole lines only; a short write
/// is cut back), `fsync`s once, and only then answers each `append`: a
/// group commit, so concurrent turns share an `fsync` and every caller
/// still returns only once its record is durable.
#[derive(Debug, Clone)]
pub struct JsonlAuditSink {
    jobs: mpsc::Sender<Job>,
    path: PathBuf,
    commits: Arc<Commits>,
}

/// What the writer thread has committed: records, and commits (one
/// `write` and one `fsync` each).
#[derive(Debug, Default)]
struct Commits {
    records: std::sync::atomic::AtomicU64,
    commits: std::sync::atomic::AtomicU64,
}

/// Whole lines, how many records they hold, and the caller to answer.
type Job = (Vec<u8>, u64, oneshot::Sender<Result<(), String>>);

/// At most this many records share one write and one `fsync`.
const MAX_BATCH: usize = 256;

impl JsonlAuditSink {
    /// Opens (creating) the file and starts its writer thread. A trailing
    /// partial line left by a crash mid-write (never acknowledged, so
    /// nothing acted on it) is cut, so a reader parses every line.
    pub fn open(path: impl AsRef<Path>) -> std::io::Result<Self> {
        let path = path.as_ref().to_path_buf();
        let created = !path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)?;
        repair_tail(&mut file)?;
        if created && let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)?.sync_all()?;
        }
        let (jobs, rx) = mpsc::channel::<Job>();
        let commits = Arc::new(Commits::default());
        let counted = commits.clone();
        std::thread::Builder::new()
            .name("sharedos-audit".into())
            .spawn(move || commit_loop(file, rx, &counted))?;
        Ok(Self {
            jobs,
            path,
            commits,
        })
    }
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `(records, commits)` written so far by this sink (shared by its
    /// clones): each commit is one `write` and one `fsync`, so records per
    /// commit is how much the group commit shares a sync.
    pub fn committed(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.commits.records.load(Relaxed),
            self.commits.commits.load(Relaxed),
        )
    }
}

/// The longest a commit waits for the appends of the callers the last
/// commit released (see [`gather`]).
const MAX_GATHER: Duration = Duration::from_millis(1);

/// Takes every record already waiting, up to [`MAX_BATCH`].
fn drain(rx: &mpsc::Receiver<Job>, batch: &mut Vec<Job>) {
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(job) => batch.push(job),
            Err(_) => break,
        }
    }
}

/// With concurrent writers, waits a little for the rest of them before
/// committing. The callers a commit releases append again a moment later
/// (a decision's effect then its outcome; an answer then the next call's
/// decision); a commit started on the first of them would leave the others
/// to wait a whole `fsync` for the next one, so concurrent calls would get
/// one record durable every two syncs. So when the last commit held
/// `last` > 1 records, this one waits until as many are queued, at most a
/// quarter of the last sync's duration (and [`MAX_GATHER`]). A lone writer
/// (`last` ≤ 1) never waits: a sequential call still pays two syncs.
fn gather(rx: &mpsc::Receiver<Job>, batch: &mut Vec<Job>, last: usize, last_sync: Duration) {
    if last <= 1 {
        return;
    }
    let until = Instant::now() + (last_sync / 4).min(MAX_GATHER);
    while batch.len() < last.min(MAX_BATCH) {
        let Some(left) = until.checked_duration_since(Instant::now()) else {
            return;
        };
        match rx.recv_timeout(left) {
            Ok(job) => {
                batch.push(job);
                drain(rx, batch);
            }
            Err(_) => return,
        }
    }
}

/// Runs until every sender is gone.
fn commit_loop(mut file: File, rx: mpsc::Receiver<Job>, counted: &Commits) {
    let (mut last, mut last_sync) = (0usize, Duration::ZERO);
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        drain(&rx, &mut batch);
        gather(&rx, &mut batch, last, last_sync);
        let started = Instant::now();
        // One record (the common case at low load) is written as it is.
        let result = if let [(line, _, _)] = batch.as_slice() {
            write_line(&mut file, line)
        } else {
            let mut buf = Vec::with_capacity(batch.iter().map(|(l, _, _)| l.len()).sum());
            for (line, _, _) in &batch {
                buf.extend_from_slice(line);
            }
            write_line(&mut file, &buf)
        }
        .map_err(|e| e.to_string());
        (last, last_sync) = (batch.len(), started.elapsed());
        if result.is_ok() {
            use std::sync::atomic::Ordering::Relaxed;
            counted
                .records
                .fetch_add(batch.iter().map(|(_, n, _)| n).sum(), Relaxed);
            counted.commits.fetch_add(1, Relaxed);
        }
        for (_, _, reply) in batch {
            let _ = reply.send(result.clone());
        }
    }
}

pub(crate) fn repair_tail(file: &mut File) -> std::io::Result<()> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    // Find the last newline, reading backwards in chunks.
    let mut end = len;
    let mut buf = vec![0u8; 4096];
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let n = (end - start) as usize;
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut buf[..n])?;
        if let Some(pos) = buf[..n].iter().rposition(|b| *b == b'\n') {
            let keep = start + pos as u64 + 1;
            if keep != len {
                file.set_len(keep)?;
                file.sync_all()?;
            }
            return Ok(());
        }
        end = start;
    }
    file.set_len(0)?;
    file.sync_all()
}

pub(crate) fn write_line(file: &mut File, line: &[u8]) -> std::io::Result<()> {
    let before = file.metadata()?.len();
    let written = rustix::io::write(&*file, line).map_err(std::io::Error::from)?;
    if written != line.len() {
        // A short write would leave a torn line: cut it back before
        // reporting the failure. Each file has a single writer.
        file.set_len(before)?;
        return Err(std::io::Error::other(format!(
            "short audit write: {written} of {} bytes",
            line.len()
        )));
    }
    file.sync_all()
}

impl JsonlAuditSink {
    /// Hands whole lines (`records` of them) to the writer thread and
    /// waits until they are durable.
    async fn append_lines(&self, lines: Vec<u8>, records: u64) -> Result<(), AuditError> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send((lines, records, reply))
            .map_err(|_| AuditError::Sink("the audit writer thread has stopped".into()))?;
        answer
            .await
            .map_err(|_| AuditError::Sink("the audit writer thread has stopped".into()))?
            .map_err(AuditError::Sink)
    }
}

#[async_trait]
impl AuditSink for JsonlAuditSink {
    async fn append(&self, record: &AuditRecord) -> Result<(), AuditError> {
        self.append_lines(record.to_json_line()?, 1).await
    }
    async fn append_entry(&self, entry: &AuditEntry<'_>) -> Result<(), AuditError> {
        self.append_lines(entry.to_json_line()?, 1).await
    }
    /// One job of whole lines: one `write` and one `fsync` for all.
    async fn append_all(&self, records: &[AuditRecord]) -> Result<(), AuditError> {
        let mut lines = Vec::new();
        for r in records {
            lines.extend_from_slice(&r.to_json_line()?);
        }
        if lines.is_empty() {
            return Ok(());
        }
        self.append_lines(lines, records.len() as u64).await
    }
}

/// A sink that keeps records in memory (tests, benchmarks, embedding).
#[derive(Debug, Default, Clone)]
pub struct MemoryAuditSink {
    records: Arc<Mutex<Vec<AuditRecord>>>,
}

impl MemoryAuditSink {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn records(&self) -> Vec<AuditRecord> {
        self.records.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

#[async_trait]
impl AuditSink for MemoryAuditSink {
    async fn append(&self, record: &AuditRecord) -> Result<(), AuditError> {
        self.records
            .lock()
            .map_err(|_| AuditError::Sink("memory sink lock poisoned".into()))?
            .push(record.clone());
        Ok(())
    }
}

/// Reads a JSONL audit file back, one record per line. Any line that does
/// not parse is an error naming its number.
pub fn read_jsonl(path: impl AsRef<Path>) -> Result<Vec<AuditRecord>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    text.lines()
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect()
}
