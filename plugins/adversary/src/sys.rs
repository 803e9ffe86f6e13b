//! Thin wrappers over raw syscalls: the attacks want the exact errno.

use std::ffi::CString;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Hold mode (bait `hold`): what an attack obtained (a socket, a listener,
/// an io_uring or a bpf fd, a mount, a crash directory) is kept until the
/// process ends, so the host can look for it from `/proc` while the
/// attack is held.
static HOLD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static KEPT: std::sync::Mutex<Vec<OwnedFd>> = std::sync::Mutex::new(Vec::new());

pub fn set_holding(on: bool) {
    HOLD.store(on, std::sync::atomic::Ordering::Relaxed);
}

pub fn holding() -> bool {
    HOLD.load(std::sync::atomic::Ordering::Relaxed)
}

/// Keeps `fd` open while holding; closes it otherwise.
pub fn keep(fd: OwnedFd) {
    if holding() {
        KEPT.lock().unwrap_or_else(|p| p.into_inner()).push(fd);
    }
}

/// How an attack left what it obtained, for its receipt.
pub fn kept_or_closed() -> &'static str {
    if holding() {
        "kept open while held"
    } else {
        "closed at once"
    }
}

pub fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

pub fn cstring(path: &Path) -> CString {
    // A path with an interior NUL cannot name a file; refuse it as ENOENT
    // would, by turning it into an empty string.
    CString::new(path.as_os_str().as_bytes()).unwrap_or_default()
}

/// `open(2)` returning the errno on failure.
pub fn open(path: &Path, flags: i32, mode: libc::mode_t) -> Result<OwnedFd, i32> {
    let c = cstring(path);
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: `fd` was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Wraps a raw fd returned by a syscall, or the errno when it failed.
pub fn owned(fd: i64) -> Result<OwnedFd, i32> {
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: a non-negative return of an fd-creating syscall is a fresh fd
    // that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Reads at most `max` bytes from `path`.
pub fn read_prefix(path: &Path, max: usize) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    let mut buf = Vec::new();
    file.take(max as u64).read_to_end(&mut buf)?;
    Ok(buf)
}

/// One field of `/proc/self/status`, e.g. `CapEff`.
pub fn status_field(name: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(name)?
            .strip_prefix(':')
            .map(|v| v.trim().to_owned())
    })
}

/// How a probe child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal { signal: i32, core: bool },
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exit {c}"),
            Exit::Signal { signal, core } => {
                write!(
                    f,
                    "killed by signal {signal}{}",
                    if *core { " (core dumped)" } else { "" }
                )
            }
        }
    }
}

/// What a probe child wrote back (pairs of i32) and how it ended.
#[derive(Debug, Clone)]
pub struct ChildReport {
    pub words: Vec<i32>,
    pub exit: Exit,
}

/// The write end a probe child reports through. Only `write(2)`, so it
/// stays async-signal-safe in the child of a multi-threaded process.
pub struct Words(i32);

impl Words {
    /// Closes the report pipe in a grandchild that must not hold it.
    pub fn close(&self) {
        // SAFETY: closing our own pipe fd in a forked process.
        unsafe { libc::close(self.0) };
    }
    pub fn put(&self, value: i32) {
        let bytes = value.to_ne_bytes();
        // SAFETY: writes 4 bytes from a live stack buffer to our pipe fd.
        unsafe { libc::write(self.0, bytes.as_ptr().cast(), bytes.len()) };
    }
}

/// Runs `probe` in a forked child and collects what it reports.
///
/// Used where an attempt must not change this process (namespaces,
/// chroot, a crash) or needs a single-threaded caller (`unshare(USER)`).
/// The probe runs after `fork` in a process that may have other threads:
/// it must only make raw syscalls on data prepared before the fork.
pub fn in_child(probe: impl FnOnce(&Words) -> i32) -> io::Result<ChildReport> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let (rd, wr) = (fds[0], fds[1]);
    // SAFETY: the child only runs `probe` (raw syscalls by contract) and
    // leaves with `_exit`, never returning into the parent's state.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = io::Error::last_os_error();
        // SAFETY: both fds are ours and still open.
        unsafe {
            libc::close(rd);
            libc::close(wr);
        }
        return Err(e);
    }
    if pid == 0 {
        // SAFETY: in the child; `rd` is ours; `_exit` never returns.
        unsafe {
            libc::close(rd);
            let code = probe(&Words(wr));
            libc::_exit(code);
        }
    }
    // SAFETY: `wr` is the parent's copy of the write end.
    unsafe { libc::close(wr) };
    // SAFETY: `rd` is a fresh fd owned only here.
    let mut reader = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(rd) });
    let mut bytes = Vec::new();
    let _ = std::io::Read::read_to_end(&mut reader, &mut bytes);
    let exit = wait(pid)?;
    let words = bytes
        .chunks_exact(4)
        .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok(ChildReport { words, exit })
}

