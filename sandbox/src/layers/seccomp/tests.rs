use std::collections::{BTreeMap, BTreeSet};

use super::emit::{self, AUDIT_ARCH, NR_OFFSET, SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO};
use super::numbers as nr;
use super::table::{self, MFD_EXEC, NS_FLAGS, PERSONALITY_QUERY, Rule};
use super::*;

/// Run a classic BPF program over a `seccomp_data` (nr, arch, ip, args).
/// Supports exactly the instructions seccompiler and the emitter emit.
fn run(prog: &[Insn], nr: u32, args: [u64; 6]) -> u32 {
    let mut data = [0u8; 64];
    data[0..4].copy_from_slice(&nr.to_ne_bytes());
    data[4..8].copy_from_slice(&AUDIT_ARCH.to_ne_bytes());
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

const ALLOW: u32 = SECCOMP_RET_ALLOW;
const EPERM: u32 = SECCOMP_RET_ERRNO | libc::EPERM as u32;
const ENOSYS: u32 = SECCOMP_RET_ERRNO | libc::ENOSYS as u32;

/// The errnos a rule can answer, with the seccompiler conditions (ORed
/// rules of ANDed conditions) under which it does.
fn denials(r: &Rule) -> Vec<(i32, Vec<seccompiler::SeccompRule>)> {
    use seccompiler::{
        SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as Cond, SeccompRule,
    };
    let cond = |arg: u8, op: Op, v: u64| Cond::new(arg, Len::Dword, op, v).unwrap();
    let rule = |c: Vec<Cond>| SeccompRule::new(c).unwrap();
    match r {
        Rule::Always(Action::Allow) => vec![],
        Rule::Always(Action::Errno(e)) => vec![(*e, vec![])],
        // One masked rule per bit: seccompiler has no "any bit".
        Rule::DenyAnyBit { arg, mask, errno } => vec![(
            *errno,
            (0..32)
                .map(|b| 1u64 << b)
                .filter(|b| *b & *mask as u64 != 0)
                .map(|b| rule(vec![cond(*arg, Op::MaskedEq(b), b)]))
                .collect(),
        )],
        Rule::DenyEq { arg, values, errno } => vec![(
            *errno,
            values
                .iter()
                .map(|v| rule(vec![cond(*arg, Op::Eq, *v as u64)]))
                .collect(),
        )],
        Rule::AllowOnlyEq { arg, values, errno } => vec![(
            *errno,
            vec![rule(
                values
                    .iter()
                    .map(|v| cond(*arg, Op::Ne, *v as u64))
                    .collect(),
            )],
        )],
        // Not AF_UNIX nor AF_INET; AF_INET with another type (one rule per
        // masked type value); AF_INET with another protocol.
        Rule::UnixOrTcp { errno } => {
            let (unix, inet) = (libc::AF_UNIX as u64, libc::AF_INET as u64);
            let mut rules = vec![rule(vec![cond(0, Op::Ne, unix), cond(0, Op::Ne, inet)])];
            for t in (0..16u64).filter(|t| *t != libc::SOCK_STREAM as u64) {
                rules.push(rule(vec![
                    cond(0, Op::Eq, inet),
                    cond(1, Op::MaskedEq(table::SOCK_TYPE_MASK as u64), t),
                ]));
            }
            rules.push(rule(vec![
                cond(0, Op::Eq, inet),
                cond(2, Op::Ne, 0),
                cond(2, Op::Ne, libc::IPPROTO_TCP as u64),
            ]));
            vec![(*errno, rules)]
        }
    }
}

fn seccompiler_program(
    map: BTreeMap<i64, Vec<seccompiler::SeccompRule>>,
    mismatch: seccompiler::SeccompAction,
    matched: seccompiler::SeccompAction,
) -> Vec<Insn> {
    #[cfg(target_arch = "x86_64")]
    const ARCH: seccompiler::TargetArch = seccompiler::TargetArch::x86_64;
    #[cfg(target_arch = "aarch64")]
    const ARCH: seccompiler::TargetArch = seccompiler::TargetArch::aarch64;
    #[cfg(target_arch = "riscv64")]
    const ARCH: seccompiler::TargetArch = seccompiler::TargetArch::riscv64;
    let filter = seccompiler::SeccompFilter::new(map, mismatch, matched, ARCH).unwrap();
    let prog: seccompiler::BpfProgram = filter.try_into().unwrap();
    let mut out: Vec<Insn> = prog.iter().map(|i| Insn(i.code, i.jt, i.jf, i.k)).collect();
    // The x32 and clone3 guards, spliced after seccompiler's arch check.
    out.splice(3..3, emit::prologue());
    out
}

/// The same table compiled by `seccompiler` (linear), which has one match
/// action per filter: one program per errno (matching where the table
/// answers that errno), and one that allows every listed syscall and
/// answers `default` otherwise. The verdict is the first program's that
/// does not allow, as the kernel's precedence would give for them stacked.
fn reference(rules: &BTreeMap<u32, Rule>, default: Action) -> Vec<Vec<Insn>> {
    use seccompiler::SeccompAction as A;
    let mut by_errno: BTreeMap<i32, BTreeMap<i64, Vec<_>>> = BTreeMap::new();
    for (nr, r) in rules {
        for (errno, conds) in denials(r) {
            by_errno.entry(errno).or_default().insert(*nr as i64, conds);
        }
    }
    let mut progs: Vec<Vec<Insn>> = by_errno
        .into_iter()
        .map(|(e, map)| seccompiler_program(map, A::Allow, A::Errno(e as u32)))
        .collect();
    if let Action::Errno(e) = default {
        let known = rules.keys().map(|nr| (*nr as i64, vec![])).collect();
        progs.push(seccompiler_program(known, A::Errno(e as u32), A::Allow));
    }
    progs
}

fn run_reference(progs: &[Vec<Insn>], nr: u32, args: [u64; 6]) -> u32 {
    progs
        .iter()
        .map(|p| run(p, nr, args))
        .find(|v| *v != ALLOW)
        .unwrap_or(ALLOW)
}

/// Argument sets that exercise every argument rule on both sides of it.
fn argsets() -> Vec<[u64; 6]> {
    let sigchld = libc::SIGCHLD as u64;
    let mut a0: Vec<u64> = vec![0, sigchld, 1, 2, 10, 16, 17, 40, 1 | 1 << 32, 2 | 1 << 32];
    for f in NS_FLAGS {
        a0.extend([f | sigchld, f | 1 << 40]);
    }
    // prlimit64 pids (1 << 32 is pid 0 to the kernel), personalities.
    a0.extend([
        1 << 32,
        0x0040_0000,
        0x0004_0000,
        8,
        PERSONALITY_QUERY as u64,
    ]);
    let a1: Vec<u64> = vec![
        0,
        1,
        libc::TIOCSTI,
        libc::TIOCLINUX,
        libc::TIOCSTI | 1 << 32,
        libc::FIONREAD,
        libc::TIOCGWINSZ,
        MFD_EXEC as u64,
        (MFD_EXEC | libc::MFD_CLOEXEC) as u64,
        libc::MFD_CLOEXEC as u64,
        MFD_EXEC as u64 | 1 << 33,
    ];
    let mut sets: Vec<[u64; 6]> = a0.iter().map(|x| [*x, 1, 0, 0, 0, 0]).collect();
    sets.extend(a1.iter().map(|y| [0, *y, 0, 0, 0, 0]));
    // socket(AF_INET, type, protocol) on both sides of the egress rule.
    let stream = libc::SOCK_STREAM as u64;
    for ty in [
        stream,
        stream | libc::SOCK_CLOEXEC as u64,
        2,
        3,
        5,
        stream | 1 << 32,
    ] {
        for proto in [0, 6, 17, 262, 6 | 1 << 32] {
            sets.push([2, ty, proto, 0, 0, 0]);
        }
    }
    sets
}

fn every_filter() -> Vec<(BTreeMap<u32, Rule>, Action, &'static str)> {
    let enosys = Action::Errno(libc::ENOSYS);
    vec![
        (
            table::rules(FilterMode::Namespace, MemfdPolicy::Deny),
            enosys,
            "namespace",
        ),
        (
            table::rules(FilterMode::Strict, MemfdPolicy::Deny),
            enosys,
            "strict",
        ),
        (
            table::rules(FilterMode::Namespace, MemfdPolicy::AllowNoExec),
            enosys,
            "namespace+memfd",
        ),
        (
            table::rules(FilterMode::NamespaceEgress, MemfdPolicy::Deny),
            enosys,
            "namespace+egress",
        ),
        (table::emulation_rules(), Action::Allow, "emulation"),
    ]
}

#[test]
fn emitted_program_agrees_with_seccompiler_for_every_syscall() {
    let argsets = argsets();
    for (rules, default, name) in every_filter() {
        let ours = emit::emit(&rules, default).unwrap();
        let theirs = reference(&rules, default);
        let their_len: usize = theirs.iter().map(Vec::len).sum();
        assert!(ours.len() < their_len, "{name}: {} insns", ours.len());
        let mut nrs: Vec<u32> = (0..1024).collect();
        nrs.extend([X32_SYSCALL_BIT, X32_SYSCALL_BIT | 39, u32::MAX]);
        for nr in nrs {
            for a in &argsets {
                assert_eq!(
                    run(&ours, nr, *a),
                    run_reference(&theirs, nr, *a),
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
    let p = compile(FilterMode::Strict, MemfdPolicy::Deny).unwrap();
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

fn ns() -> Vec<Insn> {
    compile(FilterMode::Namespace, MemfdPolicy::Deny).unwrap()
}

fn n(x: i64) -> u32 {
    x as u32
}

#[test]
fn unknown_and_unlisted_syscalls_are_enosys() {
    let p = ns();
    // Unassigned numbers, and real syscalls nothing in the sandbox needs.
    for nr in [470u32, 500, 1000, 1023] {
        assert_eq!(run(&p, nr, [0; 6]), ENOSYS, "nr {nr}");
    }
    for nr in [
        libc::SYS_sethostname,
        libc::SYS_sync,
        libc::SYS_fanotify_init,
    ] {
        assert_eq!(run(&p, n(nr), [0; 6]), ENOSYS, "nr {nr}");
    }
    assert_eq!(run(&p, n(libc::SYS_clone3), [0; 6]), ENOSYS);
    assert_eq!(run(&p, n(libc::SYS_memfd_create), [0; 6]), ENOSYS);
}

#[test]
fn allowlist_verdicts() {
    let p = ns();
    for nr in [
        libc::SYS_getpid,
        libc::SYS_read,
        libc::SYS_openat,
        libc::SYS_epoll_pwait,
        libc::SYS_statx,
        libc::SYS_rseq,
        libc::SYS_seccomp,
        libc::SYS_landlock_restrict_self,
        // Kept on purpose (see the module docs).
        libc::SYS_sendto,
        libc::SYS_setsockopt,
    ] {
        assert_eq!(run(&p, n(nr), [0; 6]), ALLOW, "nr {nr}");
    }
}

#[test]
fn dangerous_syscalls_are_eperm() {
    let p = ns();
    let mut nrs = vec![
        libc::SYS_ptrace,
        libc::SYS_io_uring_setup,
        libc::SYS_pidfd_getfd,
        libc::SYS_mount,
        libc::SYS_unshare,
        nr::OPEN_TREE_ATTR,
        nr::LISTMOUNT,
        nr::STATMOUNT,
        nr::QUOTACTL_FD,
        nr::MEMFD_SECRET,
        nr::SETXATTRAT,
        nr::GETXATTRAT,
        nr::LISTXATTRAT,
        nr::REMOVEXATTRAT,
        nr::LSM_GET_SELF_ATTR,
        nr::LSM_SET_SELF_ATTR,
        nr::LSM_LIST_MODULES,
    ];
    #[cfg(target_arch = "x86_64")]
    nrs.push(libc::SYS_modify_ldt);
    for nr in nrs {
        assert_eq!(run(&p, n(nr), [0; 6]), EPERM, "nr {nr}");
    }
}

#[test]
fn argument_rules() {
    let p = ns();
    let call = |nr: i64, a0: u64, a1: u64| run(&p, n(nr), [a0, a1, 0, 0, 0, 0]);
    let (unix, vsock) = (libc::AF_UNIX as u64, libc::AF_VSOCK as u64);
    assert_eq!(call(libc::SYS_socket, unix, 1), ALLOW);
    assert_eq!(call(libc::SYS_socket, vsock, 1), EPERM);
    assert_eq!(call(libc::SYS_socket, 2, 1), EPERM);
    // The egress runtimes' filter: TCP over AF_INET as well, nothing else.
    let egress = compile(FilterMode::NamespaceEgress, MemfdPolicy::Deny).unwrap();
    let sock = |a0: u64, a1: u64, a2: u64| run(&egress, n(libc::SYS_socket), [a0, a1, a2, 0, 0, 0]);
    let (inet, stream) = (libc::AF_INET as u64, libc::SOCK_STREAM as u64);
    assert_eq!(sock(unix, stream, 0), ALLOW);
    assert_eq!(sock(inet, stream, 0), ALLOW);
    assert_eq!(sock(inet, stream | libc::SOCK_CLOEXEC as u64, 6), ALLOW);
    assert_eq!(sock(inet, libc::SOCK_DGRAM as u64, 0), EPERM);
    assert_eq!(sock(inet, libc::SOCK_RAW as u64, 1), EPERM);
    assert_eq!(sock(inet, stream, 262), EPERM, "MPTCP");
    assert_eq!(sock(libc::AF_INET6 as u64, stream, 0), EPERM);
    assert_eq!(sock(libc::AF_NETLINK as u64, 3, 0), EPERM);
    assert_eq!(sock(vsock, stream, 0), EPERM);
    // TIOCSTI with garbage in the upper 32 bits is still denied.
    assert_eq!(call(libc::SYS_ioctl, 0, libc::TIOCSTI), EPERM);
    assert_eq!(call(libc::SYS_ioctl, 0, libc::TIOCSTI | 1 << 32), EPERM);
    assert_eq!(call(libc::SYS_ioctl, 0, libc::FIONREAD), ALLOW);
    let sigchld = libc::SIGCHLD as u64;
    assert_eq!(call(libc::SYS_clone, sigchld, 0), ALLOW);
    let newuser = libc::CLONE_NEWUSER as u64 | sigchld;
    assert_eq!(call(libc::SYS_clone, newuser, 0), EPERM);
    // prlimit64 on itself only; the kernel reads the pid as 32 bits.
    assert_eq!(call(libc::SYS_prlimit64, 0, 7), ALLOW);
    assert_eq!(call(libc::SYS_prlimit64, 1, 7), EPERM);
    assert_eq!(call(libc::SYS_prlimit64, 1 << 32, 7), ALLOW);
    assert_eq!(call(libc::SYS_prlimit64, 1 | 1 << 32, 7), EPERM);
    // personality: the query and PER_LINUX only.
    assert_eq!(
        call(libc::SYS_personality, PERSONALITY_QUERY as u64, 0),
        ALLOW
    );
    assert_eq!(call(libc::SYS_personality, 0, 0), ALLOW);
    assert_eq!(call(libc::SYS_personality, 0x0040_0000, 0), EPERM);
    assert_eq!(call(libc::SYS_personality, 0x0004_0000, 0), EPERM);
}

#[test]
fn memfd_policy_allows_only_non_exec_memfds() {
    let p = compile(FilterMode::Namespace, MemfdPolicy::AllowNoExec).unwrap();
    let memfd = |flags: u64| run(&p, n(libc::SYS_memfd_create), [0, flags, 0, 0, 0, 0]);
    assert_eq!(memfd(libc::MFD_CLOEXEC as u64), ALLOW);
    assert_eq!(memfd(libc::MFD_NOEXEC_SEAL as u64), ALLOW);
    assert_eq!(memfd(MFD_EXEC as u64), EPERM);
    assert_eq!(memfd((MFD_EXEC | libc::MFD_CLOEXEC) as u64), EPERM);
}

#[test]
fn no_syscall_is_in_two_lists_and_every_entry_says_why() {
    let mut seen: BTreeMap<i64, usize> = BTreeMap::new();
    for (i, list) in table::lists().iter().enumerate() {
        for (nr, why) in list {
            assert!(!why.trim().is_empty(), "nr {nr} has no reason");
            if let Some(j) = seen.insert(*nr, i) {
                panic!("nr {nr} is in lists {j} and {i}");
            }
        }
    }
    // The argument rules are the only entries outside the lists.
    let ns = table::rules(FilterMode::Namespace, MemfdPolicy::Deny);
    let extra: BTreeSet<u32> = ns
        .keys()
        .filter(|nr| !seen.contains_key(&(**nr as i64)))
        .copied()
        .collect();
    let expected: BTreeSet<u32> = [
        libc::SYS_clone,
        libc::SYS_ioctl,
        libc::SYS_prlimit64,
        libc::SYS_personality,
        libc::SYS_memfd_create,
        libc::SYS_socketpair,
        libc::SYS_socket,
    ]
    .into_iter()
    .map(n)
    .collect();
    assert_eq!(extra, expected);
    let (allowed_n, denied_n) = table::counts(&ns);
    assert!(allowed_n > 150 && denied_n > 50, "{allowed_n} {denied_n}");
}

#[cfg(target_arch = "x86_64")]
#[test]
fn x32_guard_denies_x32_numbers() {
    let p = ns();
    assert!(has_x32_guard(&p));
    // getpid via the x32 ABI is refused explicitly, not by the default.
    let x32_ptrace = libc::SYS_ptrace as u32 | X32_SYSCALL_BIT;
    assert_eq!(run(&p, x32_ptrace, [0; 6]), EPERM);
    assert_eq!(
        run(&p, libc::SYS_getpid as u32 | X32_SYSCALL_BIT, [0; 6]),
        EPERM
    );
}

#[test]
fn strict_mode_denies_every_socket_and_sysv() {
    let p = compile(FilterMode::Strict, MemfdPolicy::Deny).unwrap();
    let unix = libc::AF_UNIX as u64;
    assert_eq!(run(&p, n(libc::SYS_socket), [unix, 1, 0, 0, 0, 0]), EPERM);
    assert_eq!(
        run(&p, n(libc::SYS_socketpair), [unix, 1, 0, 0, 0, 0]),
        ALLOW
    );
    for nr in [libc::SYS_shmget, libc::SYS_mq_unlink, libc::SYS_pidfd_open] {
        assert_eq!(run(&p, n(nr), [0; 6]), EPERM, "nr {nr}");
        assert_eq!(run(&ns(), n(nr), [0; 6]), ALLOW, "nr {nr}");
    }
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
    assert_eq!(run(&p, 1000, [0; 6]), ALLOW);
}
