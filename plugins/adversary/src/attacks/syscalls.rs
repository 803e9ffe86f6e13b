//! The syscall filter's newer refusals (sandbox.md C58 variants): the
//! mount and LSM introspection calls, another process's resource limits,
//! READ_IMPLIES_EXEC, memfd memory outside the bounds, and syscalls the
//! allowlist does not list at all.
//!
//! Every call is made with arguments that change nothing even where it is
//! let through (null pointers, invalid fds, a limit set to the value it
//! already has), so the unsandboxed run on a host is harmless.

use crate::bait::Bait;
use crate::receipt::{Receipt, describe_errno, describe_io};
use crate::sys;

/// Numbers from the unified table (the same on every architecture).
mod nr {
    pub const QUOTACTL_FD: i64 = 443;
    pub const MEMFD_SECRET: i64 = 447;
    pub const STATMOUNT: i64 = 457;
    pub const LISTMOUNT: i64 = 458;
    pub const LSM_GET_SELF_ATTR: i64 = 459;
    pub const LSM_SET_SELF_ATTR: i64 = 460;
    pub const LSM_LIST_MODULES: i64 = 461;
    pub const SETXATTRAT: i64 = 463;
    pub const GETXATTRAT: i64 = 464;
    pub const LISTXATTRAT: i64 = 465;
    pub const REMOVEXATTRAT: i64 = 466;
    pub const OPEN_TREE_ATTR: i64 = 467;
}

/// What a refusal by the filter looks like: EPERM for a listed denial,
/// ENOSYS for what the allowlist leaves out (or a kernel without it).
fn refused(errno: i32) -> bool {
    errno == libc::EPERM || errno == libc::ENOSYS
}

/// Runs `call`; a return of 0 or more, or an errno the kernel itself gives
/// (EFAULT, EBADF, EINVAL...), means the syscall reached the kernel.
fn attempt(name: &str, call: impl FnOnce() -> i64, obs: &mut Vec<String>) -> bool {
    let r = call();
    if r >= 0 {
        obs.push(format!("{name}: returned {r}"));
        return true;
    }
    let e = sys::errno();
    obs.push(format!("{name}: {}", describe_errno(e)));
    !refused(e)
}

pub fn c58a_mount_and_lsm_introspection(_: &Bait) -> Receipt {
    const A: &str = "C58a-mount-lsm-xattrat-syscalls";
    let mut obs = Vec::new();
    let mut reached = false;
    let null = std::ptr::null_mut::<u8>();
    // listmount(LSMT_ROOT) lists every mount of the namespace; statmount
    // on one would give its root and mount point: host paths of binds.
    let mut req = [0u64; 4];
    req[0] = 24; // mnt_id_req.size (version 0); spare 0
    req[1] = u64::MAX; // mnt_id = LSMT_ROOT
    let mut ids = [0u64; 16];
    // SAFETY: each call gets live buffers of the stated sizes, or null
    // pointers and invalid fds the kernel rejects without side effects.
    unsafe {
        reached |= attempt(
            "listmount",
            || libc::syscall(nr::LISTMOUNT, req.as_ptr(), ids.as_mut_ptr(), 16usize, 0),
            &mut obs,
        );
        reached |= attempt(
            "statmount",
            || libc::syscall(nr::STATMOUNT, req.as_ptr(), null, 0usize, 0),
            &mut obs,
        );
        reached |= attempt(
            "open_tree_attr",
            || libc::syscall(nr::OPEN_TREE_ATTR, -1, null, 0, null, 0usize),
            &mut obs,
        );
        reached |= attempt(
            "quotactl_fd",
            || libc::syscall(nr::QUOTACTL_FD, -1, 0, 0, null),
            &mut obs,
        );
        let mut size = 0u32;
        reached |= attempt(
            "lsm_list_modules",
            || libc::syscall(nr::LSM_LIST_MODULES, null, &mut size, 0),
            &mut obs,
        );
        reached |= attempt(
            "lsm_get_self_attr",
            || libc::syscall(nr::LSM_GET_SELF_ATTR, 100, null, &mut size, 0),
            &mut obs,
        );
        reached |= attempt(
            "lsm_set_self_attr",
            || libc::syscall(nr::LSM_SET_SELF_ATTR, 100, null, 0u32, 0),
            &mut obs,
        );
        for (name, n) in [
            ("setxattrat", nr::SETXATTRAT),
            ("getxattrat", nr::GETXATTRAT),
            ("listxattrat", nr::LISTXATTRAT),
            ("removexattrat", nr::REMOVEXATTRAT),
        ] {
            reached |= attempt(
                name,
                || libc::syscall(n, -1, null, 0, null, null, 0),
                &mut obs,
            );
        }
        let secret = libc::syscall(nr::MEMFD_SECRET, libc::O_CLOEXEC);
        reached |= attempt("memfd_secret", || secret, &mut obs);
        drop(sys::owned(secret));
        #[cfg(target_arch = "x86_64")]
        {
            // modify_ldt(0): read the LDT into a small buffer.
            let mut ldt = [0u8; 16];
            reached |= attempt(
                "modify_ldt(read)",
                || libc::syscall(libc::SYS_modify_ldt, 0, ldt.as_mut_ptr(), 16usize),
                &mut obs,
            );
        }
    }
    let verdict = if reached { "succeeded" } else { "blocked" };
    Receipt::judged(A, !reached, format!("{verdict}: {}", obs.join("; ")))
}

