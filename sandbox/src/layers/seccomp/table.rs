//! The syscall table of the plugin's filter: what is allowed, what is
//! refused and why, one line each. Anything not listed here returns
//! `ENOSYS`, so a syscall a future kernel adds is closed until it is
//! reviewed, and runtimes take the fallback they have for older kernels.
//!
//! The allowed set is what Python 3.11, Node 20, `/bin/sh` and the static
//! Rust plugins were seen to call under `strace -f -c` doing real work
//! (threads, processes, file I/O, timers, asyncio / promises, a Unix socket,
//! inotify), plus what the vendor CLIs need (a static Rust binary using
//! tokio that applies its own Landlock and seccomp; Node spawning ripgrep
//! and shells) and the libc entry points those programs reach on other
//! paths (the legacy x86_64 forms of the same calls).

use std::collections::BTreeMap;

use super::allowed::allowed;
use super::numbers as nr;
use crate::policy::MemfdPolicy;

/// Which filter to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilterMode {
    /// With namespaces: non-UNIX socket families denied.
    Namespace,
    /// With namespaces, for a runtime with an egress gateway: also TCP
    /// sockets (`AF_INET`, `SOCK_STREAM`, protocol 0 or TCP), which
    /// Landlock then lets connect to the gateway's port only.
    NamespaceEgress,
    /// Without a user namespace: no `socket()` at all, no SysV IPC, no
    /// POSIX mqueue, no `pidfd_open` (spec B.3, degraded mode).
    Strict,
}

/// What the filter answers for one syscall or one argument test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Action {
    Allow,
    Errno(i32),
}

/// What the filter does with one listed syscall. Arguments are compared on
/// their low 32 bits only: clone flags, socket domains, ioctl requests,
/// pids and personalities are 32-bit in the kernel, and comparing 64 bits
/// would let `TIOCSTI | 1 << 32` through (CVE-2019-10063).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Rule {
    /// The same answer whatever the arguments.
    Always(Action),
    /// `errno` when `arg` has any bit of `mask` set; allowed otherwise.
    DenyAnyBit { arg: u8, mask: u32, errno: i32 },
    /// `errno` when `arg` is one of `values`; allowed otherwise.
    DenyEq {
        arg: u8,
        values: Vec<u32>,
        errno: i32,
    },
    /// Allowed only when `arg` is one of `values`; `errno` otherwise.
    AllowOnlyEq {
        arg: u8,
        values: Vec<u32>,
        errno: i32,
    },
    /// `socket(2)` for the egress runtimes: allowed for `AF_UNIX`, and for
    /// `AF_INET` only with type `SOCK_STREAM` (flags aside) and protocol 0
    /// or `IPPROTO_TCP`; `errno` otherwise.
    UnixOrTcp { errno: i32 },
}

/// `SOCK_TYPE_MASK`: the type of `socket(2)` without `SOCK_NONBLOCK` /
/// `SOCK_CLOEXEC`.
pub(crate) const SOCK_TYPE_MASK: u32 = 0xf;

const EPERM: i32 = libc::EPERM;
const DENY: Rule = Rule::Always(Action::Errno(EPERM));
const ALLOW: Rule = Rule::Always(Action::Allow);

/// `personality(2)` values a plugin may pass: the query and plain Linux.
/// READ_IMPLIES_EXEC makes every readable mapping executable,
/// ADDR_NO_RANDOMIZE turns ASLR off for what it executes next, and the
/// other flags change the ABI under the filter's feet.
pub(crate) const PERSONALITY_QUERY: u32 = 0xffff_ffff;
pub(crate) const PER_LINUX: u32 = 0;

/// `MFD_EXEC`: an executable memfd (Linux 6.3).
pub(crate) const MFD_EXEC: u32 = 0x10;

pub(crate) const NS_FLAGS: [u64; 7] = [
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
];

fn ns_mask() -> u32 {
    NS_FLAGS.iter().fold(0, |m, f| m | *f as u32)
}

