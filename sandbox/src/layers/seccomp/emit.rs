//! The BPF emitter: the syscall table as a binary search.
//!
//! After the architecture check, the x32 guard (`nr >= 0x40000000` →
//! EPERM) and `clone3` → ENOSYS, the syscall number is found by binary
//! search over runs of consecutive numbers with the same rule (unlisted
//! numbers get the filter's default), not one comparison after the other. The kernel (>= 5.11) runs a new filter once per
//! syscall number at install time to find the ones it can always allow,
//! so a linear program made that walk the most expensive part of the
//! spawn's seccomp layer.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::table::{Action, Rule};

/// One classic BPF instruction, serializable so the host can hand the
/// compiled program to the helper inside the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Insn(pub u16, pub u8, pub u8, pub u32);

pub(crate) const BPF_LD_W_ABS: u16 = 0x20;
pub(crate) const BPF_JMP_JEQ_K: u16 = 0x15;
pub(crate) const BPF_JMP_JGE_K: u16 = 0x35;
pub(crate) const BPF_RET_K: u16 = 0x06;
pub(crate) const BPF_ALU_AND_K: u16 = 0x54;
pub(crate) const BPF_JMP_JA: u16 = 0x05;
pub(crate) const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
pub(crate) const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
/// Offset of `nr` in `struct seccomp_data`.
pub(crate) const NR_OFFSET: u32 = 0;
/// Offset of `arch` in `struct seccomp_data`.
const ARCH_OFFSET: u32 = 4;
/// x32 syscalls carry this bit in `nr` on x86_64.
pub(crate) const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// `AUDIT_ARCH_*` of the target.
#[cfg(target_arch = "x86_64")]
pub(crate) const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
pub(crate) const AUDIT_ARCH: u32 = 0xC000_00B7;
#[cfg(target_arch = "riscv64")]
pub(crate) const AUDIT_ARCH: u32 = 0xC000_00F3;
/// The kernel's limit on a filter's length (BPF_MAXINSNS).
const MAX_INSNS: usize = 4096;

// The low 32 bits of an argument are at offset 16 + 8 * i only on a
// little-endian machine.
const _: () = assert!(cfg!(target_endian = "little"));

/// The `SECCOMP_RET_*` value of an action.
pub(crate) fn ret_value(a: Action) -> u32 {
    match a {
        Action::Allow => SECCOMP_RET_ALLOW,
        Action::Errno(e) => SECCOMP_RET_ERRNO | e as u32,
    }
}

fn arg_low(arg: u8) -> u32 {
    16 + 8 * arg as u32
}

fn ret(a: Action) -> Insn {
    Insn(BPF_RET_K, 0, 0, ret_value(a))
}

/// What the filter runs for one listed syscall (the accumulator holds the
/// syscall number on entry; every path returns).
fn body(rule: &Rule) -> Vec<Insn> {
    let allow = ret(Action::Allow);
    let load = |arg: u8| Insn(BPF_LD_W_ABS, 0, 0, arg_low(arg));
    match rule {
        Rule::Always(a) => vec![ret(*a)],
        Rule::DenyAnyBit { arg, mask, errno } => vec![
            load(*arg),
            Insn(BPF_ALU_AND_K, 0, 0, *mask),
            Insn(BPF_JMP_JEQ_K, 0, 1, 0),
            allow,
            ret(Action::Errno(*errno)),
        ],
        Rule::DenyEq { arg, values, errno } => {
            let mut v = vec![load(*arg)];
            for x in values {
                v.push(Insn(BPF_JMP_JEQ_K, 0, 1, *x));
                v.push(ret(Action::Errno(*errno)));
            }
            v.push(allow);
            v
        }
        Rule::AllowOnlyEq { arg, values, errno } => {
            let mut v = vec![load(*arg)];
            for x in values {
                v.push(Insn(BPF_JMP_JEQ_K, 0, 1, *x));
                v.push(allow);
            }
            v.push(ret(Action::Errno(*errno)));
            v
        }
        Rule::UnixOrTcp { errno } => {
            let deny = ret(Action::Errno(*errno));
            vec![
                load(0),
                Insn(BPF_JMP_JEQ_K, 0, 1, libc::AF_UNIX as u32),
                allow,
                Insn(BPF_JMP_JEQ_K, 1, 0, libc::AF_INET as u32),
                deny,
                load(1),
                Insn(BPF_ALU_AND_K, 0, 0, super::table::SOCK_TYPE_MASK),
                Insn(BPF_JMP_JEQ_K, 1, 0, libc::SOCK_STREAM as u32),
                deny,
                load(2),
                Insn(BPF_JMP_JEQ_K, 2, 0, 0),
                Insn(BPF_JMP_JEQ_K, 1, 0, libc::IPPROTO_TCP as u32),
                deny,
                allow,
            ]
        }
    }
}

