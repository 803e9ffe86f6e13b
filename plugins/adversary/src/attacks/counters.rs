//! Per-uid kernel counters (issue 14, item 4): inotify instances and
//! queued signals. Takes as many as the kernel gives (up to `fd_count`)
//! and holds them, so that a second sandbox started meanwhile can show it
//! still gets its own, and the host can count them in `/proc`.

use crate::bait::Bait;
use crate::receipt::{Receipt, describe_errno};
use crate::sys;

pub fn c35b_inotify_and_signal_queue(bait: &Bait) -> Receipt {
    const A: &str = "C35b-inotify-and-signal-queue";
    let want = bait.fd_count();
    let (inotify, inotify_stop) = inotify_instances(want);
    let (queued, queue_stop) = queue_signals(want);
    let describe = |got: u64, stop: Option<i32>, what: &str| match stop {
        Some(e) => format!("{what}: {got}, then {}", describe_errno(e)),
        None => format!("{what}: all {got}"),
    };
    let observed = format!(
        "(held) {}; {}",
        describe(inotify, inotify_stop, "inotify instances"),
        describe(queued, queue_stop, "queued signals")
    );
    if inotify_stop.is_some() && queue_stop.is_some() {
        Receipt::blocked(A, format!("blocked: {observed}"))
    } else {
        Receipt::succeeded(A, format!("succeeded: {observed}"))
    }
}

fn inotify_instances(want: u64) -> (u64, Option<i32>) {
    let mut got = 0;
    while got < want {
        // SAFETY: inotify_init1 takes a flag word; the fd is held (never
        // closed) on purpose.
        if unsafe { libc::inotify_init1(libc::IN_CLOEXEC) } < 0 {
            return (got, Some(sys::errno()));
        }
        got += 1;
    }
    (got, None)
}

/// Real-time signals to ourselves, blocked so they stay queued.
fn queue_signals(want: u64) -> (u64, Option<i32>) {
    let sig = libc::SIGRTMIN();
    // SAFETY: a sigset on the stack, filled and installed as the mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    let mut got = 0;
    while got < want {
        let val = libc::sigval {
            sival_ptr: std::ptr::null_mut(),
        };
        // SAFETY: queueing a blocked signal to ourselves.
        if unsafe { libc::sigqueue(me, sig, val) } != 0 {
            return (got, Some(sys::errno()));
        }
        got += 1;
    }
    (got, None)
}
