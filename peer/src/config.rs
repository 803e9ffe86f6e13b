//! A peer's limits and its side of the method table. The host's hardening
//! is one configuration ([`PeerConfig::default`] with `handshake_first`),
//! the plugin SDK's another ([`PeerConfig::plugin`]). Which methods a
//! peer takes is its type's side ([`crate::Inbox`]), not configuration.

use std::time::Duration;

/// Limits of one peer. On the host one peer serves one process, which
/// serves one turn, so every budget here is per turn.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// One line, either direction.
    pub max_message_bytes: usize,
    /// Incoming requests in flight at once; more get `-32055`.
    pub max_inflight_requests: usize,
    /// Lines queued for the writer.
    pub write_queue: usize,
    /// A write that makes no progress for this long is fatal.
    pub write_stall_timeout: Duration,
    /// Semantic violations (dropped and counted) before the peer is killed.
    pub violation_budget: u32,
    /// Notifications, requests and empty lines allowed in total.
    pub notification_budget: u64,
    /// Bytes of notifications, requests and empty lines allowed in total.
    pub notification_bytes_budget: u64,
    /// Token bucket on notifications, requests and empty lines: refill
    /// rate per second and burst.
    pub notification_rate: (u32, u32),
    /// The other end speaks only after answering this end's first request
    /// (`initialize`): until a response to a pending request is read, any
    /// other line is fatal (`stdout_before_handshake`).
    pub handshake_first: bool,
}

/// The plugin's write queue, in lines. `emit` cannot wait (it is
/// synchronous), so a burst of emits is queued: the queue holds more than
/// the host's default notification burst (10,000, `notification_rate`), so
/// a burst the host accepts never finds the plugin's own queue full. A
/// bounded tokio channel takes memory per queued line, not per slot.
pub const PLUGIN_WRITE_QUEUE: usize = 16_384;

impl Default for PeerConfig {
    /// The host's end of a plugin connection, without the handshake rule.
    fn default() -> Self {
        Self {
            max_message_bytes: sharedos_protocol::DEFAULT_MAX_MESSAGE_BYTES,
            max_inflight_requests: 8,
            write_queue: 64,
            write_stall_timeout: Duration::from_secs(10),
            violation_budget: 100,
            notification_budget: 100_000,
            notification_bytes_budget: 64 << 20,
            notification_rate: (2_000, 10_000),
            handshake_first: false,
        }
    }
}

impl PeerConfig {
    /// The plugin's end: it takes the host's methods, trusts the host's
    /// pace (no budgets: a host that floods its own plugin harms only
    /// itself) and ignores what it does not know (protocol.md B.7).
    pub fn plugin() -> Self {
        Self {
            max_inflight_requests: usize::MAX >> 4,
            write_queue: PLUGIN_WRITE_QUEUE,
            write_stall_timeout: Duration::from_secs(24 * 3600),
            violation_budget: u32::MAX,
            notification_budget: u64::MAX,
            notification_bytes_budget: u64::MAX,
            notification_rate: (u32::MAX, u32::MAX),
            ..Self::default()
        }
    }
}
