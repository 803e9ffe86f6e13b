//! The direct launcher's containment where no cgroup can be made: a
//! subreaper between the host and the plugin.
//!
//! The child the host forks for the plugin does not exec. It makes itself
//! a child subreaper (`PR_SET_CHILD_SUBREAPER`), forks the plugin, closes
//! every descriptor it holds and waits. Every orphan of the plugin's tree,
//! a double-forked `setsid` daemon included, is re-parented to it, so when
//! the plugin exits, when the host sends it SIGTERM, or when the host dies
//! (its parent-death signal is SIGTERM), it SIGKILLs its children round by
//! round until it has none, then exits as the plugin did (the same code,
//! or the same signal). The host therefore sees one child that ends when
//! the whole tree has ended.
//!
//! It is a fork of a multi-threaded process, so after the fork it runs
//! raw system calls on its own stack only: no allocation, no lock, no
//! glibc `fork` (whose atfork handlers take locks another thread may have
//! held), only `clone(SIGCHLD)`.
//!
//! What it cannot contain: a plugin that SIGKILLs the shim itself (the
//! plugin runs as the host's user), after which its remaining processes
//! are re-parented past it. The turn's report says `subreaper` and why no
//! cgroup was made, never `cgroup`.

// Everything here runs between fork and exec, or in a forked child that
// never execs: system calls std has no safe form for.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// Longest the shim keeps killing: a tree that forks faster than it is
/// killed is still ended, since every killed process forks no more.
const KILL_ROUNDS: u32 = 100_000;

/// The pipe on which the shim reports the plugin's pid: the read end stays
/// with the host, the write end goes into the forked child.
pub(super) struct PidPipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl PidPipe {
    pub(super) fn new() -> io::Result<Self> {
        let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        Ok(Self { read, write })
    }

    /// The write end, for [`become_shim`] in the forked child.
    pub(super) fn write_fd(&self) -> RawFd {
        self.write.as_raw_fd()
    }

