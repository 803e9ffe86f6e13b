//! Shared memory of the host: SysV and POSIX (sandbox.md C56, C57).

use crate::bait::Bait;
use crate::receipt::{Receipt, describe_errno, describe_io};
use crate::sys;

pub fn c56_sysv_shm(bait: &Bait) -> Receipt {
    const A: &str = "C56-host-sysv-shm";
    let visible = std::fs::read_to_string("/proc/sysvipc/shm").map(|t| t.lines().skip(1).count());
    let listing = match &visible {
        Ok(n) => format!("/proc/sysvipc/shm lists {n} segments"),
        Err(e) => format!("/proc/sysvipc/shm: {}", describe_io(e)),
    };
    let Some(key) = bait.shm_key else {
        // The generic form: create a private segment (SysV IPC reachable at all?).
        // SAFETY: shmget with integer arguments.
        let id = unsafe { libc::shmget(libc::IPC_PRIVATE, 4096, libc::IPC_CREAT | 0o600) };
        if id < 0 {
            return Receipt::blocked(
                A,
                format!(
                    "blocked: shmget(IPC_PRIVATE): {}; {listing}",
                    describe_errno(sys::errno())
                ),
            );
        }
        // SAFETY: removing the segment we just created.
        unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
        return Receipt::unjudged(
            A,
            format!("no shm_key in the bait; shmget(IPC_PRIVATE) ok (removed); {listing}"),
        );
    };
    // SAFETY: shmget of an existing key, integer arguments.
    let id = unsafe { libc::shmget(key, 0, 0) };
    if id < 0 {
        return Receipt::blocked(
            A,
            format!(
                "blocked: shmget({key:#x}): {}; {listing}",
                describe_errno(sys::errno())
            ),
        );
    }
    // SAFETY: attach read-only at an address the kernel picks.
    let p = unsafe { libc::shmat(id, std::ptr::null(), libc::SHM_RDONLY) };
    if p as isize == -1 {
        return Receipt::succeeded(
            A,
            format!(
                "succeeded: shmget({key:#x}) found id {id}; shmat: {}",
                describe_errno(sys::errno())
            ),
        );
    }
    // SAFETY: the segment is mapped read-only and at least one page long.
    let first = unsafe { *(p as *const u8) };
    // SAFETY: detaching what we attached.
    unsafe { libc::shmdt(p) };
    Receipt::succeeded(
        A,
        format!(
            "succeeded: attached host segment {key:#x} (id {id}) and read it (first byte {first:#x})"
        ),
    )
}

pub fn c57_devshm_file(bait: &Bait) -> Receipt {
    const A: &str = "C57-host-dev-shm-file";
    if let Some(p) = &bait.devshm_path {
        return match sys::read_prefix(p, 64 * 1024) {
            Ok(b) => Receipt::succeeded(
                A,
                format!("succeeded: read {} bytes of {}", b.len(), p.display()),
            ),
            Err(e) => Receipt::blocked(
                A,
                format!("blocked: {} on {}", describe_io(&e), p.display()),
            ),
        };
    }
    match std::fs::read_dir("/dev/shm") {
        Ok(d) => Receipt::unjudged(
            A,
            format!(
                "no devshm_path in the bait; /dev/shm lists {} entries",
                d.count()
            ),
        ),
        Err(e) => Receipt::blocked(A, format!("blocked: /dev/shm: {}", describe_io(&e))),
    }
}
