//! Layer: seccomp, applied last, just before `execve`.
//!
//! The filter is an allowlist (default deny): every syscall the table in
//! [`table`] does not list returns `ENOSYS`, so a syscall a future kernel
//! adds is closed by default and runtimes take their old-kernel fallback;
//! the explicitly dangerous ones return `EPERM`; a few are allowed only
//! with given arguments (clone without namespace flags, socket with
//! AF_UNIX (and AF_INET stream sockets for a runtime with an egress
//! gateway), ioctl without TIOCSTI/TIOCLINUX, prlimit64 on itself,
//! personality query/PER_LINUX, memfd_create by policy). It is compiled
//! once per host process and handed to the helper, which installs it with
//! one `seccomp(2)` call.
//!
//! The program is emitted by [`emit`] rather than by `seccompiler`, as a
//! binary search; the verdicts are unit-tested with a small BPF interpreter
//! and checked equal, for every syscall number and a set of arguments, to
//! `seccompiler` programs built from the same table.
//!
//! Deliberately allowed: `sendto`, `sendmsg`, `recvmsg`, `setsockopt`,
//! `getsockopt`, `bind`, `listen`, `accept`, `getsockname`. Denying them
//! broke Node `spawnSync`, Python asyncio, the Python 3.14 forkserver and
//! Chromium in Codex (openai/codex#41175, #24933, #24943, #47452); inside
//! an empty network namespace they reach nothing anyway, and in strict
//! mode `socket()` itself is denied.

mod allowed;
mod emit;
mod numbers;
mod table;

use std::sync::OnceLock;

pub use emit::Insn;
use emit::{BPF_JMP_JGE_K, X32_SYSCALL_BIT};
use table::Action;
pub use table::FilterMode;

use super::layer::{Layer, Need, Slot, Stage};
use crate::policy::MemfdPolicy;

pub(crate) fn arch_name() -> &'static str {
    std::env::consts::ARCH
}

type Cell = OnceLock<Result<Vec<Insn>, String>>;

/// Build the plugin's filter for `mode` and the `memfd_create` policy.
/// Compiled once per process: the program only depends on these and the
/// architecture.
pub fn compile(mode: FilterMode, memfd: MemfdPolicy) -> Result<Vec<Insn>, String> {
    static CELLS: [Cell; 6] = [const { OnceLock::new() }; 6];
    let i = match mode {
        FilterMode::Namespace => 0,
        FilterMode::Strict => 2,
        FilterMode::NamespaceEgress => 4,
    } + match memfd {
        MemfdPolicy::Deny => 0,
        MemfdPolicy::AllowNoExec => 1,
    };
    CELLS[i]
        .get_or_init(|| emit::emit(&table::rules(mode, memfd), Action::Errno(libc::ENOSYS)))
        .clone()
}

/// The test-only filter that emulates a host without user namespaces.
pub fn compile_no_userns_emulation() -> Result<Vec<Insn>, String> {
    emit::emit(&table::emulation_rules(), Action::Allow)
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

/// The seccomp allowlist, installed last in the plugin's process (step 16).
pub(crate) const LAYER: Layer = Layer {
    name: "seccomp",
    stage: Stage::Plugin,
    toggle: Some(|p| p.layers.seccomp),
    slot: Slot::Status(|r| &r.seccomp.status, |r| &mut r.seccomp.status),
    need: Need::Applied,
    fix: "use a kernel with CONFIG_SECCOMP_FILTER=y",
    detail: |r| {
        format!(
            " ({} mode, allowlist, unlisted -> {}, memfd_create {}, {} instructions, x32 guard {})",
            r.seccomp.mode,
            r.seccomp.default_action,
            r.seccomp.memfd_create,
            r.seccomp.insns,
            if r.seccomp.x32_guard { "yes" } else { "no" }
        )
    },
    apply: None,
};

#[cfg(test)]
mod tests;
