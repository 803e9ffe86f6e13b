//! What the host hands the helper on the control socket: one length-prefixed
//! JSON object (never argv, which is world-readable in `/proc/<pid>/cmdline`)
//! plus two or three fds by SCM_RIGHTS: the plugin's stdin, the report
//! pipe, and for a prepared sandbox the pipe its start order comes on.

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::{Deserialize, Serialize};

use crate::policy::SandboxPolicy;
use crate::report::CgroupReport;
use crate::seccomp::Insn;

/// The argument that turns `__sandbox-exec` into the fork server.
pub(crate) const FORK_SERVER_ARG: &str = "--fork-server";

/// Largest request the helper accepts.
const MAX_REQUEST: u64 = 16 << 20;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct HelperRequest {
    pub policy: SandboxPolicy,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Final environment of the plugin (already filtered by the host).
    pub env: Vec<(String, String)>,
    /// A host directory for the workspace; `None`: a tmpfs of the
    /// sandbox's own.
    pub workspace: Option<PathBuf>,
    /// The copy of `program` in the host-private state directory that the
    /// minimal root binds (its path reveals nothing of the host); `None`
    /// without a mount namespace, where `program` is executed in place.
    #[serde(default)]
    pub program_staged: Option<PathBuf>,
    /// The program lies inside one of the policy's read-only paths and is
    /// executed from its own path (nothing staged, nothing at `/plugin`).
    #[serde(default)]
    pub program_in_place: bool,
    /// The uid (and gid) of this sandbox, held by the host for the
    /// sandbox's life (`None`: the host is not root, or `drop_uid` is off).
    pub uid: Option<u32>,
    /// The host's pid: the helper's parent must still be it once the
    /// parent-death signal is armed.
    pub host_pid: i32,
    /// Filter for the namespaced sandbox.
    pub seccomp_namespace: Vec<Insn>,
    /// Filter for the no-user-namespace sandbox.
    pub seccomp_strict: Vec<Insn>,
    /// Test-only filter that refuses CLONE_NEWUSER, installed first.
    pub emulation_filter: Option<Vec<Insn>>,
    pub cgroup_paths: Vec<PathBuf>,
    pub cgroup: CgroupReport,
    /// Environment keys the host dropped (reported as warnings).
    pub dropped_env: Vec<String>,
    /// `CLOCK_MONOTONIC` ns when the host entered `spawn` (the origin of
    /// the report's `timings_us`).
    pub origin_ns: u64,
    /// A prepared sandbox: once the report is sent, the plugin process
    /// waits for one byte on the start pipe (the third fd) before its
    /// `execve`; EOF instead means the host discarded it, and it exits.
    #[serde(default)]
    pub hold: bool,
}

/// The start order of a prepared sandbox, on its start pipe.
pub(crate) const START_BYTE: u8 = b'G';

/// The fds that come with a request.
pub(crate) struct RequestFds {
    pub stdin_r: OwnedFd,
    pub report_w: OwnedFd,
    /// The start pipe of a prepared sandbox (`hold`).
    pub start_r: Option<OwnedFd>,
}

/// Host side, before the helper exists: queue the request and the two fds
/// on the control socket, as far as the socket buffer takes it without
/// blocking (a request is a few KiB, the buffer ~200 KiB: usually all of
/// it). The helper then finds everything waiting when it starts, instead
/// of waiting for the host thread to be scheduled again. Returns the
/// bytes of `body` still to send with [`send_rest`].
pub(crate) fn send_start<'a>(
    sock: &UnixStream,
    body: &'a [u8],
    stdin_r: BorrowedFd,
    report_w: BorrowedFd,
    start_r: Option<BorrowedFd>,
) -> std::io::Result<&'a [u8]> {
    let len = (body.len() as u64).to_le_bytes();
    let mut fds = vec![stdin_r.as_raw_fd(), report_w.as_raw_fd()];
    fds.extend(start_r.map(|f| f.as_raw_fd()));
    let iov = [std::io::IoSlice::new(&len)];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    // MSG_NOSIGNAL: a helper that died early is an error, not a SIGPIPE
    // for the host.
    let n = sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None)?;
    if n != len.len() {
        return Err(std::io::Error::other("short write of the request header"));
    }
    let mut rest = body;
    while !rest.is_empty() {
        let flags = MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT;
        match nix::sys::socket::send(sock.as_raw_fd(), rest, flags) {
            Ok(n) => rest = &rest[n..],
            Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EAGAIN) => break,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(rest)
}

/// Host side, once the helper runs: the part of the request the socket
/// buffer did not take (blocking).
pub(crate) fn send_rest(sock: &UnixStream, mut rest: &[u8]) -> std::io::Result<()> {
    while !rest.is_empty() {
        match nix::sys::socket::send(sock.as_raw_fd(), rest, MsgFlags::MSG_NOSIGNAL) {
            Ok(n) => rest = &rest[n..],
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Helper side: receive the request and the fds (close-on-exec).
pub(crate) fn receive(fd: RawFd) -> std::io::Result<(HelperRequest, RequestFds)> {
    let mut len = [0u8; 8];
    let mut cmsg_buf = nix::cmsg_space!([RawFd; 3]);
    let mut fds: Vec<OwnedFd> = Vec::new();
    let got = {
        let mut iov = [std::io::IoSliceMut::new(&mut len)];
        let msg = recvmsg::<()>(
            fd,
            &mut iov,
            Some(&mut cmsg_buf),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                for r in raw {
                    // SAFETY: the kernel just installed `r` in our table for
                    // us; nothing else owns it.
                    fds.push(unsafe { OwnedFd::from_raw_fd(r) });
                }
            }
        }
        msg.bytes
    };
    // SAFETY: `fd` is the control socket, owned by the caller for the whole
    // life of the helper; ManuallyDrop keeps this temporary from closing it.
    let sock = std::mem::ManuallyDrop::new(unsafe { UnixStream::from_raw_fd(fd) });
    let mut s: &UnixStream = &sock;
    if got < len.len() {
        s.read_exact(&mut len[got..])?;
    }
    let n = u64::from_le_bytes(len);
    if n > MAX_REQUEST {
        return Err(std::io::Error::other(format!(
            "request too large: {n} bytes"
        )));
    }
    let mut body = vec![0u8; n as usize];
    s.read_exact(&mut body)?;
    let req: HelperRequest = serde_json::from_slice(&body).map_err(std::io::Error::other)?;
    let want = if req.hold { 3 } else { 2 };
    if fds.len() != want {
        return Err(std::io::Error::other(format!(
            "expected {want} fds with the request, got {}",
            fds.len()
        )));
    }
    let mut fds = fds.into_iter();
    let (Some(stdin_r), Some(report_w)) = (fds.next(), fds.next()) else {
        return Err(std::io::Error::other("fds missing from the request"));
    };
    Ok((
        req,
        RequestFds {
            stdin_r,
            report_w,
            start_r: fds.next(),
        },
    ))
}
