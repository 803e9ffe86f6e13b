//! Memory past the bound (issue 14, item 3): the kinds of memory
//! `RLIMIT_DATA` does not count. Each kind is pushed towards `alloc_mib`
//! and whatever it got is *held* (mappings, segments, files and fds stay),
//! so that the host can measure the tree while the attack's `then` waits.

use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;

use crate::bait::Bait;
use crate::receipt::{Receipt, describe_errno, describe_io};
use crate::sys;

const MIB: usize = 1 << 20;
/// Below the sandbox's `kernel.shmmax`, so `shmall` is what stops it.
const SHM_CHUNK: usize = 8 * MIB;

/// One kind's outcome: MiB obtained, and what stopped it (None: all of it).
pub(super) type Got = (u64, Option<String>);

pub fn c31b_memory_past_the_bound(bait: &Bait) -> Receipt {
    const A: &str = "C31b-memory-past-the-bound";
    let want = bait.alloc_mib();
    // SIGXFSZ would kill us at RLIMIT_FSIZE; ignored, the write gets EFBIG.
    // SAFETY: setting one signal's disposition.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let kinds: [(&str, Got); 5] = [
        ("shared-anonymous", shared_anonymous(want)),
        ("sysv-shm", sysv_shm(want)),
        ("posix-shm", file_fill(Path::new("/dev/shm"), want)),
        ("memfd", memfd(want)),
        ("tmpfs-file", file_fill(Path::new("/tmp"), want)),
    ];
    let all_stopped = kinds.iter().all(|(_, (_, stop))| stop.is_some());
    let text: Vec<String> = kinds
        .iter()
        .map(|(name, (got, stop))| match stop {
            Some(why) => format!("{name}: {got} of {want} MiB, then {why}"),
            None => format!("{name}: all {want} MiB"),
        })
        .collect();
    let observed = format!("(held) {}", text.join("; "));
    if all_stopped {
        Receipt::blocked(A, format!("blocked: {observed}"))
    } else {
        Receipt::succeeded(A, format!("succeeded: {observed}"))
    }
}

/// Keeps what the attack got until the process dies.
pub fn hold(bait: &Bait) {
    sys::raw_sleep(bait.hang_secs());
}

pub(super) fn touch(p: *mut u8, len: usize) {
    for off in (0..len).step_by(4096) {
        // SAFETY: `off` is inside the `len`-byte writable mapping at `p`.
        unsafe { p.add(off).write_volatile(0x5a) };
    }
}

pub(super) fn shared_anonymous(want: u64) -> Got {
    const CHUNK: usize = 64 * MIB;
    let mut got = 0;
    while got < want {
        // SAFETY: a fresh shared anonymous mapping; checked below, then
        // deliberately never unmapped (held).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                CHUNK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return (got, Some(format!("mmap {}", describe_errno(sys::errno()))));
        }
        touch(p.cast(), CHUNK);
        got += (CHUNK / MIB) as u64;
    }
    (got, None)
}

/// Segments are touched through a mapping, then detached: a detached
/// segment keeps its memory (only `shmall` counts it then).
pub(super) fn sysv_shm(want: u64) -> Got {
    let mut got = 0;
    while got < want {
        // SAFETY: plain shmget arguments.
        let id = unsafe { libc::shmget(libc::IPC_PRIVATE, SHM_CHUNK, libc::IPC_CREAT | 0o600) };
        if id < 0 {
            return (
                got,
                Some(format!("shmget {}", describe_errno(sys::errno()))),
            );
        }
        // SAFETY: attaching the segment just made, anywhere.
        let p = unsafe { libc::shmat(id, std::ptr::null(), 0) };
        if p as isize == -1 {
            return (got, Some(format!("shmat {}", describe_errno(sys::errno()))));
        }
        touch(p.cast(), SHM_CHUNK);
        // SAFETY: detaching what shmat returned; the segment stays.
        unsafe { libc::shmdt(p) };
        got += (SHM_CHUNK / MIB) as u64;
    }
    (got, None)
}

fn write_until(mut f: std::fs::File, want: u64) -> Got {
    let chunk = vec![0x5au8; MIB];
    let mut got = 0;
    while got < want {
        if let Err(e) = f.write_all(&chunk) {
            return (got, Some(format!("write {}", describe_io(&e))));
        }
        got += 1;
    }
    std::mem::forget(f); // held: the fd stays open
    (got, None)
}

pub(super) fn file_fill(dir: &Path, want: u64) -> Got {
    let path = dir.join(sys::unique("hold"));
    match std::fs::File::create(&path) {
        Ok(f) => write_until(f, want),
        Err(e) => (
            0,
            Some(format!("create {}: {}", path.display(), describe_io(&e))),
        ),
    }
}

pub(super) fn memfd(want: u64) -> Got {
    // SAFETY: memfd_create with a static name; the fd is owned below.
    let fd = unsafe { libc::memfd_create(c"hold".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return (
            0,
            Some(format!("memfd_create {}", describe_errno(sys::errno()))),
        );
    }
    // SAFETY: `fd` was just returned by memfd_create.
    let f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    write_until(f, want)
}
