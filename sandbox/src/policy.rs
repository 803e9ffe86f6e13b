//! The sandbox policy: what the host asks the helper to enforce.
//!
//! It is embedded per runtime in the host's TOML config (under
//! `[runtimes.<name>.sandbox]`), so every field has a default and the whole
//! struct round-trips through serde. The defaults are the strong sandbox;
//! the layer toggles exist for tests and for operators who knowingly run a
//! degraded mode (the report and `min_level` still apply).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::level::SandboxLevel;
use crate::report::LayerToggles;

/// Everything the helper needs to know about how to confine one plugin.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct SandboxPolicy {
    /// The host refuses to start a plugin whose report is below this level.
    /// The default, `isolated`, asks for every isolation layer; `strong`
    /// also asks for the whole tree's memory to be bounded.
    pub min_level: SandboxLevel,
    /// Refuse to start a plugin whose tree's memory is not bounded as a
    /// whole (no delegated cgroup v2 memory controller with `memory.max`),
    /// whatever `min_level` says: `SandboxError::MemoryUnbounded` names
    /// the unbounded kinds and the fix.
    pub require_memory_bound: bool,
    /// Switch individual layers off (tests, degraded hosts).
    pub layers: LayerToggles,
    /// Resource limits applied to the plugin process.
    pub rlimits: Rlimits,
    /// Cgroup limits, applied only where a cgroup can be delegated.
    pub cgroup: CgroupPolicy,
    /// Size of the private `/tmp` tmpfs, in bytes.
    pub tmp_size_bytes: u64,
    /// Size of the private `/dev/shm` tmpfs, in bytes.
    pub shm_size_bytes: u64,
    /// Inode cap of each private tmpfs (the workspace's too: it bounds
    /// how many files and how deep a directory chain the plugin can make).
    pub tmpfs_nr_inodes: u64,
    /// Size of the workspace, a tmpfs of the sandbox's own that goes away
    /// with it (memory-backed: count it in the memory budget).
    pub workspace_size_bytes: u64,
    /// Size of the per-turn home (`HOME`, at [`crate::fsview::HOME`]), a
    /// tmpfs of the sandbox's own like the workspace: where a program
    /// keeps its dotfiles and caches for the turn.
    pub home_size_bytes: u64,
    /// The host paths bound read-only into the sandbox root, at the same
    /// path: system directories and the `/etc` entries programs need. A
    /// missing one is skipped silently; a top-level one that is a symlink
    /// (`/bin` on merged-usr systems) is mirrored as that symlink. Only
    /// parts of `/usr` are listed, so `/usr/local/etc` and other host
    /// configuration never appear inside unless a runtime names them.
    pub ro_paths: Vec<String>,
    /// The uids (and gids) sandboxes run as when the host is root: one
    /// per live sandbox, machine-wide (docs/SECURITY.md, "One uid per
    /// sandbox").
    pub uids: UidPolicy,
    /// SysV IPC limits written into the sandbox's own ipc namespace.
    pub ipc: IpcLimits,
    /// Per-user-namespace ceilings written into the sandbox's own user
    /// namespace (`/proc/sys/user/*`).
    pub ceilings: NsCeilings,
    /// Socket sysctls written into the sandbox's own network namespace,
    /// where the kernel namespaces them (docs/SECURITY.md, "Memory").
    pub net: NetLimits,
    /// Host paths a runtime adds to `ro_paths`, bound read-only at the
    /// same path inside (an install directory, a venv, an interpreter and
    /// its libraries, CA certificates). A program inside one is executed
    /// from its own path ([`crate::fsview::program_in_place`]). Each must
    /// exist and be readable by the sandbox uid: the host refuses a
    /// configuration that names one that is not
    /// ([`crate::fsview::check_runtime`]), and a spawn fails if one
    /// vanished since. A root host clones them before the uid drop, so a
    /// directory under a private parent (`/root/.pyenv/versions/3.12.1`)
    /// can be named as long as it is readable by others itself.
    pub extra_ro_paths: Vec<String>,
    /// Environment keys the plugin may receive from the host (exact names,
    /// or prefixes ending in `*`); `SHAREDOS_*` (the host's own variables,
    /// such as `SHAREDOS_PLUGIN`) is always admitted. Anything else the
    /// host passes is dropped and named in the report's warnings (the host
    /// refuses a configured `env` key outside it at load). Credentials
    /// never belong here: `*_TOKEN`, `*_KEY`, `AWS_*`, `SSH_AUTH_SOCK`,
    /// `DOCKER_HOST`, ...
    pub env_allowlist: Vec<String>,
    /// Record in the report's `view` what the plugin sees: every mount of
    /// its root, the program's path, the working directory (`sharedos
    /// sandbox check --runtime` sets it; off, the report stays small).
    pub describe: bool,
    /// Test-only: run the helper under a seccomp filter that refuses
    /// `unshare(CLONE_NEWUSER)`, as Docker's default profile does, so the
    /// no-user-namespace path can be exercised on a capable machine.
    pub emulate_no_userns: bool,
    /// Record per-stage timestamps of the spawn (host and helper side) in
    /// the report's `timings_us`, for operators and the benchmark.
    pub timings: bool,
    /// Fork each helper from a fork server (one per helper binary, started
    /// with the first spawn) instead of executing the helper binary per
    /// spawn. Every layer is still built anew for each spawn. Off by
    /// default: the fork server is a long-lived child of the host, which a
    /// host must account for (no process outlives its turn otherwise); it
    /// saves about 1 ms a spawn (docs/BENCHMARKS.md).
    pub fork_server: bool,
    /// Sandboxes the host keeps prepared ahead of turns (0 to
    /// [`MAX_WARM`]): each has every layer built, its report checked and a
    /// fresh workspace, and waits right before the plugin's `execve`, so a
    /// turn that takes one pays only that `execve`. A taken one is replaced
    /// in the background. Each is a live process tree of the host between
    /// turns (no plugin code runs in it); 0, the default, builds every
    /// sandbox when its turn asks for it.
    pub warm: u32,
    /// What the seccomp filter does with `memfd_create` (docs/SECURITY.md,
    /// "The seccomp filter").
    pub memfd_create: MemfdPolicy,
    /// The egress gateway's listener (docs/EGRESS.md): the helper binds
    /// `127.0.0.1:<port>` in the sandbox's network namespace, hands the
    /// listening socket to the host and keeps no copy; the plugin may
    /// create TCP sockets and connect to that one port only. `None`, the
    /// default: no socket at all. Set by the host from the runtime's
    /// `network` policy, never by hand.
    pub egress_port: Option<u16>,
    /// The harness mode (docs/HARNESS.md, "The sandbox"): the MCP harness
    /// serves its CLI streamable HTTP on `127.0.0.1:<port>` of the
    /// sandbox's own network namespace. The helper brings `lo` up; the
    /// plugin may create TCP sockets, bind and connect that one port (and
    /// connect the egress port, if any), nothing else. `None`, the
    /// default: no such port. Set by the host for a harness runtime with
    /// `mcp = "http"`, never by hand.
    pub mcp_port: Option<u16>,
    /// The content pin (docs/SECURITY.md, "Content pin"): the SHA-256 the
    /// program's bytes must have. The program is then staged as a copy
    /// keyed by this digest, and the plugin's process hashes the staged
    /// file through the descriptor it executes (`execveat`), refusing any
    /// other bytes. `None`, the default: no pin. Set by the host from the
    /// runtime entry's `sha256`, never by hand.
    #[schemars(with = "Option<String>")]
    pub program_sha256: Option<crate::pin::ProgramDigest>,
}

