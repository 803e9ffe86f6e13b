//! Layer: seccomp, applied last, just before `execve`.
//!
//! The filter is a narrow denylist (default allow): the namespaces are the
//! primary boundary, and an allowlist cannot be maintained for arbitrary
//! vendor CLIs (Node, Python, Go, the JVM, Chromium). It is compiled once
//! per host process and handed to the helper, which installs it with one
//! `seccomp(2)` call.
//!
//! The program is emitted here rather than by `seccompiler`: after the
//! architecture check, an x32 guard (`nr >= 0x40000000` → EPERM) and
//! `clone3` → ENOSYS, the listed syscalls are found by binary search, not
//! one comparison after the other. The kernel evaluates a new filter for
//! every syscall number at install time (its constant-action cache), so
//! the linear program `seccompiler` emits cost ~0.2 ms per spawn on its
//! own. The verdicts are unit-tested with a small BPF interpreter, and
//! checked equal to the `seccompiler` program for every syscall number.
//!
//! Deliberately **not** denied: `sendto`, `sendmsg`, `recvmsg`,
//! `setsockopt`, `getsockopt`, `bind`, `listen`, `accept`, `getsockname`.
//! Denying them broke Node `spawnSync`, Python asyncio, the Python 3.14
//! forkserver and Chromium in Codex (openai/codex#41175, #24933, #24943,
//! #47452); inside an empty network namespace they reach nothing anyway,
//! and in strict mode `socket()` itself is denied.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// One classic BPF instruction, serializable so the host can hand the
/// compiled program to the helper inside the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Insn(pub u16, pub u8, pub u8, pub u32);

/// Which filter to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilterMode {
    /// With namespaces: non-UNIX socket families denied.
    Namespace,
    /// Without a user namespace: no `socket()` at all, no SysV IPC, no
    /// POSIX mqueue, no `pidfd_open` (spec B.3, degraded mode).
    Strict,
}

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x15;
const BPF_JMP_JGE_K: u16 = 0x35;
const BPF_RET_K: u16 = 0x06;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
/// Offset of `nr` in `struct seccomp_data`.
const NR_OFFSET: u32 = 0;
/// x32 syscalls carry this bit in `nr` on x86_64.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

pub(crate) fn arch_name() -> &'static str {
    std::env::consts::ARCH
}

