//! Every kind of memory in turn, under whatever policy the sandbox has
//! (issue 28, item 3): shared mappings, SysV segments, a memfd, the tmpfs
//! mounts (`/dev/shm`, `/tmp`, `HOME`, the workspace), pipe buffers in many
//! pipes, unix socket queues in many socket pairs, and many processes. Each
//! kind is pushed towards `alloc_mib` (at most [`MAX_KIND_MIB`], so ten
//! kinds stay under 2 GiB on any host) and held, so that the host can
//! compare what the tree holds with what the report states.
//!
//! The bait's `memory_kinds` narrows the kinds (the guest test of the
//! memory controller, tests/tests/memory_controller_guest.rs, takes the
//! queues alone under a small `memory.max`). The receipt's `observed` is
//! one `<kind>: <got> of <want> MiB` entry per kind, `, then <why>` when
//! something stopped it, joined by `; `.

use std::path::{Path, PathBuf};

use super::memory::{Got, file_fill, memfd, shared_anonymous, sysv_shm, touch};
use crate::bait::Bait;
use crate::receipt::{Receipt, describe_errno};
use crate::sys;

const MIB: u64 = 1 << 20;
/// The most one kind takes, whatever the bait asks.
pub const MAX_KIND_MIB: u64 = 160;
/// Pipes and socket pairs stop here: 2 fds each, under RLIMIT_NOFILE 1024
/// with the held files and the transport.
const MAX_PIPES: usize = 320;
const MAX_PAIRS: usize = 96;
/// Processes that each hold a share of the kind's memory.
const PROCESSES: u64 = 8;

pub fn c31c_memory_every_kind(bait: &Bait) -> Receipt {
    const A: &str = "C31c-memory-every-kind";
    let want = bait.alloc_mib().min(MAX_KIND_MIB);
    // SIGXFSZ would kill us at RLIMIT_FSIZE; ignored, the write gets EFBIG.
    // SAFETY: setting one signal's disposition.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/sandbox/home"), Into::into);
    let ws = sys::workspace(bait.workspace.as_deref());
    let kinds: [(&str, &dyn Fn() -> Got); 10] = [
        ("shared-anonymous", &|| shared_anonymous(want)),
        ("sysv-shm", &|| sysv_shm(want)),
        ("memfd", &|| memfd(want)),
        ("posix-shm", &|| file_fill(Path::new("/dev/shm"), want)),
        ("tmpfs-tmp", &|| file_fill(Path::new("/tmp"), want)),
        ("tmpfs-home", &|| file_fill(&home, want)),
        ("tmpfs-workspace", &|| file_fill(&ws, want)),
        ("pipes", &|| pipes(want)),
        ("unix-sockets", &|| socket_pairs(want)),
        ("processes", &|| processes(want, bait.hang_secs())),
    ];
    // In order, each held while the next is taken; only the bait's kinds
    // when it names some.
    let chosen =
        |name: &str| bait.memory_kinds.is_empty() || bait.memory_kinds.iter().any(|k| k == name);
    let text: Vec<String> = kinds
        .iter()
        .filter(|(name, _)| chosen(name))
        .map(|(name, take)| match take() {
            (got, Some(why)) => format!("{name}: {got} of {want} MiB, then {why}"),
            (got, None) => format!("{name}: {got} of {want} MiB"),
        })
        .collect();
    Receipt::unjudged(A, format!("(held) {}", text.join("; ")))
}

/// Fills `fd` (non-blocking) until it would block; the bytes queued.
fn fill_fd(fd: i32, chunk: &[u8], cap: u64) -> (u64, Option<i32>) {
    let mut queued = 0u64;
    while queued < cap {
        // SAFETY: writing from a live slice of the given length.
        let n = unsafe { libc::write(fd, chunk.as_ptr().cast(), chunk.len()) };
        if n < 0 {
            let e = sys::errno();
            return (queued, (e != libc::EAGAIN).then_some(e));
        }
        queued += n as u64;
    }
    (queued, None)
}

