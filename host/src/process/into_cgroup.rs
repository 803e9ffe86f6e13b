//! A direct plugin created inside its cgroup (`clone3` with
//! `CLONE_INTO_CGROUP`), for the direct launcher.
//!
//! Moving a running process into a cgroup (a write to `cgroup.procs`)
//! takes the kernel's cgroup-wide thread-group lock for writing, which
//! waits for an RCU grace period: 11–14 ms a launch under strace on the
//! project's VM, where the whole direct launch took 11–14 ms
//! (docs/BENCHMARKS.md, 2026-12-06), against 0.2 ms for the `clone`. A child created in its cgroup is never moved.
//! std's `Command` cannot create one, so this is the spawn the direct
//! launcher's `Command` would do, by hand: the same pipes, working
//! directory, process group, signal state, parent-death signal and exec,
//! and an exec failure reported through a close-on-exec pipe. When
//! `clone3` is refused (an older kernel, no `CLONE_INTO_CGROUP`), the
//! caller falls back to `Command` and the write.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::Arc;

use super::launcher::LaunchSpec;
use super::pinned::PinnedExec;

/// `CLONE_INTO_CGROUP` (linux/sched.h; not in every libc crate version).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` up to `cgroup` (CLONE_ARGS_SIZE_VER2).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// A child made by [`spawn`], waited for by pid.
#[derive(Debug)]
pub(super) struct RawChild {
    pid: i32,
    status: Option<ExitStatus>,
}

impl RawChild {
    pub(super) fn id(&self) -> u32 {
        self.pid as u32
    }