/// `memfd_create` under the seccomp filter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum MemfdPolicy {
    /// Refused with ENOSYS (runtimes fall back to a file in the capped
    /// `/dev/shm` or `/tmp`): a memfd that is never mapped is bounded only
    /// by `RLIMIT_FSIZE` per file times the open files, not by `RLIMIT_AS`.
    #[default]
    Deny,
    /// Allowed, except with `MFD_EXEC`: for runtimes that need a memfd
    /// and whose memory the operator bounds otherwise (a memory cgroup).
    AllowNoExec,
}

/// The default of [`SandboxPolicy::ro_paths`]: the program and library
/// directories of `/usr` (not `/usr/local`, `/usr/include`, `/usr/src`),
/// the top-level links or directories into them, and the `/etc` entries a
/// dynamically linked program, a TLS client or a shell commonly needs;
/// nothing with secrets (no shadow, no ssh, no machine-id). `/etc/passwd`
/// and `/etc/group` are not bound: the sandbox writes its own
/// ([`crate::users`]).
pub const DEFAULT_RO_PATHS: [&str; 28] = [
    "/usr/bin",
    "/usr/sbin",
    "/usr/lib",
    "/usr/lib32",
    "/usr/lib64",
    "/usr/libx32",
    "/usr/libexec",
    "/usr/share",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/lib32",
    "/libx32",
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/nsswitch.conf",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/mime.types",
    "/etc/protocols",
    "/etc/services",
    "/etc/host.conf",
];

