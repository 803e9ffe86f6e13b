//! Layer: file descriptors. The plugin starts with 0, 1 and 2 only; every
//! fd the host leaked (a secret file, a socket) is closed in the helper
//! before anything else can use it.

use std::os::fd::RawFd;

/// Close every fd >= 3 except those in `keep`, with `close_range(2)` over
/// the gaps; falls back to walking `/proc/self/fd` on old kernels.
pub fn close_all_except(keep: &[RawFd]) -> std::io::Result<()> {
    let mut keep: Vec<RawFd> = keep.iter().copied().filter(|fd| *fd >= 3).collect();
    keep.sort_unstable();
    keep.dedup();
    let mut start: u32 = 3;
    let mut ranges = Vec::new();
    for fd in &keep {
        let fd = *fd as u32;
        if fd > start {
            ranges.push((start, fd - 1));
        }
        start = fd + 1;
    }
    ranges.push((start, u32::MAX));
    for (lo, hi) in ranges {
        // SAFETY: close_range only closes descriptors; the helper owns every
        // fd in these ranges (none is held by a Rust object it still uses:
        // the kept ones are excluded), so no owner is left with a dangling fd.
        let rc = unsafe { libc::syscall(libc::SYS_close_range, lo, hi, 0u32) };
        if rc != 0 {
            return close_by_listing(&keep);
        }
    }
    Ok(())
}

fn close_by_listing(keep: &[RawFd]) -> std::io::Result<()> {
    for fd in list()? {
        if fd >= 3 && !keep.contains(&fd) {
            // SAFETY: as above: closing an fd the helper does not use.
            unsafe { libc::close(fd) };
        }
    }
    Ok(())
}

/// The fds open in this process, from `/proc/self/fd` (the fd used to read
/// the directory is left out).
pub fn list() -> std::io::Result<Vec<RawFd>> {
    let dir = std::fs::read_dir("/proc/self/fd")?;
    let mut fds: Vec<RawFd> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    // The last entry read is usually the directory fd itself; drop fds
    // that are no longer open.
    fds.retain(|fd| {
        // SAFETY: F_GETFD only queries flags of the fd number.
        unsafe { libc::fcntl(*fd, libc::F_GETFD) >= 0 }
    });
    Ok(fds)
}

/// Set or clear FD_CLOEXEC.
pub fn set_cloexec(fd: RawFd, on: bool) -> std::io::Result<()> {
    // SAFETY: F_GETFD/F_SETFD touch only the flags of `fd`.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let new = if on {
        flags | libc::FD_CLOEXEC
    } else {
        flags & !libc::FD_CLOEXEC
    };
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, new) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
