//! Sessions and runs, on top of [`Executor::execute`].
//!
//! A session binds an agent, the runtime the host configured for it and a
//! trusted [`Scope`]. `run(input, requestId)` admits the run in the store
//! before anything is dispatched; a repeat of the same requestId with the
//! same payload returns the original run, a different payload is refused.
//! Each event of the turn is stored under its sequence before observers
//! are woken ([`journal`]), so an observer reading from `afterSequence`
//! gets stored history, then live events, with no gap and no duplicate.
//!
//! Session and run ids are locators, never authorization: every call
//! carries the caller's scope and is refused, as if the id did not exist,
//! when it differs from the scope the session was opened with.

mod admission;
mod cancels;
mod effects;
mod files;
mod journal;
mod lease;
mod listing;
mod metrics;
mod observe;
mod request;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sharedos_protocol::{Address, ExecutionOptions, Identifier, Timestamp, ToolDefinition};
use sharedos_store::{Admission, NewRun, RunRecord, RunState, SessionRecord, Store, StoreError};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use sharedos_host::executor::Executor;

pub use admission::{AdmissionLimits, AdmissionStatus};
pub use effects::{EffectList, Observed, SettleRequest};
pub use files::{SessionFiles, Transfer};
pub use lease::LeaseStatus;
pub use listing::{ListFilter, Page};
pub use metrics::Metrics;
pub use observe::Observer;

/// The trusted scope a session is opened under and every call re-checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Scope {
    pub namespace_id: Identifier,
    /// Under whose authority the turns run (grant issuers match it).
    pub authority: Address,
    /// On whose behalf (the message sender).
    pub owner: Address,
}

/// What a session fixes for all its runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OpenSession {
    pub agent_id: Identifier,
    pub purpose: String,
    #[serde(default)]
    pub enabled_tool_namespaces: Vec<Identifier>,
    /// The tools its runs are offered: each a name of the host's
    /// catalogue (its built-in tools), or a whole definition.
    #[serde(default)]
    pub tools: Vec<SessionTool>,
}

/// One tool a session offers: a name, resolved from the host's catalogue
/// when the session is opened, or a whole definition.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum SessionTool {
    Named(Identifier),
    Defined(Box<ToolDefinition>),
}

impl<'de> Deserialize<'de> for SessionTool {
    /// A string is a name; anything else must be a whole definition (its
    /// own error says what is missing).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match Value::deserialize(d)? {
            Value::String(name) => Identifier::new(&name)
                .map(SessionTool::Named)
                .map_err(|e| D::Error::custom(format!("tool name {name:?}: {e}"))),
            other => serde_json::from_value(other)
                .map(|t| SessionTool::Defined(Box::new(t)))
                .map_err(D::Error::custom),
        }
    }
}

/// One run's input: the message payload and optional limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RunInput {
    pub payload: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<ExecutionOptions>,
}

/// What `run` answered.
#[derive(Debug, Clone, PartialEq)]
pub struct RunHandle {
    pub run: RunRecord,
    /// The requestId was seen before: this is the original run.
    pub repeated: bool,
}

/// Why a session call was refused.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("agent {0:?} is not bound to a runtime in the configuration (add an [[agents]] entry)")]
    UnknownAgent(String),
    #[error(
        "tool {name:?} is not in this host's catalogue (it has: {known}): name one of those, or give the whole definition"
    )]
    UnknownTool { name: String, known: String },
    #[error("the runtime {0:?} of this session is not seated on this host")]
    NoSeat(String),
    #[error("the run input is invalid: {0}")]
    InvalidInput(String),
    /// A requestId no run could be stored under.
    #[error("requestId {0}")]
    InvalidRequestId(String),
    /// A session or run id that sharedos never issued (ids are UUIDs).
    #[error(
        "{what} id {shown:?} is not an id sharedos issues: send the id (a UUID) the answer that created it gave"
    )]
    InvalidId { what: &'static str, shown: String },
    /// A scope id (namespace, authority, owner) or agent id that cannot be
    /// stored or named in a path.
    #[error("{0}")]
    InvalidScope(String),
    #[error("the host is shutting down and admits no new run")]
    ShuttingDown,
    /// This host's lease was taken over; it admits no new run.
    #[error("this host admits no new run: {0}")]
    LeaseLost(String),
    /// Every slot is taken and the queue is full, or no slot was freed in
    /// time (admission.rs).
    #[error("too many runs: {message}")]
    TooManyRuns { message: String, retry_after_s: u64 },
    /// A settlement's body that cannot be recorded.
    #[error("the settlement is invalid: {0}")]
    InvalidSettlement(String),
    /// An operation id no call can have.
    #[error(
        "operation id {0:?} is not one a call can have: 1 to 256 characters, no control character, no /"
    )]
    InvalidOperationId(String),
    /// The call was settled before (by this host or another).
    #[error("effect {operation_id:?} was already settled: the first settlement stands")]
    EffectSettled {
        operation_id: String,
        settlement: Box<sharedos_kernel::AuditRecord>,
    },
    /// A file could not be moved in or out of a session.
    #[error("{0}")]
    Files(sharedos_kernel::tools::files::FileError),
    /// This host has no file tools (`[kernel.files] enabled = false`).
    #[error("this host has no session files: [kernel.files] is disabled in its configuration")]
    FilesDisabled,
    /// Only an unresolved call may be settled.
    #[error(
        "effect {operation_id:?} is {state}, not unresolved: only a call a crash left without outcome is settled"
    )]
    EffectNotUnresolved {
        operation_id: String,
        state: &'static str,
    },
}

