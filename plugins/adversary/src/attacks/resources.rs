//! Exhaustion, bounded: processes, memory, disk, inodes, fds, core dumps
//! (sandbox.md C30–C35, C61). Each stops at the first refusal or at its
//! bound and removes what it made before returning.

use std::io::Write;
use std::path::Path;

use crate::bait::Bait;
use crate::receipt::{Receipt, describe_errno, describe_io};
use crate::sys;

pub fn c30_fork_bomb(bait: &Bait) -> Receipt {
    const A: &str = "C30-fork-bomb";
    let want = bait.fork_count();
    let mut pids = Vec::new();
    let mut stop = None;
    for _ in 0..want {
        // SAFETY: the child only arms an alarm and pauses (raw syscalls),
        // so it never outlives 30 s even if we die before reaping it.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: in the child; `_exit` never returns.
            unsafe {
                libc::alarm(30);
                libc::pause();
                libc::_exit(0);
            }
        }
        if pid < 0 {
            stop = Some(sys::errno());
            break;
        }
        pids.push(pid);
    }
    for &pid in &pids {
        // SAFETY: our own children.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let _ = sys::wait(pid);
    }
    match stop {
        Some(e) => Receipt::blocked(
            A,
            format!(
                "blocked: forked {} of {want}, then {}",
                pids.len(),
                describe_errno(e)
            ),
        ),
        None => Receipt::succeeded(
            A,
            format!("succeeded: forked all {want} children (killed and reaped)"),
        ),
    }
}

pub fn c31_memory_bomb(bait: &Bait) -> Receipt {
    const A: &str = "C31-memory-bomb";
    const CHUNK: usize = 64 << 20;
    let want = bait.alloc_mib() as usize;
    let mut maps: Vec<*mut libc::c_void> = Vec::new();
    let mut stop = None;
    while maps.len() * (CHUNK >> 20) < want {
        // SAFETY: a fresh private anonymous mapping; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                CHUNK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            stop = Some(sys::errno());
            break;
        }
        // Touch every page so the memory is really committed.
        for off in (0..CHUNK).step_by(4096) {
            // SAFETY: `off` is inside the CHUNK-byte mapping just made.
            unsafe { *(p as *mut u8).add(off) = 1 };
        }
        maps.push(p);
    }
    let got = maps.len() * (CHUNK >> 20);
    for p in maps {
        // SAFETY: unmapping exactly what mmap returned.
        unsafe { libc::munmap(p, CHUNK) };
    }
    match stop {
        Some(e) => Receipt::blocked(
            A,
            format!(
                "blocked: touched {got} MiB of {want}, then mmap {}",
                describe_errno(e)
            ),
        ),
        None => Receipt::succeeded(A, format!("succeeded: touched all {got} MiB (released)")),
    }
}

/// Writes up to `mib` MiB into a new file in `dir`, then removes it.
fn fill(dir: &Path, mib: u64) -> (u64, Option<String>) {
    let path = dir.join(sys::unique("fill"));
    // SIGXFSZ would kill us at RLIMIT_FSIZE; ignored, the write gets EFBIG.
    // SAFETY: changing the disposition of one signal, restored below.
    let old = unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let chunk = vec![0x5au8; 1 << 20];
    let mut written = 0;
    let err = match std::fs::File::create(&path) {
        Err(e) => Some(format!("create {}: {}", path.display(), describe_io(&e))),
        Ok(mut f) => loop {
            if written >= mib {
                break f.sync_all().err().map(|e| describe_io(&e));
            }
            if let Err(e) = f.write_all(&chunk) {
                break Some(describe_io(&e));
            }
            written += 1;
        },
    };
    let _ = std::fs::remove_file(&path);
    // SAFETY: restoring the disposition saved above.
    unsafe { libc::signal(libc::SIGXFSZ, old) };
    (written, err)
}

pub fn c32_disk_fill_workspace(bait: &Bait) -> Receipt {
    const A: &str = "C32-disk-fill-workspace";
    let mib = bait.fill_mib();
    let ws = bait.workspace();
    match fill(&ws, mib) {
        (n, Some(e)) => Receipt::blocked(
            A,
            format!(
                "blocked: wrote {n} of {mib} MiB in {}, then {e} (removed)",
                ws.display()
            ),
        ),
        (n, None) => Receipt::succeeded(
            A,
            format!("succeeded: wrote {n} MiB in {} (removed)", ws.display()),
        ),
    }
}

