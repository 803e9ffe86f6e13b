//! The bounds of `sharedos serve` and its sessions: each named once, with
//! why (the host's own bounds are `sharedos_host::limits`).

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
