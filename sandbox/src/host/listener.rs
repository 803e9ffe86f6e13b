//! The host's side of the egress listener's handover: the socket the
//! supervisor bound in the sandbox's network namespace arrives on the
//! control socket, one marker byte with it (docs/EGRESS.md).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use crate::SandboxError;

/// The egress listener the supervisor queued on the control socket.
pub(crate) fn receive(lifeline: &UnixStream) -> Result<OwnedFd, SandboxError> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let missing = |message: String| SandboxError::Setup {
        stage: "egress".into(),
        message,
        errno: None,
    };
    let mut byte = [0u8; 1];
    let mut cmsg_buf = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let msg = recvmsg::<()>(
        lifeline.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg_buf),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| missing(format!("no listener from the helper: {e}")))?;
    let mut fds = Vec::new();
    for c in msg
        .cmsgs()
        .map_err(|e| missing(format!("control message: {e}")))?
    {
        if let ControlMessageOwned::ScmRights(raw) = c {
            // SAFETY: the kernel just installed these fds for us; nobody
            // else owns them.
            fds.extend(raw.into_iter().map(|r| unsafe { OwnedFd::from_raw_fd(r) }));
        }
    }
    let bytes = msg.bytes;
    if bytes != 1 || byte[0] != crate::helper::egress::LISTENER_BYTE || fds.len() != 1 {
        return Err(missing(format!(
            "expected the listener, got {bytes} byte(s) and {} fd(s)",
            fds.len()
        )));
    }
    Ok(fds.remove(0))
}
