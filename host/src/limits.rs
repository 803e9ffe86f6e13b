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

// ----------------------------------------------------------- conformance

/// The longest line the conformance battery's reader accepts (the host's
/// frame limit is smaller).
pub const MAX_CONFORMANCE_READ_LINE: u64 = 64 << 20;
