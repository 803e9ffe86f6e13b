//! What the plugin's seccomp filter costs: its size, the `seccomp(2)` call
//! that installs it (the kernel runs a new filter once per syscall number
//! at install time to build its always-allow cache), and the cost per
//! syscall afterwards, for a syscall the cache allows without running the
//! filter (getppid), one the filter runs for its argument check (ioctl),
//! and one it refuses (an unlisted number: ENOSYS).
//!
//! `cargo run --release -p sharedos-sandbox --example seccomp_cost -- 200`
//! (the argument is how many children install the filter).

use std::time::Instant;

use sharedos_sandbox::MemfdPolicy;
use sharedos_sandbox::seccomp::{FilterMode, Insn, compile, install};

const CALLS: u32 = 200_000;

/// Nanoseconds per call of `f`, over `CALLS` calls.
fn per_call(f: impl Fn()) -> u64 {
    let t = Instant::now();
    for _ in 0..CALLS {
        f();
    }
    t.elapsed().as_nanos() as u64 / CALLS as u64
}

fn costs() -> [u64; 3] {
    // SAFETY: syscalls without side effects (the ioctl is on an invalid
    // fd, the number 1000 is unassigned).
    unsafe {
        [
            per_call(|| {
                libc::syscall(libc::SYS_getppid);
            }),
            per_call(|| {
                libc::syscall(libc::SYS_ioctl, -1, libc::FIONREAD, 0);
            }),
            per_call(|| {
                libc::syscall(1000);
            }),
        ]
    }
}

/// In a forked child: install `prog`, report the install time and the
/// per-syscall costs after it through a pipe.
fn child_run(prog: &[Insn]) -> [u64; 4] {
    let mut fds = [0i32; 2];
    // SAFETY: a pipe into a live array; fork of this single-threaded
    // example; the child writes to the pipe and leaves with _exit.
    unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        let pid = libc::fork();
        if pid == 0 {
            let t = Instant::now();
            let ok = install(prog).is_ok();
            let install_ns = if ok { t.elapsed().as_nanos() as u64 } else { 0 };
            let [a, b, c] = costs();
            let out = [install_ns, a, b, c];
            libc::write(fds[1], out.as_ptr().cast(), 32);
            libc::_exit(0);
        }
        libc::close(fds[1]);
        let mut out = [0u64; 4];
        libc::read(fds[0], out.as_mut_ptr().cast(), 32);
        libc::close(fds[0]);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
        out
    }
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let prog = compile(FilterMode::Namespace, MemfdPolicy::Deny).expect("compile");
    println!("filter: {} instructions (namespace mode)", prog.len());
    let runs: Vec<[u64; 4]> = (0..n).map(|_| child_run(&prog)).collect();
    let col = |i: usize| median(runs.iter().map(|r| r[i]).collect());
    let min = |i: usize| runs.iter().map(|r| r[i]).min().unwrap_or(0);
    println!(
        "install (seccomp(2) + NNP): min {} µs, median {} µs over {n} children",
        min(0) as f64 / 1000.0,
        col(0) as f64 / 1000.0
    );
    let [a, b, c] = costs();
    println!("per syscall, ns (without filter / with filter, medians):");
    println!("  getppid (always allowed, cached): {a} / {}", col(1));
    println!("  ioctl FIONREAD (argument check):   {b} / {}", col(2));
    println!("  unlisted nr 1000 (ENOSYS):         {c} / {}", col(3));
}
