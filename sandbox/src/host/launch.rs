//! Host side: launch a plugin inside the sandbox.
//!
//! A plain blocking API (the host calls it from `spawn_blocking` or its own
//! thread). The helper is started with `std::process::Command` and **no
//! `pre_exec`** (any `pre_exec` makes std `fork()` the whole host instead
//! of using `posix_spawn`), from one long-lived spawner thread, because
//! the helper's parent-death signal fires when the *thread* that created
//! it exits (bubblewrap#692, OpenDeck#329).
//!
//! How the fds reach the helper without leaking into other children: std
//! has no fd-mapping API, and clearing CLOEXEC on extra fds for the length
//! of a spawn would leak them into any child another host thread spawns
//! in that window. So the helper gets exactly three fds through the
//! `Stdio` slots, which std `dup2`s in the child only: a control socket as
//! fd 0, the plugin's stdout pipe as fd 1 and its stderr pipe as fd 2.
//! The request (policy, seccomp program, argv, env) then travels on the
//! control socket, with the plugin's stdin and the report pipe attached as
//! SCM_RIGHTS. Every fd in the host stays close-on-exec all the time. The
//! control socket then serves as the lifeline: when the host closes it (or
//! dies), the helper SIGKILLs the sandbox.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use super::child::{HelperProc, kill_helper};
use super::forkserver::{self, ForkError};
use super::spawner::{HELPER_SUBCOMMAND, NEUTRAL_NAME, on_spawner_thread};
use crate::SandboxError;
use crate::request::{self, HelperRequest};
use crate::timing::HostClock;

fn pipe() -> Result<(OwnedFd, OwnedFd), SandboxError> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| SandboxError::io("pipe2")(e.into()))
}

pub(super) struct Launched {
    pub(super) helper: HelperProc,
    pub(super) pid: i32,
    pub(super) pidfd: Option<OwnedFd>,
    pub(super) lifeline: UnixStream,
    pub(super) stdin_w: OwnedFd,
    pub(super) stdout_r: OwnedFd,
    pub(super) stderr_r: OwnedFd,
    pub(super) report_r: OwnedFd,
    pub(super) start: Option<UnixStream>,
}

pub(super) fn launch(
    helper_exe: &Path,
    req: &HelperRequest,
    clock: &mut HostClock,
) -> Result<Launched, SandboxError> {
    let (stdin_r, stdin_w) = pipe()?;
    let (stdout_r, stdout_w) = pipe()?;
    let (stderr_r, stderr_w) = pipe()?;
    let (report_r, report_w) = pipe()?;
    let (ctl_host, ctl_child) = UnixStream::pair().map_err(SandboxError::io("socketpair"))?;
    // A prepared sandbox's start order travels on a socket, not a pipe: a
    // send with MSG_NOSIGNAL never raises SIGPIPE in a host whose plugin
    // tree died.
    let (start, start_r) = if req.hold {
        let (host, child) = UnixStream::pair().map_err(SandboxError::io("socketpair"))?;
        (Some(host), Some(child))
    } else {
        (None, None)
    };
    let body =
        serde_json::to_vec(req).map_err(|e| SandboxError::io("encode the request")(e.into()))?;
    // The request goes first: the helper reads it as soon as it starts.
    let rest = request::send_start(
        &ctl_host,
        &body,
        stdin_r.as_fd(),
        report_w.as_fd(),
        start_r.as_ref().map(|s| s.as_fd()),
    )
    .map_err(SandboxError::io("send the request to the helper"))?;
    // Our copies must go now: the report pipe's EOF and the plugin's stdin
    // EOF depend on it (the helper's copies are in flight on the socket).
    drop(stdin_r);
    drop(report_w);
    drop(start_r);
    clock.stamp("request_queued");
    let fds = HelperFds {
        ctl: ctl_child,
        stdout: stdout_w,
        stderr: stderr_w,
    };
    let (helper, pid, pidfd) = match forked(helper_exe, req, &fds, clock)? {
        Some(f) => {
            drop(fds);
            (HelperProc::Forked, f.pid, Some(f.pidfd))
        }
        None => {
            let child = exec_helper(helper_exe, req, fds, clock)?;
            let pid = child.id() as i32;
            (HelperProc::Exec(child), pid, None)
        }
    };
    if let Err(e) = request::send_rest(&ctl_host, rest) {
        match helper {
            HelperProc::Forked => kill_helper(pidfd.as_ref(), pid),
            HelperProc::Exec(mut child) => {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        return Err(SandboxError::io("send the request to the helper")(e));
    }
    Ok(Launched {
        helper,
        pid,
        pidfd,
        lifeline: ctl_host,
        stdin_w,
        stdout_r,
        stderr_r,
        report_r,
        start,
    })
}

/// The helper's own fds 0, 1 and 2: its control socket, the plugin's
/// stdout and stderr write ends.
struct HelperFds {
    ctl: UnixStream,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

/// A helper forked by the fork server, when the policy asks for one and a
/// server took the order; `None` when the helper is to be executed.
fn forked(
    helper_exe: &Path,
    req: &HelperRequest,
    fds: &HelperFds,
    clock: &mut HostClock,
) -> Result<Option<forkserver::Forked>, SandboxError> {
    if !req.policy.fork_server {
        return Ok(None);
    }
    let borrowed = [fds.ctl.as_fd(), fds.stdout.as_fd(), fds.stderr.as_fd()];
    match forkserver::fork_helper(helper_exe, borrowed) {
        Ok(f) => {
            clock.stamp("helper forked by the fork server");
            Ok(Some(f))
        }
        Err(ForkError::Sent(source)) => Err(SandboxError::SpawnHelper {
            helper: helper_exe.to_path_buf(),
            source,
        }),
        // No server (an old helper binary, or none could start):
        // execute the helper directly.
        Err(ForkError::NotSent) => Ok(None),
    }
}

/// Execute the helper binary from the spawner thread, with `fds` as its
/// fds 0, 1 and 2.
fn exec_helper(
    helper_exe: &Path,
    req: &HelperRequest,
    fds: HelperFds,
    clock: &mut HostClock,
) -> Result<Child, SandboxError> {
    let helper = helper_exe.to_path_buf();
    let (child, on_thread, spawned) = on_spawner_thread(move || {
        let on_thread = crate::timing::now_ns();
        let child = Command::new(&helper)
            .arg0(NEUTRAL_NAME)
            .arg(HELPER_SUBCOMMAND)
            .env_clear()
            .current_dir("/")
            .stdin(Stdio::from(OwnedFd::from(fds.ctl)))
            .stdout(Stdio::from(fds.stdout))
            .stderr(Stdio::from(fds.stderr))
            .spawn();
        (child, on_thread, crate::timing::now_ns())
    });
    let child = child.map_err(|source| SandboxError::SpawnHelper {
        helper: helper_exe.to_path_buf(),
        source,
    })?;
    if req.policy.timings {
        clock.stamps.push(crate::timing::StageTiming {
            stage: "spawner_thread_running".into(),
            process: "host".into(),
            us: on_thread.saturating_sub(clock.origin_ns) / 1000,
        });
        clock.stamps.push(crate::timing::StageTiming {
            stage: "helper_spawned (its execve done)".into(),
            process: "host".into(),
            us: spawned.saturating_sub(clock.origin_ns) / 1000,
        });
    }
    clock.stamp("back_from_spawner_thread");
    Ok(child)
}