/// Syscalls denied in every mode, each with why.
fn always_denied() -> Vec<(libc::c_long, &'static str)> {
    let mut v = vec![
        // Reading or writing another process's memory, or tracing it.
        (libc::SYS_ptrace, "debug/inspect other processes"),
        (libc::SYS_process_vm_readv, "read another process's memory"),
        (
            libc::SYS_process_vm_writev,
            "write another process's memory",
        ),
        (libc::SYS_process_madvise, "act on another process's memory"),
        (libc::SYS_kcmp, "compare kernel objects of other processes"),
        (libc::SYS_pidfd_getfd, "steal fds from another process"),
        // io_uring ops (IORING_OP_SOCKET/OPENAT) bypass the socket filter.
        (
            libc::SYS_io_uring_setup,
            "io_uring bypasses syscall filtering",
        ),
        (
            libc::SYS_io_uring_enter,
            "io_uring bypasses syscall filtering",
        ),
        (
            libc::SYS_io_uring_register,
            "io_uring bypasses syscall filtering",
        ),
        // Large kernel attack surface, never needed by a plugin.
        (libc::SYS_bpf, "eBPF: kernel attack surface"),
        (
            libc::SYS_perf_event_open,
            "perf: kernel attack surface, side channels",
        ),
        (libc::SYS_userfaultfd, "userfaultfd: exploitation primitive"),
        (libc::SYS_keyctl, "kernel keyrings are not namespaced"),
        (libc::SYS_add_key, "kernel keyrings are not namespaced"),
        (libc::SYS_request_key, "kernel keyrings are not namespaced"),
        // Mount table changes: the minimal root must stay as built.
        (libc::SYS_mount, "change the mount table"),
        (libc::SYS_umount2, "uncover hidden host mounts"),
        (libc::SYS_pivot_root, "change the root"),
        (libc::SYS_chroot, "change the root"),
        (libc::SYS_move_mount, "new mount API"),
        (libc::SYS_open_tree, "new mount API"),
        (libc::SYS_fsopen, "new mount API"),
        (libc::SYS_fsmount, "new mount API"),
        (libc::SYS_fsconfig, "new mount API"),
        (libc::SYS_fspick, "new mount API"),
        (libc::SYS_mount_setattr, "new mount API"),
        // New namespaces would hand the plugin fresh capabilities.
        (libc::SYS_unshare, "nested namespaces regain capabilities"),
        (libc::SYS_setns, "join other namespaces"),
        // Whole-machine operations.
        (libc::SYS_kexec_load, "replace the kernel"),
        (libc::SYS_kexec_file_load, "replace the kernel"),
        (libc::SYS_init_module, "load kernel code"),
        (libc::SYS_finit_module, "load kernel code"),
        (libc::SYS_delete_module, "unload kernel code"),
        (libc::SYS_reboot, "reboot the machine"),
        (libc::SYS_swapon, "machine-wide swap"),
        (libc::SYS_swapoff, "machine-wide swap"),
        (libc::SYS_acct, "process accounting"),
        (libc::SYS_quotactl, "filesystem quotas"),
        (libc::SYS_settimeofday, "the clock is not namespaced"),
        (libc::SYS_clock_settime, "the clock is not namespaced"),
        (libc::SYS_clock_adjtime, "the clock is not namespaced"),
        (libc::SYS_adjtimex, "the clock is not namespaced"),
        (libc::SYS_syslog, "kernel log: address leaks"),
        // File handles bypass path-based checks (the "shocker" escape).
        (
            libc::SYS_name_to_handle_at,
            "file handles bypass path checks",
        ),
        (
            libc::SYS_open_by_handle_at,
            "file handles bypass path checks",
        ),
        (libc::SYS_lookup_dcookie, "kernel profiling interface"),
        (libc::SYS_vhangup, "hang up the terminal of others"),
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        (libc::SYS_iopl, "raw I/O port access"),
        (libc::SYS_ioperm, "raw I/O port access"),
        (libc::SYS_uselib, "legacy loader, unneeded"),
    ]);
    v
}

/// Syscalls denied only in strict mode (no user namespace), each with why.
fn strict_denied() -> Vec<(libc::c_long, &'static str)> {
    vec![
        // SysV IPC and POSIX mqueues are shared with the host without an ipc ns.
        (libc::SYS_shmget, "host SysV shm without an ipc namespace"),
        (libc::SYS_shmat, "host SysV shm without an ipc namespace"),
        (libc::SYS_shmctl, "host SysV shm without an ipc namespace"),
        (libc::SYS_shmdt, "host SysV shm without an ipc namespace"),
        (
            libc::SYS_msgget,
            "host SysV queues without an ipc namespace",
        ),
        (
            libc::SYS_msgsnd,
            "host SysV queues without an ipc namespace",
        ),
        (
            libc::SYS_msgrcv,
            "host SysV queues without an ipc namespace",
        ),
        (
            libc::SYS_msgctl,
            "host SysV queues without an ipc namespace",
        ),
        (
            libc::SYS_semget,
            "host SysV semaphores without an ipc namespace",
        ),
        (
            libc::SYS_semop,
            "host SysV semaphores without an ipc namespace",
        ),
        (
            libc::SYS_semtimedop,
            "host SysV semaphores without an ipc namespace",
        ),
        (
            libc::SYS_semctl,
            "host SysV semaphores without an ipc namespace",
        ),
        (
            libc::SYS_mq_open,
            "host POSIX mqueues without an ipc namespace",
        ),
        // Host pids are visible without a pid namespace.
        (
            libc::SYS_pidfd_open,
            "pidfds of host processes without a pid namespace",
        ),
    ]
}

const NS_FLAGS: [u64; 7] = [
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
];

