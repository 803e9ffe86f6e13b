//! The supervisor: the helper itself, outside the pid namespace. It
//! receives the request, builds the layers that belong to the whole tree
//! (lifeline, session, fds, cgroup, credentials and namespaces), forks pid 1
//! and then watches the lifeline until the tree ends.

use std::convert::Infallible;
use std::os::fd::{AsRawFd, OwnedFd};

use rustix::process::{Pid, PidfdFlags, WaitOptions};

use super::process::{
    CONTROL_FD, CTL_FD, Fail, ReportPipe, Signal, arm_parent_death_signal, block_term_and_chld,
    errno_fail, exit_code, exit_status_to_host, fail, os_fail, parent_death_signal, parent_gone,
    pipe_cloexec,
};
use super::reaper::pid_one;
use super::sources::HostSources;
use super::{credentials, egress, fds};
use crate::cgroup;
use crate::landlock as ll;
use crate::layers::layer::Slot;
use crate::layers::{LAYERS, Stage};
use crate::policy::SandboxPolicy;
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
    rustix::system::uname()
        .release()
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
    initial_layers(&req.policy, &mut rep);
    rep
}

/// Each layer the helper builds starts `unavailable: not reached`, or
/// `disabled` when the policy switches it off; the host's (the cgroup) is
/// already in `rep`.
fn initial_layers(policy: &SandboxPolicy, rep: &mut SandboxReport) {
    for layer in LAYERS.iter().filter(|l| l.stage != Stage::Host) {
        if let Slot::Status(_, slot) = &layer.slot {
            *slot(rep) = if layer.wanted(policy) {
                LayerStatus::unavailable("not reached")
            } else {
                LayerStatus::Disabled
            };
        }
    }
}

/// Steps 1–8, then fork pid 1 and wait.
fn supervise(
    req: HelperRequest,
    stdin_r: OwnedFd,
    pipe: &ReportPipe,
    parent: i32,
) -> Result<Infallible, Fail> {
    let mut rep = skeleton(&req);
    let ctl = own_process(&mut rep, stdin_r, pipe, parent)?;
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
    let root = rustix::process::geteuid().is_root();
    let early = if root && req.policy.layers.drop_uid && req.policy.layers.mountns {
        Some(HostSources::clone_trees(&req)?)
    } else {
        None
    };
    // 5–7. The sandbox's own uid, its namespaces and limits.
    credentials::identity_and_namespaces(&req, &mut rep, parent)?;
    egress_listener(&req, &rep, &ctl)?;
    harness_loopback(&req, &rep)?;

    // Otherwise open them now, with the host's view of the filesystem.
    let sources = match early {
        Some(s) => s,
        None => HostSources::open_paths(&req)?,
    };
    fork_pid_one(req, rep, sources, ctl, pipe)
}

/// Steps 1–3. The lifeline: the parent-death signal is racy
/// (bubblewrap#633): if the host died before it was armed we were
/// reparented; check the pid. A new session: no controlling terminal, so
/// TIOCSTI/TIOCLINUX injection into the host's terminal is impossible.
/// The fds: the control socket moves above 2 (it stays as the lifeline,
/// and is returned), the plugin's stdin goes to 0; everything else
/// inherited is closed.
fn own_process(
    rep: &mut SandboxReport,
    stdin_r: OwnedFd,
    pipe: &ReportPipe,
    parent: i32,
) -> Result<OwnedFd, Fail> {
    if Pid::as_raw(rustix::process::getppid()) != parent {
        return Err(fail(
            "lifeline",
            "the host exited before the helper started",
        ));
    }
    rep.lifeline = LayerStatus::Applied;

    rep.setsid = match rustix::process::setsid() {
        Ok(_) => LayerStatus::Applied,
        Err(e) => LayerStatus::unavailable(std::io::Error::from(e)),
    };

    let ctl = rustix::io::fcntl_dupfd_cloexec(rustix::stdio::stdin(), 3)
        .map_err(|e| errno_fail("fds", "dup control socket", e))?;
    CTL_FD.store(ctl.as_raw_fd(), std::sync::atomic::Ordering::Relaxed);
    // Onto 0, the control socket's old slot, which is no longer used.
    rustix::stdio::dup2_stdin(&stdin_r).map_err(|e| errno_fail("fds", "dup2 plugin stdin", e))?;
    drop(stdin_r);
    let mut keep = vec![ctl.as_raw_fd(), pipe.0.as_raw_fd()];
    keep.extend(pipe.1.as_ref().map(|f| f.as_raw_fd()));
    fds::close_all_except(&keep).map_err(|e| fail("fds", format!("close inherited fds: {e}")))?;
    Ok(ctl)
}