/// Where a live run is: the last stored sequence, and whether it ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Progress {
    pub(crate) last_sequence: Option<u64>,
    pub(crate) ended: bool,
}

/// A run whose turn is running in this process.
pub(crate) struct LiveRun {
    cancel: CancellationToken,
    progress: watch::Sender<Progress>,
}

/// The sessions of one host: the store, the seated executors, the runs
/// live here.
pub struct Sessions {
    store: Arc<dyn Store>,
    executors: HashMap<String, Arc<Executor>>,
    agents: HashMap<String, String>,
    host_id: String,
    live: Mutex<HashMap<String, Arc<LiveRun>>>,
    idle: Notify,
    closing: CancellationToken,
    lease: Mutex<LeaseStatus>,
    /// The host's tools a session may name, by name.
    catalogue: HashMap<String, ToolDefinition>,
    /// The run slots: a run holds one from before it is stored until its
    /// turn has ended.
    slots: Arc<admission::Slots>,
    metrics: Arc<Metrics>,
    /// Files in and out of sessions (`None`: no file tools on this host).
    files: Option<Arc<files::SessionFiles>>,
    /// What a session would get here (`GET /v1/preflight`).
    preflight: Option<Arc<crate::preflight::Preflight>>,
}

/// How often an observer of a run that is not live in this process looks
/// at the store again.
const POLL: Duration = Duration::from_millis(100);

fn now() -> Timestamp {
    Timestamp::now()
}

impl Sessions {
    /// `executors` by runtime id; `agents` maps an agent id to its runtime
    /// id (the host's choice, never a request's).
    pub fn new(
        store: Arc<dyn Store>,
        executors: HashMap<String, Arc<Executor>>,
        agents: HashMap<String, String>,
        host_id: impl Into<String>,
    ) -> Self {
        Self {
            store,
            executors,
            agents,
            host_id: host_id.into(),
            live: Mutex::new(HashMap::new()),
            idle: Notify::new(),
            closing: CancellationToken::new(),
            lease: Mutex::new(LeaseStatus::default()),
            catalogue: HashMap::new(),
            slots: admission::Slots::new(AdmissionLimits::unbounded()),
            metrics: Arc::new(Metrics::new()),
            files: None,
            preflight: None,
        }
    }

    /// Answers `GET /v1/preflight` from `preflight`.
    pub fn with_preflight(mut self, preflight: crate::preflight::Preflight) -> Self {
        self.preflight = Some(Arc::new(preflight));
        self
    }

    /// The preflight, when the host was built from a configuration.
    pub fn preflight(&self) -> Option<&Arc<crate::preflight::Preflight>> {
        self.preflight.as_ref()
    }

    /// Bounds the runs live at once (docs/SERVE.md, "Admission").
    pub fn with_admission(mut self, limits: AdmissionLimits) -> Self {
        self.slots = admission::Slots::new(limits);
        self
    }

    /// What admission holds now.
    pub fn admission_status(&self) -> AdmissionStatus {
        self.slots.status()
    }

    /// The Prometheus text exposition of this host's metrics.
    pub fn metrics_text(&self) -> String {
        self.metrics
            .render(self.slots.status(), &self.lease_status())
    }

    /// The tools sessions may name instead of defining them (the host's
    /// built-in tools).
    pub fn with_catalogue(mut self, tools: impl IntoIterator<Item = ToolDefinition>) -> Self {
        self.catalogue = tools.into_iter().map(|t| (t.name.to_string(), t)).collect();
        self
    }