/// Refused with EPERM in every mode, each with what it would open.
fn denied() -> Vec<(i64, &'static str)> {
    use libc::*;
    let mut v = vec![
        (SYS_ptrace, "debug or inspect other processes"),
        (SYS_process_vm_readv, "read another process's memory"),
        (SYS_process_vm_writev, "write another process's memory"),
        (SYS_process_madvise, "act on another process's memory"),
        (SYS_kcmp, "compare kernel objects of other processes"),
        (SYS_pidfd_getfd, "steal fds from another process"),
        // io_uring ops (IORING_OP_SOCKET/OPENAT) bypass the socket filter.
        (SYS_io_uring_setup, "io_uring bypasses syscall filtering"),
        (SYS_io_uring_enter, "io_uring bypasses syscall filtering"),
        (SYS_io_uring_register, "io_uring bypasses syscall filtering"),
        (SYS_bpf, "eBPF: kernel attack surface"),
        (
            SYS_perf_event_open,
            "perf: kernel attack surface, side channels",
        ),
        (SYS_userfaultfd, "userfaultfd: exploitation primitive"),
        (SYS_keyctl, "kernel keyrings are not namespaced"),
        (SYS_add_key, "kernel keyrings are not namespaced"),
        (SYS_request_key, "kernel keyrings are not namespaced"),
        // The mount table and the root must stay as built.
        (SYS_mount, "change the mount table"),
        (SYS_umount2, "uncover hidden host mounts"),
        (SYS_pivot_root, "change the root"),
        (SYS_chroot, "change the root"),
        (SYS_move_mount, "new mount API"),
        (SYS_open_tree, "new mount API: clone a mount"),
        (
            nr::OPEN_TREE_ATTR,
            "new mount API: clone a mount with new attributes",
        ),
        (SYS_fsopen, "new mount API"),
        (SYS_fsmount, "new mount API"),
        (SYS_fsconfig, "new mount API"),
        (SYS_fspick, "new mount API"),
        (SYS_mount_setattr, "new mount API"),
        (nr::LISTMOUNT, "lists mounts, host paths of the binds"),
        (nr::STATMOUNT, "reads mount roots and sources: host paths"),
        (SYS_unshare, "nested namespaces regain capabilities"),
        (SYS_setns, "join other namespaces"),
        (SYS_kexec_load, "replace the kernel"),
        (SYS_kexec_file_load, "replace the kernel"),
        (SYS_init_module, "load kernel code"),
        (SYS_finit_module, "load kernel code"),
        (SYS_delete_module, "unload kernel code"),
        (SYS_reboot, "reboot the machine"),
        (SYS_swapon, "machine-wide swap"),
        (SYS_swapoff, "machine-wide swap"),
        (SYS_acct, "process accounting"),
        (SYS_quotactl, "filesystem quotas"),
        (nr::QUOTACTL_FD, "filesystem quotas through an fd"),
        (SYS_settimeofday, "the clock is not namespaced"),
        (SYS_clock_settime, "the clock is not namespaced"),
        (SYS_clock_adjtime, "the clock is not namespaced"),
        (SYS_adjtimex, "the clock is not namespaced"),
        (SYS_syslog, "kernel log: address leaks"),
        // File handles bypass path-based checks (the "shocker" escape).
        (SYS_name_to_handle_at, "file handles bypass path checks"),
        (SYS_open_by_handle_at, "file handles bypass path checks"),
        (SYS_lookup_dcookie, "kernel profiling interface"),
        (SYS_vhangup, "hang up the terminal of others"),
        (
            nr::MEMFD_SECRET,
            "memory hidden from the kernel: no bound, no dump",
        ),
        (
            nr::SETXATTRAT,
            "new xattr API, unreviewed; the fd forms suffice",
        ),
        (nr::GETXATTRAT, "new xattr API, unreviewed"),
        (nr::LISTXATTRAT, "new xattr API, unreviewed"),
        (nr::REMOVEXATTRAT, "new xattr API, unreviewed"),
        (nr::LSM_GET_SELF_ATTR, "LSM state of the host's policy"),
        (nr::LSM_SET_SELF_ATTR, "change own LSM labels"),
        (nr::LSM_LIST_MODULES, "which LSMs the host runs"),
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        (SYS_iopl, "raw I/O port access"),
        (SYS_ioperm, "raw I/O port access"),
        (SYS_uselib, "legacy loader, unneeded"),
        (
            SYS_modify_ldt,
            "16-bit segments: a long line of kernel bugs",
        ),
    ]);
    v
}

