//! The supervisor: the helper itself, outside the pid namespace. It
//! receives the request, builds the layers that belong to the whole tree
//! (lifeline, session, fds, cgroup, credentials and namespaces), forks pid 1
//! and then watches the lifeline until the tree ends.

use std::convert::Infallible;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::process::{
    CONTROL_FD, CTL_FD, Fail, ReportPipe, arm_parent_death_signal, block_term_and_chld, exit_code,
    exit_status_to_host, fail, os_fail, parent_gone, pipe_cloexec, prctl,
};
use super::reaper::pid_one;
use super::sources::HostSources;
use super::{credentials, egress, fds};
use crate::cgroup;
use crate::landlock as ll;
use crate::report::{LandlockReport, LayerStatus, SandboxReport, SeccompReport};
use crate::request::{self, HelperRequest};
use crate::seccomp;
use crate::timing::{self, stamp};

/// One helper, executed by the host or forked by the fork server (then
/// `parent` is the server's pid, which the lifeline checks against instead
/// of the host's).
pub(super) fn run(entered: u64, parent: Option<i32>) -> ! {
    // Lifeline, part 1: armed before anything else, so a host that dies from
    // here on takes the helper with it (checked against the host pid below).
    arm_parent_death_signal();
    CTL_FD.store(CONTROL_FD, std::sync::atomic::Ordering::Relaxed);
    let (req, fds) = match request::receive(CONTROL_FD) {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "sharedos __sandbox-exec: no request on fd 0 ({e}). This is the sandbox helper of \
                 sharedos; it is not meant to be run by hand."
            );
            exit_status_to_host(125);
            std::process::exit(125);
        }
    };
    if req.policy.timings {
        timing::enable(
            req.origin_ns,
            &[
                (
                    if parent.is_some() {
                        "forked by the fork server"
                    } else {
                        "main_entered"
                    },
                    entered,
                ),
                ("request_received", timing::now_ns()),
            ],
        );
    }
    let pipe = ReportPipe(fds.report_w, fds.start_r);
    let parent = parent.unwrap_or(req.host_pid);
    match supervise(req, fds.stdin_r, &pipe, parent) {
        Ok(never) => match never {},
        Err(f) => pipe.fail(f),
    }
}

/// `uname -r` (a syscall, not a procfs read).
fn kernel_release() -> String {
    // SAFETY: utsname is plain old data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid out pointer.
    if unsafe { libc::uname(&mut u) } != 0 {
        return String::new();
    }
    // SAFETY: uname NUL-terminates `release`, which lives in `u`.
    unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn skeleton(req: &HelperRequest) -> SandboxReport {
    let mut rep = SandboxReport {
        kernel: kernel_release(),
        landlock: LandlockReport {
            kernel_abi: ll::kernel_abi(),
            requested_abi: 6,
            ruleset: "NotEnforced".into(),
            net: "none".into(),
            ..Default::default()
        },
        seccomp: SeccompReport {
            arch: seccomp::arch_name().into(),
            mode: "none".into(),
            default_action: "none".into(),
            memfd_create: "none".into(),
            ..Default::default()
        },
        cgroup: req.cgroup.clone(),
        env_keys: req.env.iter().map(|(k, _)| k.clone()).collect(),
        warnings: req
            .dropped_env
            .iter()
            .map(|k| format!("environment variable {k} is not in the allowlist; dropped"))
            .collect(),
        ..Default::default()
    };
    crate::layers::initial(&req.policy.layers, &mut rep);
    rep
}

/// Steps 1–8, then fork pid 1 and wait.
fn supervise(
    req: HelperRequest,
    stdin_r: OwnedFd,
    pipe: &ReportPipe,
    parent: i32,
) -> Result<Infallible, Fail> {
    let mut rep = skeleton(&req);

    // 1. Lifeline: the parent-death signal is racy (bubblewrap#633): if the
    // host died before it was armed we were reparented; check the pid.
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } != parent {
        return Err(fail(
            "lifeline",
            "the host exited before the helper started",
        ));
    }
    rep.lifeline = LayerStatus::Applied;

    // 2. A new session: no controlling terminal, so TIOCSTI/TIOCLINUX
    // injection into the host's terminal is impossible.
    // SAFETY: setsid has no memory preconditions.
    rep.setsid = if unsafe { libc::setsid() } >= 0 {
        LayerStatus::Applied
    } else {
        LayerStatus::unavailable(std::io::Error::last_os_error())
    };

    // 3. Fds: the control socket moves above 2 (it stays as the lifeline),
    // the plugin's stdin goes to 0; everything else inherited is closed.
    // SAFETY: F_DUPFD_CLOEXEC duplicates an fd we own.
    let ctl = unsafe { libc::fcntl(CONTROL_FD, libc::F_DUPFD_CLOEXEC, 3) };
    if ctl < 0 {
        return Err(os_fail("fds", "dup control socket"));
    }
    // SAFETY: `ctl` was just created and is owned here from now on.
    let ctl = unsafe { OwnedFd::from_raw_fd(ctl) };
    CTL_FD.store(ctl.as_raw_fd(), std::sync::atomic::Ordering::Relaxed);
    // SAFETY: dup2 onto 0 replaces the control socket's old slot, which we
    // no longer use; stdin_r stays owned by its OwnedFd and is dropped next.
    if unsafe { libc::dup2(stdin_r.as_raw_fd(), 0) } < 0 {
        return Err(os_fail("fds", "dup2 plugin stdin"));
    }
    drop(stdin_r);
    let mut keep = vec![ctl.as_raw_fd(), pipe.0.as_raw_fd()];
    keep.extend(pipe.1.as_ref().map(|f| f.as_raw_fd()));
    fds::close_all_except(&keep).map_err(|e| fail("fds", format!("close inherited fds: {e}")))?;

    stamp("helper", "setsid_fds_done");

    // Test-only: emulate a host whose seccomp profile refuses user namespaces.
    if let Some(f) = &req.emulation_filter {
        seccomp::install(f).map_err(|e| fail("emulate_no_userns", e))?;
        rep.warnings
            .push("test mode: user namespaces refused by an emulation filter".into());
    }

    // 4. Join the plugin's cgroups before anything forks.
    if !req.cgroup_paths.is_empty() {
        cgroup::join(&req.cgroup_paths, &mut rep.cgroup);
        stamp("helper", "cgroup_joined");
    }

    // What the root needs of the host, taken while still uid 0 (a path
    // under a directory only root may traverse, e.g. the state directory or
    // a private TMPDIR, works).
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let early = if root && req.policy.layers.drop_uid && req.policy.layers.mountns {
        Some(HostSources::clone_trees(&req)?)
    } else {
        None
    };
    // 5–7. The sandbox's own uid, its namespaces and limits.
    credentials::identity_and_namespaces(&req, &mut rep, parent)?;

    // The egress gateway's listener, in the sandbox's own network
    // namespace only: never one bound in the host's.
    if let Some(port) = req.policy.egress_port {
        if rep.netns != LayerStatus::Applied {
            return Err(fail(
                "egress",
                "the sandbox has no network namespace of its own; the gateway's listener is \
                 never bound in the host's",
            ));
        }
        egress::hand_to_host(&ctl, egress::listen(port)?)?;
        stamp("helper", "egress_listener_sent");
    }

    // Otherwise open them now, with the host's view of the filesystem.
    let sources = match early {
        Some(s) => s,
        None => HostSources::open_paths(&req)?,
    };

    // 8. Fork pid 1. `alive` lets the child detect a supervisor that died
    // before its parent-death signal was armed (getppid is 0 across pid ns).
    let (alive_r, alive_w) = pipe_cloexec().map_err(|e| fail("fork", e))?;
    // SAFETY: the helper is single-threaded, so the child may run arbitrary
    // code after fork.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(os_fail("fork", "fork pid 1"));
    }
    let pidns = rep.pidns == LayerStatus::Applied;
    if child == 0 {
        stamp("pid1", "forked");
        CTL_FD.store(-1, std::sync::atomic::Ordering::Relaxed);
        drop(alive_w);
        drop(ctl);
        if pidns {
            arm_parent_death_signal();
        } else {
            // No pid namespace: SIGKILL would leave the plugin's orphans
            // running, so pid 1 gets SIGTERM and kills its descendants first.
            block_term_and_chld();
            prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong);
        }
        if parent_gone(&alive_r) {
            // SAFETY: _exit in a forked child.
            unsafe { libc::_exit(137) }
        }
        drop(alive_r);
        match pid_one(req, rep, sources, pipe) {
            Ok(never) => match never {},
            Err(f) => pipe.fail(f),
        }
    }
    drop(alive_r);
    drop(sources);
    wait_and_watch(child, pidns, &ctl, pipe)
}

