//! The policy's switch for each layer ([`LayerToggles`]): plain data that
//! the policy holds and the layers read, kept apart from both so that the
//! policy does not import the layers that import it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One switch per layer; all on by default.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct LayerToggles {
    /// Leave uid 0 when the host runs as root.
    pub drop_uid: bool,
    /// New user namespace (needed for every other namespace as non-root).
    pub userns: bool,
    /// Mount namespace + minimal root via `pivot_root`.
    pub mountns: bool,
    /// Pid namespace with a pid-1 reaper (the tree dies with it).
    pub pidns: bool,
    /// Empty network namespace.
    pub netns: bool,
    /// Private SysV IPC / POSIX mqueue namespace.
    pub ipcns: bool,
    /// Private hostname.
    pub utsns: bool,
    /// Private cgroup namespace view.
    pub cgroupns: bool,
    /// Landlock filesystem, TCP and scope rules.
    pub landlock: bool,
    /// The seccomp allowlist.
    pub seccomp: bool,
    /// Resource limits.
    pub rlimits: bool,
}

impl Default for LayerToggles {
    fn default() -> Self {
        LayerToggles {
            drop_uid: true,
            userns: true,
            mountns: true,
            pidns: true,
            netns: true,
            ipcns: true,
            utsns: true,
            cgroupns: true,
            landlock: true,
            seccomp: true,
            rlimits: true,
        }
    }
}

impl LayerToggles {
    /// Every layer off: only for measuring the cost of the layers and for
    /// tests ([`crate::SandboxPolicy::unconfined`]).
    pub fn none() -> Self {
        LayerToggles {
            drop_uid: false,
            userns: false,
            mountns: false,
            pidns: false,
            netns: false,
            ipcns: false,
            utsns: false,
            cgroupns: false,
            landlock: false,
            seccomp: false,
            rlimits: false,
        }
    }
}
