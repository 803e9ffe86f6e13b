//! Pid 1 of the sandbox: builds the minimal root, forks the plugin and
//! reaps. With a pid namespace its exit takes the whole namespace down;
//! without one it is a subreaper that kills every descendant itself.

use std::convert::Infallible;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};

use nix::sys::signal::Signal;
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::process::{Pid, Signal as RustixSignal, WaitOptions};
use std::path::{Path, PathBuf};

use super::plugin::plugin_exec;
use super::process::{
    Fail, ReportPipe, arm_parent_death_signal, exit_code, fail, os_fail, set_dumpable, sigset,
};
use super::sources::HostSources;
use crate::mounts::{self, RootSpec};
use crate::report::{LayerStatus, SandboxReport};
use crate::request::HelperRequest;
use crate::timing::stamp;

/// Without a pid namespace: SIGKILL every descendant of this process until
/// none is left. It is a subreaper, so every orphan of the plugin's tree is
/// its child; each round kills the children `proc` (the host's `/proc`,
/// opened before the sandbox's root replaced it with an empty one) lists,
/// reaps the dead, and the children of a killed one come back here for the
/// next round. Bounded: a tree that forks is still ended, since every
/// killed process forks no more.
fn kill_descendants(proc: Option<&OwnedFd>) {
    for _ in 0..100_000 {
        if let Some(proc) = proc {
            for pid in listed_children(proc) {
                let _ = rustix::process::kill_process(pid, RustixSignal::KILL);
            }
        }
        match rustix::process::wait(WaitOptions::NOHANG) {
            // Reaped one: the next round lists what it left.
            Ok(Some(_)) => {}
            // Killed, not yet dead: a moment before the next round.
            Ok(None) => std::thread::sleep(std::time::Duration::from_micros(500)),
            // ECHILD: none left.
            Err(_) => return,
        }
    }
}

/// This single-threaded process's children, from `<proc>/thread-self/children`.
fn listed_children(proc: &OwnedFd) -> Vec<Pid> {
    let Ok(fd) = rustix::fs::openat(
        proc,
        "thread-self/children",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return Vec::new();
    };
    let mut text = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = rustix::io::read(&fd, &mut buf) {
        if n == 0 {
            break;
        }
        text.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&text)
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .filter_map(Pid::from_raw)
        .collect()
}

/// Pid 1 of the new pid namespace (or a plain reaper without one).
pub(super) fn pid_one(
    req: HelperRequest,
    mut rep: SandboxReport,
    sources: HostSources,
    pipe: &ReportPipe,
) -> Result<Infallible, Fail> {
    let pidns = rep.pidns == LayerStatus::Applied;
    // Nothing inside may ptrace or read the memory of the reaper.
    let _ = set_dumpable(false);
    // A neutral name (its argv[0] is already `sandbox-init`): the plugin
    // reads pid 1's comm, never the host binary's name.
    let _ = rustix::thread::set_name(c"sandbox-init");
    // Without a pid namespace, orphans of the plugin come back to us, and
    // the host's `/proc` (the sandbox's is left empty) lists them.
    let host_proc = if pidns {
        None
    } else {
        let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
        rustix::fs::open(
            "/proc",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()
    };
    let program_name = req
        .program
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "plugin".into());

    let mountns = rep.mountns == LayerStatus::Applied;
    if mountns {
        build_root(&req, &mut rep, &sources, pidns, &program_name)?;
    }
    drop(sources);
    // 10. Hostname.
    if rep.utsns == LayerStatus::Applied {
        let _ = rustix::system::sethostname(b"sandbox");
    }

    let (workdir, tmpdir, exe) = places(&req, mountns, &program_name)?;
    if let Some(view) = rep.view.as_mut() {
        view.program = exe.display().to_string();
        view.program_in_place = req.program_in_place;
        view.workdir = workdir.display().to_string();
    }

    // 11. Fork the plugin and reap until it exits.
    // SAFETY: pid 1 is single-threaded.
    let plugin = unsafe { libc::fork() };
    if plugin < 0 {
        return Err(os_fail("fork", "fork plugin"));
    }
    if plugin == 0 {
        stamp("plugin", "forked");
        arm_parent_death_signal();
        let r = plugin_exec(&req, &mut rep, mountns, &workdir, &tmpdir, &exe, pipe);
        match r {
            Ok(never) => match never {},
            Err(f) => pipe.fail(f),
        }
    }
    release_stdio(pipe);
    if pidns {
        reap_in_pid_namespace(plugin)
    } else {
        reap_as_subreaper(plugin, host_proc.as_ref())
    }
}