/// The supervisor's life after the fork: forward pid 1's exit status, and
/// SIGKILL pid 1 (and with it the whole pid namespace) when the host closes
/// its end of the control socket or dies.
fn wait_and_watch(
    child: libc::pid_t,
    pidns: bool,
    ctl: &OwnedFd,
    pipe: &ReportPipe,
) -> Result<Infallible, Fail> {
    // The plugin's pipes and the report pipe belong to pid 1 and the plugin
    // now: holding them would keep the host from ever seeing EOF.
    // SAFETY: closing our copies of fds 0-2 and of the report and start
    // pipes; their owner (`pipe`) is never used again in this process.
    unsafe {
        libc::close(pipe.0.as_raw_fd());
        if let Some(start) = &pipe.1 {
            libc::close(start.as_raw_fd());
        }
        for fd in 0..3 {
            libc::close(fd);
        }
    }
    // SAFETY: pidfd_open on our own unreaped child.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, child, 0) } as RawFd;
    loop {
        let mut pfds = [
            libc::pollfd {
                fd: ctl.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: pidfd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let nfds = if pidfd >= 0 { 2 } else { 1 };
        // SAFETY: `pfds` holds `nfds` valid entries; a negative timeout waits.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), nfds, if pidfd >= 0 { -1 } else { 100 }) };
        if n < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
        if pfds[0].revents != 0 {
            let mut buf = [0u8; 64];
            // SAFETY: reading into a local buffer of the given length.
            let r = unsafe { libc::read(ctl.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if r <= 0 {
                // The host is gone or wants us gone: take the tree down
                // (without a pid namespace, pid 1 kills its descendants on
                // SIGTERM first).
                let sig = if pidns { libc::SIGKILL } else { libc::SIGTERM };
                // SAFETY: signalling our own child.
                unsafe { libc::kill(child, sig) };
                break;
            }
        }
        let mut status = 0;
        // SAFETY: waiting on our own child; `status` is a valid out pointer.
        let w = unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) };
        if w == child {
            let code = exit_code(status);
            exit_status_to_host(code);
            // SAFETY: plain exit of the supervisor.
            unsafe { libc::_exit(code) }
        }
    }
    let mut status = 0;
    // SAFETY: as above, blocking this time.
    unsafe { libc::waitpid(child, &mut status, 0) };
    // SAFETY: plain exit.
    unsafe { libc::_exit(137) }
}
