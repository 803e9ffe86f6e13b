//! The `SandboxReport`: what the helper really enforced, sent to the host
//! on a close-on-exec pipe just before `execve`, and the host-side check
//! against the configured minimum level.
//!
//! The level is computed from the layers that were *observed* applied, and
//! then capped by the self-check the helper reads from `/proc/self/status`
//! after the last layer: a layer that returned `Ok` but does not show in the
//! kernel's own view does not count.
//!
//! Each layer's plain data sits here, both ends of it: its switch in the
//! policy ([`LayerToggles`], which [`crate::SandboxPolicy`] holds) and its
//! outcome in the report. This module imports neither the policy nor the
//! layers, so the policy can hold the switches without an import cycle,
//! and a new layer is its module, its line in the registry and this file
//! (docs/ARCHITECTURE.md, "Where to change X").

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::level::SandboxLevel;

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

/// The outcome of one layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum LayerStatus {
    /// Enforced as requested.
    Applied,
    /// Enforced in part; `reason` says what is missing.
    Degraded { reason: String },
    /// The kernel or host could not provide it; `reason` has the errno.
    Unavailable { reason: String },
    /// Switched off by the policy.
    Disabled,
}

impl Default for LayerStatus {
    fn default() -> Self {
        LayerStatus::unavailable("not reported")
    }
}

impl LayerStatus {
    /// True for `Applied` and `Degraded` (something is enforced).
    pub fn is_enforced(&self) -> bool {
        matches!(self, LayerStatus::Applied | LayerStatus::Degraded { .. })
    }

    pub(crate) fn unavailable(reason: impl fmt::Display) -> Self {
        LayerStatus::Unavailable {
            reason: reason.to_string(),
        }
    }
}

/// Landlock details.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LandlockReport {
    pub status: LayerStatus,
    /// ABI the running kernel offers (`None` when Landlock is missing).
    pub kernel_abi: Option<i32>,
    /// ABI the ruleset is written against (pinned, never derived from the kernel).
    pub requested_abi: i32,
    /// `FullyEnforced`, `PartiallyEnforced` or `NotEnforced`, as returned by `restrict_self`.
    pub ruleset: String,
    /// Scopes requested (`signal`, `abstract_unix`).
    pub scopes: Vec<String>,
    /// `tcp-deny` when TCP bind/connect are handled with no allowed port.
    pub net: String,
}

/// Seccomp details.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SeccompReport {
    pub status: LayerStatus,
    pub arch: String,
    /// Number of BPF instructions installed.
    pub insns: usize,
    /// The `nr >= 0x40000000` (x32 ABI) guard is present.
    pub x32_guard: bool,
    /// `namespace` (non-UNIX socket families denied) or `strict` (no
    /// `socket()` at all, no SysV IPC, no `pidfd_open`).
    pub mode: String,
    /// What an unlisted syscall gets: `ENOSYS` (the filter is an
    /// allowlist).
    pub default_action: String,
    /// `memfd_create` under the policy: `deny` or `allowNoExec`.
    pub memfd_create: String,
}

/// Cgroup details.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CgroupReport {
    pub status: LayerStatus,
    /// Directories the helper joined.
    pub paths: Vec<String>,
    /// Whether `cgroup.kill` (v2) is available for an atomic tree kill.
    pub kill: bool,
    pub pids_max: Option<u64>,
    pub memory_max: Option<u64>,
}

/// What the kernel itself says about the process just before `execve`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SelfCheck {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub cap_eff: Option<u64>,
    pub cap_prm: Option<u64>,
    pub cap_inh: Option<u64>,
    pub cap_bnd: Option<u64>,
    pub cap_amb: Option<u64>,
    pub no_new_privs: Option<bool>,
    /// 0 = off, 1 = strict, 2 = filter.
    pub seccomp: Option<u32>,
    pub seccomp_filters: Option<u32>,
    /// Contents of `/proc/self/uid_map`, one mapping per entry.
    pub uid_map: Vec<String>,
    /// Fds open at the moment of the check, excluding the report pipe and
    /// the fd used to read `/proc/self/status`.
    pub fds: Vec<i32>,
}