/// The most sandboxes a runtime may keep prepared ([`SandboxPolicy::warm`]).
pub const MAX_WARM: u32 = 8;

impl Default for SandboxPolicy {
    fn default() -> Self {
        SandboxPolicy {
            min_level: SandboxLevel::Isolated,
            require_memory_bound: false,
            layers: LayerToggles::default(),
            rlimits: Rlimits::default(),
            cgroup: CgroupPolicy::default(),
            tmp_size_bytes: 128 << 20,
            shm_size_bytes: 64 << 20,
            tmpfs_nr_inodes: 16_384,
            workspace_size_bytes: 256 << 20,
            home_size_bytes: 128 << 20,
            ro_paths: DEFAULT_RO_PATHS.map(String::from).to_vec(),
            uids: UidPolicy::default(),
            ipc: IpcLimits::default(),
            ceilings: NsCeilings::default(),
            net: NetLimits::default(),
            extra_ro_paths: Vec::new(),
            env_allowlist: [
                "PATH",
                "HOME",
                "TMPDIR",
                "LANG",
                "LC_*",
                "TZ",
                "TERM",
                "RUST_LOG",
                "RUST_BACKTRACE",
                "SHAREDOS_*",
            ]
            .map(String::from)
            .to_vec(),
            describe: false,
            emulate_no_userns: false,
            timings: false,
            fork_server: false,
            warm: 0,
            memfd_create: MemfdPolicy::Deny,
            egress_port: None,
            mcp_port: None,
            program_sha256: None,
        }
    }
}

/// Resource limits (soft = hard). `None` leaves the inherited limit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Rlimits {
    /// `RLIMIT_CORE`: 0 so a crash never dumps plugin memory to disk.
    pub core: Option<u64>,
    /// `RLIMIT_NOFILE`.
    pub nofile: Option<u64>,
    /// `RLIMIT_FSIZE`, bytes: the largest file the plugin can write.
    pub fsize: Option<u64>,
    /// `RLIMIT_DATA`, bytes (private memory only: shared mappings, SysV
    /// shm and memfd escape it, which is why `address_space` is on too).
    pub data: Option<u64>,
    /// `RLIMIT_AS`, bytes: every mapping of a process counts, reserved
    /// or not. Unset by default: it is not the memory bound (socket and
    /// pipe buffers and kernel objects escape it) and it breaks runtimes
    /// that reserve large regions (Node's WebAssembly memories, and so
    /// `fetch`, which loads a WebAssembly HTTP parser).
    pub address_space: Option<u64>,
    /// `RLIMIT_NPROC` (only effective for a non-root uid).
    pub nproc: Option<u64>,
    /// `RLIMIT_CPU`, seconds: a backstop well past any turn deadline.
    pub cpu_seconds: Option<u64>,
    /// `RLIMIT_MEMLOCK`, bytes.
    pub memlock: Option<u64>,
    /// `RLIMIT_MSGQUEUE`, bytes.
    pub msgqueue: Option<u64>,
    /// `RLIMIT_RTPRIO`.
    pub rtprio: Option<u64>,
    /// `RLIMIT_SIGPENDING`: queued signals of the sandbox uid.
    pub sigpending: Option<u64>,
}