/// Refused with EPERM only in strict mode (no user, ipc, pid or network
/// namespace): without them these reach the host's objects.
fn strict_denied() -> Vec<(i64, &'static str)> {
    use libc::*;
    vec![
        (SYS_shmget, "host SysV shm without an ipc namespace"),
        (SYS_shmat, "host SysV shm without an ipc namespace"),
        (SYS_shmctl, "host SysV shm without an ipc namespace"),
        (SYS_shmdt, "host SysV shm without an ipc namespace"),
        (SYS_msgget, "host SysV queues without an ipc namespace"),
        (SYS_msgsnd, "host SysV queues without an ipc namespace"),
        (SYS_msgrcv, "host SysV queues without an ipc namespace"),
        (SYS_msgctl, "host SysV queues without an ipc namespace"),
        (SYS_semget, "host SysV semaphores without an ipc namespace"),
        (SYS_semop, "host SysV semaphores without an ipc namespace"),
        (
            SYS_semtimedop,
            "host SysV semaphores without an ipc namespace",
        ),
        (SYS_semctl, "host SysV semaphores without an ipc namespace"),
        (SYS_mq_open, "host POSIX mqueues without an ipc namespace"),
        (SYS_mq_unlink, "host POSIX mqueues without an ipc namespace"),
        (
            SYS_mq_timedsend,
            "host POSIX mqueues without an ipc namespace",
        ),
        (
            SYS_mq_timedreceive,
            "host POSIX mqueues without an ipc namespace",
        ),
        (SYS_mq_notify, "host POSIX mqueues without an ipc namespace"),
        (
            SYS_mq_getsetattr,
            "host POSIX mqueues without an ipc namespace",
        ),
        (
            SYS_pidfd_open,
            "pidfds of host processes without a pid namespace",
        ),
    ]
}

