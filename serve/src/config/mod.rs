//! `[serve]` of host.toml: what `sharedos serve` alone reads
//! (docs/SERVE.md, docs/STORE.md, "Data at rest"). The host's own
//! configuration keeps the table unread ([`HostConfig::serve`]); a
//! [`ServeConfig`] is the host's configuration with this section parsed
//! and checked, its errors worded as the host's (file, key, what to fix).
//!
//! ```toml
//! [serve]
//! allowSharedStore = false     # true: start on a store others may read (not advised)
//! headerReadTimeoutMs = 10000  # a request head whole this long after its first byte
//! idleTimeoutMs = 60000        # a connection with no request under way closed after this
//! maxConnections = 1024        # connections open at once
//! maxLiveRuns = 64             # runs live on this host at once
//! maxLiveRunsPerTenant = 64    # runs of one namespace live at once
//! admissionQueue = 256         # requests waiting for a slot
//! admissionWaitMs = 10000      # how long one waits before 429
//! tlsCert = "cert.pem"         # TLS for --listen (with tlsKey; or --tls-cert/--tls-key)
//! tlsKey = "key.pem"
//! allowPlainTcp = false        # true: plain TCP (no TLS) on a non-loopback address
//! maxUploadBytes = 8388608     # the most bytes one file put into a session's files has
//!
//! [[serve.peers]]              # a unix peer uid bound to a tenant's scope
//! uid = 1000
//! namespaceId = "tenant-a"
//! authority = { kind = "service", serviceId = "app-a" }
//! ```

pub mod retention;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sharedos_host::config::{ConfigError, ConfigText, HostConfig, describe_toml_error};
use sharedos_protocol::{Address, Identifier};

use crate::limits::{
    ADMISSION_QUEUE_RANGE, ADMISSION_WAIT_RANGE_MS, CONNECTION_TIMEOUT_RANGE_MS,
    DEFAULT_ADMISSION_QUEUE, DEFAULT_ADMISSION_WAIT_MS, DEFAULT_HEADER_READ_TIMEOUT_MS,
    DEFAULT_IDLE_TIMEOUT_MS, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_LIVE_RUNS,
    DEFAULT_MAX_UPLOAD_BYTES, MAX_CONNECTIONS_RANGE, MAX_LIVE_RUNS_RANGE, MAX_UPLOAD_BYTES_RANGE,
};
use crate::session::AdmissionLimits;
use retention::RetentionSection;

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
    /// Runs live on this host at once; a run beyond it waits for a slot
    /// (docs/SERVE.md, "Admission").
    #[serde(default = "max_live_runs")]
    pub max_live_runs: usize,
    /// Runs of one tenant (the scope's `namespaceId`) live at once; by
    /// default `maxLiveRuns`.
    #[serde(default)]
    pub max_live_runs_per_tenant: Option<usize>,
    /// Requests waiting for a slot at once; beyond it `429 too_many_runs`.
    #[serde(default = "admission_queue")]
    pub admission_queue: usize,
    /// How long a request waits for a slot before `429 too_many_runs`.
    #[serde(default = "admission_wait")]
    pub admission_wait_ms: u64,
    /// TLS for `--listen`: the certificate chain (PEM), relative to the
    /// configuration's directory; with `tlsKey`.
    #[serde(default)]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of `tlsCert`.
    #[serde(default)]
    pub tls_key: Option<PathBuf>,
    /// Listen on plain TCP (no TLS) on an address other than loopback.
    /// Off by default: bearer tokens would cross the network in clear.
    #[serde(default)]
    pub allow_plain_tcp: bool,
    /// The most bytes of one file put into a session's files
    /// (`PUT /v1/sessions/{id}/files/{path}`); beyond it `413`.
    #[serde(default = "max_upload_bytes")]
    pub max_upload_bytes: u64,
    /// Unix peers (by uid, `SO_PEERCRED`) bound to a tenant's scope; an
    /// unmapped peer is the socket's owner, trusted with any scope.
    #[serde(default)]
    pub peers: Vec<PeerTenant>,
    /// `[serve.retention]`: ended runs and closed sessions deleted by age.
    #[serde(default)]
    pub retention: RetentionSection,
}

/// A unix peer bound to a tenant: its requests get this namespace and
/// authority, and may give only the owner (docs/SERVE.md, "Tenants").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PeerTenant {
    pub uid: u32,
    pub namespace_id: Identifier,
    pub authority: Address,
}

