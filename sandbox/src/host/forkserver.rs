//! Host side of the fork server (see the helper's `server` module): one
//! server per helper binary, started on the spawner thread the first time
//! it is needed and replaced when it is gone.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};

use nix::poll::{PollFd, PollFlags, poll};
use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, recv,
    recvmsg, sendmsg, socketpair,
};

use super::spawner::{HELPER_SUBCOMMAND, NEUTRAL_NAME, on_spawner_thread};
use crate::request::FORK_SERVER_ARG;

/// How long a live server may take to answer (a spawn that waited this long
/// fails; the server stays).
const REPLY_TIMEOUT_MS: u16 = 10_000;

/// A helper forked by the server: not the host's child, so it is watched
/// through its pidfd, and its exit status comes on its control socket.
#[derive(Debug)]
pub(crate) struct Forked {
    pub pid: i32,
    pub pidfd: OwnedFd,
}

/// Why no helper was forked.
pub(crate) enum ForkError {
    /// The order never reached a server: the fds are still only ours, and
    /// the caller may execute a helper directly instead.
    NotSent,
    /// The order was sent but not answered: a forked helper may hold the
    /// fds (it dies with the server, which was killed), so the spawn fails.
    Sent(std::io::Error),
}

struct Server {
    sock: OwnedFd,
    child: Child,
    /// Number of the last order.
    seq: u64,
}

impl Server {
    fn start(helper: &Path) -> std::io::Result<Server> {
        let (host_end, server_end) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
        let helper = helper.to_path_buf();
        let child = on_spawner_thread(move || {
            Command::new(&helper)
                .arg0(NEUTRAL_NAME)
                .arg(HELPER_SUBCOMMAND)
                .arg(FORK_SERVER_ARG)
                .env_clear()
                .current_dir("/")
                .stdin(Stdio::from(server_end))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
        })?;
        let server = Server {
            sock: host_end,
            child,
            seq: 0,
        };
        // A fork server says it is ready; anything else (an older helper
        // binary, not a helper at all) is not one.
        let mut b = [0u8; 1];
        let ready = server.wait_readable().is_ok()
            && recv(server.sock.as_raw_fd(), &mut b, MsgFlags::empty()) == Ok(1)
            && b[0] == b'R';
        if !ready {
            server.stop();
            return Err(std::io::Error::other(
                "the helper binary is not a fork server",
            ));
        }
        Ok(server)
    }

    fn wait_readable(&self) -> std::io::Result<()> {
        loop {
            let mut pfd = [PollFd::new(self.sock.as_fd(), PollFlags::POLLIN)];
            match poll(&mut pfd, REPLY_TIMEOUT_MS) {
                Ok(0) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the fork server did not answer",
                    ));
                }
                Ok(_) => return Ok(()),
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn order(&mut self, fds: [BorrowedFd; 3]) -> Result<Forked, ForkError> {
        self.seq += 1;
        let seq = self.seq.to_le_bytes();
        let raw: [RawFd; 3] = fds.map(|f| f.as_raw_fd());
        let iov = [std::io::IoSlice::new(&seq)];
        let cmsg = [ControlMessage::ScmRights(&raw)];
        sendmsg::<()>(
            self.sock.as_raw_fd(),
            &iov,
            &cmsg,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(|_| ForkError::NotSent)?;
        let sent = |e: std::io::Error| ForkError::Sent(e);
        loop {
            self.wait_readable().map_err(sent)?;
            let mut buf = [0u8; 16];
            let mut cmsg_buf = nix::cmsg_space!([RawFd; 1]);
            let mut iov = [std::io::IoSliceMut::new(&mut buf)];
            let msg = recvmsg::<()>(
                self.sock.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg_buf),
                MsgFlags::MSG_CMSG_CLOEXEC,
            )
            .map_err(|e| sent(e.into()))?;
            let mut pidfd = None;
            for c in msg.cmsgs().map_err(|e| sent(e.into()))? {
                if let ControlMessageOwned::ScmRights(raw) = c {
                    for r in raw {
                        // SAFETY: the kernel just installed `r` for us.
                        let fd = unsafe { OwnedFd::from_raw_fd(r) };
                        pidfd.get_or_insert(fd);
                    }
                }
            }
            let n = msg.bytes;
            if n == 0 {
                return Err(sent(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the fork server exited",
                )));
            }
            if n < 8 || buf[..8] != seq {
                // A late answer to an order given up on: its helper finds
                // its control socket closed and exits.
                continue;
            }
            return match (n, pidfd) {
                (12, Some(pidfd)) => {
                    let pid = i32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]);
                    Ok(Forked { pid, pidfd })
                }
                _ => Err(sent(std::io::Error::other(
                    "the fork server could not fork",
                ))),
            };
        }
    }
}

/// Fork a helper with `ctl`, `stdout` and `stderr` as its fds 0, 1 and 2,
/// from the fork server of `helper` (started on first use, replaced when it
/// has exited).
pub(crate) fn fork_helper(helper: &Path, fds: [BorrowedFd; 3]) -> Result<Forked, ForkError> {
    // `None`: the binary is no fork server; its helpers are executed.
    static SERVERS: OnceLock<Mutex<HashMap<PathBuf, Option<Server>>>> = OnceLock::new();
    let mut servers = SERVERS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let gone = match servers.get_mut(helper) {
        Some(Some(s)) => !matches!(s.child.try_wait(), Ok(None)),
        Some(None) => return Err(ForkError::NotSent),
        None => false,
    };
    if gone && let Some(Some(s)) = servers.remove(helper) {
        s.stop();
    }
    if !servers.contains_key(helper) {
        match Server::start(helper) {
            Ok(s) => servers.insert(helper.to_path_buf(), Some(s)),
            Err(_) => {
                servers.insert(helper.to_path_buf(), None);
                return Err(ForkError::NotSent);
            }
        };
    }
    let Some(Some(server)) = servers.get_mut(helper) else {
        return Err(ForkError::NotSent);
    };
    // On an error the server stays: stopping it would take the sandboxes
    // it forked down with it (their parent-death signal). One that has
    // exited is replaced at the next spawn.
    server.order(fds)
}