pub fn c58b_prlimit_pid_1(_: &Bait) -> Receipt {
    const A: &str = "C58b-prlimit64-on-pid-1";
    let mut old = libc::rlimit64 {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // Read pid 1's open-file limit, then set it to the value it has: the
    // same permission check as a change, and nothing changes.
    // SAFETY: prlimit64 with a live out-pointer and no new limit.
    let r = unsafe {
        libc::syscall(
            libc::SYS_prlimit64,
            1,
            libc::RLIMIT_NOFILE,
            std::ptr::null::<libc::rlimit64>(),
            &mut old,
        )
    };
    if r != 0 {
        let e = describe_errno(sys::errno());
        return Receipt::blocked(A, format!("blocked: reading pid 1's limits: {e}"));
    }
    // SAFETY: prlimit64 with a live in-pointer holding the limit just read.
    let w = unsafe {
        libc::syscall(
            libc::SYS_prlimit64,
            1,
            libc::RLIMIT_NOFILE,
            &old,
            std::ptr::null_mut::<libc::rlimit64>(),
        )
    };
    let (cur, max) = (old.rlim_cur, old.rlim_max);
    if w == 0 {
        Receipt::succeeded(
            A,
            format!("succeeded: pid 1's RLIMIT_NOFILE read ({cur}/{max}) and set (to the same)"),
        )
    } else {
        let e = describe_errno(sys::errno());
        Receipt::blocked(
            A,
            format!("blocked: read pid 1's RLIMIT_NOFILE ({cur}/{max}) but setting it: {e}"),
        )
    }
}

/// `READ_IMPLIES_EXEC`: every readable mapping becomes executable.
const READ_IMPLIES_EXEC: u64 = 0x0040_0000;

pub fn c58c_personality(_: &Bait) -> Receipt {
    const A: &str = "C58c-personality-read-implies-exec";
    // In a child: a personality sticks to the process and what it execs.
    let report = sys::in_child(|w| {
        // SAFETY: personality with a flag word, then the query.
        let (set, now) = unsafe {
            let set = libc::syscall(libc::SYS_personality, READ_IMPLIES_EXEC);
            let e = sys::errno();
            let now = libc::syscall(libc::SYS_personality, 0xffff_ffffu64);
            (if set < 0 { -e } else { 0 }, now)
        };
        w.put(set);
        w.put(now as i32);
        0
    });
    match report {
        Err(e) => Receipt::not_attempted(A, format!("fork failed: {}", describe_io(&e))),
        Ok(r) => match r.words.as_slice() {
            [0, now] if *now as u64 & READ_IMPLIES_EXEC != 0 => Receipt::succeeded(
                A,
                format!("succeeded: personality is now {now:#x} (in a child)"),
            ),
            [0, now] => Receipt::blocked(
                A,
                format!("blocked: the call returned but the personality is {now:#x}"),
            ),
            [e, _] => Receipt::blocked(A, format!("blocked: {}", describe_errno(-*e))),
            _ => Receipt::unjudged(A, format!("the probe child reported nothing ({})", r.exit)),
        },
    }
}

pub fn c58d_memfd(_: &Bait) -> Receipt {
    const A: &str = "C58d-memfd-outside-the-memory-bound";
    let mut obs = Vec::new();
    let mut reached = false;
    // MFD_CLOEXEC, then MFD_EXEC | MFD_CLOEXEC (an executable memfd).
    for (name, flags) in [("memfd_create", 1u32), ("memfd_create(MFD_EXEC)", 0x11)] {
        // SAFETY: a NUL-terminated name and a flag word; the fd is closed.
        let fd = unsafe { libc::syscall(libc::SYS_memfd_create, c"sharedos".as_ptr(), flags) };
        reached |= attempt(name, || fd, &mut obs);
        drop(sys::owned(fd));
    }
    let verdict = if reached { "succeeded" } else { "blocked" };
    Receipt::judged(A, !reached, format!("{verdict}: {}", obs.join("; ")))
}

pub fn c58e_unlisted_syscalls(_: &Bait) -> Receipt {
    const A: &str = "C58e-unlisted-syscalls-are-enosys";
    let mut obs = Vec::new();
    let mut reached = false;
    // Numbers no kernel has assigned yet, and a real syscall the allowlist
    // leaves out: all must answer ENOSYS, so a new kernel's additions are
    // closed until reviewed.
    for n in [470i64, 1000] {
        // SAFETY: an unassigned syscall number without arguments.
        let r = unsafe { libc::syscall(n) };
        let e = sys::errno();
        reached |= r >= 0 || e != libc::ENOSYS;
        obs.push(if r >= 0 {
            format!("syscall {n}: returned {r}")
        } else {
            format!("syscall {n}: {}", describe_errno(e))
        });
    }
    // fanotify_init(FAN_CLASS_NOTIF, O_RDONLY): an fd, closed right away.
    // SAFETY: two flag words.
    let fd = unsafe { libc::syscall(libc::SYS_fanotify_init, 0, libc::O_RDONLY) };
    let e = sys::errno();
    reached |= fd >= 0 || e != libc::ENOSYS;
    obs.push(if fd >= 0 {
        "fanotify_init: returned an fd".into()
    } else {
        format!("fanotify_init: {}", describe_errno(e))
    });
    drop(sys::owned(fd));
    let verdict = if reached { "succeeded" } else { "blocked" };
    Receipt::judged(A, !reached, format!("{verdict}: {}", obs.join("; ")))
}
