//! What a host that died (SIGKILL, a crash) left of its VMs: QEMU dies
//! with it (a parent-death signal), but the run directories stay. The
//! first microVM seat of a host process removes every
//! `sharedos-microvm-<pid>-*` directory whose host pid is no longer alive
//! (`process/dead_hosts.rs`).

use super::PREFIX;

/// Sweeps the temp directory once per host process.
pub(super) fn sweep_once() {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        crate::process::dead_hosts::sweep(&std::env::temp_dir(), PREFIX, "microVM run")
    });
}
