//! Containers prepared ahead of turns (`sandbox.warm = N`), in the pool
//! every launcher's prepared plugins use (host/src/process/warm.rs): each
//! is a `runsc run` whose first process is the relay with `--gate`, so the
//! gVisor sandbox, its gofer, the mounts and the relay are up and the
//! plugin is not started yet. A launch takes a live one for the same
//! program, arguments, environment and pin, writes the one byte the relay
//! waits for on the container's stdin (the plugin then starts with the
//! protocol on the same pipes) and orders a replacement, built by a thread
//! of the pool off the turn's path. The tree is the same as a cold
//! launch's (`runsc run` with its parent-death signal), so a prepared
//! container dies with its host like any other; dropping the last
//! launcher tears every prepared one down on a thread
//! `process::settle_kills` waits for.

use std::time::Duration;

use super::GvisorLauncher;
use crate::process::launcher::{LaunchSpec, LaunchedChild};
use crate::process::warm::{LaunchKey, WarmPool};

/// The prepared containers of one launcher and its clones.
pub(super) type WarmContainers = WarmPool<LaunchKey, LaunchedChild>;

/// The longest a launch waits for a container being prepared.
const WARM_WAIT: Duration = Duration::from_secs(30);

/// The byte the gate waits for.
const GO: &[u8] = b"g";

pub(super) fn pool() -> WarmContainers {
    WarmPool::new(WARM_WAIT, "sharedos-gvisor-warm")
}

pub(super) fn key(l: &GvisorLauncher, spec: &LaunchSpec) -> LaunchKey {
    LaunchKey::of(spec, l.policy.program_sha256)
}

/// What prepares a container for `spec` (on the pool's thread, with a
/// clone of the launcher: its pool is shared).
pub(super) fn preparer(
    l: &GvisorLauncher,
    spec: &LaunchSpec,
) -> impl Fn() -> Result<LaunchedChild, String> + Clone + Send + 'static {
    let (l, spec) = (l.clone(), spec.clone());
    move || l.launch_blocking(&spec, true).map_err(|e| e.to_string())
}

/// A prepared container started: its gate opened (the plugin starts), its
/// report marked `prepared`. `None` when the gate could not be opened (the
/// container is torn down as it drops).
pub(super) fn start(mut child: LaunchedChild) -> Option<LaunchedChild> {
    match rustix::io::write(&child.stdin, GO) {
        Ok(1) => {}
        _ => return None,
    }
    if let Some(report) = child.report.as_mut() {
        report["prepared"] = true.into();
    }
    Some(child)
}
