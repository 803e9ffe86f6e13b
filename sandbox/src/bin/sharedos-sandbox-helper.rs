//! The lean helper: `sharedos-sandbox-helper __sandbox-exec`, the same
//! [`sharedos_sandbox::helper_main`] as `sharedos __sandbox-exec` in a
//! binary that holds nothing else. A host that installs it next to itself
//! and passes it as `SpawnSpec::helper_exe` saves the cost of re-executing
//! its own, much larger, binary on every spawn (more pages to map and
//! relocate before `main`). This crate's tests use it too.
//!
//! `no_main`: std's start-up (a stack-overflow handler, which reads
//! `/proc/self/maps`, and the check that fds 0–2 are open) is skipped: the
//! host always hands the helper fds 0–2 (`spawn` builds them), and SIGPIPE
//! is ignored here as std would.

// The test harness brings its own `main`.
#![cfg_attr(not(test), no_main)]

#[cfg(not(test))]
#[unsafe(no_mangle)]
extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    // SAFETY: setting a signal disposition to SIG_IGN at start-up, before
    // anything else runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    // glibc hands argv to std through .init_array, so args_os works
    // without std's main.
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if args
        .first()
        .is_some_and(|a| a == sharedos_sandbox::HELPER_SUBCOMMAND)
    {
        args.remove(0);
        sharedos_sandbox::helper_main(args);
    }
    eprintln!("usage: sharedos-sandbox-helper __sandbox-exec (the policy comes on fd 0)");
    2
}
