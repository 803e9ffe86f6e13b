//! Every limit of the host in one place: the defaults a host gets when its
//! configuration says nothing, the bounds a configuration is checked
//! against, and the fixed reserves of the turn's byte ledger. The wire's
//! own bounds (message size, a turn's timeout, steps and tool calls, ids)
//! are the protocol's (`sharedos_protocol`), and are only cited here.

/// Upper bound of `drain_grace_ms` and `default_timeout_ms`: the
/// protocol's bound on a turn's timeout, written once there.
pub const MAX_TIMEOUT_MS: u64 = sharedos_protocol::MAX_EXECUTION_TIMEOUT_MS;

// ---------------------------------------------------------------- the turn

/// A turn's step limit when the request sets none.
pub const DEFAULT_MAX_STEPS: u32 = 16;
/// A turn's timeout when the request sets none (2 minutes).
pub const DEFAULT_TIMEOUT_MS: u64 = 120_000;
/// The most tool calls a host may default a turn to (the protocol's bound
/// on `maxToolCalls`).
pub const MAX_DEFAULT_TOOL_CALLS: u32 = sharedos_protocol::MAX_EXECUTION_TOOL_CALLS;

// ------------------------------------- the turn's bounded memory (ENVELOPE.md)

/// The most events one turn holds by default.
pub const DEFAULT_MAX_EVENTS_PER_TURN: usize = 100_000;
/// 16 MiB: 64 turns at their limit hold about 1 GiB in the ledger's measure
/// (docs/PROTOCOL.md section 5 has the measured resident size).
pub const DEFAULT_MAX_TURN_BYTES: usize = 16 * 1024 * 1024;
pub const DEFAULT_MAX_ANNOTATION_KEYS: usize = 1024;
pub const DEFAULT_MAX_ANNOTATION_BYTES: usize = 1024 * 1024;
/// The smallest event budget an executor takes: room for `turn.started`,
/// a few calls and the ending.
pub const MIN_EVENTS_PER_TURN: usize = 16;
/// The smallest ledger an executor takes: the reserves (stderr tail, the
/// ending) and room for a few events.
pub const MIN_TURN_BYTES: usize = 256 * 1024;
/// The largest ledger an executor takes (1 GiB).
pub const MAX_TURN_BYTES: usize = 1 << 30;

/// Events kept back for the envelope's own ending: whatever a plugin does,
/// the final `turn.completed | turn.failed | turn.escalated |
/// turn.cancelled` always fits.
pub(crate) const RESERVED_EVENTS: usize = 1;
/// Ledger bytes kept back for that final event (`turn.escalated` carries a
/// reason of at most 512 characters and the reviewer's address).
pub(crate) const RESERVED_EVENT_BYTES: usize = 8 * 1024;
/// What a `tool.completed` may weigh over its `tool.requested` in the
/// ledger: the status and a code of at most 256 characters, and their
/// parsed values. A call pays for its completion when it is requested, so
/// a completion is never refused.
pub(crate) const COMPLETION_EXTRA_BYTES: usize = 1_100;
/// What one parsed JSON value costs beyond its serialized bytes: a
/// `serde_json::Value` is 32 bytes, plus the allocator's and the map
/// node's share.
pub const VALUE_NODE_BYTES: usize = 48;
/// What one event costs beyond its serialized bytes: the struct and the
/// headers of its owned strings.
pub const EVENT_OVERHEAD_BYTES: usize = 256;
/// The reserve for the plugin's stderr tail: at most 20 lines
/// (`process::stderr::TAIL_LINES`) of at most 512 bytes
/// (`TAIL_LINE_BYTES`), each byte escaped to at most 4.
pub const STDERR_TAIL_RESERVE_BYTES: usize = 20 * (4 * 512 + 64);

// ------------------------------------------------------------ runtimes

