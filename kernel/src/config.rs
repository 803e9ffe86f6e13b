//! The kernel's part of the host configuration (TOML or JSON).
//!
//! ```toml
//! auditWriteTimeoutMs = 2000
//!
//! [files]
//! enabled = true
//! maxReadBytes = 1048576
//!
//! [[grants]]
//! id = "alice-admission"
//! subject = { kind = "agent", agentId = "alice" }
//! issuer = { kind = "service", serviceId = "host" }
//! namespaceId = "tenant-1"
//! [[grants.capabilities]]
//! namespace = "sharedos.execution"
//! path = ["agent", "alice"]
//! scope = "exact"
//! actions = ["invoke"]
//! ```

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use sharedos_protocol::PathSegment;

use crate::grant::{Capability, Grant};
use crate::tools::{ESCALATION_NAMESPACE, EXECUTION_NAMESPACE, FILES_NAMESPACE};

/// The built-in file tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FilesConfig {
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default = "default_max_read")]
    pub max_read_bytes: u64,
    #[serde(default = "default_max_write")]
    pub max_write_bytes: u64,
    #[serde(default = "default_max_entries")]
    pub max_list_entries: usize,
}

fn yes() -> bool {
    true
}
fn default_max_read() -> u64 {
    1024 * 1024
}
fn default_max_write() -> u64 {
    1024 * 1024
}
fn default_max_entries() -> usize {
    1000
}

impl Default for FilesConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_read_bytes: default_max_read(),
            max_write_bytes: default_max_write(),
            max_list_entries: default_max_entries(),
        }
    }
}

/// The `sharedos.escalate` affordance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EscalationConfig {
    #[serde(default = "yes")]
    pub enabled: bool,
}

impl Default for EscalationConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// A subtree the host has frozen: no action on it is allowed, whatever
/// the grants say.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FrozenSubtree {
    pub namespace: sharedos_protocol::Identifier,
    #[serde(default)]
    pub path: Vec<PathSegment>,
}

/// The host's ceiling over every grant. It can only narrow: a call it
/// refuses is `denied host_policy_denied`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HostPolicy {
    #[serde(default)]
    pub frozen: Vec<FrozenSubtree>,
    /// Refuses every `write` tool, and withholds them from the catalogue.
    #[serde(default)]
    pub freeze_mutations: bool,
}

impl HostPolicy {
    /// Whether the policy refuses `action` on `namespace`/`path` by a tool
    /// of class `read_write`.
    pub fn refuses(
        &self,
        namespace: &str,
        path: &[String],
        read_write: sharedos_protocol::ReadWrite,
    ) -> bool {
        if self.freeze_mutations && read_write == sharedos_protocol::ReadWrite::Write {
            return true;
        }
        self.frozen.iter().any(|f| {
            f.namespace.as_str() == namespace
                && f.path.len() <= path.len()
                && f.path.iter().zip(path).all(|(a, b)| a.as_str() == b)
        })
    }
}

/// What the host's configuration says to the kernel.
///
/// Unknown keys at this level are left to the host, so it can embed this
/// struct with `#[serde(flatten)]` and keep `[[grants]]` at its top level;
/// every nested entry (grant, capability, files, escalation) is strict.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KernelConfig {
    #[serde(default)]
    pub grants: Vec<Grant>,
    /// Resource namespaces of tools the host registers itself, so grants
    /// naming them validate. The built-in ones are always known.
    #[serde(default)]
    pub namespaces: Vec<String>,
    #[serde(default)]
    pub files: FilesConfig,
    #[serde(default)]
    pub escalation: EscalationConfig,
    #[serde(default)]
    pub host_policy: HostPolicy,
    /// Where bounded grants' use counts are kept across restarts (a JSONL
    /// file). Without it they are counted in memory and reset when the host
    /// restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_store_path: Option<std::path::PathBuf>,
    /// Bound on outcome-path audit writes; none means they are awaited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_write_timeout_ms: Option<u64>,
}