/// The egress gateway's listener, in the sandbox's own network namespace
/// only: never one bound in the host's.
fn egress_listener(req: &HelperRequest, rep: &SandboxReport, ctl: &OwnedFd) -> Result<(), Fail> {
    let Some(port) = req.policy.egress_port else {
        return Ok(());
    };
    if rep.netns != LayerStatus::Applied {
        return Err(fail(
            "egress",
            "the sandbox has no network namespace of its own; the gateway's listener is \
             never bound in the host's",
        ));
    }
    egress::hand_to_host(ctl, egress::listen(port)?)?;
    stamp("helper", "egress_listener_sent");
    Ok(())
}

/// The harness mode: the plugin binds its own MCP listener on the sandbox's
/// loopback (Landlock admits that one port), so `lo` must be up.
fn harness_loopback(req: &HelperRequest, rep: &SandboxReport) -> Result<(), Fail> {
    if req.policy.mcp_port.is_none() {
        return Ok(());
    }
    if rep.netns != LayerStatus::Applied {
        return Err(fail(
            "harness",
            "the sandbox has no network namespace of its own; the harness's MCP listener is              never bound in the host's",
        ));
    }
    egress::loopback_up()
}

/// Step 8: fork pid 1, and wait. `alive` lets the child detect a supervisor
/// that died before its parent-death signal was armed (getppid is 0
/// across a pid namespace).
fn fork_pid_one(
    req: HelperRequest,
    rep: SandboxReport,
    sources: HostSources,
    ctl: OwnedFd,
    pipe: &ReportPipe,
) -> Result<Infallible, Fail> {
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
            parent_death_signal(Signal::TERM);
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
    // Our own unreaped child: the pid cannot be recycled yet.
    let pidfd =
        Pid::from_raw(child).and_then(|p| rustix::process::pidfd_open(p, PidfdFlags::empty()).ok());
    let pidfd = pidfd.as_ref().map_or(-1, |fd| fd.as_raw_fd());
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
            let r = rustix::io::read(ctl, &mut buf);
            if !matches!(r, Ok(n) if n > 0) {
                // The host is gone or wants us gone: take the tree down
                // (without a pid namespace, pid 1 kills its descendants on
                // SIGTERM first).
                let sig = if pidns { Signal::KILL } else { Signal::TERM };
                if let Some(pid) = Pid::from_raw(child) {
                    let _ = rustix::process::kill_process(pid, sig);
                }
                break;
            }
        }
        let w = rustix::process::waitpid(Pid::from_raw(child), WaitOptions::NOHANG);
        if let Ok(Some((_, status))) = w {
            let code = exit_code(status.as_raw());
            exit_status_to_host(code);
            // SAFETY: plain exit of the supervisor.
            unsafe { libc::_exit(code) }
        }
    }
    let _ = rustix::process::waitpid(Pid::from_raw(child), WaitOptions::empty());
    // SAFETY: plain exit.
    unsafe { libc::_exit(137) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initial_states_follow_the_toggles() {
        let not_reached = LayerStatus::unavailable("not reached");
        let mut rep = SandboxReport::default();
        initial_layers(&SandboxPolicy::unconfined(), &mut rep);
        for st in [
            &rep.uid_drop,
            &rep.own_uid,
            &rep.userns,
            &rep.mountns,
            &rep.pidns,
            &rep.netns,
            &rep.ipcns,
            &rep.utsns,
            &rep.cgroupns,
            &rep.root,
            &rep.landlock.status,
            &rep.seccomp.status,
            &rep.rlimits_status,
            &rep.ceilings_status,
            &rep.ipc_limits_status,
        ] {
            assert_eq!(*st, LayerStatus::Disabled);
        }
        for st in [&rep.caps, &rep.lifeline, &rep.setsid] {
            assert_eq!(*st, not_reached);
        }
        // The host's layer is left as the host made it.
        assert_eq!(rep.cgroup.status, LayerStatus::default());
        let mut rep = SandboxReport::default();
        initial_layers(&SandboxPolicy::default(), &mut rep);
        assert_eq!(rep.userns, not_reached);
        assert_eq!(rep.root, not_reached);
        assert_eq!(rep.landlock.status, not_reached);
    }
}