/// What the filter does with one syscall; every syscall not listed is
/// allowed. Arguments are compared on their low 32 bits only: clone flags,
/// socket domains and ioctl requests are 32-bit in the kernel, and comparing
/// 64 bits would let `TIOCSTI | 1 << 32` through (CVE-2019-10063).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Rule {
    /// EPERM whatever the arguments.
    Deny,
    /// EPERM when `arg` has any bit of `mask` set.
    DenyAnyBit { arg: u8, mask: u32 },
    /// EPERM when `arg` is one of `values`.
    DenyEq { arg: u8, values: Vec<u32> },
    /// EPERM unless `arg` is `value`.
    AllowOnlyEq { arg: u8, value: u32 },
}

fn ns_mask() -> u32 {
    NS_FLAGS.iter().fold(0, |m, f| m | *f as u32)
}

/// The rules of the plugin's filter for `mode`.
fn rules(mode: FilterMode) -> BTreeMap<u32, Rule> {
    let mut rules = BTreeMap::new();
    for (nr, _why) in always_denied() {
        rules.insert(nr as u32, Rule::Deny);
    }
    // clone: deny any namespace flag.
    rules.insert(
        libc::SYS_clone as u32,
        Rule::DenyAnyBit {
            arg: 0,
            mask: ns_mask(),
        },
    );
    // ioctl: terminal input injection (CVE-2017-5226) and console control.
    rules.insert(
        libc::SYS_ioctl as u32,
        Rule::DenyEq {
            arg: 1,
            values: vec![libc::TIOCSTI as u32, libc::TIOCLINUX as u32],
        },
    );
    // socketpair: only AF_UNIX pairs (no network reachable through it anyway,
    // but there is no reason to allow anything else).
    let unix_only = Rule::AllowOnlyEq {
        arg: 0,
        value: libc::AF_UNIX as u32,
    };
    rules.insert(libc::SYS_socketpair as u32, unix_only.clone());
    match mode {
        FilterMode::Namespace => {
            // socket: only AF_UNIX. This denies AF_VSOCK, which is not
            // namespaced and reaches the hypervisor host, and AF_NETLINK /
            // AF_PACKET / AF_INET*, which are useless in the empty netns.
            rules.insert(libc::SYS_socket as u32, unix_only);
        }
        FilterMode::Strict => {
            // No netns: even AF_UNIX would reach host pathname sockets,
            // which Landlock < ABI 9 does not mediate. socketpair stays.
            rules.insert(libc::SYS_socket as u32, Rule::Deny);
            for (nr, _why) in strict_denied() {
                rules.insert(nr as u32, Rule::Deny);
            }
        }
    }
    rules
}

/// The rules of the test-only filter that emulates a host without user
/// namespaces (Docker's default profile refuses `unshare`/`clone` with
/// CLONE_NEWUSER).
fn emulation_rules() -> BTreeMap<u32, Rule> {
    let newuser = Rule::DenyAnyBit {
        arg: 0,
        mask: libc::CLONE_NEWUSER as u32,
    };
    BTreeMap::from([
        (libc::SYS_unshare as u32, newuser.clone()),
        (libc::SYS_clone as u32, newuser),
    ])
}

/// Build the plugin's filter for `mode`. Compiled once per process: the
/// program only depends on `mode` and the architecture.
pub fn compile(mode: FilterMode) -> Result<Vec<Insn>, String> {
    static NAMESPACE: OnceLock<Result<Vec<Insn>, String>> = OnceLock::new();
    static STRICT: OnceLock<Result<Vec<Insn>, String>> = OnceLock::new();
    let cell = match mode {
        FilterMode::Namespace => &NAMESPACE,
        FilterMode::Strict => &STRICT,
    };
    cell.get_or_init(|| emit(&rules(mode))).clone()
}

/// The test-only filter that emulates a host without user namespaces.
pub fn compile_no_userns_emulation() -> Result<Vec<Insn>, String> {
    emit(&emulation_rules())
}

const BPF_ALU_AND_K: u16 = 0x54;
const BPF_JMP_JA: u16 = 0x05;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
/// Offset of `arch` in `struct seccomp_data`.
const ARCH_OFFSET: u32 = 4;
/// `AUDIT_ARCH_*` of the target.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;
#[cfg(target_arch = "riscv64")]
const AUDIT_ARCH: u32 = 0xC000_00F3;
/// Up to this many syscalls are matched one after the other; above it the
/// set is split in two by a `>=` comparison.
const LINEAR_MAX: usize = 4;