pub fn c33_disk_fill_tmp(bait: &Bait) -> Receipt {
    const A: &str = "C33-disk-fill-tmp-and-dev-shm";
    let mib = bait.fill_mib();
    let mut obs = Vec::new();
    let mut stopped = true;
    for dir in ["/tmp", "/dev/shm"] {
        match fill(Path::new(dir), mib) {
            (n, Some(e)) => obs.push(format!("{dir}: {n} of {mib} MiB, then {e}")),
            (n, None) => {
                stopped = false;
                obs.push(format!("{dir}: wrote all {n} MiB"));
            }
        }
    }
    let verdict = if stopped { "blocked" } else { "succeeded" };
    Receipt::judged(
        A,
        stopped,
        format!("{verdict}: {} (removed)", obs.join("; ")),
    )
}

pub fn c34_inode_exhaustion(bait: &Bait) -> Receipt {
    const A: &str = "C34-inode-exhaustion";
    let want = bait.inode_count();
    let dir = bait.workspace().join(sys::unique("inodes"));
    if let Err(e) = std::fs::create_dir(&dir) {
        return Receipt::blocked(
            A,
            format!("blocked: mkdir {}: {}", dir.display(), describe_io(&e)),
        );
    }
    let mut made = 0;
    let mut stop = None;
    while made < want {
        let p = dir.join(made.to_string());
        if let Err(e) = std::fs::File::create(&p) {
            stop = Some(describe_io(&e));
            break;
        }
        made += 1;
    }
    let _ = std::fs::remove_dir_all(&dir);
    match stop {
        Some(e) => Receipt::blocked(
            A,
            format!("blocked: created {made} of {want} files, then {e} (removed)"),
        ),
        None => Receipt::succeeded(A, format!("succeeded: created all {want} files (removed)")),
    }
}

pub fn c35_fd_exhaustion(bait: &Bait) -> Receipt {
    const A: &str = "C35-fd-exhaustion";
    let want = bait.fd_count();
    let mut fds = Vec::new();
    let mut stop = None;
    while (fds.len() as u64) < want {
        match sys::open(Path::new("/dev/null"), libc::O_RDONLY, 0) {
            Ok(fd) => fds.push(fd),
            Err(e) => {
                stop = Some(e);
                break;
            }
        }
    }
    let n = fds.len();
    drop(fds);
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit into a live struct.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    match stop {
        Some(e) => Receipt::blocked(
            A,
            format!(
                "blocked: opened {n} fds, then {} (RLIMIT_NOFILE {}/{})",
                describe_errno(e),
                limit.rlim_cur,
                limit.rlim_max
            ),
        ),
        None => Receipt::succeeded(
            A,
            format!(
                "succeeded: opened all {n} fds (RLIMIT_NOFILE {}/{})",
                limit.rlim_cur, limit.rlim_max
            ),
        ),
    }
}

pub fn c61_core_dump(bait: &Bait) -> Receipt {
    const A: &str = "C61-core-dump";
    let pattern = std::fs::read_to_string("/proc/sys/kernel/core_pattern")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|e| describe_io(&e));
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit into a live struct.
    unsafe { libc::getrlimit(libc::RLIMIT_CORE, &mut limit) };
    // The crash happens in an empty directory of our own, so a core file
    // written relative to the cwd lands there and is removed.
    let Some(dir) = [bait.workspace(), "/tmp".into()]
        .into_iter()
        .map(|d| d.join(sys::unique("core")))
        .find(|d| std::fs::create_dir(d).is_ok())
    else {
        return Receipt::not_attempted(A, "no writable directory to crash in");
    };
    let cdir = sys::cstring(&dir);
    let child = sys::in_child(|_| {
        // SAFETY: raw syscalls in the child; abort() raises SIGABRT.
        unsafe {
            libc::chdir(cdir.as_ptr());
            let raise = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &raise);
            libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
            libc::signal(libc::SIGABRT, libc::SIG_DFL);
            libc::abort();
        }
    });
    let files = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
    // While held, the host looks into the crash directory itself.
    let fate = if sys::holding() {
        format!("kept while held: {}", dir.display())
    } else {
        let _ = std::fs::remove_dir_all(&dir);
        "removed".to_owned()
    };
    let obs = format!(
        "RLIMIT_CORE {}/{}, core_pattern {pattern:?}, {files} files left in the crash dir ({fate})",
        limit.rlim_cur, limit.rlim_max
    );
    match child {
        Err(e) => Receipt::not_attempted(A, format!("fork failed: {}", describe_io(&e))),
        Ok(r) => match r.exit {
            sys::Exit::Signal { core: true, .. } => {
                Receipt::succeeded(A, format!("succeeded: core dumped; {obs}"))
            }
            exit => Receipt::blocked(A, format!("blocked: crash child {exit}; {obs}")),
        },
    }
}