    // waitpid(2) on this child: std has no safe form by pid.
    #[allow(unsafe_code)]
    pub(super) fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        let mut raw = 0;
        // SAFETY: waitpid on our own child with a valid pointer to a local.
        let r = unsafe { libc::waitpid(self.pid, &mut raw, libc::WNOHANG) };
        match r {
            0 => Ok(None),
            r if r == self.pid => {
                let s = ExitStatus::from_raw(raw);
                self.status = Some(s);
                Ok(Some(s))
            }
            _ => Err(io::Error::last_os_error()),
        }
    }

    #[allow(unsafe_code)]
    pub(super) fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(s) = self.status {
            return Ok(s);
        }
        loop {
            let mut raw = 0;
            // SAFETY: as in `try_wait`.
            let r = unsafe { libc::waitpid(self.pid, &mut raw, 0) };
            if r == self.pid {
                let s = ExitStatus::from_raw(raw);
                self.status = Some(s);
                return Ok(s);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// The parent's ends of the child's stdio, and the child.
pub(super) struct Spawned {
    pub child: RawChild,
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// Why [`spawn`] made no child: `Unsupported` when the caller should fall
/// back to `Command` (nothing was started), `Failed` when the child could
/// not run the plugin (it was reaped).
enum SpawnError {
    Unsupported,
    Failed(io::Error),
}

fn cstring(bytes: &[u8]) -> Option<CString> {
    CString::new(bytes).ok()
}

/// `program`'s argv and envp as NUL-terminated strings and the
/// null-terminated pointer arrays over them, made before the clone (the
/// child allocates nothing). `None` for a program found through `PATH` or
/// a string with a NUL: `Command` handles (or refuses) those.
struct Exec {
    program: CString,
    _strings: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
}

impl Exec {
    fn new(spec: &LaunchSpec) -> Option<Self> {
        let program_bytes = spec.program.as_os_str().as_bytes();
        if !program_bytes.contains(&b'/') {
            return None;
        }
        let program = cstring(program_bytes)?;
        let mut args = vec![program.clone()];
        for a in &spec.args {
            args.push(cstring(a.as_bytes())?);
        }
        let mut env = Vec::new();
        for (k, v) in &spec.env {
            env.push(cstring(format!("{k}={v}").as_bytes())?);
        }
        let argv: Vec<_> = args
            .iter()
            .map(|s| s.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let envp: Vec<_> = env
            .iter()
            .map(|s| s.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let mut strings = args;
        strings.extend(env);
        Some(Self {
            program,
            _strings: strings,
            argv,
            envp,
        })
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(io::Error::from)
}

/// Starts `spec`'s program in the cgroup whose directory is `cgroup`, with
/// piped stdio, `cwd`, a process group of its own, the default signal
/// state, `PR_SET_PDEATHSIG` (checked against the host's pid, `host`), and
/// the pinned copy's descriptor when there is one.
// The child between clone3 and exec runs only async-signal-safe calls on
// values made before the clone.
#[allow(unsafe_code)]
fn spawn(
    spec: &LaunchSpec,
    cwd: &Path,
    cgroup: &OwnedFd,
    pinned: Option<&Arc<PinnedExec>>,
    host: i32,
) -> Result<Spawned, SpawnError> {
    let exec = Exec::new(spec).ok_or(SpawnError::Unsupported)?;
    let cwd = cstring(cwd.as_os_str().as_bytes()).ok_or(SpawnError::Unsupported)?;
    let fail = SpawnError::Failed;
    let (in_r, in_w) = pipe().map_err(fail)?;
    let (out_r, out_w) = pipe().map_err(fail)?;
    let (err_r, err_w) = pipe().map_err(fail)?;
    let (report_r, report_w) = pipe().map_err(fail)?;
    let fds = [
        in_r.as_raw_fd(),
        out_w.as_raw_fd(),
        err_w.as_raw_fd(),
        report_w.as_raw_fd(),
    ];
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: clone3 without CLONE_VM, like fork: the child gets a copy of
    // this thread alone, on a copy of its stack, and returns here with 0.
    // `args` is a valid clone_args of the size given.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if pid == 0 {
        // SAFETY: in the child, before exec: only async-signal-safe calls
        // on descriptors, strings and arrays made before the clone; it
        // never returns.
        unsafe { child(&exec, &cwd, fds, pinned, host) }
    }
    if pid < 0 {
        return Err(SpawnError::Unsupported);
    }
    let pid = pid as i32;
    drop((in_r, out_w, err_w, report_w));
    let mut child = RawChild { pid, status: None };
    // The child writes its errno here if it could not exec; end of file
    // (the close-on-exec descriptor closed by a successful exec) is success.
    let mut errno = [0u8; 4];
    let mut got = 0;
    while got < errno.len() {
        match rustix::io::read(&report_r, &mut errno[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                let _ = child.wait();
                return Err(SpawnError::Failed(e.into()));
            }
        }
    }
    if got > 0 {
        let _ = child.wait();
        return Err(SpawnError::Failed(io::Error::from_raw_os_error(
            i32::from_ne_bytes(errno),
        )));
    }
    Ok(Spawned {
        child,
        stdin: in_w,
        stdout: out_r,
        stderr: err_r,
    })
}

/// The child's side: stdio, working directory, process group, signals,
/// parent-death signal, exec; on failure its errno to the report pipe.
///
/// # Safety
///
/// Only in the child of [`spawn`]'s clone, before exec.
#[allow(unsafe_code)]
unsafe fn child(
    exec: &Exec,
    cwd: &CString,
    [stdin, stdout, stderr, report]: [i32; 4],
    pinned: Option<&Arc<PinnedExec>>,
    host: i32,
) -> ! {
    // SAFETY: every call below is async-signal-safe and takes descriptors,
    // pointers into `exec` and `cwd` (alive: this frame never returns) or
    // locals.
    unsafe {
        let errno = (|| -> i32 {
            for (fd, to) in [(stdin, 0), (stdout, 1), (stderr, 2)] {
                // A pipe end that already is the target (a host started
                // with that descriptor closed) keeps it: only its
                // close-on-exec flag goes.
                let ok = if fd == to {
                    libc::fcntl(fd, libc::F_SETFD, 0) == 0
                } else {
                    libc::dup2(fd, to) >= 0
                };
                if !ok {
                    return *libc::__errno_location();
                }
            }
            if libc::chdir(cwd.as_ptr()) != 0 || libc::setpgid(0, 0) != 0 {
                return *libc::__errno_location();
            }
            // As `Command` leaves it: no signal blocked, SIGPIPE default.
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return *libc::__errno_location();
            }
            // The host died between the clone and the prctl.
            if libc::getppid() != host {
                return libc::ESRCH;
            }
            match pinned {
                Some(p) => p.exec().raw_os_error().unwrap_or(libc::ENOEXEC),
                None => {
                    libc::execve(
                        exec.program.as_ptr(),
                        exec.argv.as_ptr(),
                        exec.envp.as_ptr(),
                    );
                    *libc::__errno_location()
                }
            }
        })();
        let bytes = errno.to_ne_bytes();
        libc::write(report, bytes.as_ptr().cast(), bytes.len());
        libc::_exit(127)
    }
}

/// [`spawn`] into the cgroup directory `dir`: `None` when the caller
/// should fall back to `Command` and the move (nothing was started).
pub(super) fn spawn_in(
    spec: &LaunchSpec,
    cwd: &Path,
    dir: &Path,
    pinned: Option<&Arc<PinnedExec>>,
) -> io::Result<Option<Spawned>> {
    let flags =
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC;
    let Ok(cgroup) = rustix::fs::open(dir, flags, rustix::fs::Mode::empty()) else {
        return Ok(None);
    };
    let host = rustix::process::getpid().as_raw_nonzero().get();
    match spawn(spec, cwd, &cgroup, pinned, host) {
        Ok(spawned) => Ok(Some(spawned)),
        Err(SpawnError::Unsupported) => Ok(None),
        Err(SpawnError::Failed(e)) => Err(e),
    }
}
