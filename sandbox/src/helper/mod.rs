//! The helper: `sharedos __sandbox-exec`. Single-threaded, no async
//! runtime. It builds the layers in the order of spec B.2 and `execve`s
//! the plugin:
//!
//! ```text
//! supervisor (the helper itself, outside the pid ns): lifeline, setsid, fds,
//!   │  cgroup, ipc ns + limits, own uid, userns, non-dumpable, other
//!   │  namespaces, ceilings, rlimits ([`credentials`]); then waits and watches the
//!   │  lifeline (host gone → SIGKILL pid 1)
//!   └─ pid 1 (non-dumpable reaper): minimal root, hostname
//!       └─ plugin: caps → no_new_privs → Landlock → seccomp
//!          → self-check → report → execve
//! ```

use std::ffi::OsString;

mod credentials;
pub(crate) mod egress;
pub mod fds;
mod plugin;
mod process;
mod reaper;
pub(crate) mod server;
mod sources;
mod supervisor;

use crate::timing;

/// Entry point of `sharedos __sandbox-exec`. Without arguments, one helper:
/// everything arrives on the control socket at fd 0. With `--fork-server`,
/// the fork server ([`server`]), which forks one helper per spawn. With
/// `--loopback-relay`, the loopback relay of an engine without a network
/// of its own ([`crate::relay`]; it runs inside that engine's container).
pub fn helper_main(args: Vec<OsString>) -> ! {
    let entered = timing::now_ns();
    let server = match args.as_slice() {
        [] => false,
        [a, rest @ ..] if a == crate::relay::RELAY_ARG => crate::relay::relay_main(rest),
        [a] if a == server::FORK_SERVER_ARG => true,
        _ => {
            eprintln!("sharedos __sandbox-exec takes no arguments; the policy comes on fd 0");
            std::process::exit(2);
        }
    };
    // unshare(CLONE_NEWUSER) and a safe fork need a single-threaded
    // process: the host must dispatch here before it starts any runtime.
    // procfs counts the threads in the link count of /proc/self/task (2 +
    // threads): one statx instead of generating /proc/self/status.
    let threads = std::fs::metadata("/proc/self/task")
        .ok()
        .map(|m| std::os::unix::fs::MetadataExt::nlink(&m).saturating_sub(2));
    if threads.is_some_and(|t| t != 1) {
        eprintln!(
            "sharedos __sandbox-exec: the helper must run single-threaded, found {} threads; \
             call sharedos_sandbox::helper_main before starting tokio or any thread",
            threads.unwrap_or(0)
        );
        std::process::exit(125);
    }
    if server {
        server::serve();
    }
    supervisor::run(entered, None);
}
