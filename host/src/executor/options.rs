//! The executor's vocabulary: options, errors, observers and the seat.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use sharedos_plugin_sdk::{RuntimeError, RuntimeHost, RuntimePlugin, Signal};
use sharedos_protocol::json::str_len;
use sharedos_protocol::{
    ContractError, ExecutionEvent, Identifier, RuntimeManifest, RuntimeTurnOutcome,
    RuntimeTurnRequest, Timestamp,
};
use tokio_util::sync::CancellationToken;

pub use crate::provenance::{ProgramProvenance, RuntimeDiagnosis, TurnReport};

pub use crate::limits::{
    DEFAULT_MAX_ANNOTATION_BYTES, DEFAULT_MAX_ANNOTATION_KEYS, DEFAULT_MAX_EVENTS_PER_TURN,
    DEFAULT_MAX_TURN_BYTES, MAX_TIMEOUT_MS, MAX_TURN_BYTES, MIN_EVENTS_PER_TURN, MIN_TURN_BYTES,
};
use crate::limits::{DEFAULT_MAX_STEPS, DEFAULT_TIMEOUT_MS};

/// The clock every timestamp of a turn comes from.
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;
/// Observes each event, in order, as an immutable value.
pub type OnEvent = Arc<dyn Fn(&ExecutionEvent) + Send + Sync>;
/// Hears why a turn failed: a runtime that threw, or an audit outage.
pub type OnTurnError = Arc<dyn Fn(&TurnError, &TurnIds) + Send + Sync>;

/// Makes event ids.
#[derive(Clone)]
pub struct IdSource(Ids);

#[derive(Clone)]
enum Ids {
    /// The default: written straight into the id, no string in between.
    Uuid(Arc<UuidIds>),
    Custom(Arc<dyn Fn() -> String + Send + Sync>),
}

struct UuidIds {
    base: u128,
    next: std::sync::atomic::AtomicU64,
}

impl IdSource {
    /// Ids shaped like v4 UUIDs, without a `getrandom` per id: one random
    /// base per source, then the base with a counter in its low 62 bits
    /// (version and variant bits untouched). Distinct within a source by
    /// the counter, across sources by the random base; never secret.
    pub fn uuid() -> Self {
        Self(Ids::Uuid(Arc::new(UuidIds {
            base: uuid::Uuid::new_v4().as_u128(),
            next: std::sync::atomic::AtomicU64::new(0),
        })))
    }
    pub fn from_fn(f: impl Fn() -> String + Send + Sync + 'static) -> Self {
        Self(Ids::Custom(Arc::new(f)))
    }
    /// The next id and its serialized length, quotes included. A UUID's
    /// text (the default's, and the fallback's of a custom source) is hex
    /// digits and hyphens, which need no escape: its length is fixed.
    pub(crate) fn next_measured(&self) -> (Identifier, usize) {
        const UUID_LEN: usize = uuid::fmt::Hyphenated::LENGTH + 2;
        match &self.0 {
            Ids::Uuid(ids) => {
                let n = ids.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let low = u128::from(n) & ((1u128 << 62) - 1);
                let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
                let made = Identifier::new(
                    uuid::Uuid::from_u128(ids.base ^ low)
                        .hyphenated()
                        .encode_lower(&mut text),
                );
                (made.unwrap_or_else(|_| random_id()), UUID_LEN)
            }
            Ids::Custom(f) => match Identifier::new(f()) {
                Ok(id) => {
                    let len = str_len(id.as_str());
                    (id, len)
                }
                Err(_) => (random_id(), UUID_LEN),
            },
        }
    }

    #[cfg(test)]
    pub(crate) fn next(&self) -> Identifier {
        self.next_measured().0
    }
}

/// The id of a source whose own was not an identifier: a random UUID.
#[cold]
fn random_id() -> Identifier {
    Identifier::new(uuid::Uuid::new_v4().to_string()).unwrap_or_else(|_| unreachable!())
}

/// Why a turn ended in failure, for `on_turn_error` (never in the result).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnError {
    /// The runtime threw, broke the protocol, or could not be loaded.
    Runtime(RuntimeError),
    /// A decision-path audit write failed; `cause` is the sink's message.
    AuditUnavailable { cause: String },
    /// A kernel port failed for a reason other than the audit.
    Kernel(String),
    /// The runtime broke a host-side limit and its seat was stopped, e.g.
    /// `rate_limit_exceeded` for a turn over its event count budget,
    /// `turn_memory_exceeded` over its byte ledger. The turn
    /// ends `failed runtime_failed`, not retryable, with the reason (a
    /// fixed token) in `error.details.reason`.
    Violation { reason: &'static str },
}

/// Which turn an error belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnIds {
    pub execution_id: String,
    pub trace_id: String,
}