// The low 32 bits of an argument are at offset 16 + 8 * i only on a
// little-endian machine.
const _: () = assert!(cfg!(target_endian = "little"));

fn arg_low(arg: u8) -> u32 {
    16 + 8 * arg as u32
}

fn ret(v: u32) -> Insn {
    Insn(BPF_RET_K, 0, 0, v)
}

fn jump(off: usize) -> Result<u8, String> {
    u8::try_from(off).map_err(|_| format!("conditional jump of {off} instructions"))
}

/// What the filter runs for one listed syscall (the accumulator holds the
/// syscall number on entry; every path returns).
fn body(rule: &Rule) -> Vec<Insn> {
    let eperm = ret(SECCOMP_RET_ERRNO | libc::EPERM as u32);
    let allow = ret(SECCOMP_RET_ALLOW);
    match rule {
        Rule::Deny => vec![eperm],
        Rule::DenyAnyBit { arg, mask } => vec![
            Insn(BPF_LD_W_ABS, 0, 0, arg_low(*arg)),
            Insn(BPF_ALU_AND_K, 0, 0, *mask),
            Insn(BPF_JMP_JEQ_K, 0, 1, 0),
            allow,
            eperm,
        ],
        Rule::DenyEq { arg, values } => {
            let mut v = vec![Insn(BPF_LD_W_ABS, 0, 0, arg_low(*arg))];
            for x in values {
                v.push(Insn(BPF_JMP_JEQ_K, 0, 1, *x));
                v.push(eperm);
            }
            v.push(allow);
            v
        }
        Rule::AllowOnlyEq { arg, value } => vec![
            Insn(BPF_LD_W_ABS, 0, 0, arg_low(*arg)),
            Insn(BPF_JMP_JEQ_K, 0, 1, *value),
            allow,
            eperm,
        ],
    }
}

/// A binary search over the listed syscall numbers: every syscall reaches
/// its verdict in O(log n) instructions. This matters at install time: the
/// kernel (>= 5.11) runs the filter once per syscall number to find the
/// ones it can always allow, and a linear denylist made that walk, not the
/// filter itself, the most expensive part of the spawn's seccomp layer.
fn tree(rules: &[(u32, &Rule)]) -> Result<Vec<Insn>, String> {
    if rules.len() <= LINEAR_MAX {
        let mut out = Vec::new();
        for (nr, rule) in rules {
            let b = body(rule);
            out.push(Insn(BPF_JMP_JEQ_K, 0, jump(b.len())?, *nr));
            out.extend(b);
        }
        out.push(ret(SECCOMP_RET_ALLOW));
        return Ok(out);
    }
    let (left, right) = rules.split_at(rules.len() / 2);
    let (l, r) = (tree(left)?, tree(right)?);
    // nr >= pivot: the next instruction jumps over the left half.
    let mut out = vec![
        Insn(BPF_JMP_JGE_K, 0, 1, right[0].0),
        Insn(BPF_JMP_JA, 0, 0, l.len() as u32),
    ];
    out.extend(l);
    out.extend(r);
    Ok(out)
}

fn emit(rules: &BTreeMap<u32, Rule>) -> Result<Vec<Insn>, String> {
    let mut out = vec![
        Insn(BPF_LD_W_ABS, 0, 0, ARCH_OFFSET),
        Insn(BPF_JMP_JEQ_K, 1, 0, AUDIT_ARCH),
        ret(SECCOMP_RET_KILL_PROCESS),
    ];
    out.extend(prologue());
    let listed: Vec<(u32, &Rule)> = rules.iter().map(|(nr, r)| (*nr, r)).collect();
    out.extend(tree(&listed)?);
    if out.len() >= 4096 {
        return Err(format!("filter too large: {} instructions", out.len()));
    }
    Ok(out)
}