/// The number line cut into runs of consecutive syscall numbers that get
/// the same rule (unlisted numbers get `default`): 316 listed syscalls are
/// about 120 runs on x86_64, and the search is over the runs.
fn runs(rules: &BTreeMap<u32, Rule>, default: &Rule) -> Vec<(u32, Rule)> {
    let mut out: Vec<(u32, Rule)> = Vec::new();
    let mut push = |lo: u32, rule: &Rule| {
        if out.last().map(|(_, r)| r) != Some(rule) {
            out.push((lo, rule.clone()));
        }
    };
    let mut next = 0u32;
    for (nr, rule) in rules {
        if *nr > next {
            push(next, default);
        }
        push(*nr, rule);
        next = nr + 1;
    }
    push(next, default);
    out
}

/// A binary search over the runs: every syscall reaches its verdict in
/// O(log n) instructions. A split is one `>=` comparison jumping over the
/// lower half when it is short enough for a conditional jump, else a
/// comparison and an unconditional jump.
fn tree(runs: &[(u32, Rule)]) -> Vec<Insn> {
    if let [(_, rule)] = runs {
        return body(rule);
    }
    let (left, right) = runs.split_at(runs.len() / 2);
    let (l, r) = (tree(left), tree(right));
    let pivot = right[0].0;
    let mut out = match u8::try_from(l.len()) {
        Ok(skip) => vec![Insn(BPF_JMP_JGE_K, skip, 0, pivot)],
        // nr >= pivot: the next instruction jumps over the left half.
        Err(_) => vec![
            Insn(BPF_JMP_JGE_K, 0, 1, pivot),
            Insn(BPF_JMP_JA, 0, 0, l.len() as u32),
        ],
    };
    out.extend(l);
    out.extend(r);
    out
}

/// The whole program: arch check, prologue, then the search.
pub(crate) fn emit(rules: &BTreeMap<u32, Rule>, default: Action) -> Result<Vec<Insn>, String> {
    let mut out = vec![
        Insn(BPF_LD_W_ABS, 0, 0, ARCH_OFFSET),
        Insn(BPF_JMP_JEQ_K, 1, 0, AUDIT_ARCH),
        Insn(BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
    ];
    out.extend(prologue());
    out.extend(tree(&runs(rules, &Rule::Always(default))));
    if out.len() >= MAX_INSNS {
        return Err(format!("filter too large: {} instructions", out.len()));
    }
    Ok(out)
}

/// The instructions after the arch check: load the syscall number, then
/// the guards that come before any per-syscall rule.
pub(crate) fn prologue() -> Vec<Insn> {
    let mut p = vec![Insn(BPF_LD_W_ABS, 0, 0, NR_OFFSET)];
    if cfg!(target_arch = "x86_64") {
        // x32 guard: on kernels with CONFIG_X86_X32_ABI the same arch value
        // carries x32 syscall numbers (nr | 0x40000000); they are refused
        // explicitly rather than left to the default.
        p.push(Insn(BPF_JMP_JGE_K, 0, 1, X32_SYSCALL_BIT));
        p.push(ret(Action::Errno(libc::EPERM)));
    }
    // clone3 passes its flags in a struct seccomp cannot read: ENOSYS makes
    // libc fall back to clone(2), whose flags the filter checks.
    p.push(Insn(BPF_JMP_JEQ_K, 0, 1, libc::SYS_clone3 as u32));
    p.push(ret(Action::Errno(libc::ENOSYS)));
    p
}
