//! Other processes: trace, read, signal, steal fds (sandbox.md C20–C26).
//!
//! Only the bait's `victim_pid` is ever traced or signalled. The host pid
//! (or our parent) is only read from.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::bait::Bait;
use crate::receipt::{Receipt, describe_errno, describe_io};
use crate::sys;

/// The process to read from: the bait's host pid, else the victim, else
/// our parent (the helper or the host).
fn read_target(bait: &Bait) -> i32 {
    // SAFETY: getppid cannot fail.
    bait.host_pid
        .or(bait.victim_pid)
        .unwrap_or_else(|| unsafe { libc::getppid() })
}

pub fn c20_ptrace_attach(bait: &Bait) -> Receipt {
    const A: &str = "C20-ptrace-attach";
    let Some(pid) = bait.victim_pid else {
        return Receipt::not_attempted(
            A,
            "no victim_pid in the bait (only the test's victim is ever traced)",
        );
    };
    let null = std::ptr::null_mut::<libc::c_void>();
    // SAFETY: PTRACE_ATTACH takes no pointers.
    if unsafe { libc::ptrace(libc::PTRACE_ATTACH, pid, null, null) } != 0 {
        return Receipt::blocked(
            A,
            format!(
                "blocked: PTRACE_ATTACH {pid}: {}",
                describe_errno(sys::errno())
            ),
        );
    }
    // Attached: wait for the attach stop, then let the victim go.
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut status = 0;
    while Instant::now() < deadline {
        // SAFETY: `status` is a valid out-pointer; the tracee is waitable by us.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::__WALL | libc::WNOHANG) };
        if r == pid || r < 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: PTRACE_DETACH with signal 0 takes no pointers.
    let detached = unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, null, null) } == 0;
    Receipt::succeeded(
        A,
        format!("succeeded: attached to {pid} (detached: {detached})"),
    )
}

/// The start of the first readable mapping of `pid`, if its maps are visible.
fn readable_address(pid: i32) -> Option<usize> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let line = maps.lines().find(|l| {
        l.split_whitespace()
            .nth(1)
            .is_some_and(|p| p.starts_with('r'))
    })?;
    usize::from_str_radix(line.split('-').next()?, 16).ok()
}

pub fn c21_process_vm_readv(bait: &Bait) -> Receipt {
    const A: &str = "C21-process-vm-readv";
    let pid = read_target(bait);
    let addr = readable_address(pid);
    let mut buf = [0u8; 16];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr.unwrap_or(0x400000) as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: one local iovec over our own live buffer; the remote address
    // is only dereferenced by the kernel in the target.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    let e = sys::errno();
    match (n, e) {
        (n, _) if n >= 0 => Receipt::succeeded(
            A,
            format!("succeeded: read {n} bytes of pid {pid}'s memory"),
        ),
        // EFAULT means the access check passed and only the address was bad.
        (_, libc::EFAULT) => Receipt::succeeded(
            A,
            format!("succeeded: access to pid {pid} granted (EFAULT on a guessed address)"),
        ),
        (_, e) => Receipt::blocked(
            A,
            format!("blocked: process_vm_readv pid {pid}: {}", describe_errno(e)),
        ),
    }
}

pub fn c22_proc_pid_files(bait: &Bait) -> Receipt {
    const A: &str = "C22-proc-pid-environ-mem-fd-cmdline";
    let pid = read_target(bait);
    let dir = format!("/proc/{pid}");
    let mut obs = Vec::new();
    let mut leaked = false;
    for name in ["environ", "cmdline"] {
        let p = Path::new(&dir).join(name);
        match sys::read_prefix(&p, 1 << 20) {
            Ok(b) => {
                leaked = true;
                let secrets = bait
                    .secret_env_names
                    .iter()
                    .filter(|n| {
                        b.windows(n.len() + 1)
                            .any(|w| w == format!("{n}=").as_bytes())
                    })
                    .count();
                obs.push(format!(
                    "{name}: read {} bytes ({secrets} bait secret names)",
                    b.len()
                ));
            }
            Err(e) => obs.push(format!("{name}: {}", describe_io(&e))),
        }
    }
    match sys::open(&Path::new(&dir).join("mem"), libc::O_RDONLY, 0) {
        Ok(_) => {
            leaked = true;
            obs.push("mem: opened".into());
        }
        Err(e) => obs.push(format!("mem: {}", describe_errno(e))),
    }
    match std::fs::read_dir(Path::new(&dir).join("fd")) {
        Ok(d) => {
            leaked = true;
            obs.push(format!("fd: listed {} entries", d.count()));
        }
        Err(e) => obs.push(format!("fd: {}", describe_io(&e))),
    }
    let verdict = if leaked { "succeeded" } else { "blocked" };
    Receipt::judged(
        A,
        !leaked,
        format!("{verdict}: pid {pid}: {}", obs.join("; ")),
    )
}

pub fn c23_count_processes(bait: &Bait) -> Receipt {
    const A: &str = "C23-see-other-processes";
    let pids: Vec<i32> = match std::fs::read_dir("/proc") {
        Ok(d) => d
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect(),
        Err(e) => return Receipt::blocked(A, format!("blocked: /proc: {}", describe_io(&e))),
    };
    let victim_seen = bait.victim_pid.is_some_and(|v| pids.contains(&v));
    // Our own sandbox holds the mini-init, us, and perhaps a child or two.
    let leaked = victim_seen || pids.len() > 4;
    let verdict = if leaked { "succeeded" } else { "blocked" };
    Receipt::judged(
        A,
        !leaked,
        format!(
            "{verdict}: {} processes visible in /proc, victim visible: {victim_seen}",
            pids.len()
        ),
    )
}