/// Many pipes, each filled until it would block; every end held.
fn pipes(want: u64) -> Got {
    let chunk = vec![0x5au8; 64 << 10];
    let mut bytes = 0u64;
    for _ in 0..MAX_PIPES {
        if bytes >= want * MIB {
            return (bytes / MIB, None);
        }
        let mut fds = [0i32; 2];
        // SAFETY: pipe2 writes two fds into the array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } < 0 {
            return (
                bytes / MIB,
                Some(format!("pipe2 {}", describe_errno(sys::errno()))),
            );
        }
        let (queued, err) = fill_fd(fds[1], &chunk, want * MIB - bytes);
        bytes += queued;
        // Both ends stay open (raw fds, never closed): held.
        if let Some(e) = err {
            return (bytes / MIB, Some(format!("write {}", describe_errno(e))));
        }
    }
    (
        bytes / MIB,
        Some(format!("{MAX_PIPES} pipes (the attack's own cap)")),
    )
}

/// Many unix stream socket pairs, each send buffer raised as far as the
/// kernel lets a process and filled until it would block; every end held.
fn socket_pairs(want: u64) -> Got {
    let chunk = vec![0x5au8; 64 << 10];
    let mut bytes = 0u64;
    for _ in 0..MAX_PAIRS {
        if bytes >= want * MIB {
            return (bytes / MIB, None);
        }
        let mut fds = [0i32; 2];
        let ty = libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
        // SAFETY: socketpair writes two fds into the array.
        if unsafe { libc::socketpair(libc::AF_UNIX, ty, 0, fds.as_mut_ptr()) } < 0 {
            return (
                bytes / MIB,
                Some(format!("socketpair {}", describe_errno(sys::errno()))),
            );
        }
        let size: libc::c_int = 64 << 20;
        for (fd, opt) in [(fds[0], libc::SO_SNDBUF), (fds[1], libc::SO_RCVBUF)] {
            // SAFETY: an int option of a socket just made; the kernel caps it.
            unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    opt,
                    (&raw const size).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
        }
        let (queued, err) = fill_fd(fds[0], &chunk, want * MIB - bytes);
        bytes += queued;
        // Both ends stay open (raw fds, never closed): held.
        if let Some(e) = err {
            return (bytes / MIB, Some(format!("send {}", describe_errno(e))));
        }
    }
    (
        bytes / MIB,
        Some(format!("{MAX_PAIRS} socket pairs (the attack's own cap)")),
    )
}

/// [`PROCESSES`] children, each touching its share of private anonymous
/// memory and holding it until `hang_secs` pass or the tree is killed.
fn processes(want: u64, hang_secs: u64) -> Got {
    let share = (want / PROCESSES).max(1) as usize * MIB as usize;
    let mut got = 0u64;
    for _ in 0..PROCESSES {
        let mut fds = [0i32; 2];
        // SAFETY: pipe2 writes two fds into the array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
            return (got, Some(format!("pipe2 {}", describe_errno(sys::errno()))));
        }
        // SAFETY: fork; the child below only makes raw syscalls.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            let e = sys::errno();
            // SAFETY: both ends of the pipe just made, closed once.
            unsafe {
                libc::close(fds[0]);
                libc::close(fds[1]);
            }
            return (got, Some(format!("fork {}", describe_errno(e))));
        }
        if pid == 0 {
            // SAFETY: a fresh private anonymous mapping, touched and held.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    share,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            let ok = p != libc::MAP_FAILED;
            if ok {
                touch(p.cast(), share);
            }
            let _ = sys::write_all_fd(fds[1], &[u8::from(ok)]);
            sys::raw_sleep(hang_secs);
            // SAFETY: ending the forked child without running destructors.
            unsafe { libc::_exit(0) };
        }
        // SAFETY: the parent's write end, closed once.
        unsafe { libc::close(fds[1]) };
        let mut byte = [0u8; 1];
        // SAFETY: reading one byte into a live buffer; then closing the fd.
        let n = unsafe { libc::read(fds[0], byte.as_mut_ptr().cast(), 1) };
        // SAFETY: the read end, closed once.
        unsafe { libc::close(fds[0]) };
        if n != 1 || byte[0] != 1 {
            return (got, Some("a child's mmap failed".into()));
        }
        got += share as u64 / MIB;
    }
    (got, None)
}
