//! The host's handle on a running sandbox: its pipes, its report, and
//! the kill and wait of its whole tree.

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::MsgFlags;
use rustix::process::{Pid, PidfdFlags, Signal};

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use crate::cgroup::{self, PluginCgroup};
use crate::report::SandboxReport;
use crate::uid::UidLease;

/// A running sandboxed plugin. Dropping it kills the whole tree and
/// removes its cgroup.
#[derive(Debug)]
pub struct SandboxedChild {
    /// Write end of the plugin's stdin (take it with `Option::take`).
    pub stdin: Option<OwnedFd>,
    /// Read end of the plugin's stdout.
    pub stdout: Option<OwnedFd>,
    /// Read end of the plugin's stderr.
    pub stderr: Option<OwnedFd>,
    /// What the sandbox enforced (at least `policy.min_level`).
    pub report: SandboxReport,
    /// Pid of the helper (the supervisor); the plugin's tree dies with it.
    pub pid: i32,
    /// The egress gateway's listening socket, bound to 127.0.0.1 in the
    /// sandbox's network namespace (`policy.egress_port`); no process of
    /// the sandbox holds a copy. Take it with `Option::take`.
    pub egress_listener: Option<OwnedFd>,
    pub(super) pidfd: Option<OwnedFd>,
    /// A pidfd of the sandbox's pid 1 (the init of its pid namespace),
    /// opened once the report is read, and only when the tree has no
    /// cgroup. Pid 1 exits only after every other process of its namespace
    /// is gone, so waiting for it waits for the whole tree.
    pub(super) ns_init: Option<OwnedFd>,
    pub(super) helper: HelperProc,
    pub(super) lifeline: Option<UnixStream>,
    pub(super) cgroup: PluginCgroup,
    pub(super) status: Option<ExitStatus>,
    /// The sandbox's own uid, released when this drops, after `Drop` has
    /// killed and waited for the tree (fields drop after `drop` runs).
    pub(super) uid: Option<UidLease>,
}

/// How long [`SandboxedChild::wait`] waits for the pid namespace's pid 1
/// once the helper is gone, when there is no cgroup to wait on.
const NS_INIT_WAIT: Duration = Duration::from_secs(10);

/// A pidfd of the sandbox's pid 1: the helper's only child, read from
/// `/proc/<helper>/task/<helper>/children` while the helper lives. `None`
/// when it cannot be read (the wait then falls back to the helper's).
/// The pidfd is kept only if the process it names is still the helper's
/// child once it is open, so a pid recycled in between is never waited on.
pub(super) fn ns_init_pidfd(helper: i32) -> Option<OwnedFd> {
    let listed = std::fs::read_to_string(format!("/proc/{helper}/task/{helper}/children")).ok()?;
    let mut pids = listed.split_whitespace();
    let pid: i32 = pids.next()?.parse().ok()?;
    if pids.next().is_some() {
        return None;
    }
    let fd = rustix::process::pidfd_open(Pid::from_raw(pid)?, PidfdFlags::empty()).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let parent = status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse::<i32>().ok());
    (parent == Some(helper)).then_some(fd)
}

/// How the helper was started.
#[derive(Debug)]
pub(super) enum HelperProc {
    /// Executed by the host: its child, waited for with `waitpid`.
    Exec(Child),
    /// Forked by the fork server: watched through its pidfd, exit status
    /// read from the control socket.
    Forked,
}

impl SandboxedChild {
    /// The uid (and gid) held for this sandbox alone, when the host could
    /// give one (root, `drop_uid` on).
    pub fn own_uid(&self) -> Option<u32> {
        self.uid.as_ref().map(UidLease::uid)
    }