/// The instructions after the arch check: load the syscall number, then
/// the guards that come before any per-syscall rule.
fn prologue() -> Vec<Insn> {
    let mut p = vec![Insn(BPF_LD_W_ABS, 0, 0, NR_OFFSET)];
    if cfg!(target_arch = "x86_64") {
        // x32 guard: on kernels with CONFIG_X86_X32_ABI the same arch value
        // carries x32 syscall numbers (nr | 0x40000000), which would miss
        // every rule of a denylist.
        p.push(Insn(BPF_JMP_JGE_K, 0, 1, X32_SYSCALL_BIT));
        p.push(Insn(
            BPF_RET_K,
            0,
            0,
            SECCOMP_RET_ERRNO | libc::EPERM as u32,
        ));
    }
    // clone3 passes its flags in a struct seccomp cannot read: ENOSYS makes
    // libc fall back to clone(2), whose flags the filter checks.
    p.push(Insn(BPF_JMP_JEQ_K, 0, 1, libc::SYS_clone3 as u32));
    p.push(Insn(
        BPF_RET_K,
        0,
        0,
        SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
    ));
    p
}

/// Whether the program carries the x32 guard (for the report).
pub fn has_x32_guard(prog: &[Insn]) -> bool {
    prog.iter()
        .any(|i| i.0 == BPF_JMP_JGE_K && i.3 == X32_SYSCALL_BIT)
}