/// Options of an executor (envelope.md B.0).
#[derive(Clone)]
pub struct ExecutorOptions {
    pub clock: Clock,
    pub ids: IdSource,
    pub default_max_steps: u32,
    pub default_max_tool_calls: Option<u32>,
    pub default_timeout_ms: u64,
    /// The drain grace, inside the limit: `turn/draining` comes this long
    /// before the deadline. 0 (the default) means one signal only.
    pub drain_grace_ms: u64,
    pub on_turn_error: Option<OnTurnError>,
    /// The most events one turn holds (default 100 000). A plugin action
    /// (`emit`, a tool call and its answer) that would go past it, with
    /// room kept for the envelope's ending, stops the seat and ends the
    /// turn `failed runtime_failed` (violation `rate_limit_exceeded`).
    pub max_events_per_turn: usize,
    /// The turn's byte ledger (default 16 MiB): the most bytes one turn
    /// makes the host hold, counting every event whole, the annotations,
    /// the completions its calls paid for and the reserves for its stderr
    /// tail and its ending (`ledger.rs` says how each is measured). A
    /// plugin event past it stops the seat and ends the turn `failed
    /// runtime_failed` (violation `turn_memory_exceeded`); an annotation
    /// past it is dropped and counted, as for the annotation store's bounds.
    pub max_turn_bytes: usize,
    /// The most annotation keys one turn holds (default 1024). Past it a
    /// new key is dropped and counted, never refused (see `annotate`).
    pub max_annotation_keys: usize,
    /// The most annotation bytes (keys plus serialized values) one turn
    /// holds (default 1 MiB); past it a write is dropped and counted.
    pub max_annotation_bytes: usize,
}

impl Default for ExecutorOptions {
    fn default() -> Self {
        Self {
            clock: Arc::new(Timestamp::now),
            ids: IdSource::uuid(),
            default_max_steps: DEFAULT_MAX_STEPS,
            default_max_tool_calls: None,
            default_timeout_ms: DEFAULT_TIMEOUT_MS,
            drain_grace_ms: 0,
            on_turn_error: None,
            max_events_per_turn: DEFAULT_MAX_EVENTS_PER_TURN,
            max_turn_bytes: DEFAULT_MAX_TURN_BYTES,
            max_annotation_keys: DEFAULT_MAX_ANNOTATION_KEYS,
            max_annotation_bytes: DEFAULT_MAX_ANNOTATION_BYTES,
        }
    }
}

/// A configuration error of the executor itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ExecutorError(pub String);

/// Why `execute` returned no result at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecuteError {
    /// The request does not match the v1 contract; no result, no event, no
    /// audit record.
    #[error("ExecutionRequest does not match the SharedOS v1 contract: {0}")]
    InvalidRequest(String),
}

impl From<ContractError> for ExecuteError {
    fn from(e: ContractError) -> Self {
        ExecuteError::InvalidRequest(e.0)
    }
}

/// A record of the turn that the host keeps outside the kernel (a
/// session's event journal) could not be written. Given to
/// [`Executor::execute_recorded`](super::Executor::execute_recorded), its
/// raising is an audit outage (docs/spec/envelope.md B.10): the turn is
/// drained and ends `failed audit_unavailable`, exactly as when the kernel's
/// own decision write fails.
#[derive(Clone, Default)]
pub struct RecordOutage {
    raised: CancellationToken,
    cause: Arc<std::sync::Mutex<Option<String>>>,
}

impl RecordOutage {
    pub fn new() -> Self {
        Self::default()
    }
    /// Notes the first cause and raises the outage.
    pub fn raise(&self, cause: impl Into<String>) {
        if let Ok(mut slot) = self.cause.lock()
            && slot.is_none()
        {
            *slot = Some(cause.into());
        }
        self.raised.cancel();
    }
    pub fn cause(&self) -> Option<String> {
        self.cause.lock().ok().and_then(|c| c.clone())
    }
    pub(crate) async fn raised(&self) {
        self.raised.cancelled().await
    }
}

/// Per-call options of `execute`.
#[derive(Clone, Default)]
pub struct ExecuteOptions {
    /// The host's own cancellation: an immediate stop, no drain.
    pub cancel: Option<CancellationToken>,
    pub on_event: Option<OnEvent>,
}

/// A runtime the trusted host seated, with the manifest snapshot the
/// envelope writes into every result.
#[derive(Clone)]
pub struct Seat {
    pub manifest: RuntimeManifest,
    pub runtime: Arc<dyn SeatedRuntime>,
    /// The seat's egress gateway (a runtime with a network policy): the
    /// envelope binds each turn to it.
    pub egress: Option<Arc<sharedos_egress::EgressSeat>>,
    /// A seat that may serve consecutive turns of one session from one
    /// process (session affinity); `None`: every turn is `runtime.turn`.
    pub sessions: Option<Arc<dyn SessionSeat>>,
}

