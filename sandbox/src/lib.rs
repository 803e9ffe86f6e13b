//! The sharedos sandbox: how an untrusted runtime plugin is confined.
//!
//! The host calls [`spawn`]; it re-executes the `sharedos` binary as
//! `sharedos __sandbox-exec` ([`helper_main`]), a single-threaded helper that
//! leaves uid 0, enters user/mount/pid/net/ipc/uts namespaces, builds a
//! minimal root, applies rlimits, drops every capability, sets
//! no_new_privs, applies Landlock and then seccomp, and `execve`s the plugin.
//! Before the exec it sends a [`SandboxReport`]; the host refuses a plugin
//! below the policy's `min_level`, and never falls back silently.
//!
//! The code is laid out by where it runs: `host/` in the host process
//! (spawn, fork server, child handle, cgroup, uid, staging, removal),
//! `helper/` in the helper's processes (the choreography of
//! docs/spec/sandbox.md B.2), `layers/` one module per layer ([`namespaces`],
//! [`mounts`], [`landlock`], [`seccomp`], [`caps`], [`rlimits`], ...) each
//! with its descriptor in one registry; the probes are in [`check`].
//!
//! ```no_run
//! use sharedos_sandbox::{spawn, SandboxPolicy, SpawnSpec};
//! let child = spawn(&SpawnSpec {
//!     helper_exe: std::env::current_exe().unwrap(),
//!     program: "/usr/libexec/sharedos/plugin-standard".into(),
//!     args: vec![],
//!     env: vec![("RUST_LOG".into(), "info".into())],
//!     policy: SandboxPolicy::default(),
//!     workspace: None, // a tmpfs in the sandbox's own mount namespace
//! })?;
//! println!("{}", serde_json::to_string(&child.report).unwrap());
//! child.kill_tree();
//! # Ok::<(), sharedos_sandbox::SandboxError>(())
//! ```

#![cfg(target_os = "linux")]

pub mod check;
mod error;
mod helper;
mod host;
mod layers;
mod level;
mod pin;
mod policy;
mod relay;
mod report;
mod request;
pub mod timing;

pub use helper::fds;
pub(crate) use host::listener;
pub use host::{cgroup, removal, staging, statedir, uid};
pub(crate) use layers::memory;
pub use layers::{caps, fsview, landlock, mounts, namespaces, procmask, rlimits, seccomp, users};

pub use check::check;
pub use error::SandboxError;
pub use helper::helper_main;
pub use host::child::{KillHandle, SandboxedChild};
pub use host::spawn::{PreparedSandbox, SpawnSpec, needs_host_workspace, prepare, spawn};
pub use host::spawner::HELPER_SUBCOMMAND;
pub use pin::ProgramDigest;
pub use policy::{
    CgroupPolicy, IpcLimits, MAX_WARM, MemfdPolicy, NetLimits, NsCeilings, Rlimits, SandboxPolicy,
    UidPolicy,
};
pub use relay::{RELAY_ARG, RelayArgs, relay_args};
pub use report::{
    CgroupReport, LandlockReport, LayerStatus, LayerToggles, MemoryLayer, MemoryReport,
    MissingLayer, SandboxLevel, SandboxReport, SeccompReport, SelfCheck,
};
pub use timing::StageTiming;