    /// The limits the kernel enforced on the tree, from its cgroups'
    /// event counters: a reader that outlives this handle (zeros once
    /// [`SandboxedChild::wait`] has removed the cgroups).
    pub fn limits_reader(&self) -> impl Fn() -> cgroup::LimitsHit + Send + Sync + 'static {
        self.cgroup.limits_reader()
    }

    /// The helper's pidfd (poll it for exit; POLLIN when it is gone).
    pub fn pidfd(&self) -> Option<BorrowedFd<'_>> {
        self.pidfd.as_ref().map(|f| f.as_fd())
    }

    /// SIGKILL the whole tree: the helper (through its pidfd, so a recycled
    /// pid is never hit), whose pid 1 follows by parent-death signal and
    /// takes the pid namespace with it; plus `cgroup.kill` (or each pid of
    /// the cgroup) for what a degraded sandbox left outside a pid ns.
    /// Returns immediately; [`Self::wait`] reaps.
    pub fn kill_tree(&self) {
        if self.status.is_none() {
            kill_helper(self.pidfd.as_ref(), self.pid);
        }
        self.cgroup.kill();
    }

    /// A cloneable handle that can kill the tree from another thread while
    /// this one blocks in [`Self::wait`] (e.g. the turn's deadline timer).
    pub fn kill_handle(&self) -> std::io::Result<KillHandle> {
        Ok(KillHandle {
            pidfd: match &self.pidfd {
                Some(fd) => Some(std::sync::Arc::new(fd.try_clone()?)),
                None => None,
            },
            pid: self.pid,
            cgroup_v2: self.cgroup.v2.clone(),
            cgroup_paths: self.cgroup.paths.clone(),
        })
    }

    /// Wait for the helper to exit (it exits with the plugin's status, or
    /// 128 + signal), then for the cgroup to empty, and remove the cgroup.
    pub fn wait(&mut self) -> std::io::Result<ExitStatus> {
        let st = match self.status {
            Some(s) => s,
            None => {
                let s = match &mut self.helper {
                    HelperProc::Exec(child) => child.wait()?,
                    HelperProc::Forked => {
                        self.poll_exit(-1)?;
                        self.forked_status()
                    }
                };
                self.status = Some(s);
                s
            }
        };
        self.lifeline = None;
        self.wait_ns_init();
        self.cleanup_cgroup();
        Ok(st)
    }

    /// Without a cgroup whose `populated 0` covers the tree, waits (at
    /// most [`NS_INIT_WAIT`]) for the pid namespace's pid 1, which dies by
    /// its parent-death signal after the helper and exits only once the
    /// kernel has killed and reaped every other process of its namespace.
    fn wait_ns_init(&mut self) {
        let Some(init) = self.ns_init.take() else {
            return;
        };
        let end = Instant::now() + NS_INIT_WAIT;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
            if ms == 0 {
                return;
            }
            let timeout = PollTimeout::try_from(ms).unwrap_or(PollTimeout::NONE);
            let mut pfd = [PollFd::new(init.as_fd(), PollFlags::POLLIN)];
            match poll(&mut pfd, timeout) {
                Err(Errno::EINTR) => {}
                _ => return,
            }
        }
    }

    /// Non-blocking [`Self::wait`].
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = match &mut self.helper {
                HelperProc::Exec(child) => child.try_wait()?,
                HelperProc::Forked => {
                    if self.poll_exit(0)? {
                        Some(self.forked_status())
                    } else {
                        None
                    }
                }
            };
        }
        Ok(self.status)
    }

    /// A forked helper: whether it has exited (its pidfd is readable),
    /// waiting up to `timeout_ms` (-1: forever).
    fn poll_exit(&self, timeout_ms: i32) -> std::io::Result<bool> {
        let Some(fd) = &self.pidfd else {
            return Err(std::io::Error::other("forked helper without a pidfd"));
        };
        let timeout = PollTimeout::try_from(timeout_ms).unwrap_or(PollTimeout::NONE);
        loop {
            let mut pfd = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut pfd, timeout) {
                Ok(n) => return Ok(n > 0),
                Err(Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// A forked helper that has exited: the status it sent on the control
    /// socket, or SIGKILL when it sent none (killed outright).
    fn forked_status(&self) -> ExitStatus {
        use std::os::unix::process::ExitStatusExt;
        let mut b = [0u8; 1];
        let got = self.lifeline.as_ref().map_or(Ok(0), |l| {
            nix::sys::socket::recv(l.as_raw_fd(), &mut b, MsgFlags::MSG_DONTWAIT)
        });
        if got == Ok(1) {
            ExitStatus::from_raw((b[0] as i32) << 8)
        } else {
            ExitStatus::from_raw(libc::SIGKILL)
        }
    }

    pub(super) fn wait_timeout(&mut self, t: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + t;
        while Instant::now() < end {
            if let Ok(Some(s)) = self.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    fn cleanup_cgroup(&mut self) {
        if self.cgroup.paths.is_empty() {
            return;
        }
        // One `cgroup.kill`, one wait for `populated 0`; rmdir of a v1
        // cgroup whose last task is still exiting may need a retry.
        self.cgroup.kill();
        let end = Instant::now() + Duration::from_secs(10);
        self.cgroup.wait_empty(Duration::from_secs(10));
        self.cgroup.remove();
        while !self.cgroup.paths.is_empty() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(1));
            self.cgroup.kill();
            self.cgroup.remove();
        }
    }
}

pub(super) fn kill_helper(pidfd: Option<&OwnedFd>, pid: i32) {
    match pidfd {
        // A pidfd never designates a recycled pid.
        Some(fd) => {
            let _ = rustix::process::pidfd_send_signal(fd, Signal::KILL);
        }
        // Only used when pidfd_open is missing (kernel < 5.3), while the
        // child is unreaped.
        None => {
            if let Some(pid) = Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, Signal::KILL);
            }
        }
    }
}

/// Kills a sandboxed tree from any thread; see [`SandboxedChild::kill_handle`].
#[derive(Clone, Debug)]
pub struct KillHandle {
    pidfd: Option<std::sync::Arc<OwnedFd>>,
    pid: i32,
    cgroup_v2: Option<PathBuf>,
    cgroup_paths: Vec<PathBuf>,
}

impl KillHandle {
    /// Same as [`SandboxedChild::kill_tree`]. Without a pidfd (kernel < 5.3)
    /// this may only be used while the owner has not reaped the helper.
    pub fn kill_tree(&self) {
        kill_helper(self.pidfd.as_deref(), self.pid);
        cgroup::kill_paths(self.cgroup_v2.as_deref(), &self.cgroup_paths);
    }
}

impl Drop for SandboxedChild {
    fn drop(&mut self) {
        if self.status.is_none() {
            self.kill_tree();
        }
        let _ = self.wait();
    }
}