pub fn c24_kill_victim(bait: &Bait) -> Receipt {
    const A: &str = "C24-kill-victim";
    let Some(pid) = bait.victim_pid else {
        return Receipt::not_attempted(
            A,
            "no victim_pid in the bait (only the test's victim is ever signalled)",
        );
    };
    // SAFETY: kill with integer arguments; the victim is the test's own.
    if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
        Receipt::succeeded(A, format!("succeeded: SIGKILL delivered to {pid}"))
    } else {
        Receipt::blocked(
            A,
            format!(
                "blocked: kill({pid}, SIGKILL): {}",
                describe_errno(sys::errno())
            ),
        )
    }
}

/// capability(7) number of CAP_KILL.
const CAP_KILL: u32 = 5;

/// True when this process could signal the whole machine: root or
/// CAP_KILL in the initial user namespace, or no way to tell.
fn could_kill_the_machine() -> Option<String> {
    let map = match std::fs::read_to_string("/proc/self/uid_map") {
        Ok(m) => m,
        Err(e) => {
            return Some(format!(
                "cannot read /proc/self/uid_map ({})",
                describe_io(&e)
            ));
        }
    };
    let initial = map.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"];
    if !initial {
        return None;
    }
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    let cap_kill = sys::status_field("CapEff")
        .and_then(|c| u64::from_str_radix(&c, 16).ok())
        .is_some_and(|c| c & (1 << CAP_KILL) != 0);
    (euid == 0 || cap_kill)
        .then(|| format!("euid {euid}, CAP_KILL {cap_kill} in the initial user namespace"))
}

/// Most processes a private pid namespace of a sandboxed plugin shows
/// (its pid 1, itself, a few children).
const PRIVATE_PID_NS_MAX: usize = 8;

/// Some reason when this process may share its pid namespace with the
/// machine: a uid-mapped user namespace without a pid namespace would
/// still let `kill(-1)` reach every process of that uid (other sandboxes
/// included). Run only where `/proc` shows a small, private process list.
fn shares_the_hosts_pids() -> Option<String> {
    let pids = match std::fs::read_dir("/proc") {
        Ok(d) => d
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.parse::<u32>().is_ok())
            })
            .count(),
        Err(e) => return Some(format!("/proc is unreadable ({})", describe_io(&e))),
    };
    if pids == 0 {
        return Some("/proc lists no process (no pid namespace of our own?)".into());
    }
    (pids > PRIVATE_PID_NS_MAX).then(|| format!("/proc lists {pids} processes"))
}

pub fn c25_kill_everything(bait: &Bait) -> Receipt {
    const A: &str = "C25-kill-minus-one";
    if !bait.allow_kill_all {
        return Receipt::not_attempted(A, "refused: the bait does not set allow_kill_all");
    }
    if let Some(why) = could_kill_the_machine() {
        return Receipt::not_attempted(
            A,
            format!("refused: {why}; kill(-1) would reach the whole machine"),
        );
    }
    if let Some(why) = shares_the_hosts_pids() {
        return Receipt::not_attempted(
            A,
            format!(
                "refused: {why}; kill(-1) could reach every process of this uid on the machine"
            ),
        );
    }
    // SAFETY: kill with integer arguments; guarded above.
    let r = unsafe { libc::kill(-1, libc::SIGKILL) };
    let e = sys::errno();
    // kill(-1) returns 0 even when every target refused: only the host's
    // view of the victim decides.
    if r == 0 {
        Receipt::unjudged(
            A,
            "kill(-1, SIGKILL) returned 0 (the host checks the victim)",
        )
    } else {
        Receipt::blocked(
            A,
            format!("blocked: kill(-1, SIGKILL): {}", describe_errno(e)),
        )
    }
}

pub fn c26_pidfd_tricks(bait: &Bait) -> Receipt {
    const A: &str = "C26-pidfd-open-getfd-signal";
    let pid = bait.victim_pid.unwrap_or_else(|| read_target(bait));
    // SAFETY: pidfd_open(pid, 0) takes integers.
    let pidfd = match sys::owned(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) }) {
        Ok(fd) => fd,
        Err(e) => {
            return Receipt::blocked(
                A,
                format!("blocked: pidfd_open({pid}): {}", describe_errno(e)),
            );
        }
    };
    use std::os::fd::AsRawFd;
    let mut obs = vec![format!("pidfd_open({pid}) ok")];
    // Steal the target's stdin: a dup, closed at once.
    // SAFETY: pidfd_getfd(pidfd, targetfd, 0) takes integers.
    let stolen =
        sys::owned(unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), 0, 0) });
    let stole = stolen.is_ok();
    obs.push(match stolen {
        Ok(_) => "pidfd_getfd(0) stole the fd".into(),
        Err(e) => format!("pidfd_getfd: {}", describe_errno(e)),
    });
    // Signal 0: the full permission check, nothing delivered.
    // SAFETY: pidfd_send_signal(pidfd, 0, NULL, 0).
    let sig = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<u8>(),
            0,
        )
    };
    let signalled = sig == 0;
    obs.push(if signalled {
        "pidfd_send_signal(0) permitted".into()
    } else {
        format!("pidfd_send_signal: {}", describe_errno(sys::errno()))
    });
    let worked = stole || signalled;
    let verdict = if worked { "succeeded" } else { "blocked" };
    Receipt::judged(A, !worked, format!("{verdict}: {}", obs.join("; ")))
}
