//! Teardown off the turn's path. A turn whose outcome is settled signals
//! its tree at once (SIGKILL, non-blocking) and hands it here; one
//! long-lived thread reaps each tree and removes its workspace and cgroup
//! while the caller already has its result. [`settle`] waits until every
//! tree handed over is gone, so a host that calls `settle_kills` before it
//! exits leaves nothing behind.

use std::sync::mpsc::{Sender, channel};
use std::sync::{Condvar, Mutex, OnceLock};

use super::ProcessTree;

struct Reaper {
    queue: Mutex<Sender<Box<dyn ProcessTree>>>,
    /// Trees handed over and not yet reaped.
    pending: Mutex<usize>,
    idle: Condvar,
}

static REAPER: OnceLock<Option<Reaper>> = OnceLock::new();

fn reaper() -> Option<&'static Reaper> {
    REAPER
        .get_or_init(|| {
            let (tx, rx) = channel::<Box<dyn ProcessTree>>();
            let started = std::thread::Builder::new()
                .name("sharedos-reaper".into())
                .spawn(move || {
                    for mut tree in rx {
                        if let Err(e) = tree.kill_tree() {
                            tracing::warn!("reaping the plugin tree failed: {e}");
                        }
                        drop(tree);
                        if let Some(r) = REAPER.get().and_then(Option::as_ref) {
                            let mut n = r.pending.lock().unwrap_or_else(|p| p.into_inner());
                            *n = n.saturating_sub(1);
                            r.idle.notify_all();
                        }
                    }
                });
            match started {
                Ok(_) => Some(Reaper {
                    queue: Mutex::new(tx),
                    pending: Mutex::new(0),
                    idle: Condvar::new(),
                }),
                Err(e) => {
                    tracing::warn!("no reaper thread ({e}); trees are reaped in the turn's path");
                    None
                }
            }
        })
        .as_ref()
}

/// Kills `tree` now (non-blocking) and reaps it on the reaper thread.
/// Without a reaper thread, reaps it here: late rather than never.
pub(crate) fn reap_later(mut tree: Box<dyn ProcessTree>) {
    tree.start_kill();
    let Some(r) = reaper() else {
        let _ = tree.kill_tree();
        return;
    };
    *r.pending.lock().unwrap_or_else(|p| p.into_inner()) += 1;
    let sent = r.queue.lock().unwrap_or_else(|p| p.into_inner()).send(tree);
    if let Err(back) = sent {
        let mut tree = back.0;
        let _ = tree.kill_tree();
        let mut n = r.pending.lock().unwrap_or_else(|p| p.into_inner());
        *n = n.saturating_sub(1);
        r.idle.notify_all();
    }
}

/// Blocks until every tree handed to [`reap_later`] is reaped and its
/// workspace and cgroup removed.
pub(crate) fn settle() {
    let Some(r) = REAPER.get().and_then(Option::as_ref) else {
        return;
    };
    let mut n = r.pending.lock().unwrap_or_else(|p| p.into_inner());
    while *n > 0 {
        n = r.idle.wait(n).unwrap_or_else(|p| p.into_inner());
    }
}

/// Makes this process the reaper of every orphan among its descendants
/// (`PR_SET_CHILD_SUBREAPER`): a sandbox's pid 1 that outlives its helper
/// by an instant, or a direct plugin's daemon, is re-parented here instead
/// of to init, so [`reap_orphans`] can collect it before the host exits.
/// For a command that runs a bounded number of turns and then exits
/// (`sharedos run`, `demo`): a long-running host would hold the zombies
/// until it exits.
#[allow(unsafe_code)]
pub fn adopt_orphans() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only; no memory is passed.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Reaps every child that has exited, waiting up to `bound` for children
/// still dying. Call it only when no `std::process::Child` is still waited
/// for (after `settle_kills`): it waits for any child. Returns how many it
/// reaped.
#[allow(unsafe_code)]
pub fn reap_orphans(bound: std::time::Duration) -> usize {
    let end = std::time::Instant::now() + bound;
    let mut reaped = 0;
    loop {
        let mut status = 0;
        // SAFETY: waitpid on any child with a valid pointer to a local.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid > 0 {
            reaped += 1;
            continue;
        }
        // No child left (ECHILD), or an error: nothing more to reap.
        if pid < 0 || std::time::Instant::now() >= end {
            return reaped;
        }
        // Children remain and none has exited yet.
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