impl Default for Rlimits {
    fn default() -> Self {
        Rlimits {
            core: Some(0),
            nofile: Some(1024),
            fsize: Some(1 << 30),
            data: Some(4 << 30),
            address_space: None,
            nproc: Some(256),
            cpu_seconds: Some(3600),
            memlock: Some(64 << 10),
            msgqueue: Some(0),
            rtprio: Some(0),
            sigpending: Some(512),
        }
    }
}

/// Cgroup limits. A throwaway cgroup is created per plugin only when
/// `enabled` and the host can write the hierarchy; otherwise the report
/// says `cgroup: unavailable` and the pid namespace + rlimits still hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct CgroupPolicy {
    /// Try to create a per-plugin cgroup.
    pub enabled: bool,
    /// `pids.max` of the plugin's cgroup.
    pub pids_max: Option<u64>,
    /// `memory.max` of the tree, bytes (4 GiB by default), with
    /// `memory.oom.group` 1: set only where the memory controller is
    /// delegated to the cgroup v2 parent of the sandbox's cgroup (never by
    /// moving a process between v1 memory cgroups); elsewhere the cgroup
    /// is reported degraded and the tree's memory unbounded.
    pub memory_max: Option<u64>,
    /// `memory.swap.max`, written with `memory_max` (0: the tree's pages
    /// are never swapped out from under the bound).
    pub memory_swap_max: Option<u64>,
    /// The cgroup v2 directory the sandboxes' cgroups are made in. `None`,
    /// the default: the host's own cgroup. A populated cgroup other than
    /// the root cannot enable a controller for its children (cgroup v2's
    /// no-internal-processes rule), so a host in a delegated scope keeps
    /// itself in one leaf and names a sibling with `memory` and `pids` in
    /// its `cgroup.subtree_control` here (docs/SECURITY.md, "Getting a
    /// memory controller"). One that is not a cgroup v2 directory is
    /// reported and no cgroup is made in it.
    pub parent: Option<String>,
}

impl Default for CgroupPolicy {
    fn default() -> Self {
        CgroupPolicy {
            enabled: true,
            pids_max: Some(512),
            memory_max: Some(4 << 30),
            memory_swap_max: Some(0),
            parent: None,
        }
    }
}

/// Where sandbox uids come from. Uid and gid are the same number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct UidPolicy {
    /// First uid of the range.
    pub first: u32,
    /// Number of uids (the most sandboxes alive at once on the machine).
    pub count: u32,
    /// Refuse to spawn when no uid of its own can be given (a host not
    /// running as root shares its own uid with every sandbox; without
    /// this the report says so and the spawn goes ahead).
    pub required: bool,
}

impl Default for UidPolicy {
    fn default() -> Self {
        UidPolicy {
            first: 0x6000_0000,
            count: 4096,
            required: false,
        }
    }
}