/// Reaps one of our own children.
pub fn wait(pid: i32) -> io::Result<Exit> {
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid out-pointer; `pid` is our child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
        if r == pid {
            break;
        }
        if r < 0 && errno() != libc::EINTR {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(if libc::WIFSIGNALED(status) {
        Exit::Signal {
            signal: libc::WTERMSIG(status),
            core: libc::WCOREDUMP(status),
        }
    } else {
        Exit::Code(libc::WEXITSTATUS(status))
    })
}

/// The workspace: the bait's, else the current directory.
pub fn workspace(bait_ws: Option<&Path>) -> std::path::PathBuf {
    bait_ws
        .map(Path::to_path_buf)
        .unwrap_or_else(|| std::env::current_dir().unwrap_or_else(|_| ".".into()))
}

/// A name unique to this attempt, for files the attacks create. The pid
/// alone is not enough: inside a pid namespace every plugin is pid 2.
pub fn unique(stem: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "sharedos-adversary-{stem}-{}-{nanos:09}",
        std::process::id()
    )
}

/// Makes a forked process a quiet daemon body: named `comm` (for the host
/// to find), deaf to SIGTERM/SIGHUP/SIGINT, and, when `detach_stdio`,
/// with stdio on /dev/null and every other fd closed. Raw syscalls only.
///
/// # Safety
/// Call only in a freshly forked child; `comm` and `devnull` must have been
/// prepared before the fork.
pub unsafe fn become_daemon_body(
    comm: &std::ffi::CStr,
    devnull: &std::ffi::CStr,
    detach_stdio: bool,
) {
    // SAFETY: raw syscalls on strings prepared before the fork.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, comm.as_ptr());
        for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT, libc::SIGPIPE] {
            libc::signal(sig, libc::SIG_IGN);
        }
        if detach_stdio {
            let fd = libc::open(devnull.as_ptr(), libc::O_RDWR);
            if fd >= 0 {
                for target in 0..=2 {
                    libc::dup2(fd, target);
                }
            }
        }
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
    }
}

/// Sleeps `secs` seconds with raw nanosleep (safe in a forked child).
pub fn raw_sleep(secs: u64) {
    let mut left = libc::timespec {
        tv_sec: secs as libc::time_t,
        tv_nsec: 0,
    };
    loop {
        let mut rem = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: nanosleep with two live timespecs.
        if unsafe { libc::nanosleep(&left, &mut rem) } == 0 {
            return;
        }
        left = rem;
    }
}

/// Ignores the polite termination signals in this process.
pub fn ignore_termination() {
    for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT] {
        // SAFETY: setting a signal to SIG_IGN.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
}

/// Writes all of `bytes` to a raw fd; the errno of the first failure.
pub fn write_all_fd(fd: i32, mut bytes: &[u8]) -> Result<(), i32> {
    while !bytes.is_empty() {
        // SAFETY: writing from a live slice of the given length.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            if e == libc::EAGAIN {
                // A non-blocking pipe (the plugin transport's): wait until
                // the reader makes room, as a blocking write would.
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLOUT,
                    revents: 0,
                };
                // SAFETY: poll on one live pollfd.
                unsafe { libc::poll(&mut pfd, 1, -1) };
                continue;
            }
            return Err(e);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

/// The identity (device, inode) of the pipe fd 1 was when the process
/// started, recorded by [`record_protocol_stdout`].
static PROTOCOL_STDOUT: std::sync::OnceLock<(u64, u64)> = std::sync::OnceLock::new();

fn fd_identity(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: fstat into a zeroed plain-old-data struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on an integer fd and a live struct.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// Records what fd 1 is at start. The plugin SDK keeps its own dup of
/// stdout for the protocol and then points fd 1 at stderr (so a stray
/// print cannot break the wire): the stdio attacks must aim at that dup,
/// the host's real stdout reader, not at fd 1.
pub fn record_protocol_stdout() {
    if let Some(id) = fd_identity(1) {
        let _ = PROTOCOL_STDOUT.set(id);
    }
}

/// Every open fd on the host's stdout pipe (fd 1 itself when nothing moved
/// it, else the transport's dup), lowest first.
pub fn protocol_stdout_fds() -> Vec<i32> {
    let Some(id) = PROTOCOL_STDOUT.get().copied().or_else(|| fd_identity(1)) else {
        return Vec::new();
    };
    let mut max = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit into a live struct.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut max) };
    let top = max.rlim_cur.clamp(64, 65_536) as i32;
    (0..top).filter(|&fd| fd_identity(fd) == Some(id)).collect()
}

/// The fd that reaches the host's stdout reader.
pub fn protocol_stdout() -> i32 {
    protocol_stdout_fds().first().copied().unwrap_or(1)
}
