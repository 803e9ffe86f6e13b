//! The process primitives every step of the helper uses: a failed step
//! and how it reaches the host (the report pipe, the exit status on the
//! control socket), `prctl`, signal sets, pipes and exit codes.

use std::os::fd::{AsFd, OwnedFd, RawFd};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, SigmaskHow, Signal as NixSignal, sigprocmask};
use nix::sys::socket::MsgFlags;
use rustix::process::DumpableBehavior;
pub(super) use rustix::process::Signal;

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

/// A step that failed with the errno a rustix call returned.
pub(super) fn errno_fail(stage: &'static str, what: &str, e: rustix::io::Errno) -> Fail {
    Fail {
        stage,
        message: format!("{what}: {}", std::io::Error::from(e)),
        errno: Some(e.raw_os_error()),
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
        let mut rest = &line[..];
        while !rest.is_empty() {
            match rustix::io::write(&self.0, rest) {
                Ok(0) => break,
                Ok(n) => rest = &rest[n..],
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => break,
            }
        }
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
        // The control socket, which the supervisor holds until it exits.
        let _ = nix::sys::socket::send(
            fd,
            &[code as u8],
            MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
        );
    }
}

/// This process's parent-death signal (cleared by a uid change and by
/// `fork`, so each process of the tree arms its own).
pub(super) fn parent_death_signal(sig: Signal) {
    let _ = rustix::process::set_parent_process_death_signal(Some(sig));
}

/// Whether this process may be dumped, ptraced or have its `/proc` files
/// read by other processes of its uid.
pub(super) fn set_dumpable(dumpable: bool) -> std::io::Result<()> {
    let behavior = if dumpable {
        DumpableBehavior::Dumpable
    } else {
        DumpableBehavior::NotDumpable
    };
    Ok(rustix::process::set_dumpable_behavior(behavior)?)
}

pub(super) fn arm_parent_death_signal() {
    parent_death_signal(Signal::KILL);
}

pub(super) fn sigset(signals: &[NixSignal]) -> SigSet {
    let mut set = SigSet::empty();
    for s in signals {
        set.add(*s);
    }
    set
}

/// Block SIGTERM and SIGCHLD so pid 1 can wait for either with
/// `sigtimedwait` without a race between a check and a blocking wait.
pub(super) fn block_term_and_chld() {
    let set = sigset(&[NixSignal::SIGTERM, NixSignal::SIGCHLD]);
    let _ = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None);
}

pub(super) fn pipe_cloexec() -> std::io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?)
}

pub(super) fn parent_gone(alive_r: &OwnedFd) -> bool {
    let mut pfd = [PollFd::new(alive_r.as_fd(), PollFlags::POLLIN)];
    let n = poll(&mut pfd, PollTimeout::ZERO).unwrap_or(0);
    n > 0
        && pfd[0]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLIN))
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
