//! Device nodes and the terminal (sandbox.md C51, C54).

use std::os::fd::AsRawFd;
use std::path::Path;

use crate::bait::Bait;
use crate::receipt::{Receipt, describe_errno};
use crate::sys;

pub fn c51_dev_access(_: &Bait) -> Receipt {
    const A: &str = "C51-dev-node-access";
    let mut obs = Vec::new();
    let mut opened = Vec::new();
    // Opened without reading or writing; /dev/vsock is the device node,
    // not a socket, and is never used.
    for p in [
        "/dev/vda",
        "/dev/mem",
        "/dev/kmsg",
        "/dev/console",
        "/dev/vsock",
        "/dev/tty",
    ] {
        match sys::open(
            Path::new(p),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY,
            0,
        ) {
            Ok(_) => {
                opened.push(p);
                obs.push(format!("{p}: opened"));
            }
            Err(e) => obs.push(format!("{p}: {}", describe_errno(e))),
        }
    }
    let worked = !opened.is_empty();
    let verdict = if worked { "succeeded" } else { "blocked" };
    Receipt::judged(A, !worked, format!("{verdict}: {}", obs.join("; ")))
}

pub fn c54_tiocsti(_: &Bait) -> Receipt {
    const A: &str = "C54-tiocsti-tioclinux-injection";
    // A terminal to inject into: one of our stdio fds, else the controlling tty.
    // SAFETY: isatty on small integers.
    let std_tty = (0..=2).find(|&fd| unsafe { libc::isatty(fd) } == 1);
    let ctty = match std_tty {
        Some(_) => None,
        None => sys::open(
            Path::new("/dev/tty"),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_NONBLOCK,
            0,
        )
        .ok(),
    };
    let fd = std_tty
        .or(ctty.as_ref().map(|f| f.as_raw_fd()))
        .unwrap_or(0);
    // '#': if it ever lands on a shell prompt, it starts a comment.
    let ch: u8 = b'#';
    let mut obs = vec![format!(
        "fd {fd} ({})",
        if std_tty.is_some() || ctty.is_some() {
            "a tty"
        } else {
            "no tty found"
        }
    )];
    let mut injected = false;
    // SAFETY: TIOCSTI reads one byte from a live local.
    let r = unsafe { libc::ioctl(fd, libc::TIOCSTI, &ch) };
    obs.push(if r == 0 {
        injected = true;
        "TIOCSTI ok".into()
    } else {
        format!("TIOCSTI: {}", describe_errno(sys::errno()))
    });
    // The same request with garbage in the upper 32 bits (CVE-2019-10063).
    // SAFETY: as above, through the raw syscall so the 64-bit value survives.
    let r = unsafe {
        libc::syscall(
            libc::SYS_ioctl,
            fd,
            libc::TIOCSTI | 1 << 32,
            &ch as *const u8,
        )
    };
    obs.push(if r == 0 {
        injected = true;
        "TIOCSTI|1<<32 ok".into()
    } else {
        format!("TIOCSTI|1<<32: {}", describe_errno(sys::errno()))
    });
    let mut sub: u8 = 6; // TIOCL_GETSHIFTSTATE: a read-only subcode
    // SAFETY: TIOCLINUX reads and writes the one byte it is given.
    let r = unsafe { libc::ioctl(fd, libc::TIOCLINUX, &mut sub) };
    obs.push(if r == 0 {
        injected = true;
        "TIOCLINUX ok".into()
    } else {
        format!("TIOCLINUX: {}", describe_errno(sys::errno()))
    });
    let verdict = if injected { "succeeded" } else { "blocked" };
    Receipt::judged(A, !injected, format!("{verdict}: {}", obs.join("; ")))
}