/// Step 9: the minimal root.
fn build_root(
    req: &HelperRequest,
    rep: &mut SandboxReport,
    sources: &HostSources,
    pidns: bool,
    program_name: &str,
) -> Result<(), Fail> {
    let p = &req.policy;
    // What `/proc/meminfo` shows: the tree's `memory.max` where one was
    // set, else the per-process limits.
    let mem_total = rep
        .cgroup
        .memory_max
        .or(p.rlimits.address_space)
        .or(p.rlimits.data)
        .unwrap_or(4 << 30);
    let built = mounts::build(&RootSpec {
        workspace: sources.workspace.as_ref().map(|w| w.0),
        workspace_size: p.workspace_size_bytes,
        program: sources.program.as_ref().map(|s| s.0),
        program_name,
        tmp_size: p.tmp_size_bytes,
        shm_size: p.shm_size_bytes,
        home_size: p.home_size_bytes,
        nr_inodes: p.tmpfs_nr_inodes,
        ro_paths: &p.ro_paths,
        extra_ro: &p.extra_ro_paths,
        extras: sources
            .extras
            .iter()
            .map(|(path, dir, fd)| (path.clone(), *dir, fd.as_raw_fd()))
            .collect(),
        proc_replacements: crate::procmask::Replacements::new(mem_total >> 10),
        with_proc: pidns,
        describe: p.describe,
    })
    .map_err(|e| fail("root", e))?;
    rep.warnings.extend(built.warnings);
    if p.describe {
        rep.view = Some(crate::fsview::RootView {
            mounts: built.view,
            ..Default::default()
        });
    }
    rep.root = LayerStatus::Applied;
    stamp("pid1", "root_built");
    Ok(())
}

/// Where the plugin runs: its working directory, its temp directory and
/// the path it is executed from.
fn places(
    req: &HelperRequest,
    mountns: bool,
    program_name: &str,
) -> Result<(PathBuf, PathBuf, PathBuf), Fail> {
    if mountns {
        let exe = if req.program_in_place {
            req.program.clone()
        } else {
            Path::new(mounts::PLUGIN_DIR).join(program_name)
        };
        return Ok((
            PathBuf::from(mounts::WORKSPACE),
            PathBuf::from(crate::fsview::TMP),
            exe,
        ));
    }
    // No mount namespace, so no tmpfs workspace: the host's directory.
    let Some(ws) = req.workspace.clone() else {
        return Err(fail(
            "workspace",
            "this sandbox has no mount namespace, so its workspace cannot be a tmpfs of \
             its own; the host must give it a workspace directory",
        ));
    };
    // No private /tmp: a private dir inside the workspace instead of the
    // host's /tmp (the degraded reference launcher leaked through it).
    let t = ws.join(".sharedos-tmp");
    let _ = std::fs::create_dir(&t);
    Ok((ws, t, req.program.clone()))
}

/// Pid 1's copies of the plugin's stdio and of the report pipe go, so the
/// host sees EOF when the plugin (tree) closes them.
fn release_stdio(pipe: &ReportPipe) {
    // SAFETY: closing pid 1's copy of the report pipe; its owner (`pipe`)
    // is never used again in this process.
    unsafe { libc::close(pipe.0.as_raw_fd()) };
    match rustix::fs::open("/dev/null", OFlags::RDWR, Mode::empty()) {
        Ok(null) => {
            let _ = rustix::stdio::dup2_stdin(&null);
            let _ = rustix::stdio::dup2_stdout(&null);
            let _ = rustix::stdio::dup2_stderr(&null);
            if null.as_raw_fd() <= 2 {
                // It took a stdio slot: that slot must stay open.
                let _ = null.into_raw_fd();
            }
        }
        Err(_) => {
            for fd in 0..3 {
                // SAFETY: closing pid 1's stdio slots, which no owned fd of
                // this process holds.
                unsafe { libc::close(fd) };
            }
        }
    }
}

/// With a pid namespace: reap until the plugin exits, then exit with its
/// status; the kernel SIGKILLs the rest of the namespace when pid 1 exits.
fn reap_in_pid_namespace(plugin: libc::pid_t) -> ! {
    loop {
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some((pid, status))) if pid.as_raw_pid() == plugin => {
                // SAFETY: plain exit.
                unsafe { libc::_exit(exit_code(status.as_raw())) }
            }
            Err(e) if e != Errno::INTR => {
                // SAFETY: plain exit.
                unsafe { libc::_exit(1) }
            }
            _ => {}
        }
    }
}

/// No pid namespace: SIGTERM (the supervisor's death signal, or its
/// request) and the plugin's exit both end with every descendant killed.
fn reap_as_subreaper(plugin: libc::pid_t, proc: Option<&OwnedFd>) -> ! {
    let wanted = sigset(&[Signal::SIGTERM, Signal::SIGCHLD]);
    loop {
        loop {
            match rustix::process::wait(WaitOptions::NOHANG) {
                Ok(Some((pid, status))) if pid.as_raw_pid() == plugin => {
                    kill_descendants(proc);
                    // SAFETY: plain exit.
                    unsafe { libc::_exit(exit_code(status.as_raw())) }
                }
                Ok(Some(_)) => {}
                _ => break,
            }
        }
        let timeout = libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        // SAFETY: `wanted` is initialized and blocked; null info is allowed.
        let sig = unsafe { libc::sigtimedwait(wanted.as_ref(), std::ptr::null_mut(), &timeout) };
        if sig == libc::SIGTERM {
            kill_descendants(proc);
            // SAFETY: plain exit.
            unsafe { libc::_exit(128 + libc::SIGTERM) }
        }
    }
}
