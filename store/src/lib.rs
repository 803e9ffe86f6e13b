//! The sharedos durable store: the state a host keeps beyond one turn.
//!
//! One trait, [`Store`], holds what the kernel needs (grants, read through
//! [`StoreGrants`], the kernel's `GrantSource`; usage counters of `maxUses`
//! grants; the audit trail: it is also a kernel `AuditSink` and
//! `UsageStore`) and what sessions need (sessions, runs admitted before
//! dispatch, the event journal). [`SqliteStore`] is the embedded backend:
//! one file, WAL, migrations applied at open. Each host process holds a
//! lease ([`Lease`], [`Store::acquire_lease`]) whose epoch fences every run
//! write it makes; the runs of a host that crashed, or whose lease expired,
//! are reconciled by [`recovery`]'s rules without executing anything.

#![forbid(unsafe_code)]

pub mod cluster;
pub mod effects;
pub mod grants;
mod group;
mod lease;
mod listing;
mod postgres;
pub mod recovery;
mod sqlite;
pub mod tokens;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sharedos_kernel::{AuditRecord, AuditSink, Grant, UsageStore};
use sharedos_protocol::{Address, ExecutionEvent, Timestamp};

use recovery::RecoveredRun;

pub use grants::{GrantImport, GrantOrigin, StoreGrants, StoredGrant};
pub use lease::{Acquired, Lease};
pub use listing::{Keyset, RunQuery, SessionQuery, TimeRange};
pub use postgres::PostgresStore;
pub use sqlite::{SqliteOptions, SqliteStore};
pub use tokens::StoredToken;

/// The schema version this build writes; a database with a higher one is
/// refused at open.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The checked-in SQLite migrations, in order: migration `i` takes a
/// database from version `i` to `i + 1`.
pub const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/sqlite/0001_initial.sql"),
    include_str!("../migrations/sqlite/0002_grants.sql"),
    include_str!("../migrations/sqlite/0003_host_leases.sql"),
    include_str!("../migrations/sqlite/0004_cancel_requests.sql"),
    include_str!("../migrations/sqlite/0005_tokens.sql"),
    include_str!("../migrations/sqlite/0006_listing.sql"),
];

/// The prefix of a [`Store::changes`] message that asks a run's host to
/// cancel it (the run id follows).
pub const CANCEL_PREFIX: &str = "cancel:";

/// The same schema for PostgreSQL, version for version.
pub const POSTGRES_MIGRATIONS: &[&str] = &[
    include_str!("../migrations/postgres/0001_initial.sql"),
    include_str!("../migrations/postgres/0002_grants.sql"),
    include_str!("../migrations/postgres/0003_host_leases.sql"),
    include_str!("../migrations/postgres/0004_cancel_requests.sql"),
    include_str!("../migrations/postgres/0005_tokens.sql"),
    include_str!("../migrations/postgres/0006_listing.sql"),
];