/// The rules of the plugin's filter for `mode`; every syscall not listed
/// gets the filter's default, `ENOSYS`.
pub(crate) fn rules(mode: FilterMode, memfd: MemfdPolicy) -> BTreeMap<u32, Rule> {
    let mut rules = BTreeMap::new();
    for (nr, _why) in allowed() {
        rules.insert(nr as u32, ALLOW);
    }
    // In namespace mode the ipc namespace is private (its size limits are
    // the uid layer's), and pidfds reach only the sandbox's own pids.
    for (nr, _why) in strict_denied() {
        let rule = match mode {
            FilterMode::Namespace | FilterMode::NamespaceEgress => ALLOW,
            FilterMode::Strict => DENY,
        };
        rules.insert(nr as u32, rule);
    }
    for (nr, _why) in denied() {
        rules.insert(nr as u32, DENY);
    }
    // clone: threads and fork, never a namespace flag. clone3 is answered
    // ENOSYS before this table (see the prologue).
    let clone = Rule::DenyAnyBit {
        arg: 0,
        mask: ns_mask(),
        errno: EPERM,
    };
    rules.insert(libc::SYS_clone as u32, clone);
    // ioctl: everything but terminal input injection (CVE-2017-5226) and
    // console control; FIONREAD, TCGETS and TIOCGWINSZ are needed by all.
    let ioctl = Rule::DenyEq {
        arg: 1,
        values: vec![libc::TIOCSTI as u32, libc::TIOCLINUX as u32],
        errno: EPERM,
    };
    rules.insert(libc::SYS_ioctl as u32, ioctl);
    // prlimit64: only on itself (pid 0), which is what glibc's
    // getrlimit/setrlimit pass; another pid would be pid 1's or a
    // sibling's limits. Raising a hard limit still needs a capability.
    let own_pid = Rule::AllowOnlyEq {
        arg: 0,
        values: vec![0],
        errno: EPERM,
    };
    rules.insert(libc::SYS_prlimit64 as u32, own_pid);
    // personality: the query and PER_LINUX only (see PERSONALITY_QUERY).
    let personality = Rule::AllowOnlyEq {
        arg: 0,
        values: vec![PER_LINUX, PERSONALITY_QUERY],
        errno: EPERM,
    };
    rules.insert(libc::SYS_personality as u32, personality);
    rules.insert(libc::SYS_memfd_create as u32, memfd_rule(memfd));
    // socketpair: only AF_UNIX pairs (nothing else is a pair anyway).
    let unix_only = Rule::AllowOnlyEq {
        arg: 0,
        values: vec![libc::AF_UNIX as u32],
        errno: EPERM,
    };
    rules.insert(libc::SYS_socketpair as u32, unix_only.clone());
    let socket = match mode {
        // Only AF_UNIX: this refuses AF_VSOCK, which is not namespaced and
        // reaches the hypervisor host, and AF_NETLINK / AF_PACKET /
        // AF_INET*, which are useless in the empty netns.
        FilterMode::Namespace => unix_only,
        // The egress gateway's runtimes: TCP as well, nothing else of
        // AF_INET (no UDP, no raw, no MPTCP); the empty netns holds only
        // the gateway's listener, and Landlock allows connecting to its
        // port only.
        FilterMode::NamespaceEgress => Rule::UnixOrTcp { errno: EPERM },
        // No netns: even AF_UNIX would reach host pathname sockets, which
        // Landlock < ABI 9 does not mediate. socketpair stays.
        FilterMode::Strict => DENY,
    };
    rules.insert(libc::SYS_socket as u32, socket);
    rules
}

/// `memfd_create` by policy. Refused by default: the pages of a memfd
/// that is never mapped count against no limit but `RLIMIT_FSIZE` per
/// file times the open files, so it would step around `RLIMIT_AS`.
/// ENOSYS, not EPERM: runtimes fall back to a file in `/dev/shm` or
/// `/tmp`, whose tmpfs has a size cap.
fn memfd_rule(memfd: MemfdPolicy) -> Rule {
    match memfd {
        MemfdPolicy::Deny => Rule::Always(Action::Errno(libc::ENOSYS)),
        MemfdPolicy::AllowNoExec => Rule::DenyAnyBit {
            arg: 1,
            mask: MFD_EXEC,
            errno: EPERM,
        },
    }
}

/// The rules of the test-only filter that emulates a host without user
/// namespaces (Docker's default profile refuses `unshare`/`clone` with
/// CLONE_NEWUSER). It is a denylist: its default is to allow.
pub(crate) fn emulation_rules() -> BTreeMap<u32, Rule> {
    let newuser = Rule::DenyAnyBit {
        arg: 0,
        mask: libc::CLONE_NEWUSER as u32,
        errno: EPERM,
    };
    BTreeMap::from([
        (libc::SYS_unshare as u32, newuser.clone()),
        (libc::SYS_clone as u32, newuser),
    ])
}

/// The three plain lists (allowed, denied, denied in strict mode), for
/// the tests that check no syscall is in two of them.
#[cfg(test)]
pub(crate) fn lists() -> [Vec<(i64, &'static str)>; 3] {
    [allowed(), denied(), strict_denied()]
}

#[cfg(test)]
/// How many syscalls the filter allows outright and how many it refuses
/// outright (the report's figures).
pub(crate) fn counts(rules: &BTreeMap<u32, Rule>) -> (usize, usize) {
    let allowed = rules.values().filter(|r| **r == ALLOW).count();
    let denied = rules
        .values()
        .filter(|r| matches!(r, Rule::Always(Action::Errno(_))))
        .count();
    (allowed, denied)
}