/// SysV IPC limits of the sandbox's ipc namespace (`kernel.shm*`,
/// `kernel.msg*`). `None` leaves the kernel's default for a new namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct IpcLimits {
    /// `kernel.shmmax`: largest segment, bytes.
    pub shmmax: Option<u64>,
    /// `kernel.shmall`: all segments together, bytes (written in pages).
    pub shmall_bytes: Option<u64>,
    /// `kernel.shmmni`: number of segments.
    pub shmmni: Option<u64>,
    /// `kernel.msgmax`: largest message, bytes.
    pub msgmax: Option<u64>,
    /// `kernel.msgmnb`: bytes one queue holds.
    pub msgmnb: Option<u64>,
    /// `kernel.msgmni`: number of queues.
    pub msgmni: Option<u64>,
}

impl Default for IpcLimits {
    fn default() -> Self {
        IpcLimits {
            shmmax: Some(16 << 20),
            shmall_bytes: Some(32 << 20),
            shmmni: Some(32),
            msgmax: Some(8192),
            msgmnb: Some(16384),
            msgmni: Some(16),
        }
    }
}

/// Socket sysctls of the sandbox's own network namespace (Linux 6.x
/// namespaces these four; `net.core.[rw]mem_max`, `tcp_mem` and `udp_mem`
/// stay host-wide). `None` leaves the kernel's default for a new namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct NetLimits {
    /// `net.ipv4.tcp_rmem`: a TCP socket's receive buffer, min, default
    /// and max, bytes.
    pub tcp_rmem: Option<[u64; 3]>,
    /// `net.ipv4.tcp_wmem`: a TCP socket's send buffer, min, default and
    /// max, bytes.
    pub tcp_wmem: Option<[u64; 3]>,
    /// `net.core.optmem_max`: ancillary buffer of a socket, bytes.
    pub optmem_max: Option<u64>,
    /// `net.unix.max_dgram_qlen`: datagrams one unix socket queues.
    pub unix_max_dgram_qlen: Option<u64>,
}

impl Default for NetLimits {
    fn default() -> Self {
        NetLimits {
            tcp_rmem: Some([4096, 65_536, 1 << 20]),
            tcp_wmem: Some([4096, 16_384, 1 << 20]),
            optmem_max: Some(20_480),
            unix_max_dgram_qlen: Some(10),
        }
    }
}

/// Ceilings of the sandbox's user namespace (`/proc/sys/user/<name>`).
/// They bind the sandbox below the per-uid limits of the host. `None`
/// leaves the value the kernel gives a new namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct NsCeilings {
    pub max_inotify_instances: Option<u64>,
    pub max_inotify_watches: Option<u64>,
    pub max_fanotify_groups: Option<u64>,
    pub max_fanotify_marks: Option<u64>,
    /// Applied to every `max_*_namespaces` (user, mnt, pid, net, ipc,
    /// uts, cgroup, time): the plugin never needs a namespace of its own.
    pub max_namespaces: Option<u64>,
}

impl Default for NsCeilings {
    fn default() -> Self {
        NsCeilings {
            max_inotify_instances: Some(64),
            max_inotify_watches: Some(8192),
            max_fanotify_groups: Some(0),
            max_fanotify_marks: Some(0),
            max_namespaces: Some(0),
        }
    }
}

impl SandboxPolicy {
    /// Whether `key` may be handed to the plugin: `SHAREDOS_*` always (a
    /// custom allowlist without it would drop `SHAREDOS_PLUGIN`, and the
    /// plugin would refuse to run as if started by hand).
    pub fn env_allowed(&self, key: &str) -> bool {
        key.starts_with("SHAREDOS_")
            || self
                .env_allowlist
                .iter()
                .any(|pat| match pat.strip_suffix('*') {
                    Some(prefix) => key.starts_with(prefix),
                    None => key == pat,
                })
    }

    /// A policy with every layer off and no minimum: only for measuring
    /// the cost of the layers (`bench`) and for tests.
    pub fn unconfined() -> Self {
        SandboxPolicy {
            min_level: SandboxLevel::Minimal,
            layers: LayerToggles::none(),
            cgroup: CgroupPolicy {
                enabled: false,
                ..CgroupPolicy::default()
            },
            ..SandboxPolicy::default()
        }
    }
}
