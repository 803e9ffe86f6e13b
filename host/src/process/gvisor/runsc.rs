//! Finding runsc, asking its version, and running its short commands with
//! a bound.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long `runsc --version`, `kill` or `delete` may take.
pub(super) const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the gVisor engine cannot be used on this host, with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GvisorError {
    #[error(
        "runsc (gVisor) is not installed: no `runsc` on PATH ({path}); install it with \
         `apt-get install runsc`, or set runtimes.gvisor.runsc to its absolute path"
    )]
    RunscMissing { path: String },
    #[error(
        "runsc at {} cannot be used: {reason}; reinstall it (`apt-get install --reinstall runsc`) \
         or point runtimes.gvisor.runsc at a working one",
        runsc.display()
    )]
    RunscBroken { runsc: PathBuf, reason: String },
}

/// A located, working runsc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runsc {
    pub path: PathBuf,
    /// The first line of `runsc --version` (`runsc version 0.0~20221219.0`).
    pub version: String,
    /// The host is not root: every runsc command gets `--rootless` (runsc
    /// then maps the host's uid to root of a user namespace of its own; the
    /// plugin still runs as the sandbox uid inside the gVisor kernel).
    pub rootless: bool,
}

impl Runsc {
    /// `configured`, or `runsc` on `PATH`; checked by running `--version`.
    pub fn locate(configured: Option<&Path>) -> Result<Runsc, GvisorError> {
        use crate::process::engine_tool::{ToolProblem, locate};
        match locate(configured, "runsc", "runsc version") {
            Ok((path, version)) => Ok(Runsc {
                path,
                version,
                rootless: !rustix::process::geteuid().is_root(),
            }),
            Err(ToolProblem::Missing { path }) => Err(GvisorError::RunscMissing { path }),
            Err(ToolProblem::Broken { path, reason }) => Err(GvisorError::RunscBroken {
                runsc: path,
                reason,
            }),
        }
    }

    /// `runsc` with its global flags: the state directory `state`, and
    /// `--rootless` for a host that is not root.
    pub(super) fn command(&self, state: &Path) -> Command {
        let mut cmd = Command::new(&self.path);
        if self.rootless {
            cmd.arg("--rootless");
        }
        cmd.arg(format!("--root={}", state.display()));
        cmd
    }

    /// `runsc --root <state> <args>` with a bound: killed (by its pid) and
    /// reaped when it takes longer than `bound`.
    pub(super) fn bounded(&self, state: &Path, args: &[&str], bound: Duration) -> io::Result<()> {
        let child = self
            .command(state)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        match wait_bounded(child, bound)? {
            Some(s) if s.success() => Ok(()),
            Some(s) => Err(io::Error::other(format!("runsc {args:?} exited {s}"))),
            None => Err(io::Error::other(format!(
                "runsc {args:?} did not finish in {bound:?}; killed"
            ))),
        }
    }
}

/// Waits for `child` up to `bound`; past it, SIGKILLs it (by its pid),
/// reaps it and returns `None`.
pub(crate) fn wait_bounded(mut child: Child, bound: Duration) -> io::Result<Option<ExitStatus>> {
    let end = Instant::now() + bound;
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(Some(s));
        }
        if Instant::now() >= end {
            let _ = child.kill();
            child.wait()?;
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Gives `cmd` a parent-death SIGKILL, so runsc (and the sandbox and
/// gofer attached to it) dies with the host. The signal follows the thread
/// that forks: spawn `cmd` on the direct launcher's long-lived spawn
/// thread.
// The parent-death signal is set between fork and exec: a system call std
// has no form for.
#[allow(unsafe_code)]
pub(crate) fn dies_with_host(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let host = rustix::process::getpid().as_raw_nonzero().get();
    // SAFETY: runs in the forked child before exec and calls only
    // async-signal-safe functions (prctl, getppid) on copied values.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != host {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}