impl Default for ServeSection {
    fn default() -> Self {
        Self {
            allow_shared_store: false,
            header_read_timeout_ms: DEFAULT_HEADER_READ_TIMEOUT_MS,
            idle_timeout_ms: DEFAULT_IDLE_TIMEOUT_MS,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_live_runs: DEFAULT_MAX_LIVE_RUNS,
            max_live_runs_per_tenant: None,
            admission_queue: DEFAULT_ADMISSION_QUEUE,
            admission_wait_ms: DEFAULT_ADMISSION_WAIT_MS,
            tls_cert: None,
            tls_key: None,
            allow_plain_tcp: false,
            max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES,
            peers: Vec::new(),
            retention: RetentionSection::default(),
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
fn max_live_runs() -> usize {
    DEFAULT_MAX_LIVE_RUNS
}
fn admission_queue() -> usize {
    DEFAULT_ADMISSION_QUEUE
}
fn max_upload_bytes() -> u64 {
    DEFAULT_MAX_UPLOAD_BYTES
}
fn admission_wait() -> u64 {
    DEFAULT_ADMISSION_WAIT_MS
}

impl ServeSection {
    /// Each bound in its range, the key named.
    fn check(&self) -> Result<(), String> {
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
        if !MAX_UPLOAD_BYTES_RANGE.contains(&self.max_upload_bytes) {
            return Err(format!(
                "serve.maxUploadBytes: must be {}..={}, got {}",
                MAX_UPLOAD_BYTES_RANGE.start(),
                MAX_UPLOAD_BYTES_RANGE.end(),
                self.max_upload_bytes
            ));
        }
        self.check_tenants()?;
        self.check_admission()?;
        self.retention.check()
    }

    fn check_tenants(&self) -> Result<(), String> {
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err("serve.tlsCert and serve.tlsKey go together: give both, or neither".into());
        }
        for (i, p) in self.peers.iter().enumerate() {
            let ids = [p.namespace_id.as_str(), &p.authority.path()[1]];
            if ids.iter().any(|id| id.chars().any(char::is_control)) {
                return Err(format!(
                    "serve.peers[{i}]: a control character in namespaceId or authority: use printable characters only"
                ));
            }
            if self.peers[..i].iter().any(|q| q.uid == p.uid) {
                return Err(format!(
                    "serve.peers[{i}]: uid {} is mapped twice: keep one entry per uid",
                    p.uid
                ));
            }
        }
        Ok(())
    }

    fn check_admission(&self) -> Result<(), String> {
        let range = &MAX_LIVE_RUNS_RANGE;
        for (key, n) in [
            ("maxLiveRuns", Some(self.max_live_runs)),
            ("maxLiveRunsPerTenant", self.max_live_runs_per_tenant),
        ] {
            if let Some(n) = n
                && !range.contains(&n)
            {
                return Err(format!(
                    "serve.{key}: must be {}..={}, got {n}",
                    range.start(),
                    range.end()
                ));
            }
        }
        if !ADMISSION_QUEUE_RANGE.contains(&self.admission_queue) {
            return Err(format!(
                "serve.admissionQueue: must be {}..={} (0: refuse at once when every slot is taken), got {}",
                ADMISSION_QUEUE_RANGE.start(),
                ADMISSION_QUEUE_RANGE.end(),
                self.admission_queue
            ));
        }
        if !ADMISSION_WAIT_RANGE_MS.contains(&self.admission_wait_ms) {
            return Err(format!(
                "serve.admissionWaitMs: must be {}..={}, got {}",
                ADMISSION_WAIT_RANGE_MS.start(),
                ADMISSION_WAIT_RANGE_MS.end(),
                self.admission_wait_ms
            ));
        }
        Ok(())
    }

    /// The admission bounds these options give.
    pub fn admission(&self) -> AdmissionLimits {
        AdmissionLimits {
            max_live: self.max_live_runs,
            max_live_per_tenant: self.max_live_runs_per_tenant.unwrap_or(self.max_live_runs),
            queue: self.admission_queue,
            wait: Duration::from_millis(self.admission_wait_ms),
        }
    }

    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }

    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }
}

/// A host configuration with its `[serve]` section parsed and checked:
/// what `sharedos serve` runs from.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    pub host: HostConfig,
    pub serve: ServeSection,
}

/// The file as `[serve]` reads it: every other table is the host's.
#[derive(Deserialize)]
struct ServeFile {
    #[serde(default)]
    serve: ServeSection,
}

impl ServeConfig {
    /// Reads and checks a configuration file, `[serve]` included.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let f = ConfigText::read(path)?;
        Self::parse(&f.text, &f.file, &f.base_dir)
    }

    /// Parses and checks configuration text; `file` names it in errors.
    pub fn parse(text: &str, file: &str, base_dir: &Path) -> Result<Self, ConfigError> {
        let err = |message: String| ConfigError {
            file: file.to_owned(),
            message,
        };
        // The section is read from the text, not from the host's table,
        // so an unknown key's error names the byte it is at.
        let section: ServeFile = toml::from_str(text).map_err(|e| err(describe_toml_error(&e)))?;
        section.serve.check().map_err(err)?;
        let host = HostConfig::parse(text, file, base_dir)?;
        Ok(Self {
            host,
            serve: section.serve,
        })
    }

    /// The `[serve]` table a host configuration kept unread, parsed and
    /// checked (for a configuration built without its file's text).
    pub fn from_host(host: HostConfig, file: &str) -> Result<Self, ConfigError> {
        let err = |message: String| ConfigError {
            file: file.to_owned(),
            message,
        };
        let serve = ServeSection::deserialize(toml::Value::Table(host.serve.clone()))
            .map_err(|e| err(format!("serve: {}", e.message().trim())))?;
        serve.check().map_err(err)?;
        Ok(Self { host, serve })
    }
}