    /// After the spawn: the plugin's pid, which the shim wrote before it
    /// closed its descriptors (so before `spawn` returned).
    pub(super) fn plugin_pid(self) -> io::Result<u32> {
        drop(self.write);
        let mut buf = [0u8; 4];
        let mut got = 0;
        while got < buf.len() {
            match rustix::io::read(&self.read, &mut buf[got..]) {
                Ok(0) => {
                    return Err(io::Error::other(
                        "the direct launcher's subreaper ended before it named the plugin",
                    ));
                }
                Ok(n) => got += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(u32::from_ne_bytes(buf))
    }
}

/// Called in the child std forked, before exec: forks the plugin, which
/// returns `Ok` here and goes on to exec; this process becomes the shim
/// and never returns.
///
/// # Safety
///
/// Only between fork and exec in a child of `host`, with `pid_fd` the
/// write end of a [`PidPipe`].
pub(super) unsafe fn become_shim(host: libc::pid_t, pid_fd: RawFd) -> io::Result<()> {
    // SAFETY: (the whole block) raw system calls on locals; see the
    // function's contract.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigemptyset(&mut none);
        // Blocked before anything can be pending: every signal the shim
        // acts on is then taken by sigwaitinfo, never by a handler that
        // belongs to the host.
        if libc::sigprocmask(libc::SIG_SETMASK, &all, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0) != 0
            || libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0
        {
            return Err(io::Error::last_os_error());
        }
        // The host died before the parent-death signal was armed.
        if libc::getppid() != host {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        let shim = libc::getpid();
        let clone_flags = libc::SIGCHLD as libc::c_ulong;
        let pid = libc::syscall(libc::SYS_clone, clone_flags, 0usize, 0usize, 0usize, 0usize);
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            // The plugin: its own process group (as a cgroup-contained
            // plugin is), no signal blocked, killed when the shim dies.
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            if libc::setpgid(0, 0) != 0
                || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0
            {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != shim {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            return Ok(());
        }
        let plugin = pid as libc::pid_t;
        let bytes = (plugin as u32).to_ne_bytes();
        libc::write(pid_fd, bytes.as_ptr().cast(), bytes.len());
        run_shim(plugin)
    }
}

/// The shim's life after the fork.
unsafe fn run_shim(plugin: libc::pid_t) -> ! {
    // SAFETY: (the whole block) raw system calls on locals in a forked
    // child that owns its stack and never returns.
    unsafe {
        // Nothing of the host's is held: not its pipes (the host's
        // `spawn` waits for its error pipe to close), not the plugin's
        // stdio (the host sees EOF when the plugin's tree is gone).
        if libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) != 0 {
            for fd in 0..65_536 {
                libc::close(fd);
            }
        }
        for sig in 1..libc::SIGRTMAX() {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        let mut wanted: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut wanted);
        libc::sigaddset(&mut wanted, libc::SIGCHLD);
        libc::sigaddset(&mut wanted, libc::SIGTERM);
        let mut status: Option<libc::c_int> = None;
        loop {
            reap_ready(plugin, &mut status);
            if status.is_some() {
                break;
            }
            if libc::sigwaitinfo(&wanted, std::ptr::null_mut()) == libc::SIGTERM {
                libc::kill(plugin, libc::SIGKILL);
                break;
            }
        }
        kill_children(plugin, &mut status);
        exit_as(status)
    }
}

/// Reaps every child that has exited, noting the plugin's status.
unsafe fn reap_ready(plugin: libc::pid_t, status: &mut Option<libc::c_int>) {
    loop {
        let mut st = 0;
        // SAFETY: waitpid with a pointer to a local.
        let r = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
        if r <= 0 {
            return;
        }
        if r == plugin {
            *status = Some(st);
        }
    }
}

/// SIGKILLs every child, round by round (the children of a killed one are
/// re-parented here), until none is left.
unsafe fn kill_children(plugin: libc::pid_t, status: &mut Option<libc::c_int>) {
    for _ in 0..KILL_ROUNDS {
        // SAFETY: the callee reads into a stack buffer.
        unsafe { kill_listed_children() };
        let mut st = 0;
        // SAFETY: waitpid with a pointer to a local.
        let r = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
        if r == plugin {
            *status = Some(st);
        }
        if r < 0 {
            // ECHILD: no child left.
            return;
        }
        if r == 0 {
            // Killed, not yet dead: a moment before the next round.
            let pause = libc::timespec {
                tv_sec: 0,
                tv_nsec: 500_000,
            };
            // SAFETY: nanosleep with a pointer to a local.
            unsafe { libc::nanosleep(&pause, std::ptr::null_mut()) };
        }
    }
}

/// SIGKILLs each pid in `/proc/thread-self/children` (this single-threaded
/// process's children).
unsafe fn kill_listed_children() {
    // SAFETY: (the whole block) open/read/close/kill on a stack buffer.
    unsafe {
        let fd = libc::open(
            c"/proc/thread-self/children".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return;
        }
        let mut buf = [0u8; 4096];
        let mut pid: libc::pid_t = 0;
        loop {
            let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
            if n <= 0 {
                break;
            }
            for &b in &buf[..n as usize] {
                if b.is_ascii_digit() {
                    pid = pid
                        .saturating_mul(10)
                        .saturating_add(libc::pid_t::from(b - b'0'));
                } else {
                    if pid > 0 {
                        libc::kill(pid, libc::SIGKILL);
                    }
                    pid = 0;
                }
            }
        }
        if pid > 0 {
            libc::kill(pid, libc::SIGKILL);
        }
        libc::close(fd);
    }
}

/// Exits with the plugin's code, or dies of the plugin's signal (without
/// a core dump of the host's memory).
unsafe fn exit_as(status: Option<libc::c_int>) -> ! {
    // SAFETY: (the whole block) exit-path system calls on locals.
    unsafe {
        let Some(st) = status else { libc::_exit(125) };
        if libc::WIFEXITED(st) {
            libc::_exit(libc::WEXITSTATUS(st));
        }
        let sig = libc::WTERMSIG(st);
        let no_core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        libc::kill(libc::getpid(), sig);
        let mut only: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut only);
        libc::sigaddset(&mut only, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &only, std::ptr::null_mut());
        libc::_exit(128 + sig)
    }
}