/// How long a plugin has to answer `initialize` when its entry sets no
/// `handshakeTimeoutMs`.
pub const DEFAULT_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// How long a write to a plugin's stdin may stall before the turn ends.
pub const DEFAULT_WRITE_STALL_TIMEOUT_MS: u64 = 10_000;
/// The per-turn in-flight tool call limit when a runtime entry sets none.
pub const DEFAULT_INFLIGHT_TOOL_CALLS: u32 = 64;
/// The highest `maxInflightToolCalls` a runtime entry may set.
pub const MAX_INFLIGHT_TOOL_CALLS: u32 = 1024;
/// The largest `affinity.ttlMs` a runtime entry may set (5 minutes): a
/// parked process holds its sandbox and memory with no turn running.
pub const MAX_AFFINITY_TTL_MS: u64 = 300_000;
/// The `maxTokens` a driver table may set.
pub const MAX_TOKENS_RANGE: std::ops::RangeInclusive<u64> = 1..=131_072;

// ---------------------------------------------------------------- serve

/// The lease of a host that does not say otherwise.
pub const DEFAULT_LEASE: std::time::Duration = std::time::Duration::from_secs(10);
/// The shortest bearer token accepted.
pub const MIN_TOKEN_LEN: usize = 16;
/// The most bytes a request body of `serve`'s API may have.
pub const MAX_REQUEST_BODY_BYTES: usize = 4 * 1024 * 1024;
/// `[serve] maxUploadBytes` by default: the most bytes one file put into
/// a session's files may have.
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 8 * 1024 * 1024;
/// The range of `maxUploadBytes` (1 GiB at most: a file is held whole in
/// memory while it is hashed and written).
pub const MAX_UPLOAD_BYTES_RANGE: std::ops::RangeInclusive<u64> = 1..=1024 * 1024 * 1024;
/// `[serve] headerReadTimeoutMs` by default: a request head must be whole
/// this long after its first byte (and its body this long after the head).
pub const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// `[serve] idleTimeoutMs` by default: a connection with no request under
/// way and no byte received is closed after this long.
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 60_000;
/// The range of both timeouts.
pub const CONNECTION_TIMEOUT_RANGE_MS: std::ops::RangeInclusive<u64> = 100..=3_600_000;
/// `[serve] maxConnections` by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// The range of `maxConnections`.
pub const MAX_CONNECTIONS_RANGE: std::ops::RangeInclusive<usize> = 1..=1_000_000;
/// `[serve] maxLiveRuns` by default: runs live on one host at once.
pub const DEFAULT_MAX_LIVE_RUNS: usize = 64;
/// The range of `maxLiveRuns` and `maxLiveRunsPerTenant`.
pub const MAX_LIVE_RUNS_RANGE: std::ops::RangeInclusive<usize> = 1..=100_000;
/// `[serve] admissionQueue` by default: requests waiting for a run slot.
pub const DEFAULT_ADMISSION_QUEUE: usize = 256;
/// The range of `admissionQueue`.
pub const ADMISSION_QUEUE_RANGE: std::ops::RangeInclusive<usize> = 0..=1_000_000;
/// `[serve] admissionWaitMs` by default: how long a request waits for a
/// run slot before `429 too_many_runs`.
pub const DEFAULT_ADMISSION_WAIT_MS: u64 = 10_000;
/// The range of `admissionWaitMs`.
pub const ADMISSION_WAIT_RANGE_MS: std::ops::RangeInclusive<u64> = 0..=600_000;
/// Descriptors kept for everything but connections (the store, each run's
/// pipes and sandbox): `maxConnections` is lowered, and says so, when the
/// descriptor limit cannot hold both.
pub const RESERVED_DESCRIPTORS: u64 = 512;
/// Connections answered `503 too_many_connections` at once when the cap is
/// reached and none is idle; beyond it a connection is closed unanswered.
pub const MAX_REFUSING_CONNECTIONS: usize = 64;
/// At most one warning about failing accepts per this long (the rest are
/// counted into the next one).
pub const ACCEPT_WARNING_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);
/// How long accepting pauses after running out of descriptors or memory,
/// at first and at most (doubling in between).
pub const ACCEPT_BACKOFF: (std::time::Duration, std::time::Duration) = (
    std::time::Duration::from_millis(10),
    std::time::Duration::from_secs(1),
);

// ----------------------------------------------------------- conformance

/// The longest line the conformance battery's reader accepts (the host's
/// frame limit is smaller).
pub const MAX_CONFORMANCE_READ_LINE: u64 = 64 << 20;