/// A configuration entry that does not make sense.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl KernelConfig {
    /// The resource namespaces a grant may name.
    pub fn known_namespaces(&self) -> HashSet<String> {
        let mut known: HashSet<String> = self.namespaces.iter().cloned().collect();
        known.insert(EXECUTION_NAMESPACE.to_owned());
        known.insert(FILES_NAMESPACE.to_owned());
        known.insert(ESCALATION_NAMESPACE.to_owned());
        known
    }

    /// Refuses an entry that does not make sense, naming it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let known = self.known_namespaces();
        for ns in &self.namespaces {
            if sharedos_protocol::Identifier::new(ns).is_err() {
                return Err(ConfigError(format!(
                    "namespaces: {ns:?} is not a valid identifier"
                )));
            }
        }
        let all_ids: HashSet<&str> = self.grants.iter().map(|g| g.id.as_str()).collect();
        let mut ids = HashSet::new();
        for (i, g) in self.grants.iter().enumerate() {
            let at = format!("grants[{i}] (id {:?})", g.id.as_str());
            if !ids.insert(g.id.as_str()) {
                return Err(ConfigError(format!(
                    "{at}: the id is used by an earlier grant"
                )));
            }
            check_grant(&at, g, &all_ids, &known)?;
        }
        for (i, f) in self.host_policy.frozen.iter().enumerate() {
            if !known.contains(f.namespace.as_str()) {
                return Err(ConfigError(format!(
                    "hostPolicy.frozen[{i}]: unknown namespace {:?}",
                    f.namespace.as_str()
                )));
            }
        }
        if self.files.max_read_bytes == 0 || self.files.max_write_bytes == 0 {
            return Err(ConfigError(
                "files: maxReadBytes and maxWriteBytes must be positive".into(),
            ));
        }
        Ok(())
    }
}

/// One grant of the configuration, `at` naming it in errors.
fn check_grant(
    at: &str,
    g: &Grant,
    all_ids: &HashSet<&str>,
    known: &HashSet<String>,
) -> Result<(), ConfigError> {
    if let Some(parent) = &g.parent_grant_id
        && (!all_ids.contains(parent.as_str()) || parent == &g.id)
    {
        return Err(ConfigError(format!(
            "{at}: parentGrantId {:?} names no other grant in the configuration",
            parent.as_str()
        )));
    }
    if g.capabilities.is_empty() {
        return Err(ConfigError(format!(
            "{at}: has no capabilities; a grant must allow something"
        )));
    }
    if g.max_uses == Some(0) {
        return Err(ConfigError(format!(
            "{at}: maxUses is 0; remove the grant or allow at least one use"
        )));
    }
    if let (Some(a), Some(b)) = (&g.not_before, &g.expires_at)
        && a.to_offset() > b.to_offset()
    {
        return Err(ConfigError(format!("{at}: notBefore is after expiresAt")));
    }
    if g.constraints
        .as_ref()
        .and_then(|c| c.purposes.as_ref())
        .is_some_and(|p| p.is_empty())
    {
        return Err(ConfigError(format!(
            "{at}: constraints.purposes is empty, which allows no purpose; remove it or list one"
        )));
    }
    for (j, c) in g.capabilities.iter().enumerate() {
        check_capability(&format!("{at}.capabilities[{j}]"), c, known)?;
    }
    Ok(())
}

/// One capability of a grant, `cat` naming it in errors.
fn check_capability(cat: &str, c: &Capability, known: &HashSet<String>) -> Result<(), ConfigError> {
    if !known.contains(c.namespace.as_str()) {
        return Err(ConfigError(format!(
            "{cat}: unknown namespace {:?}; known: {}; declare a host namespace under `namespaces`",
            c.namespace.as_str(),
            sorted(known)
        )));
    }
    if c.actions.is_empty() {
        return Err(ConfigError(format!("{cat}: actions is empty")));
    }
    if c.path.len() > 64 {
        return Err(ConfigError(format!(
            "{cat}: path has more than 64 segments"
        )));
    }
    for s in &c.path {
        // Segments built in code bypass deserialization: check again.
        if PathSegment::new(s.as_str()).ok().as_ref() != Some(s) {
            return Err(ConfigError(format!(
                "{cat}: bad path segment {:?}",
                s.as_str()
            )));
        }
    }
    Ok(())
}

fn sorted(set: &HashSet<String>) -> String {
    let mut v: Vec<&str> = set.iter().map(String::as_str).collect();
    v.sort_unstable();
    v.join(", ")
}
