//! The level of confinement ([`SandboxLevel`]): what a policy asks for
//! as its minimum and a report computes from the layers it observed, kept
//! apart from both so that the policy does not import the report.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How strongly a plugin is confined. Ordered: `Minimal < Reduced <
/// Isolated < Strong`.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum SandboxLevel {
    /// Some of uid drop, filesystem confinement or seccomp is missing: the
    /// plugin can reach host resources. Refused unless explicitly allowed.
    #[default]
    Minimal,
    /// No namespaces, but a non-root uid, Landlock (filesystem, TCP,
    /// scopes), the strict seccomp filter, no capabilities and rlimits.
    /// Host `/proc` and network interfaces stay visible; whole-tree kill
    /// relies on the cgroup.
    Reduced,
    /// Every isolation layer: user, mount, pid, net, ipc and uts
    /// namespaces, a minimal root, Landlock, seccomp, no capabilities,
    /// no_new_privs, rlimits; but the tree's memory is not bounded as a
    /// whole (no delegated memory controller): the report's `memory`
    /// section names what is unbounded.
    Isolated,
    /// Every isolation layer, and the whole tree's memory bounded (a
    /// delegated cgroup v2 memory controller with `memory.max`).
    Strong,
}

impl fmt::Display for SandboxLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SandboxLevel::Minimal => "minimal",
            SandboxLevel::Reduced => "reduced",
            SandboxLevel::Isolated => "isolated",
            SandboxLevel::Strong => "strong",
        })
    }
}
