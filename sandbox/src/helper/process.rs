//! The process primitives every step of the helper uses: a failed step
//! and how it reaches the host (the report pipe, the exit status on the
//! control socket), `prctl`, signal sets, pipes and exit codes.

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::report::HelperMessage;

/// The control socket arrives as fd 0.
pub(super) const CONTROL_FD: RawFd = 0;

pub(super) struct Fail {
    stage: &'static str,
    message: String,
    errno: Option<i32>,
}

pub(super) fn fail(stage: &'static str, message: impl std::fmt::Display) -> Fail {
    Fail {
        stage,
        message: message.to_string(),
        errno: None,
    }
}

pub(super) fn os_fail(stage: &'static str, what: &str) -> Fail {
    let e = std::io::Error::last_os_error();
    Fail {
        stage,
        message: format!("{what}: {e}"),
        errno: e.raw_os_error(),
    }
}

/// The report pipe (close-on-exec: it closes by itself when `execve`
/// succeeds, so EOF without a report means the exec failed), and the start
/// pipe of a prepared sandbox (read end, close-on-exec too).
pub(super) struct ReportPipe(pub(super) OwnedFd, pub(super) Option<OwnedFd>);

impl ReportPipe {
    pub(super) fn send(&self, msg: &HelperMessage) {
        let mut line = serde_json::to_vec(msg).unwrap_or_default();
        line.push(b'\n');
        // SAFETY: the fd is owned by `self.0` and stays open for the call;
        // ManuallyDrop keeps the temporary File from closing it.
        let mut f =
            std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(self.0.as_raw_fd()) });
        let _ = f.write_all(&line);
    }

    pub(super) fn fail(&self, f: Fail) -> ! {
        self.send(&HelperMessage::Error {
            stage: f.stage.to_string(),
            message: f.message,
            errno: f.errno,
        });
        exit_status_to_host(125);
        // SAFETY: _exit ends the process without running destructors,
        // which is what a forked child must do.
        unsafe { libc::_exit(125) }
    }
}

/// The supervisor's control socket (-1 in pid 1 and the plugin, which do
/// not hold it).
pub(super) static CTL_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// Tell the host the supervisor's exit code on the control socket: a
/// helper forked by the fork server is not the host's child, so the host
/// cannot `waitpid` it (one killed outright sends nothing, and the host
/// reports SIGKILL). A no-op outside the supervisor.
pub(super) fn exit_status_to_host(code: i32) {
    let fd = CTL_FD.load(std::sync::atomic::Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: sending one byte from a local buffer on the control
        // socket, which the supervisor holds until it exits.
        unsafe {
            libc::send(
                fd,
                (&(code as u8) as *const u8).cast(),
                1,
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
    }
}

pub(super) fn prctl(opt: libc::c_int, arg: libc::c_ulong) -> libc::c_int {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(opt, arg, 0, 0, 0) }
}

pub(super) fn arm_parent_death_signal() {
    prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
}

pub(super) fn sigset(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigemptyset initializes the zeroed set; sigaddset only adds
    // valid signal numbers to it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in signals {
            libc::sigaddset(&mut set, *s);
        }
        set
    }
}

/// Block SIGTERM and SIGCHLD so pid 1 can wait for either with
/// `sigtimedwait` without a race between a check and a blocking wait.
pub(super) fn block_term_and_chld() {
    let set = sigset(&[libc::SIGTERM, libc::SIGCHLD]);
    // SAFETY: `set` is initialized; the old mask is not needed.
    unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

pub(super) fn pipe_cloexec() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut p = [0; 2];
    // SAFETY: `p` has room for the two fds pipe2 writes.
    if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) })
}

pub(super) fn parent_gone(alive_r: &OwnedFd) -> bool {
    let mut pfd = libc::pollfd {
        fd: alive_r.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n > 0 && pfd.revents & (libc::POLLHUP | libc::POLLIN) != 0
}

pub(super) fn exit_code(status: libc::c_int) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        1
    }
}
