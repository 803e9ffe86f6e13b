//! `[serve]` of host.toml: what `sharedos serve` alone reads
//! (docs/SERVE.md, docs/STORE.md, "Data at rest").
//!
//! ```toml
//! [serve]
//! allowSharedStore = false     # true: start on a store others may read (not advised)
//! headerReadTimeoutMs = 10000  # a request head whole this long after its first byte
//! idleTimeoutMs = 60000        # a connection with no request under way closed after this
//! maxConnections = 1024        # connections open at once
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::limits::{
    CONNECTION_TIMEOUT_RANGE_MS, DEFAULT_HEADER_READ_TIMEOUT_MS, DEFAULT_IDLE_TIMEOUT_MS,
    DEFAULT_MAX_CONNECTIONS, MAX_CONNECTIONS_RANGE,
};

/// Options of `sharedos serve`; every one has a default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServeSection {
    /// Start even when the SQLite store, its WAL/SHM or the files root is
    /// readable or writable by group or others, or owned by another user.
    /// Off by default: `serve` refuses such a store, naming the path.
    #[serde(default)]
    pub allow_shared_store: bool,
    /// A request head must be whole this long after its first byte, and
    /// its body this long after the head; else the connection is closed.
    #[serde(default = "header_read_timeout")]
    pub header_read_timeout_ms: u64,
    /// A connection with no request under way (new, or between keep-alive
    /// requests) that receives nothing for this long is closed.
    #[serde(default = "idle_timeout")]
    pub idle_timeout_ms: u64,
    /// Connections open at once. At the cap, the connection idle the
    /// longest makes room for a new one; with none idle, the new one is
    /// answered `503 too_many_connections`.
    #[serde(default = "max_connections")]
    pub max_connections: usize,
}

impl Default for ServeSection {
    fn default() -> Self {
        Self {
            allow_shared_store: false,
            header_read_timeout_ms: DEFAULT_HEADER_READ_TIMEOUT_MS,
            idle_timeout_ms: DEFAULT_IDLE_TIMEOUT_MS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

fn header_read_timeout() -> u64 {
    DEFAULT_HEADER_READ_TIMEOUT_MS
}
fn idle_timeout() -> u64 {
    DEFAULT_IDLE_TIMEOUT_MS
}
fn max_connections() -> usize {
    DEFAULT_MAX_CONNECTIONS
}

impl ServeSection {
    /// Each bound in its range, the key named.
    pub(super) fn check(&self) -> Result<(), String> {
        for (key, ms) in [
            ("headerReadTimeoutMs", self.header_read_timeout_ms),
            ("idleTimeoutMs", self.idle_timeout_ms),
        ] {
            if !CONNECTION_TIMEOUT_RANGE_MS.contains(&ms) {
                return Err(format!(
                    "serve.{key}: must be {}..={} (0.1 s to 1 hour), got {ms}",
                    CONNECTION_TIMEOUT_RANGE_MS.start(),
                    CONNECTION_TIMEOUT_RANGE_MS.end()
                ));
            }
        }
        if !MAX_CONNECTIONS_RANGE.contains(&self.max_connections) {
            return Err(format!(
                "serve.maxConnections: must be {}..={}, got {}",
                MAX_CONNECTIONS_RANGE.start(),
                MAX_CONNECTIONS_RANGE.end(),
                self.max_connections
            ));
        }
        Ok(())
    }

    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }

    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }
}
