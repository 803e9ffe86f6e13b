//! A peer's limits and its side of the method table. The host's hardening
//! is one configuration ([`PeerConfig::default`] with `handshake_first`),
//! the plugin SDK's another ([`PeerConfig::plugin`]).

use std::time::Duration;

use sharedos_protocol::method::{Direction, MethodEntry, TABLE};

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
    /// Which side this peer is: it takes the methods of the protocol's
    /// table ([`TABLE`]) sent the other way. Other requests get `-32601`,
    /// other notifications are dropped and counted.
    pub receives: Direction,
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
            receives: Direction::PluginToHost,
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
            receives: Direction::HostToPlugin,
            ..Self::default()
        }
    }

    /// The table's entry for a request this peer serves.
    pub(crate) fn request(&self, method: &str) -> Option<&'static MethodEntry> {
        self.entry(method).filter(|m| m.result.is_some())
    }

    /// The table's entry for a notification this peer takes.
    pub(crate) fn notification(&self, method: &str) -> Option<&'static MethodEntry> {
        self.entry(method).filter(|m| m.result.is_none())
    }

    fn entry(&self, method: &str) -> Option<&'static MethodEntry> {
        TABLE
            .iter()
            .find(|m| m.direction == self.receives && m.name == method)
    }
}

#[cfg(test)]
mod tests {
    use sharedos_protocol::method::{Direction, TABLE};

    use super::PeerConfig;

    /// Each side takes exactly its half of the protocol's method table,
    /// split by kind, and nothing of the other half.
    #[test]
    fn each_side_takes_exactly_the_other_sides_methods_of_the_table() {
        for (config, sender) in [
            (PeerConfig::default(), Direction::PluginToHost),
            (PeerConfig::plugin(), Direction::HostToPlugin),
        ] {
            for m in TABLE {
                let is_request = m.result.is_some();
                let ours = m.direction == sender;
                assert_eq!(
                    config.request(m.name).is_some(),
                    ours && is_request,
                    "{}",
                    m.name
                );
                assert_eq!(
                    config.notification(m.name).is_some(),
                    ours && !is_request,
                    "{}",
                    m.name
                );
            }
            assert!(config.request("probe/unknown").is_none());
        }
        assert!(PeerConfig::default().request("host/invokeTool").is_some());
        assert!(PeerConfig::plugin().request("turn/run").is_some());
    }
}
