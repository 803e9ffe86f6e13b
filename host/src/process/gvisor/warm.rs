//! Containers prepared ahead of turns (`sandbox.warm = N`): each is a
//! `runsc run` whose first process is the relay with `--gate`, so the
//! gVisor sandbox, its gofer, the mounts and the relay are up and the
//! plugin is not started yet. A launch takes a live one for the same
//! program, arguments and environment, writes the one byte the relay waits
//! for on the container's stdin (the plugin then starts with the protocol
//! on the same pipes) and orders a replacement, built by a thread of its
//! own off the turn's path. The tree is the same as a cold launch's
//! (`runsc run` with its parent-death signal), so a prepared container dies
//! with its host like any other; dropping the last launcher tears every
//! prepared one down on a thread `process::settle_kills` waits for.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use sharedos_sandbox::ProgramDigest;

use super::GvisorLauncher;
use crate::process::launcher::{LaunchSpec, LaunchedChild};

/// What a prepared container serves: a launch of the same program,
/// arguments, environment and pin.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct WarmKey {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    pin: Option<ProgramDigest>,
}

impl WarmKey {
    pub(super) fn of(spec: &LaunchSpec) -> WarmKey {
        WarmKey {
            program: spec.program.clone(),
            args: spec.args.clone(),
            env: spec.env.clone(),
            pin: spec.program_sha256,
        }
    }
}

#[derive(Default)]
struct State {
    key: Option<WarmKey>,
    ready: Vec<LaunchedChild>,
    preparing: usize,
    /// A preparation failed: turns launch their own until one is taken.
    failing: bool,
}

/// The prepared containers of one launcher and its clones.
#[derive(Default)]
pub(super) struct WarmPool {
    state: Mutex<State>,
    changed: Condvar,
}

/// The longest a launch waits for a container being prepared.
const WARM_WAIT: Duration = Duration::from_secs(30);

impl std::fmt::Debug for WarmPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("WarmPool")
            .field("ready", &st.ready.len())
            .field("preparing", &st.preparing)
            .finish()
    }
}

/// The byte the gate waits for.
const GO: &[u8] = b"g";

impl WarmPool {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A live prepared container for `key` (waiting for one being
    /// prepared rather than launching a second), started: its gate opened,
    /// its report marked `prepared`. Prepared containers of another key go.
    pub(super) fn take(&self, key: &WarmKey) -> Option<LaunchedChild> {
        let mut stale = Vec::new();
        let end = Instant::now() + WARM_WAIT;
        let found = {
            let mut st = self.lock();
            if st.key.as_ref() != Some(key) {
                st.key = Some(key.clone());
                st.failing = false;
                stale = std::mem::take(&mut st.ready);
            }
            loop {
                let mut found = None;
                while let Some(mut child) = st.ready.pop() {
                    if matches!(child.tree.try_wait(), Ok(None)) {
                        found = Some(child);
                        break;
                    }
                    stale.push(child);
                }
                let left = end.saturating_duration_since(Instant::now());
                if found.is_some() || st.preparing == 0 || st.failing || left.is_zero() {
                    break found;
                }
                st = self
                    .changed
                    .wait_timeout(st, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        };
        drop(stale);
        let mut child = found?;
        match rustix::io::write(&child.stdin, GO) {
            Ok(1) => {}
            _ => return None,
        }
        if let Some(report) = child.report.as_mut() {
            report["prepared"] = true.into();
        }
        Some(child)
    }

    /// Orders preparations until `target` are ready or being built for
    /// `spec`, each on a thread of its own (tracked for `settle_kills`).
    pub(super) fn refill(
        pool: &Arc<Self>,
        launcher: &GvisorLauncher,
        spec: &LaunchSpec,
        target: usize,
    ) {
        let key = WarmKey::of(spec);
        let need = {
            let mut st = pool.lock();
            if st.key.is_none() {
                st.key = Some(key.clone());
            }
            if st.key.as_ref() != Some(&key) || st.failing {
                return;
            }
            let need = target.saturating_sub(st.ready.len() + st.preparing);
            st.preparing += need;
            need
        };
        for _ in 0..need {
            let (on_thread, launcher, spec, key) = (
                Arc::clone(pool),
                launcher.clone(),
                spec.clone(),
                key.clone(),
            );
            let started = std::thread::Builder::new()
                .name("sharedos-gvisor-warm".into())
                .spawn(move || {
                    let made = launcher.launch_blocking(&spec, true);
                    drop(launcher);
                    on_thread.prepared(&key, made);
                });
            match started {
                Ok(handle) => crate::process::track_thread(handle),
                Err(e) => {
                    tracing::warn!(error = %e, "could not start preparing a gVisor container");
                    pool.lock().preparing -= 1;
                    pool.changed.notify_all();
                }
            }
        }
    }

    fn prepared(
        &self,
        key: &WarmKey,
        made: Result<LaunchedChild, crate::process::launcher::LaunchError>,
    ) {
        let stale = {
            let mut st = self.lock();
            st.preparing -= 1;
            match made {
                Ok(child) if st.key.as_ref() == Some(key) => {
                    st.ready.push(child);
                    None
                }
                Ok(child) => Some(child),
                Err(e) => {
                    tracing::warn!(error = %e, "preparing a gVisor container ahead of its turn failed; turns launch their own");
                    st.failing = true;
                    None
                }
            }
        };
        self.changed.notify_all();
        drop(stale);
    }
}

impl Drop for WarmPool {
    /// Tearing a container down blocks for a moment and the last launcher
    /// may be dropped on an async worker: the containers go on a thread of
    /// their own, which `settle_kills` waits for.
    fn drop(&mut self) {
        let spares = std::mem::take(&mut self.lock().ready);
        crate::process::drop_off_path(spares, "sharedos-gvisor-warm-drop");
    }
}
