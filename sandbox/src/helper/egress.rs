//! The egress gateway's listener (docs/EGRESS.md, steps 1–2): made by the
//! supervisor while it still holds every capability of the sandbox's own
//! network namespace, handed to the host on the control socket, and closed
//! here before anything of the plugin exists. The host's gateway then
//! accepts on it, in the host; nothing inside the sandbox relays a byte.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};

use super::process::{Fail, fail, os_fail};

/// The byte that carries the listener on the control socket (the only
/// other byte ever sent there is the supervisor's exit status, after it).
pub(crate) const LISTENER_BYTE: u8 = b'L';

/// Brings `lo` up, binds `127.0.0.1:<port>` and listens. Must run inside
/// the sandbox's own network namespace, with `CAP_NET_ADMIN` in it.
pub(super) fn listen(port: u16) -> Result<OwnedFd, Fail> {
    loopback_up()?;
    // SAFETY: socket takes integer arguments; the fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(os_fail("egress", "socket(AF_INET)"));
    }
    // SAFETY: `fd` was just created and is owned by nobody else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: `addr` is a valid sockaddr_in of the given length.
    let rc = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(os_fail("egress", &format!("bind 127.0.0.1:{port}")));
    }
    // SAFETY: listen on a socket we own.
    if unsafe { libc::listen(sock.as_raw_fd(), 128) } != 0 {
        return Err(os_fail("egress", "listen"));
    }
    Ok(sock)
}

/// `SIOCSIFFLAGS` with `IFF_UP` on `lo` (a new network namespace starts
/// with it down, so nothing, not even 127.0.0.1, is reachable).
pub(super) fn loopback_up() -> Result<(), Fail> {
    // SAFETY: socket takes integer arguments; the fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(os_fail("egress", "socket for the loopback's flags"));
    }
    // SAFETY: `fd` was just created and is owned by nobody else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq naming "lo"; the kernel fills the flags.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } != 0 {
        return Err(os_fail("egress", "SIOCGIFFLAGS lo"));
    }
    // SAFETY: reading and writing the flags member of the union the kernel
    // just filled.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: as above, setting the flags.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } != 0 {
        return Err(os_fail("egress", "SIOCSIFFLAGS lo up"));
    }
    Ok(())
}

/// Sends the listener to the host on the control socket and closes this
/// process's copy (it is consumed), so neither pid 1 nor the plugin, both
/// forked later, ever holds it.
pub(super) fn hand_to_host(ctl: &OwnedFd, listener: OwnedFd) -> Result<(), Fail> {
    let fds = [listener.as_raw_fd()];
    let iov = [std::io::IoSlice::new(&[LISTENER_BYTE])];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let sent = sendmsg::<()>(ctl.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None)
        .map_err(|e| fail("egress", format!("send the listener to the host: {e}")))?;
    if sent != 1 {
        return Err(fail("egress", "short send of the listener"));
    }
    drop(listener);
    Ok(())
}