/// Install `prog` on the calling thread (the helper is single-threaded).
/// Also sets no_new_privs, which an unprivileged filter requires.
pub fn install(prog: &[Insn]) -> std::io::Result<()> {
    let bpf: Vec<seccompiler::sock_filter> = prog
        .iter()
        .map(|i| seccompiler::sock_filter {
            code: i.0,
            jt: i.1,
            jf: i.2,
            k: i.3,
        })
        .collect();
    seccompiler::apply_filter(&bpf).map_err(|e| match e {
        seccompiler::Error::Prctl(io) | seccompiler::Error::Seccomp(io) => io,
        other => std::io::Error::other(other.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run a classic BPF program over a `seccomp_data` (nr, arch, ip, args).
    /// Supports exactly the instructions seccompiler and the prologue emit.
    fn run(prog: &[Insn], nr: u32, args: [u64; 6]) -> u32 {
        let arch: u32 = if cfg!(target_arch = "x86_64") {
            0xC000_003E
        } else {
            0xC000_00B7
        };
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_ne_bytes());
        data[4..8].copy_from_slice(&arch.to_ne_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
        }
        let (mut acc, mut pc) = (0u32, 0usize);
        loop {
            let Insn(code, jt, jf, k) = prog[pc];
            pc += 1;
            match code {
                0x20 => {
                    let o = k as usize;
                    acc = u32::from_ne_bytes(data[o..o + 4].try_into().unwrap())
                }
                0x54 => acc &= k,
                0x05 => pc += k as usize,
                0x15 => pc += if acc == k { jt } else { jf } as usize,
                0x25 => pc += if acc > k { jt } else { jf } as usize,
                0x35 => pc += if acc >= k { jt } else { jf } as usize,
                0x06 => return k,
                other => panic!("unsupported BPF op {other:#x}"),
            }
        }
    }

    const ALLOW: u32 = 0x7fff_0000;
    const EPERM: u32 = SECCOMP_RET_ERRNO | libc::EPERM as u32;

    /// The same rules compiled by `seccompiler` (linear), with the x32 and
    /// clone3 guards spliced after its arch check: the reference the
    /// emitted program must agree with.
    fn reference(rules: &BTreeMap<u32, Rule>) -> Vec<Insn> {
        use seccompiler::{
            SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as Cond,
            SeccompFilter, SeccompRule, TargetArch,
        };
        #[cfg(target_arch = "x86_64")]
        const ARCH: TargetArch = TargetArch::x86_64;
        #[cfg(target_arch = "aarch64")]
        const ARCH: TargetArch = TargetArch::aarch64;
        #[cfg(target_arch = "riscv64")]
        const ARCH: TargetArch = TargetArch::riscv64;
        let cond = |arg: u8, op: Op, v: u64| Cond::new(arg, Len::Dword, op, v).unwrap();
        let rule = |c: Vec<Cond>| SeccompRule::new(c).unwrap();
        let mut map: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
        for (nr, r) in rules {
            let v = match r {
                Rule::Deny => vec![],
                // One masked rule per bit: seccompiler has no "any bit".
                Rule::DenyAnyBit { arg, mask } => (0..32)
                    .map(|b| 1u64 << b)
                    .filter(|b| *b & *mask as u64 != 0)
                    .map(|b| rule(vec![cond(*arg, Op::MaskedEq(b), b)]))
                    .collect(),
                Rule::DenyEq { arg, values } => values
                    .iter()
                    .map(|v| rule(vec![cond(*arg, Op::Eq, *v as u64)]))
                    .collect(),
                Rule::AllowOnlyEq { arg, value } => {
                    vec![rule(vec![cond(*arg, Op::Ne, *value as u64)])]
                }
            };
            map.insert(*nr as i64, v);
        }
        let filter = SeccompFilter::new(
            map,
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
            ARCH,
        )
        .unwrap();
        let prog: seccompiler::BpfProgram = filter.try_into().unwrap();
        let mut out: Vec<Insn> = prog.iter().map(|i| Insn(i.code, i.jt, i.jf, i.k)).collect();
        out.splice(3..3, prologue());
        out
    }

    #[test]
    fn emitted_program_agrees_with_seccompiler_for_every_syscall() {
        let sigchld = libc::SIGCHLD as u64;
        let mut argsets: Vec<[u64; 6]> = vec![[0; 6], [sigchld, 0, 0, 0, 0, 0]];
        for f in NS_FLAGS {
            argsets.push([f | sigchld, 0, 0, 0, 0, 0]);
            argsets.push([f | 1 << 40, 0, 0, 0, 0, 0]);
        }
        for a0 in [1u64, 2, 10, 16, 17, 40, 1 | 1 << 32, 2 | 1 << 32] {
            argsets.push([a0, 1, 0, 0, 0, 0]);
        }
        for req in [
            libc::TIOCSTI,
            libc::TIOCLINUX,
            libc::TIOCSTI | 1 << 32,
            libc::FIONREAD,
            libc::TIOCGWINSZ,
        ] {
            argsets.push([0, req, 0, 0, 0, 0]);
        }
        for (rules, name) in [
            (rules(FilterMode::Namespace), "namespace"),
            (rules(FilterMode::Strict), "strict"),
            (emulation_rules(), "emulation"),
        ] {
            let ours = emit(&rules).unwrap();
            let theirs = reference(&rules);
            assert!(ours.len() < theirs.len(), "{name}: {} insns", ours.len());
            let mut nrs: Vec<u32> = (0..1024).collect();
            nrs.extend([X32_SYSCALL_BIT, X32_SYSCALL_BIT | 39, u32::MAX]);
            for nr in nrs {
                for a in &argsets {
                    assert_eq!(
                        run(&ours, nr, *a),
                        run(&theirs, nr, *a),
                        "{name}: nr {nr} args {a:?}"
                    );
                }
            }
        }
    }

    /// How many instructions the filter runs before its verdict, at most,
    /// over every syscall number (what the kernel's install-time walk pays).
    #[test]
    fn every_verdict_is_a_short_walk() {
        let p = compile(FilterMode::Strict).unwrap();
        for nr in 0..1024u32 {
            let (mut pc, mut steps, mut acc) = (0usize, 0, 0u32);
            loop {
                let Insn(code, jt, jf, k) = p[pc];
                steps += 1;
                pc += 1;
                match code {
                    0x20 if k == NR_OFFSET => acc = nr,
                    0x20 => acc = 0,
                    0x54 => acc &= k,
                    0x05 => pc += k as usize,
                    0x15 => pc += if acc == k { jt } else { jf } as usize,
                    0x35 => pc += if acc >= k { jt } else { jf } as usize,
                    0x06 => break,
                    other => panic!("unexpected op {other:#x}"),
                }
            }
            assert!(steps <= 32, "nr {nr}: {steps} instructions");
        }
    }

    #[test]
    fn denylist_verdicts() {
        let p = compile(FilterMode::Namespace).unwrap();
        let nr = |n: libc::c_long| n as u32;
        assert_eq!(run(&p, nr(libc::SYS_getpid), [0; 6]), ALLOW);
        assert_eq!(run(&p, nr(libc::SYS_ptrace), [0; 6]), EPERM);
        assert_eq!(
            run(&p, nr(libc::SYS_clone3), [0; 6]),
            SECCOMP_RET_ERRNO | libc::ENOSYS as u32
        );
        let unix = libc::AF_UNIX as u64;
        let vsock = libc::AF_VSOCK as u64;
        assert_eq!(run(&p, nr(libc::SYS_socket), [unix, 1, 0, 0, 0, 0]), ALLOW);
        assert_eq!(run(&p, nr(libc::SYS_socket), [vsock, 1, 0, 0, 0, 0]), EPERM);
        assert_eq!(run(&p, nr(libc::SYS_socket), [2, 1, 0, 0, 0, 0]), EPERM);
        // TIOCSTI with garbage in the upper 32 bits is still denied.
        let tiocsti = libc::TIOCSTI;
        assert_eq!(
            run(&p, nr(libc::SYS_ioctl), [0, tiocsti, 0, 0, 0, 0]),
            EPERM
        );
        assert_eq!(
            run(&p, nr(libc::SYS_ioctl), [0, tiocsti | 1 << 32, 0, 0, 0, 0]),
            EPERM
        );
        assert_eq!(
            run(&p, nr(libc::SYS_ioctl), [0, libc::FIONREAD, 0, 0, 0, 0]),
            ALLOW
        );
        // Plain fork-style clone passes; a namespace flag does not.
        let sigchld = libc::SIGCHLD as u64;
        assert_eq!(
            run(&p, nr(libc::SYS_clone), [sigchld, 0, 0, 0, 0, 0]),
            ALLOW
        );
        let newuser = libc::CLONE_NEWUSER as u64 | sigchld;
        assert_eq!(
            run(&p, nr(libc::SYS_clone), [newuser, 0, 0, 0, 0, 0]),
            EPERM
        );
        // sendto/setsockopt stay allowed on purpose.
        assert_eq!(run(&p, nr(libc::SYS_sendto), [0; 6]), ALLOW);
        assert_eq!(run(&p, nr(libc::SYS_setsockopt), [0; 6]), ALLOW);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn x32_guard_denies_x32_numbers() {
        let p = compile(FilterMode::Namespace).unwrap();
        assert!(has_x32_guard(&p));
        // getpid via the x32 ABI would otherwise miss every rule.
        let x32_ptrace = libc::SYS_ptrace as u32 | X32_SYSCALL_BIT;
        assert_eq!(run(&p, x32_ptrace, [0; 6]), EPERM);
        assert_eq!(
            run(&p, libc::SYS_getpid as u32 | X32_SYSCALL_BIT, [0; 6]),
            EPERM
        );
    }

    #[test]
    fn strict_mode_denies_every_socket_and_sysv() {
        let p = compile(FilterMode::Strict).unwrap();
        let nr = |n: libc::c_long| n as u32;
        let unix = libc::AF_UNIX as u64;
        assert_eq!(run(&p, nr(libc::SYS_socket), [unix, 1, 0, 0, 0, 0]), EPERM);
        assert_eq!(
            run(&p, nr(libc::SYS_socketpair), [unix, 1, 0, 0, 0, 0]),
            ALLOW
        );
        assert_eq!(run(&p, nr(libc::SYS_shmget), [0; 6]), EPERM);
        assert_eq!(run(&p, nr(libc::SYS_pidfd_open), [0; 6]), EPERM);
    }

    #[test]
    fn emulation_filter_only_refuses_newuser() {
        let p = compile_no_userns_emulation().unwrap();
        let nr = libc::SYS_unshare as u32;
        assert_eq!(
            run(&p, nr, [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0]),
            EPERM
        );
        assert_eq!(
            run(&p, nr, [libc::CLONE_NEWNS as u64, 0, 0, 0, 0, 0]),
            ALLOW
        );
    }
}
