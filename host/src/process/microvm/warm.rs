//! VMs booted ahead of turns (`sandbox.warm = N`, docs/SECURITY.md,
//! "microVM"), in the pool every launcher's prepared plugins use
//! (host/src/process/warm.rs). The image holds the program, so a warm VM
//! is a whole launch done ahead: QEMU booted to the init's ready line with
//! the plugin started and waiting for the host's `initialize` on its
//! stdin. Dropping one kills QEMU and removes its run directory.

use std::time::Duration;

use super::super::launcher::{LaunchSpec, LaunchedChild};
use super::MicrovmLauncher;
use crate::process::warm::{LaunchKey, WarmPool};

/// What a warm VM was booted for: the program, its arguments and
/// environment, its pin.
pub(super) type Key = LaunchKey;

/// The warm VMs of one runtime.
pub(super) type WarmVms = WarmPool<Key, LaunchedChild>;

/// The longest a launch waits for a VM being booted (a TCG boot on a
/// loaded host takes tens of seconds).
const WARM_WAIT: Duration = Duration::from_secs(120);

pub(super) fn pool() -> WarmVms {
    WarmPool::new(WARM_WAIT, "sharedos-warm-vm")
}

pub(super) fn key(l: &MicrovmLauncher, spec: &LaunchSpec) -> Key {
    LaunchKey::of(spec, l.policy.program_sha256)
}

/// What boots a warm VM for `spec` (on the pool's thread, with a clone of
/// the launcher: its image cache and pool are shared).
pub(super) fn booter(
    l: &MicrovmLauncher,
    spec: &LaunchSpec,
) -> impl Fn() -> Result<LaunchedChild, String> + Clone + Send + 'static {
    let (l, spec) = (l.clone(), spec.clone());
    move || l.launch_blocking(&spec).map_err(|e| e.to_string())
}
