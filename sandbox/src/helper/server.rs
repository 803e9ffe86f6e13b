//! The fork server: `__sandbox-exec --fork-server`. The host starts it once
//! per helper binary (from its spawner thread, like a helper) and, for each
//! spawn, hands it the three fds a helper starts with; the server forks,
//! and the child continues exactly as a freshly executed helper would
//! (request on fd 0, every layer built anew). That saves re-executing the
//! helper binary on every spawn (~1 ms on the reference VM, more for the
//! 90 MB `sharedos` binary). The server holds no per-spawn state: it never
//! reads a request, never runs plugin code, and closes each spawn's fds
//! right after the fork.
//!
//! Protocol on fd 0 (a `SOCK_SEQPACKET` socket): the server first says `R`
//! (ready; a binary that does not, is no fork server); the host sends an
//! order number (8 bytes, little endian) with the three fds (control
//! socket, stdout, stderr); the server answers with the same number and the
//! child's pid (4 bytes) plus a pidfd, or with the number alone when it
//! could not fork. The number lets the host drop a late answer to an order
//! it gave up on. EOF on fd 0 ends the server.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use rustix::process::{Pid, PidfdFlags, Signal};

use super::process::arm_parent_death_signal;
use super::supervisor::run;
pub(crate) use crate::request::FORK_SERVER_ARG;

const SERVER_FD: RawFd = 0;

fn reply(msg: &[u8], fd: Option<RawFd>) {
    let iov = [std::io::IoSlice::new(msg)];
    let fds = fd.map(|f| [f]);
    let cmsg: Vec<ControlMessage> = fds
        .as_ref()
        .map(|f| vec![ControlMessage::ScmRights(f)])
        .unwrap_or_default();
    let _ = sendmsg::<()>(SERVER_FD, &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None);
}

/// Receive one spawn order (its number and fds): `None` on EOF or error
/// (the host is gone).
fn receive() -> Option<([u8; 8], Vec<OwnedFd>)> {
    let mut buf = [0u8; 16];
    let mut cmsg_buf = nix::cmsg_space!([RawFd; 3]);
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let msg = loop {
        match recvmsg::<()>(
            SERVER_FD,
            &mut iov,
            Some(&mut cmsg_buf),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return None,
            Ok(m) => break m,
        }
    };
    let mut fds = Vec::new();
    if let Ok(cmsgs) = msg.cmsgs() {
        for c in cmsgs {
            if let ControlMessageOwned::ScmRights(raw) = c {
                for r in raw {
                    // SAFETY: the kernel just installed `r` for us.
                    fds.push(unsafe { OwnedFd::from_raw_fd(r) });
                }
            }
        }
    }
    if msg.bytes == 0 && fds.is_empty() {
        return None;
    }
    let mut seq = [0u8; 8];
    if msg.bytes == 8 {
        seq.copy_from_slice(&buf[..8]);
    }
    Some((seq, fds))
}

/// The server loop; never returns.
pub(super) fn serve() -> ! {
    // The server's lifeline is the host's spawner thread, as a helper's is;
    // a host that died before this was armed closed its end of fd 0, and
    // the first receive ends the server.
    arm_parent_death_signal();
    // Children are reaped by the kernel: a supervisor's exit status reaches
    // the host on its own control socket.
    // SAFETY: setting a signal disposition; the server is single-threaded.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) };
    let me = rustix::process::getpid().as_raw_pid();
    reply(b"R", None);
    while let Some((seq, fds)) = receive() {
        if fds.len() != 3 {
            reply(&seq, None);
            continue;
        }
        // SAFETY: the server is single-threaded, so the child may run
        // arbitrary code after fork.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let entered = crate::timing::now_ns();
            // SAFETY: restoring the default disposition in the child (the
            // supervisor waits for its pid 1), then moving the three fds to
            // 0, 1 and 2 (replacing the server socket at 0); the originals
            // are closed when `fds` drops.
            unsafe {
                libc::signal(libc::SIGCHLD, libc::SIG_DFL);
                for (i, fd) in fds.iter().enumerate() {
                    if libc::dup2(fd.as_raw_fd(), i as RawFd) < 0 {
                        libc::_exit(125);
                    }
                }
            }
            drop(fds);
            run(entered, Some(me));
        }
        drop(fds);
        if pid < 0 {
            reply(&seq, None);
            continue;
        }
        // Our own child, not yet reaped (it cannot have been: reaping needs
        // it to exit first, and a pidfd of an exited child still answers).
        let Some(child) = Pid::from_raw(pid) else {
            reply(&seq, None);
            continue;
        };
        let Ok(pidfd) = rustix::process::pidfd_open(child, PidfdFlags::empty()) else {
            // Without a pidfd the host could hit a recycled pid: refuse.
            let _ = rustix::process::kill_process(child, Signal::KILL);
            reply(&seq, None);
            continue;
        };
        let mut answer = [0u8; 12];
        answer[..8].copy_from_slice(&seq);
        answer[8..].copy_from_slice(&pid.to_le_bytes());
        reply(&answer, Some(pidfd.as_raw_fd()));
    }
    // SAFETY: plain exit; nothing to flush.
    unsafe { libc::_exit(0) }
}
