//! [`TreeGuard`]: the one owner of a plugin's process tree, which kills it
//! however the turn ends (an outcome, an error, a dropped future), and the
//! deferred kill that lets a queued `turn/abort` reach the plugin first.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{LimitsWatch, ProcessTree, reaper};

/// Owns the tree for the whole turn. Dropped anywhere (including when the
/// `run` future is dropped), it SIGKILLs the tree at once and reaps it on
/// a background thread; [`TreeGuard::finish`] does the same and waits.
pub(super) struct TreeGuard {
    pub(super) tree: Arc<Mutex<Option<Box<dyn ProcessTree>>>>,
    /// How the launched process ended, once seen.
    status: Arc<Mutex<Option<std::process::ExitStatus>>>,
    /// A duplicate of the write end of the plugin's stdin, only to ask how
    /// much the plugin has not read yet (never written to): the deferred
    /// kill waits until a queued `turn/abort` has been read.
    stdin_probe: Option<OwnedFd>,
    /// How long the plugin may take to exit by itself once a `turn/abort`
    /// has reached it (`ProcessRuntimeConfig::abort_grace`).
    abort_grace: Duration,
    /// The limits the kernel enforced on the tree, where the launcher
    /// counts them.
    limits: Option<LimitsWatch>,
}

impl TreeGuard {
    pub(super) fn new(
        tree: Box<dyn ProcessTree>,
        stdin_probe: Option<OwnedFd>,
        abort_grace: Duration,
    ) -> Self {
        Self {
            limits: tree.limits(),
            tree: Arc::new(Mutex::new(Some(tree))),
            status: Arc::new(Mutex::new(None)),
            stdin_probe,
            abort_grace,
        }
    }

    /// How long the plugin may take to exit by itself after an abort.
    pub(super) fn abort_grace(&self) -> Duration {
        self.abort_grace
    }

    /// The limits the kernel enforced on the tree (its cgroups' counters).
    pub(super) fn limits(&self) -> Option<LimitsWatch> {
        self.limits.clone()
    }

    /// The slot the guard (and its deferred kill) records the status in.
    pub(super) fn status_slot(&self) -> Arc<Mutex<Option<std::process::ExitStatus>>> {
        self.status.clone()
    }

    /// How the launched process ended, if it has (a non-blocking look).
    pub(super) fn status_now(&self) -> Option<std::process::ExitStatus> {
        let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
        if status.is_none()
            && let Some(tree) = self.tree.lock().unwrap_or_else(|p| p.into_inner()).as_mut()
            && let Ok(Some(s)) = tree.try_wait()
        {
            *status = Some(s);
        }
        *status
    }

