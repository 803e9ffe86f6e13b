//! Outliving the turn: spinning and sleeping through the abort, daemons,
//! new process groups, surviving the host (sandbox.md C36–C40).
//!
//! Each returns its receipt first; the part that hangs is the attack's
//! `then`, run after the receipt is out, since the process is expected to
//! be killed during it. Children carry a `comm` the host can look for.

use std::time::{Duration, Instant};

use crate::bait::Bait;
use crate::receipt::{Receipt, describe_errno, describe_io};
use crate::sys;

pub fn c36_cpu_spin(bait: &Bait) -> Receipt {
    sys::ignore_termination();
    Receipt::unjudged(
        "C36-cpu-spin-ignoring-abort",
        format!(
            "SIGTERM/SIGHUP/SIGINT ignored; spinning on a CPU for up to {} s",
            bait.hang_secs()
        ),
    )
}

pub fn c36_then(bait: &Bait) {
    let end = Instant::now() + Duration::from_secs(bait.hang_secs());
    let mut x = 0u64;
    while Instant::now() < end {
        for _ in 0..100_000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

pub fn c37_sleep_forever(bait: &Bait) -> Receipt {
    sys::ignore_termination();
    Receipt::unjudged(
        "C37-sleep-ignoring-abort",
        format!(
            "SIGTERM/SIGHUP/SIGINT ignored; sleeping for up to {} s",
            bait.hang_secs()
        ),
    )
}

pub fn hang(bait: &Bait) {
    sys::raw_sleep(bait.hang_secs());
}

/// Forks a double-forked, setsid'd grandchild named `comm` that sleeps
/// `secs`; returns its pid (as seen from here).
pub fn spawn_daemon(comm: &std::ffi::CStr, secs: u64, detach_stdio: bool) -> Result<i32, String> {
    let devnull = c"/dev/null";
    let report = sys::in_child(|w| {
        // SAFETY: raw syscalls in the child on data prepared before the fork.
        unsafe {
            libc::setsid();
            let pid = libc::fork();
            if pid == 0 {
                w.close();
                sys::become_daemon_body(comm, devnull, detach_stdio);
                sys::raw_sleep(secs);
                libc::_exit(0);
            }
            w.put(pid);
            w.put(sys::errno());
        }
        0
    })
    .map_err(|e| describe_io(&e))?;
    match report.words.as_slice() {
        [pid, _] if *pid > 0 => Ok(*pid),
        [_, e] => Err(format!("fork: {}", describe_errno(*e))),
        _ => Err(format!(
            "the intermediate child reported nothing ({})",
            report.exit
        )),
    }
}

pub fn c38_double_fork_daemon(bait: &Bait) -> Receipt {
    const A: &str = "C38-double-fork-daemon";
    match spawn_daemon(c"sdos-adv-c38", bait.hang_secs(), true) {
        Ok(pid) => Receipt::unjudged(
            A,
            format!(
                "daemon pid {pid} (comm sdos-adv-c38, setsid, SIGTERM ignored) sleeps {} s unless the sandbox kills it",
                bait.hang_secs()
            ),
        ),
        Err(e) => Receipt::blocked(A, format!("blocked: {e}")),
    }
}

pub fn c39_new_process_group(bait: &Bait) -> Receipt {
    const A: &str = "C39-new-process-group";
    let (comm, devnull, secs) = (c"sdos-adv-c39", c"/dev/null", bait.hang_secs());
    // SAFETY: the child makes raw syscalls only and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: in the child, on strings prepared before the fork.
        unsafe {
            libc::setpgid(0, 0);
            sys::become_daemon_body(comm, devnull, true);
            sys::raw_sleep(secs);
            libc::_exit(0);
        }
    }
    if pid < 0 {
        return Receipt::blocked(
            A,
            format!("blocked: fork: {}", describe_errno(sys::errno())),
        );
    }
    Receipt::unjudged(
        A,
        format!(
            "child pid {pid} (comm sdos-adv-c39) in its own process group sleeps {secs} s unless the sandbox kills it"
        ),
    )
}

pub fn c40_outlive_host(bait: &Bait) -> Receipt {
    const A: &str = "C40-outlive-the-host";
    let mut old: libc::c_int = 0;
    // SAFETY: PR_GET_PDEATHSIG writes one int; PR_SET_PDEATHSIG 0 clears it.
    let cleared = unsafe {
        libc::prctl(libc::PR_GET_PDEATHSIG, &mut old as *mut libc::c_int);
        libc::prctl(libc::PR_SET_PDEATHSIG, 0)
    } == 0;
    for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT, libc::SIGPIPE] {
        // SAFETY: setting a signal to SIG_IGN.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    // The main thread's name, which /proc/<pid>/comm shows. A read-only
    // /proc refuses that write: then name this thread (PR_SET_NAME), which
    // /proc/<pid>/task/<tid>/comm shows.
    let named = std::fs::write("/proc/self/comm", "sdos-adv-c40").is_ok() || {
        // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
        unsafe { libc::prctl(libc::PR_SET_NAME, c"sdos-adv-c40".as_ptr()) == 0 }
    };
    Receipt::unjudged(
        A,
        format!(
            "parent-death signal was {old}, cleared: {cleared}; SIGTERM/SIGHUP/SIGINT/SIGPIPE ignored; comm set: {named}; staying alive {} s",
            bait.hang_secs()
        ),
    )
}