/// The report the helper sends before `execve`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SandboxReport {
    pub level: SandboxLevel,
    /// Layers that keep this report from `strong`, with the operator's fix.
    pub missing: Vec<MissingLayer>,
    pub kernel: String,
    /// The uid the plugin runs as, seen from the host.
    pub host_uid: u32,
    pub uid_drop: LayerStatus,
    /// A uid of this sandbox's own (no other live sandbox has it).
    /// Unavailable when the host is not root: then every sandbox runs as
    /// the host's uid, which the reason names.
    #[serde(default)]
    pub own_uid: LayerStatus,
    /// The supervisor (outside the pid namespace, holding the control
    /// socket) is non-dumpable: its memory, environment and fds cannot be
    /// read, nor its namespaces entered, by any non-root host user.
    #[serde(default)]
    pub supervisor_non_dumpable: bool,
    pub userns: LayerStatus,
    pub mountns: LayerStatus,
    pub pidns: LayerStatus,
    pub netns: LayerStatus,
    pub ipcns: LayerStatus,
    pub utsns: LayerStatus,
    pub cgroupns: LayerStatus,
    /// The minimal root (`pivot_root`).
    pub root: LayerStatus,
    pub landlock: LandlockReport,
    pub seccomp: SeccompReport,
    pub caps: LayerStatus,
    pub no_new_privs: bool,
    pub rlimits: BTreeMap<String, u64>,
    pub rlimits_status: LayerStatus,
    /// Ceilings written into the sandbox's user namespace
    /// (`/proc/sys/user/*`: inotify, fanotify, namespaces).
    #[serde(default)]
    pub ceilings: BTreeMap<String, u64>,
    #[serde(default)]
    pub ceilings_status: LayerStatus,
    /// SysV IPC limits written into the sandbox's ipc namespace
    /// (`/proc/sys/kernel/shm*`, `msg*`).
    #[serde(default)]
    pub ipc_limits: BTreeMap<String, u64>,
    #[serde(default)]
    pub ipc_limits_status: LayerStatus,
    /// Socket sysctls written into the sandbox's network namespace
    /// (`/proc/sys/net/...`, as written: `ipv4/tcp_rmem` = "4096 65536 1048576").
    #[serde(default)]
    pub net_limits: BTreeMap<String, String>,
    #[serde(default)]
    pub net_limits_status: LayerStatus,
    /// What bounds memory here and the resulting bound.
    #[serde(default)]
    pub memory: MemoryReport,
    pub cgroup: CgroupReport,
    pub lifeline: LayerStatus,
    pub setsid: LayerStatus,
    /// Fds the plugin starts with (expected: 0, 1, 2).
    pub fds: Vec<i32>,
    /// Environment keys handed to the plugin (never values).
    pub env_keys: Vec<String>,
    pub self_check: SelfCheck,
    pub warnings: Vec<String>,
    /// Stage timestamps of this spawn, in microseconds since the host's
    /// call to `spawn` (only with `policy.timings`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timings_us: Vec<crate::timing::StageTiming>,
    /// The sandbox was prepared ahead of the turn (`policy.warm`): every
    /// layer was built and this report written before the host asked for
    /// it; the plugin's `execve` came with the start order. Nothing of the
    /// plugin ran before it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prepared: bool,
    /// What the plugin sees of the filesystem (only with
    /// `policy.describe`: `sharedos sandbox check --runtime`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view: Option<RootView>,
}

/// The memory section of the report: one row per kind of memory a tree
/// can hold, with the mechanism that holds it, and the whole tree's bound.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MemoryReport {
    /// One row per kind of memory.
    pub layers: Vec<MemoryLayer>,
    /// The most one process can map (`RLIMIT_AS`), bytes; `None` when no
    /// address-space limit is set (the default: it is not the memory
    /// bound, and it breaks runtimes that reserve large regions).
    pub per_process_bytes: Option<u64>,
    /// The most the whole tree can hold, bytes: the cgroup's `memory.max`,
    /// which every page and kernel object of the tree is charged to.
    /// `None` without one: some kind of memory (at least kernel objects)
    /// is unbounded, and `unbounded` names each.
    pub tree_bound_bytes: Option<u64>,
    /// The kinds of memory no mechanism bounds here (the rows without
    /// `bytes`), in row order.
    #[serde(default)]
    pub unbounded: Vec<String>,
}

/// One kind of memory and what holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MemoryLayer {
    /// The kind of memory (`pipe buffers`, `tmpfs /workspace`, ...).
    pub name: String,
    /// `applied` when a mechanism holds it, `unavailable` (with the
    /// reason) when nothing does.
    pub status: LayerStatus,
    /// The most this kind can hold, bytes; `None`: unbounded.
    pub bytes: Option<u64>,
    /// The mechanism, and how `bytes` is made up.
    pub detail: String,
}

/// What the plugin sees, as the helper built it (`policy.describe`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RootView {
    /// The program's path inside (what `execve` is given).
    pub program: String,
    /// Whether the program runs from its own path (inside a read-only
    /// path of the runtime) or from a staged copy at `/plugin/<name>`.
    pub program_in_place: bool,
    /// The working directory (the workspace).
    pub workdir: String,
    /// Every mount and mirrored link of the root, in the order built.
    pub mounts: Vec<ViewMount>,
}

/// One entry of the root.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ViewMount {
    /// The path inside (the same as the host path for a bind).
    pub path: String,
    /// `ro` or `rw`.
    pub access: String,
    /// Where it comes from: `roPaths`, `extraRoPaths`, `tmpfs 128 MiB (TMPDIR)`, ...
    pub source: String,
}

/// One layer that is missing for the next level, with what to do about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MissingLayer {
    pub layer: String,
    pub reason: String,
    pub fix: String,
}

impl fmt::Display for MissingLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} (fix: {})", self.layer, self.reason, self.fix)
    }
}

/// What the helper writes on the report pipe, one JSON object per line.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum HelperMessage {
    Report(Box<SandboxReport>),
    Error {
        stage: String,
        message: String,
        errno: Option<i32>,
    },
}