/// One turn of a seat: its run, and its report (how it was isolated, and
/// why it ended without an outcome), which the seat fills as it learns
/// each part, so a run the envelope drops at the deadline still leaves
/// its report.
pub struct SeatedTurn<'a> {
    pub outcome: BoxFuture<'a, Result<RuntimeTurnOutcome, RuntimeError>>,
    pub report: TurnReport,
}

/// What the envelope runs a turn on: a plugin in process, or a process
/// runtime (`seat::process_seat`).
pub trait SeatedRuntime: Send + Sync {
    /// One turn; nothing runs until the outcome is polled.
    fn turn(
        &self,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
    ) -> SeatedTurn<'_>;

    /// The report of a turn that ended before the seat was asked to run
    /// it (denied admission, a kernel failure first).
    fn unrun(&self) -> TurnReport {
        TurnReport::default()
    }
}

/// A plugin called in process: trusted code, no isolation to report.
struct InProcess(Arc<dyn RuntimePlugin>);

impl SeatedRuntime for InProcess {
    fn turn(
        &self,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
    ) -> SeatedTurn<'_> {
        SeatedTurn {
            outcome: self.0.run(request, host, abort),
            report: TurnReport::default(),
        }
    }
}

/// A seat with session affinity (docs/SECURITY.md, "Session affinity").
pub trait SessionSeat: Send + Sync {
    /// Runs the turn of a session: on the process parked under `key`, if
    /// any; the process may be parked again afterwards, unconfirmed. Its
    /// report carries `metadata.runtime.affinity`.
    fn run_in_session(
        &self,
        key: crate::process::AffinityKey,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
    ) -> SeatedTurn<'_>;

    /// The envelope's verdict on that turn: `keep` only when it ended
    /// `succeeded` without a drain; otherwise its process is killed.
    fn turn_ended(&self, execution_id: &str, keep: bool);

    /// Kills the processes parked for the session (it was closed).
    fn release_session(&self, session: &str);

    /// Kills every parked process (the host is shutting down).
    fn release_all(&self);
}

impl Seat {
    pub fn in_process(plugin: Arc<dyn RuntimePlugin>) -> Self {
        Self {
            manifest: plugin.manifest(),
            runtime: Arc::new(InProcess(plugin)),
            egress: None,
            sessions: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ids are the `uuid` crate's text of the same values: a v4 UUID's
    /// shape, lowercase, hyphenated, for generated bases and counters.
    #[test]
    fn an_id_is_the_uuid_crates_text_of_the_base_and_counter() {
        let mut g = sharedos_testkit::XorShift::new(0x9E37_79B9_7F4A_7C15);
        let mut next = || g.next_u64();
        for case in 0..20_000u64 {
            let base = match case {
                0 => 0,
                1 => u128::MAX,
                _ => (u128::from(next()) << 64) | u128::from(next()),
            };
            let base = if case % 2 == 0 {
                // Some bases as `IdSource::uuid` makes them: v4, RFC variant.
                uuid::Builder::from_random_bytes(base.to_le_bytes())
                    .into_uuid()
                    .as_u128()
            } else {
                base
            };
            let start = match case % 4 {
                0 => 0,
                1 => (1 << 62) - 2,
                2 => u64::MAX - 1,
                _ => next(),
            };
            let source = IdSource(Ids::Uuid(Arc::new(UuidIds {
                base,
                next: std::sync::atomic::AtomicU64::new(start),
            })));
            for n in [start, start.wrapping_add(1)] {
                let low = u128::from(n) & ((1u128 << 62) - 1);
                let expected = uuid::Uuid::from_u128(base ^ low).hyphenated().to_string();
                let (id, len) = source.next_measured();
                assert_eq!(id.as_str(), expected, "base {base:x}, n {n}");
                assert_eq!(len, serde_json::to_string(&id).unwrap().len());
            }
        }
    }

    #[test]
    fn a_sources_ids_are_v4_uuids_and_distinct() {
        let source = IdSource::uuid();
        let ids: Vec<String> = (0..1000).map(|_| source.next().into_string()).collect();
        for id in &ids {
            let parsed = uuid::Uuid::parse_str(id).unwrap();
            assert_eq!(parsed.get_version_num(), 4, "{id}");
            assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122, "{id}");
            assert_eq!(parsed.hyphenated().to_string(), *id);
        }
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len());
        assert_ne!(IdSource::uuid().next(), IdSource::uuid().next());
    }

    /// A custom source's ids are measured as written, escapes and all; one
    /// that is not an identifier is replaced by a UUID, measured the same.
    #[test]
    fn a_custom_sources_ids_are_measured_as_serialized() {
        let texts = [
            "plain",
            "q\"uote",
            "back\\slash",
            "tab\there",
            "\u{1}",
            "é☃😀",
            "  trimmed  ",
            "",
            "   ",
        ];
        for text in texts {
            let source = IdSource::from_fn(move || text.to_owned());
            let (id, len) = source.next_measured();
            assert_eq!(len, serde_json::to_string(&id).unwrap().len(), "{text:?}");
        }
    }
}