/// Why the store could not do what was asked. Each message says what to
/// fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error(
        "the database {path} has schema version {found}, newer than this sharedos supports ({supported}): run a newer sharedos, or point it at another database"
    )]
    NewerSchema {
        path: String,
        found: i64,
        supported: i64,
    },
    #[error(
        "requestId {request_id:?} was already used in session {session_id} (run {run_id}) with a different payload: repeat the original payload, or send a new requestId for a new run"
    )]
    RequestConflict {
        session_id: String,
        request_id: String,
        /// The run the requestId admitted first.
        run_id: String,
    },
    #[error(
        "run {run_id}: afterSequence {requested} is beyond the end of its journal (last sequence: {last})"
    )]
    BeyondEnd {
        run_id: String,
        requested: u64,
        /// The last stored sequence, `none` for an empty journal.
        last: String,
    },
    #[error(
        "run {run_id}: events through sequence {dropped_through} were dropped by retention; observe with afterSequence of at least {dropped_through} (asked for {requested})"
    )]
    Dropped {
        run_id: String,
        /// What the observer asked for: a sequence, or `the start`.
        requested: String,
        dropped_through: u64,
    },
    #[error("{what} {id:?} does not exist")]
    NotFound { what: &'static str, id: String },
    #[error("session {0:?} is closed: open a new session")]
    SessionClosed(String),
    /// A grant id that is taken, or a configured grant that clashes with
    /// an operator's.
    #[error("{0}")]
    GrantConflict(String),
    #[error("run {0:?} has already ended")]
    RunEnded(String),
    /// An open session cannot be deleted.
    #[error("session {0:?} is open: close it (DELETE without purge), then delete it")]
    SessionOpen(String),
    /// A run still in flight cannot be deleted.
    #[error("run {0:?} is in flight: cancel it, and delete it once it has ended")]
    RunInFlight(String),
    /// This process's lease was taken over (its epoch moved on): another
    /// host reconciled its runs after the lease expired, or another process
    /// started under the same host id. The write was refused, whole.
    #[error(
        "the lease of host id {host_id:?} held by this process (epoch {epoch}) was taken over: its runs were reconciled by another host after the lease expired, or another process started with this host id; this process writes nothing more: restart it"
    )]
    Fenced { host_id: String, epoch: i64 },
    /// The database could not be reached, is full or locked, or failed.
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
    /// A stored value does not parse back.
    #[error("the store holds a value it cannot read: {0}")]
    Corrupt(String),
}

/// A session as stored. `scope` is the trusted scope the host bound it
/// to; the store keeps it and never interprets it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionRecord {
    pub id: String,
    pub agent_id: String,
    pub runtime_id: String,
    pub scope: Value,
    /// What the session fixes for every run (context template, tools).
    pub binding: Value,
    pub open: bool,
    pub created_at: String,
    pub closed_at: Option<String>,
}

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Admitted; its turn may be running on `host_id`.
    InFlight,
    /// The turn ended; `result` holds its `ExecutionResult`.
    Ended,
    /// Its host stopped mid-run; `recovery` says what is known.
    Interrupted,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::InFlight => "in_flight",
            RunState::Ended => "ended",
            RunState::Interrupted => "interrupted",
        }
    }
    pub(crate) fn parse(text: &str) -> Result<Self, StoreError> {
        match text {
            "in_flight" => Ok(RunState::InFlight),
            "ended" => Ok(RunState::Ended),
            "interrupted" => Ok(RunState::Interrupted),
            other => Err(StoreError::Corrupt(format!("unknown run state {other:?}"))),
        }
    }
}

/// A run to admit.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    pub id: String,
    pub session_id: String,
    pub request_id: String,
    /// Digest of the canonical payload: what makes a repeat identical.
    pub payload_digest: String,
    pub input: Value,
    pub host_id: String,
    pub admitted_at: String,
}

/// A run as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    pub id: String,
    pub session_id: String,
    pub request_id: String,
    pub payload_digest: String,
    pub input: Value,
    pub state: RunState,
    pub host_id: String,
    pub result: Option<Value>,
    pub recovery: Option<Value>,
    /// Events through this sequence were dropped by retention.
    pub dropped_through: Option<u64>,
    pub admitted_at: String,
    pub ended_at: Option<String>,
}

/// What a retention sweep deletes: the sessions closed before
/// `closed_sessions_before_ms` (none of whose runs is in flight) with their
/// runs, and the runs no longer in flight that ended before
/// `ended_runs_before_ms`, with their journals; at most `limit` of each.
/// Times in milliseconds since the Unix epoch; `None` sweeps nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SweepQuery {
    pub ended_runs_before_ms: Option<i64>,
    pub closed_sessions_before_ms: Option<i64>,
    pub limit: usize,
}

/// What a retention sweep deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Swept {
    pub sessions: u64,
    pub runs: u64,
}

/// What `admit_run` did.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// The run is new and stored; dispatch it.
    New(RunRecord),
    /// The same requestId with the same payload: the original run.
    Existing(RunRecord),
}

