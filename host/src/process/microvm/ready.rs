//! Waiting for the guest: its init says `sharedos-guest-ready` on the
//! protocol line once the line is open and raw. Bytes that reached the
//! guest's serial port before would be lost, so the launch returns (and
//! the host writes `initialize`) only after that line; what came before it
//! on the line (the kernel's boot setup may print there) is dropped.

use std::io;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

/// The init's line (guest-init/src/main.rs, `READY`).
const READY: &[u8] = b"sharedos-guest-ready\n";
/// At most this much comes before it.
const MAX_BEFORE: usize = 64 * 1024;

/// Reads `stdout` up to and including the ready line, within `bound`.
/// `Err` names why not: QEMU ended the line (the guest stopped before its
/// init was ready), the bound passed, or too much came before it.
pub(super) fn wait_ready(stdout: BorrowedFd<'_>, bound: Duration) -> io::Result<()> {
    let end = Instant::now() + bound;
    let mut seen: Vec<u8> = Vec::new();
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the guest's init was not ready within {} s",
                    bound.as_secs()
                ),
            ));
        }
        let mut fds = [PollFd::new(stdout, PollFlags::POLLIN)];
        let ms = left.as_millis().min(1000) as u16;
        if poll(&mut fds, PollTimeout::from(ms))? == 0 {
            continue;
        }
        let mut b = [0u8; 1];
        let n = nix::unistd::read(stdout, &mut b)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the guest ended before its init was ready",
            ));
        }
        seen.push(b[0]);
        if seen.ends_with(READY) {
            return Ok(());
        }
        if seen.len() > MAX_BEFORE {
            return Err(io::Error::other(format!(
                "{MAX_BEFORE} bytes on the protocol line before the guest's init was ready"
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::time::Duration;

    #[test]
    fn the_ready_line_is_stripped_and_what_follows_kept() {
        let (r, w) = std::io::pipe().unwrap();
        let mut w = w;
        w.write_all(b"Probing EDD... ok\r\nsharedos-guest-ready\n{\"x\":1}\n")
            .unwrap();
        super::wait_ready(r.as_fd(), Duration::from_secs(5)).unwrap();
        let mut rest = [0u8; 8];
        let n = nix::unistd::read(r.as_fd(), &mut rest).unwrap();
        assert_eq!(&rest[..n], b"{\"x\":1}\n");
        drop(w);
        let e = super::wait_ready(r.as_fd(), Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }
}