    /// How the launched process ended, waiting up to `bound` for it to.
    pub(super) async fn status_within(&self, bound: Duration) -> Option<std::process::ExitStatus> {
        let until = tokio::time::Instant::now() + bound;
        loop {
            let status = self.status_now();
            if status.is_some() || tokio::time::Instant::now() >= until {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Resolves when the launched process has exited, with how it ended.
    pub(super) fn exited(&self) -> impl std::future::Future<Output = String> + use<> {
        let tree = self.tree.clone();
        let seen = self.status.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(25));
            loop {
                tick.tick().await;
                let mut slot = tree.lock().unwrap_or_else(|p| p.into_inner());
                match slot.as_mut().map(|t| t.try_wait()) {
                    Some(Ok(Some(status))) => {
                        *seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(status);
                        return format!("the plugin process exited ({status})");
                    }
                    Some(Ok(None)) => {}
                    Some(Err(e)) => return format!("the plugin process cannot be waited for: {e}"),
                    None => return "the plugin process was killed".to_owned(),
                }
            }
        }
    }

    /// The outcome is settled: the tree is signalled now and reaped off
    /// the caller's path (after `ABORT_FLUSH` when a `turn/abort` may still
    /// be on its way to the plugin).
    pub(super) fn finish(mut self, aborted: bool) {
        let taken = self.tree.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(tree) = taken {
            if aborted {
                let probe = self.stdin_probe.take();
                kill_after_flush(tree, probe, self.status.clone(), self.abort_grace);
            } else {
                reaper::reap_later(tree);
            }
        }
    }
}

impl Drop for TreeGuard {
    /// Dropped with the `run` future: the turn was abandoned at its abort.
    /// The kill follows after `ABORT_FLUSH`, off the async threads, so the
    /// `turn/abort` queued at the abort reaches the plugin first
    /// (protocol.md B.3.4); the result never waits for it.
    fn drop(&mut self) {
        let taken = self.tree.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(tree) = taken {
            let probe = self.stdin_probe.take();
            kill_after_flush(tree, probe, self.status.clone(), self.abort_grace);
        }
    }
}

/// How long a turn whose plugin closed its stdout waits for the plugin's
/// exit status (the kernel closes a dying process's files a moment before
/// it can be reaped), so the result says how it ended.
pub(super) const EXIT_STATUS_WAIT: Duration = Duration::from_millis(500);

/// How long the writer gets to put a queued `turn/abort` on the wire
/// before the tree is killed, at least.
const ABORT_FLUSH: Duration = Duration::from_millis(25);

/// How long a deferred kill waits, at most, for a plugin that is running
/// (or waiting for a CPU) to read what is in its stdin pipe, the
/// `turn/abort` among it.
const ABORT_FLUSH_MAX: Duration = Duration::from_millis(250);

/// How long the plugin gets to act on the `turn/abort` once it has read
/// it, before the kill.
const ABORT_READ_GRACE: Duration = Duration::from_millis(10);

/// Waits until a queued `turn/abort` has reached the plugin, or cannot:
/// `ABORT_FLUSH` for the writer to put it in the pipe; then, while the
/// pipe still holds what the plugin has not read, only as long as a
/// thread of the plugin's process is running or runnable (a loaded
/// machine has not scheduled it yet), `ABORT_FLUSH_MAX` in all at most. A
/// plugin whose threads all sleep with its stdin unread is not reading it:
/// it is killed at once. Once the pipe is read empty, `ABORT_READ_GRACE`
/// to act on it. Without a probe it waits `ABORT_FLUSH` only.
fn wait_for_abort_delivery(stdin_probe: Option<&OwnedFd>, pid: u32) {
    let started = Instant::now();
    std::thread::sleep(ABORT_FLUSH);
    let Some(probe) = stdin_probe else {
        return;
    };
    loop {
        let unread = rustix::io::ioctl_fionread(probe).unwrap_or(0);
        let elapsed = started.elapsed();
        if unread == 0 {
            std::thread::sleep(ABORT_READ_GRACE.min(ABORT_FLUSH_MAX.saturating_sub(elapsed)));
            return;
        }
        if elapsed >= ABORT_FLUSH_MAX || !any_thread_runnable(pid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Whether a thread of process `pid` is running or waiting for a CPU
/// (state `R` in `/proc/<pid>/task/<tid>/stat`). Unknown counts as no.
fn any_thread_runnable(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|task| {
        std::fs::read_to_string(task.path().join("stat"))
            .ok()
            .and_then(|stat| {
                // The state follows the command name, which may hold
                // spaces and parentheses: read it after the last ')'.
                let (_, rest) = stat.rsplit_once(')')?;
                rest.split_whitespace().next().map(|state| state == "R")
            })
            .unwrap_or(false)
    })
}

/// Deferred kills and sandbox preparations still running; [`settle_kills`]
/// waits for them.
pub(super) static PENDING_KILLS: Mutex<Vec<std::thread::JoinHandle<()>>> = Mutex::new(Vec::new());

/// The status of a tree the deferred kill ends: its own, when it exited
/// before the kill (a plugin that acted on the `turn/abort`), else how the
/// kill left it, or SIGKILL (what the host sent) when it cannot be read.
fn kill_and_record(tree: &mut dyn ProcessTree, seen: &Mutex<Option<std::process::ExitStatus>>) {
    use std::os::unix::process::ExitStatusExt;
    let before = tree.try_wait().ok().flatten();
    tree.start_kill();
    let _ = tree.kill_tree();
    let status = before
        .or_else(|| tree.try_wait().ok().flatten())
        .unwrap_or_else(|| std::process::ExitStatus::from_raw(libc::SIGKILL));
    let mut slot = seen.lock().unwrap_or_else(|p| p.into_inner());
    slot.get_or_insert(status);
}

/// Waits up to `grace` for the tree's launched process to exit by itself,
/// recording its status in `seen` when it does.
fn await_own_exit(
    slot: &Mutex<Option<Box<dyn ProcessTree>>>,
    seen: &Mutex<Option<std::process::ExitStatus>>,
    grace: Duration,
) {
    let until = Instant::now() + grace;
    while Instant::now() < until {
        let mut locked = slot.lock().unwrap_or_else(|p| p.into_inner());
        let Some(tree) = locked.as_mut() else {
            return;
        };
        if let Ok(Some(status)) = tree.try_wait() {
            seen.lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(status);
            return;
        }
        drop(locked);
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn kill_after_flush(
    tree: Box<dyn ProcessTree>,
    stdin_probe: Option<OwnedFd>,
    seen: Arc<Mutex<Option<std::process::ExitStatus>>>,
    grace: Duration,
) {
    let pid = tree.pid();
    let slot = Arc::new(Mutex::new(Some(tree)));
    let deferred = slot.clone();
    let spawned = std::thread::Builder::new()
        .name("sharedos-kill".into())
        .spawn(move || {
            wait_for_abort_delivery(stdin_probe.as_ref(), pid);
            // The probe is a write end of the plugin's stdin: closed here,
            // so a plugin given a grace sees its end-of-file.
            drop(stdin_probe);
            if !grace.is_zero() {
                await_own_exit(&deferred, &seen, grace);
            }
            if let Some(mut tree) = deferred.lock().unwrap_or_else(|p| p.into_inner()).take() {
                kill_and_record(tree.as_mut(), &seen);
            }
        });
    let mut pending = PENDING_KILLS.lock().unwrap_or_else(|p| p.into_inner());
    pending.retain(|h| !h.is_finished());
    match spawned {
        Ok(handle) => pending.push(handle),
        Err(e) => {
            // No thread to wait on: kill at once rather than not at all.
            tracing::warn!("no thread for the deferred kill ({e}); killing at once");
            if let Some(mut tree) = slot.lock().unwrap_or_else(|p| p.into_inner()).take() {
                tree.start_kill();
                let _ = tree.kill_tree();
            }
        }
    }
}