    /// Replaces each named tool of `spec` by its definition in the
    /// catalogue.
    fn resolve_tools(&self, spec: &mut OpenSession) -> Result<(), SessionError> {
        for tool in &mut spec.tools {
            if let SessionTool::Named(name) = tool {
                let definition = self.catalogue.get(name.as_str()).ok_or_else(|| {
                    let mut known: Vec<&str> = self.catalogue.keys().map(String::as_str).collect();
                    known.sort_unstable();
                    SessionError::UnknownTool {
                        name: name.to_string(),
                        known: if known.is_empty() {
                            "none".into()
                        } else {
                            known.join(", ")
                        },
                    }
                })?;
                *tool = SessionTool::Defined(Box::new(definition.clone()));
            }
        }
        Ok(())
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn host_id(&self) -> &str {
        &self.host_id
    }

    pub async fn open_session(
        &self,
        scope: &Scope,
        mut spec: OpenSession,
    ) -> Result<SessionRecord, SessionError> {
        let runtime = self
            .agents
            .get(spec.agent_id.as_str())
            .ok_or_else(|| SessionError::UnknownAgent(spec.agent_id.to_string()))?;
        scope.check()?;
        self.resolve_tools(&mut spec)?;
        request::check_binding(scope, &spec)?;
        let record = SessionRecord {
            id: uuid::Uuid::new_v4().to_string(),
            agent_id: spec.agent_id.to_string(),
            runtime_id: runtime.clone(),
            scope: to_value(scope)?,
            binding: to_value(&spec)?,
            open: true,
            created_at: now().to_string(),
            closed_at: None,
        };
        self.store.open_session(&record).await?;
        Ok(record)
    }

    /// The session, if `scope` may see it; `NotFound` otherwise.
    pub async fn session(&self, scope: &Scope, id: &str) -> Result<SessionRecord, SessionError> {
        request::check_issued_id("session", id)?;
        let not_found = || StoreError::NotFound {
            what: "session",
            id: id.to_owned(),
        };
        let record = match self.store.session(id).await {
            Err(StoreError::NotFound { .. }) => return Err(not_found().into()),
            other => other?,
        };
        let stored: Scope = serde_json::from_value(record.scope.clone())
            .map_err(|e| StoreError::Corrupt(format!("session {id} scope: {e}")))?;
        if &stored != scope {
            return Err(not_found().into());
        }
        Ok(record)
    }

    /// Closes the session; a process its last turn left parked (session
    /// affinity) is killed now.
    pub async fn close_session(&self, scope: &Scope, id: &str) -> Result<(), SessionError> {
        let session = self.session(scope, id).await?;
        let closed = self.store.close_session(id, &now().to_string()).await;
        if let Some(executor) = self.executors.get(&session.runtime_id) {
            executor.release_session(id);
        }
        Ok(closed?)
    }

    /// Admits a run durably, then dispatches it in the background. A
    /// repeated requestId with the same payload returns the original run.
    pub async fn run(
        self: &Arc<Self>,
        scope: &Scope,
        session_id: &str,
        request_id: &str,
        input: RunInput,
    ) -> Result<RunHandle, SessionError> {
        let asked = std::time::Instant::now();
        request::check_request_id(request_id)?;
        let session = self.session(scope, session_id).await?;
        let executor = self
            .executors
            .get(&session.runtime_id)
            .cloned()
            .ok_or_else(|| SessionError::NoSeat(session.runtime_id.clone()))?;
        let run_id = uuid::Uuid::new_v4().to_string();
        let request = request::build(&session, scope, &run_id, &input, now())?;
        let input_value = to_value(&input)?;
        let new = NewRun {
            id: run_id.clone(),
            session_id: session.id.clone(),
            request_id: request_id.to_owned(),
            payload_digest: request::digest(&input_value),
            input: input_value,
            host_id: self.host_id.clone(),
            admitted_at: now().to_string(),
        };
        // The slot comes first: a run is stored only when it can start.
        let slot = self.take_slot(scope).await?;
        let storing = std::time::Instant::now();
        let admitted = self.store.admit_run(&new).await;
        self.metrics.store_op("admit_run", storing.elapsed());
        if let Err(e @ StoreError::Fenced { .. }) = &admitted
            && self.lose_lease(e)
        {
            tracing::error!("the lease was lost, no new run is admitted: {e}");
        }
        let run = match admitted? {
            Admission::Existing(run) => {
                return Ok(RunHandle {
                    run,
                    repeated: true,
                });
            }
            Admission::New(run) => run,
        };
        self.metrics.admitted(asked.elapsed());
        self.dispatch(executor, (session.id, request), slot);
        Ok(RunHandle {
            run,
            repeated: false,
        })
    }

    /// A slot for a run of `scope`'s tenant, unless the host is closing or
    /// lost its lease (before and after a wait for the slot).
    async fn take_slot(&self, scope: &Scope) -> Result<admission::Slot, SessionError> {
        if self.closing.is_cancelled() {
            return Err(SessionError::ShuttingDown);
        }
        self.check_lease()?;
        let slot = match self.slots.acquire(scope.namespace_id.as_str()).await {
            Ok(slot) => slot,
            Err(e) => {
                self.metrics.refused();
                return Err(e);
            }
        };
        if self.closing.is_cancelled() {
            return Err(SessionError::ShuttingDown);
        }
        self.check_lease()?;
        Ok(slot)
    }

    /// Runs an admitted turn in the background; its slot is given back
    /// once the run's end is stored.
    fn dispatch(
        self: &Arc<Self>,
        executor: Arc<Executor>,
        (session_id, request): (String, sharedos_protocol::ExecutionRequest),
        slot: admission::Slot,
    ) {
        let run_id = request.execution_id.to_string();
        let live = Arc::new(LiveRun {
            cancel: CancellationToken::new(),
            progress: watch::Sender::new(Progress::default()),
        });
        self.lock_live().insert(run_id.clone(), Arc::clone(&live));
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let turn = (session_id.as_str(), request);
            let closing = &this.closing;
            journal::drive(&this.store, executor, turn, &live, closing, &this.metrics).await;
            this.lock_live().remove(&run_id);
            drop(slot);
            live.progress.send_modify(|p| p.ended = true);
            this.idle.notify_waiters();
        });
    }

    /// The run, if `scope` may see its session.
    pub async fn get_run(&self, scope: &Scope, run_id: &str) -> Result<RunRecord, SessionError> {
        request::check_issued_id("run", run_id)?;
        let run = self.store.run(run_id).await?;
        match self.session(scope, &run.session_id).await {
            Ok(_) => Ok(run),
            Err(SessionError::Store(StoreError::NotFound { .. })) => Err(StoreError::NotFound {
                what: "run",
                id: run_id.to_owned(),
            }
            .into()),
            Err(e) => Err(e),
        }
    }

    /// Waits for the run to end (or be marked interrupted) and returns it.
    pub async fn wait(&self, scope: &Scope, run_id: &str) -> Result<RunRecord, SessionError> {
        let mut observer = self.observe(scope, run_id, None).await;
        if let Err(SessionError::Store(StoreError::Dropped {
            dropped_through, ..
        })) = &observer
        {
            // Follow what retention kept.
            let from = *dropped_through;
            observer = self.observe(scope, run_id, Some(from)).await;
        }
        if let Ok(mut o) = observer {
            while o.next().await?.is_some() {}
        }
        let run = self.get_run(scope, run_id).await?;
        if run.state == RunState::InFlight {
            // Retention kept nothing to follow: wait on the store.
            loop {
                tokio::time::sleep(POLL).await;
                let run = self.get_run(scope, run_id).await?;
                if run.state != RunState::InFlight {
                    return Ok(run);
                }
            }
        }
        Ok(run)
    }

    /// Observes the run's events after `after` (from the start when
    /// `None`): stored history, then live events until the run ends.
    pub async fn observe(
        &self,
        scope: &Scope,
        run_id: &str,
        after: Option<u64>,
    ) -> Result<Observer, SessionError> {
        self.get_run(scope, run_id).await?;
        let progress = self.lock_live().get(run_id).map(|l| l.progress.subscribe());
        Observer::start(Arc::clone(&self.store), run_id, after, progress).await
    }

    /// Cancels a run in flight: at once when it is live here; otherwise
    /// the cancel is recorded in the store and the host that runs it
    /// cancels its turn when woken (cancels.rs). Returns the host that
    /// runs it, `None` when the run is not in flight.
    pub async fn cancel(
        &self,
        scope: &Scope,
        run_id: &str,
    ) -> Result<Option<String>, SessionError> {
        let run = self.get_run(scope, run_id).await?;
        if self.cancel_live(run_id) {
            return Ok(Some(self.host_id.clone()));
        }
        if run.state != RunState::InFlight {
            return Ok(None);
        }
        let run = self
            .store
            .request_cancel(run_id, &now().to_string())
            .await?;
        // It may have become live here meanwhile (admitted, not yet
        // dispatched when first looked at): the request is in the store
        // for the watcher either way.
        if self.cancel_live(run_id) {
            return Ok(Some(self.host_id.clone()));
        }
        Ok((run.state == RunState::InFlight).then_some(run.host_id))
    }

    /// Stops admitting runs, waits until every run live here has ended
    /// (each ends by its own deadline at the latest), then kills every
    /// process left parked for a session (session affinity).
    pub async fn drain(&self) {
        self.closing.cancel();
        loop {
            let idle = self.idle.notified();
            if self.lock_live().is_empty() {
                break;
            }
            idle.await;
        }
        for executor in self.executors.values() {
            executor.release_parked();
        }
    }

    fn lock_live(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<LiveRun>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn to_value(v: &impl Serialize) -> Result<Value, SessionError> {
    serde_json::to_value(v).map_err(|e| SessionError::InvalidInput(e.to_string()))
}