/// The state a host keeps beyond one turn. Every write is durable when
/// it returns `Ok`.
#[async_trait]
pub trait Store: AuditSink + UsageStore + Send + Sync {
    async fn open_session(&self, session: &SessionRecord) -> Result<(), StoreError>;
    async fn session(&self, id: &str) -> Result<SessionRecord, StoreError>;
    async fn close_session(&self, id: &str, at: &str) -> Result<(), StoreError>;
    /// Up to `query.limit` sessions of one scope in creation order, after
    /// `query.after` (docs/STORE.md, "Listing").
    async fn list_sessions(&self, query: &SessionQuery) -> Result<Vec<SessionRecord>, StoreError>;
    /// Up to `query.limit` runs of one session in admission order, after
    /// `query.after` (docs/STORE.md, "Listing").
    async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError>;
    /// Admits a run under its session's `requestId`, atomically: a new
    /// requestId stores the run; the same one with the same digest returns
    /// the original; a different digest is `RequestConflict`.
    async fn admit_run(&self, run: &NewRun) -> Result<Admission, StoreError>;
    async fn run(&self, id: &str) -> Result<RunRecord, StoreError>;
    /// Deletes a run that is no longer in flight, and its journal, in one
    /// transaction; its audit records are kept. Returns the run as it was;
    /// `RunInFlight` (nothing deleted) while it runs.
    async fn delete_run(&self, id: &str) -> Result<RunRecord, StoreError>;
    /// Deletes a closed session with its runs and their journals, in one
    /// transaction; audit records are kept. `SessionOpen` while it is
    /// open, `RunInFlight` while one of its runs is (nothing deleted).
    async fn delete_session(&self, id: &str) -> Result<SessionRecord, StoreError>;
    /// Retention by age, in one transaction ([`SweepQuery`]); audit
    /// records are kept.
    async fn sweep(&self, query: &SweepQuery) -> Result<Swept, StoreError>;
    /// Ends an in-flight run with its result, then applies retention.
    async fn end_run(&self, id: &str, result: &Value, at: &str) -> Result<RunRecord, StoreError>;
    /// Asks whichever host runs `id` to cancel it: an in-flight run is
    /// marked (once: the first time asked is kept) and its host woken
    /// where the store can notify (PostgreSQL: `cancel:<id>` on the
    /// changes channel). Returns the run as it is; a run no longer in
    /// flight is left as it is.
    async fn request_cancel(&self, id: &str, at: &str) -> Result<RunRecord, StoreError>;
    /// Ids of the runs in flight on `host_id` whose cancel was asked.
    async fn cancel_requests(&self, host_id: &str) -> Result<Vec<String>, StoreError>;
    /// Runs in flight on `host_id`.
    async fn in_flight_runs(&self, host_id: &str) -> Result<Vec<RunRecord>, StoreError>;
    /// Takes the lease of `host_id` for this process, in one transaction:
    /// its epoch grows by one (fencing any earlier process under this id,
    /// live or not) and the runs earlier processes left in flight are
    /// reconciled (`host_restarted`, [`recovery`]). From then on every run
    /// write of this store (admission, journal, end, audit, `maxUses` use)
    /// checks that epoch in its transaction, and fails [`StoreError::Fenced`]
    /// once it moved on.
    async fn acquire_lease(
        &self,
        host_id: &str,
        duration: std::time::Duration,
        at: &Timestamp,
    ) -> Result<Acquired, StoreError>;
    /// Moves this process's lease expiry to `duration` from now; `Fenced`
    /// when its epoch moved on (the lease is lost for good).
    async fn renew_lease(&self) -> Result<(), StoreError>;
    /// Takes over the runs of every other host whose lease expired with
    /// runs in flight: per host, one transaction bumps its epoch (fencing
    /// it) and reconciles its runs (`host_lease_expired`). `Fenced` when
    /// this process's own lease was lost.
    async fn take_over_expired(&self, at: &Timestamp) -> Result<Vec<RecoveredRun>, StoreError>;
    /// Ends this process's lease now (a graceful stop, after draining), so
    /// another host may reconcile at once anything left in flight.
    async fn release_lease(&self) -> Result<(), StoreError>;
    /// Stores one event under its sequence. A sequence stored twice is an
    /// error (no duplicate ever reaches an observer).
    async fn append_event(&self, run_id: &str, event: &ExecutionEvent) -> Result<(), StoreError>;
    /// Up to `limit` events with a sequence above `after` (all when
    /// `None`), in order. `Dropped` when retention removed some of them,
    /// `BeyondEnd` when `after` is past the last stored sequence.
    async fn events_after(
        &self,
        run_id: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<ExecutionEvent>, StoreError>;
    /// Stores a new grant; `GrantConflict` when its id exists (revoked
    /// ids included: a revoked grant is never live again).
    async fn add_grant(
        &self,
        grant: &Grant,
        origin: GrantOrigin,
        at: &str,
    ) -> Result<(), StoreError>;
    /// Revokes a grant for every later turn of every host; `Ok(false)` when
    /// it was already revoked.
    async fn revoke_grant(&self, id: &str, at: &str) -> Result<bool, StoreError>;
    /// One grant by id, revoked or not.
    async fn grant(&self, id: &str) -> Result<Option<StoredGrant>, StoreError>;
    /// Every stored grant, in the order they were added.
    async fn grants(&self) -> Result<Vec<StoredGrant>, StoreError>;
    /// The grants of `subject` in `namespace_id`, revoked ones included
    /// (the kernel filters; a delegation chain needs them).
    async fn grants_for(
        &self,
        namespace_id: &str,
        subject: &Address,
    ) -> Result<Vec<Grant>, StoreError>;
    /// Imports the configuration's grants in one transaction: new ids are
    /// added, changed ones updated, revoked ones left revoked, and grants
    /// imported earlier but no longer configured are revoked. An id an
    /// operator added is a `GrantConflict`.
    async fn import_config_grants(
        &self,
        grants: &[Grant],
        at: &str,
    ) -> Result<GrantImport, StoreError>;
    /// The audit records of one trace, in the order they were committed.
    async fn audit_trail(&self, trace_id: &str) -> Result<Vec<AuditRecord>, StoreError>;
    /// Records a settlement ([`effects`]) in one transaction: its
    /// `effect.settled` audit record and, after the run's last event, its
    /// journal event. Once per record id, whatever the hosts: a second
    /// settlement of the same call writes nothing and returns the first.
    /// `NotFound` when the run is gone.
    async fn settle_effect(
        &self,
        settlement: &effects::Settlement,
    ) -> Result<effects::Settled, StoreError>;
    /// Ids of runs whose journal or state changed, as other processes
    /// commit them (PostgreSQL `LISTEN/NOTIFY`), `cancel:<id>` for a cancel
    /// asked of a run, or the empty string for "something changed, look
    /// again" (SQLite, which sees that another connection committed but
    /// not what); `None` when the backend cannot say (observers then look
    /// again periodically).
    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        None
    }
    /// Stores a new tenant token (its secret's hash only).
    async fn add_token(&self, token: &StoredToken) -> Result<(), StoreError>;
    /// Revokes a token for every later request of every host; `Ok(false)`
    /// when it was already revoked, `NotFound` when there is no such id.
    async fn revoke_token(&self, id: &str, at: &str) -> Result<bool, StoreError>;
    /// Every stored token, revoked ones included, in the order added.
    async fn tokens(&self) -> Result<Vec<StoredToken>, StoreError>;
    /// The token whose secret hashes to `secret_sha256` (lowercase hex),
    /// revoked or not.
    async fn token_by_hash(&self, secret_sha256: &str) -> Result<Option<StoredToken>, StoreError>;
}
