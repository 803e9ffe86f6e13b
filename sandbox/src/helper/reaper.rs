//! Pid 1 of the sandbox: builds the minimal root, forks the plugin and
//! reaps. With a pid namespace its exit takes the whole namespace down;
//! without one it is a subreaper that kills every descendant itself.

use std::convert::Infallible;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::plugin::plugin_exec;
use super::process::{
    Fail, ReportPipe, arm_parent_death_signal, exit_code, fail, os_fail, prctl, sigset,
};
use super::sources::HostSources;
use crate::mounts::{self, RootSpec};
use crate::report::{LayerStatus, SandboxReport};
use crate::request::HelperRequest;
use crate::timing::stamp;

/// Without a pid namespace: SIGKILL every descendant of this process (a
/// subreaper, so orphans of the plugin are its children) until none is
/// left. Best effort: bounded rounds, each scanning `/proc`.
fn kill_descendants() {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    for _ in 0..500 {
        let mut parent_of = std::collections::HashMap::new();
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for e in dir.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                    continue;
                };
                if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    && let Some((_, rest)) = stat.rsplit_once(") ")
                {
                    let mut f = rest.split_whitespace();
                    let state = f.next().unwrap_or("");
                    let ppid: i32 = f.next().and_then(|x| x.parse().ok()).unwrap_or(0);
                    if state != "Z" && state != "X" {
                        parent_of.insert(pid, ppid);
                    }
                }
            }
        }
        let is_descendant = |mut p: i32| {
            for _ in 0..4096 {
                match parent_of.get(&p) {
                    Some(&pp) if pp == me => return true,
                    Some(&pp) if pp > 1 => p = pp,
                    _ => return false,
                }
            }
            false
        };
        let victims: Vec<i32> = parent_of
            .keys()
            .copied()
            .filter(|p| *p != me && is_descendant(*p))
            .collect();
        for p in &victims {
            // SAFETY: signalling a descendant of this process.
            unsafe { libc::kill(*p, libc::SIGKILL) };
        }
        // Reap whatever died (our children and adopted orphans).
        // SAFETY: non-blocking waitpid with a null status pointer.
        while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
        if victims.is_empty() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
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
    prctl(libc::PR_SET_DUMPABLE, 0);
    // A neutral name (its argv[0] is already `sandbox-init`): the plugin
    // reads pid 1's comm, never the host binary's name.
    prctl(libc::PR_SET_NAME, c"sandbox-init".as_ptr() as libc::c_ulong);
    if !pidns {
        // Without a pid namespace, orphans of the plugin come back to us.
        prctl(libc::PR_SET_CHILD_SUBREAPER, 1);
    }
    let program_name = req
        .program
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "plugin".into());

    // 9. The minimal root.
    let mountns = rep.mountns == LayerStatus::Applied;
    if mountns {
        let p = &req.policy;
        let mem_total = p
            .rlimits
            .address_space
            .or(p.rlimits.data)
            .unwrap_or(4 << 30);
        let built = mounts::build(&RootSpec {
            workspace: sources.workspace.as_ref().map(|w| w.0),
            workspace_size: p.workspace_size_bytes,
            program: sources.program.as_ref().map(|s| s.0),
            program_name: &program_name,
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
    }
    drop(sources);
    // 10. Hostname.
    if rep.utsns == LayerStatus::Applied {
        // SAFETY: the name pointer and length describe a static buffer.
        unsafe { libc::sethostname(c"sandbox".as_ptr(), 7) };
    }

    let (workdir, tmpdir, exe) = if mountns {
        let exe = if req.program_in_place {
            req.program.clone()
        } else {
            Path::new(mounts::PLUGIN_DIR).join(&program_name)
        };
        (
            PathBuf::from(mounts::WORKSPACE),
            PathBuf::from(crate::fsview::TMP),
            exe,
        )
    } else {
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
        (ws, t, req.program.clone())
    };
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
    // SAFETY: closing pid 1's copies of the plugin's stdio and the report
    // pipe so the host sees EOF when the plugin (tree) closes them.
    unsafe {
        libc::close(pipe.0.as_raw_fd());
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        for fd in 0..3 {
            if null >= 0 {
                libc::dup2(null, fd);
            } else {
                libc::close(fd);
            }
        }
        if null > 2 {
            libc::close(null);
        }
    }
    if pidns {
        loop {
            let mut status = 0;
            // SAFETY: reaping any child; `status` is a valid out pointer.
            let w = unsafe { libc::waitpid(-1, &mut status, 0) };
            if w == plugin {
                // When pid 1 exits the kernel SIGKILLs the rest of the namespace.
                // SAFETY: plain exit.
                unsafe { libc::_exit(exit_code(status)) }
            }
            if w < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                // SAFETY: plain exit.
                unsafe { libc::_exit(1) }
            }
        }
    }
    // No pid namespace: SIGTERM (the supervisor's death signal, or its
    // request) and the plugin's exit both end with every descendant killed.
    let wanted = sigset(&[libc::SIGTERM, libc::SIGCHLD]);
    loop {
        loop {
            let mut status = 0;
            // SAFETY: non-blocking reap; `status` is a valid out pointer.
            let w = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if w == plugin {
                kill_descendants();
                // SAFETY: plain exit.
                unsafe { libc::_exit(exit_code(status)) }
            }
            if w <= 0 {
                break;
            }
        }
        let timeout = libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        // SAFETY: `wanted` is initialized and blocked; null info is allowed.
        let sig = unsafe { libc::sigtimedwait(&wanted, std::ptr::null_mut(), &timeout) };
        if sig == libc::SIGTERM {
            kill_descendants();
            // SAFETY: plain exit.
            unsafe { libc::_exit(128 + libc::SIGTERM) }
        }
    }
}
