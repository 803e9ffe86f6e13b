//! The gVisor launcher (`launcher = "gvisor"`): each turn's plugin in an
//! OCI container of its own under runsc, built from the runtime's
//! `SandboxPolicy` ([`bundle`]). The plugin's system calls are served by
//! gVisor's user-space kernel; runsc runs with `--network=none` and
//! `--ignore-cgroups`. A runtime with a network policy reaches the egress
//! gateway only: the loopback relay (`sharedos __sandbox-exec
//! --loopback-relay`, [`sharedos_sandbox::RelayArgs`]) is the container's
//! first process, listens on the gateway's port of the container's own
//! loopback and carries each connection to a unix socket of the bundle the
//! host serves the gateway on (runsc `--host-uds=open`) (no memory controller is delegated here, so the
//! container's memory is not bounded, and the report says so). The
//! protocol travels over the stdio of `runsc run`.
//!
//! The tree: `start_kill` SIGKILLs the `runsc run` process by its pid (its
//! sandbox and gofer are attached to it and die with it); `kill_tree`
//! then runs `runsc kill --all <id> KILL` and `runsc delete --force <id>`
//! against the container's private state directory, reaps runsc and
//! removes the bundle and the state. `runsc run` is forked with a
//! parent-death signal by the long-lived thread that forks direct
//! plugins, so a host that dies takes its containers with it.

mod bundle;
pub mod config;
pub mod platform;
mod report;
pub mod runsc;
mod sweep;
mod warm;

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use sharedos_sandbox::{SandboxLevel, SandboxPolicy};

pub(crate) use bundle::rlimit_rows;
pub use platform::{Platform, platform};
pub use runsc::{GvisorError, Runsc};

use super::launcher::{LaunchError, LaunchSpec, LaunchedChild, Launcher, ProcessTree};

/// The level a gVisor container reaches here (docs/SECURITY.md, "gVisor"):
/// every layer has an equivalent, the whole tree's memory is unbounded.
pub const GVISOR_LEVEL: SandboxLevel = SandboxLevel::Isolated;

/// Launches plugins under runsc with one runtime's policy.
#[derive(Debug, Clone)]
pub struct GvisorLauncher {
    policy: SandboxPolicy,
    runsc: Runsc,
    /// The binary serving `__sandbox-exec --loopback-relay` (the running
    /// `sharedos`), bound into the container of a runtime with a network
    /// policy.
    relay: Option<std::path::PathBuf>,
    /// Containers prepared ahead of turns (`sandbox.warm`); clones share
    /// them.
    warm: std::sync::Arc<warm::WarmContainers>,
}

impl GvisorLauncher {
    /// A launcher for `policy`, with runsc at `configured` or on `PATH`.
    pub fn new(
        policy: SandboxPolicy,
        configured: Option<&std::path::Path>,
    ) -> Result<Self, GvisorError> {
        Ok(Self {
            policy,
            runsc: Runsc::locate(configured)?,
            relay: std::env::current_exe().ok(),
            warm: std::sync::Arc::new(warm::pool()),
        })
    }

    /// The same launcher with `exe` as the binary that serves
    /// `__sandbox-exec` (a host that is not the `sharedos` binary itself:
    /// a test, a library user).
    pub fn with_helper_exe(mut self, exe: std::path::PathBuf) -> Self {
        self.relay = Some(exe);
        self
    }

    pub fn runsc(&self) -> &Runsc {
        &self.runsc
    }

    /// Waits up to `timeout` until no container is being prepared; how
    /// many are ready then.
    pub fn wait_warm(&self, timeout: std::time::Duration) -> usize {
        self.warm.wait_idle(timeout)
    }

    fn warm_target(&self) -> usize {
        self.policy.warm.min(sharedos_sandbox::MAX_WARM) as usize
    }

    fn refused(&self, spec: &LaunchSpec, reason: String, platform: &Platform) -> LaunchError {
        let mut report = report::base(&self.runsc, platform);
        report["refused"] = true.into();
        report["reason"] = reason.clone().into();
        LaunchError::Refused {
            program: spec.program.clone(),
            reason,
            report: Some(report),
        }
    }

    /// The container `spec` would run in: its bundle written, its id and
    /// its report; refused below the policy's minimum or with a pin the
    /// program does not match.
    fn prepare(&self, spec: &LaunchSpec, gate: bool) -> Result<Prepared, LaunchError> {
        let platform = platform(&self.runsc);
        let p = &self.policy;
        if p.min_level > GVISOR_LEVEL || p.require_memory_bound {
            let why = format!(
                "the gVisor container reaches {GVISOR_LEVEL} here, with the container's memory unbounded (runsc --ignore-cgroups: no memory controller is delegated), below the policy's minLevel {} / requireMemoryBound {}",
                p.min_level, p.require_memory_bound
            );
            return Err(self.refused(spec, why, &platform));
        }
        let pin = spec.program_sha256.or(p.program_sha256);
        let staged = match &pin {
            Some(pin) => Some(
                super::stage_pinned(&spec.program, pin)
                    .map_err(|e| self.refused(spec, e.to_string(), &platform))?,
            ),
            None => None,
        };
        let process = bundle::Process {
            program: &spec.program,
            staged: staged.as_deref(),
            args: &spec.args,
            env: &spec.env,
            relay: self.relay.as_deref(),
            gate,
        };
        let bundle = bundle::write(p, &process, p.uids.first)
            .map_err(|e| self.refused(spec, format!("the container's bundle: {e}"), &platform))?;
        let id = container_id();
        let report = report::launched(&self.runsc, &platform, p, &bundle, &id, pin.as_ref());
        Ok(Prepared {
            bundle,
            id,
            report,
            platform,
        })
    }

    /// The report a launch of `spec` would have (its bundle written and
    /// removed again; nothing runs): `sharedos sandbox check --runtime`.
    pub fn describe(&self, spec: &LaunchSpec) -> Result<serde_json::Value, LaunchError> {
        self.prepare(spec, false).map(|p| p.report)
    }

    /// A container of `spec` running: its plugin started, or, `gate`, the
    /// relay holding it until the host writes one byte on its stdin (a
    /// container prepared ahead, [`warm`]).
    fn launch_blocking(&self, spec: &LaunchSpec, gate: bool) -> Result<LaunchedChild, LaunchError> {
        let Prepared {
            mut bundle,
            id,
            report,
            platform,
        } = self.prepare(spec, gate)?;
        let cmd = self.run_command(&bundle, &id, platform.name);
        let spawned = super::direct::on_spawn_thread(move || spawn(cmd))
            .and_then(|r| r)
            .map_err(|source| LaunchError::Spawn {
                program: spec.program.clone(),
                source,
            })?;
        let (child, stdin, stdout, stderr) = spawned;
        let egress_listener = bundle.egress_listener.take();
        for w in &bundle.warnings {
            tracing::warn!(program = %spec.program.display(), "gvisor: {w}");
        }
        Ok(LaunchedChild {
            stdin,
            stdout,
            stderr,
            tree: Box::new(GvisorTree {
                child,
                runsc: self.runsc.clone(),
                id,
                bundle: Some(bundle),
            }),
            report: Some(report),
            egress_listener,
        })
    }

    /// `runsc run` of the bundle: stdio piped, its own process group,
    /// SIGKILLed when the forking thread (a thread that lives as long as
    /// the host) goes.
    fn run_command(&self, bundle: &bundle::Bundle, id: &str, platform: &str) -> Command {
        let mut cmd = self.runsc.command(&bundle.state_dir());
        cmd.args(["--network=none", "--ignore-cgroups"]);
        if bundle.egress_listener.is_some() {
            // The relay connects to the gateway's socket bound into the
            // container; with `open`, connecting to a host socket the
            // mounts show is all the container may do (no bind, no create).
            cmd.arg("--host-uds=open");
        }
        cmd.arg(format!("--platform={platform}"))
            .arg("run")
            .arg("--bundle")
            .arg(bundle.bundle_dir())
            .arg(id)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .current_dir(bundle.dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        runsc::dies_with_host(&mut cmd);
        cmd
    }
}

/// A container ready to run: its bundle, id, report and platform.
struct Prepared {
    bundle: bundle::Bundle,
    id: String,
    report: serde_json::Value,
    platform: Platform,
}

type Spawned = (Child, OwnedFd, OwnedFd, OwnedFd);

fn spawn(mut cmd: Command) -> io::Result<Spawned> {
    let mut child = cmd.spawn()?;
    let pipes = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    match pipes {
        (Some(i), Some(o), Some(e)) => Ok((child, i.into(), o.into(), e.into())),
        _ => {
            let _ = child.kill();
            let _ = child.wait();
            Err(io::Error::other("a stdio pipe of runsc is missing"))
        }
    }
}

/// `sharedos-<host pid>-<n>`: unique among this host's containers.
fn container_id() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "sharedos-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

impl Launcher for GvisorLauncher {
    fn launch(&self, spec: &LaunchSpec) -> Result<LaunchedChild, LaunchError> {
        let target = self.warm_target();
        if target == 0 {
            return self.launch_blocking(spec, false);
        }
        let key = warm::key(self, spec);
        let taken = self.warm.take(&key).and_then(warm::start);
        let out = match taken {
            Some(child) => Ok(child),
            None => {
                let out = self.launch_blocking(spec, false);
                if out.is_ok() {
                    self.warm.succeeded();
                }
                out
            }
        };
        self.warm.refill(&key, target, warm::preparer(self, spec));
        out
    }

    /// At seating: the platform is chosen now (the KVM probe may take a
    /// few seconds once per host process), not in the first turn, and
    /// what a dead host left of its containers is removed now, once per
    /// host process.
    fn prewarm(&self, spec: &LaunchSpec) {
        sweep::sweep_once(&self.runsc);
        let platform = platform(&self.runsc);
        tracing::info!(platform = platform.name, why = %platform.why, "gvisor platform");
        let target = self.warm_target();
        if target > 0 {
            let key = warm::key(self, spec);
            self.warm.adopt(&key);
            self.warm.refill(&key, target, warm::preparer(self, spec));
        }
    }
}

/// One container: the `runsc run` process, its id, its bundle and state.
struct GvisorTree {
    child: Child,
    runsc: Runsc,
    id: String,
    /// Present until the container is torn down.
    bundle: Option<bundle::Bundle>,
}

impl GvisorTree {
    /// Kills every process of the container, deletes it, reaps runsc and
    /// removes the bundle and the state. Idempotent.
    fn teardown(&mut self) -> io::Result<()> {
        let _ = self.child.kill();
        let Some(bundle) = self.bundle.take() else {
            return Ok(());
        };
        let state = bundle.state_dir();
        let bound = runsc::COMMAND_TIMEOUT;
        // The container usually went with runsc already (its sandbox is
        // attached); these make sure, and remove runsc's state of it.
        let _ = self
            .runsc
            .bounded(&state, &["kill", "--all", &self.id, "KILL"], bound);
        let deleted = self
            .runsc
            .bounded(&state, &["delete", "--force", &self.id], bound);
        self.child.wait()?;
        if let Err(e) = &deleted
            && state_has_container(&state, &self.id)
        {
            tracing::warn!(container = %self.id, "runsc delete failed: {e}");
        }
        drop(bundle);
        Ok(())
    }
}

fn state_has_container(state: &std::path::Path, id: &str) -> bool {
    std::fs::read_dir(state).is_ok_and(|d| {
        d.filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().contains(id))
    })
}

impl ProcessTree for GvisorTree {
    fn pid(&self) -> u32 {
        self.child.id()
    }
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.child.try_wait()
    }
    fn start_kill(&mut self) {
        // SIGKILL to runsc by its pid: its attached sandbox and gofer die
        // with it. Never blocks.
        let _ = self.child.kill();
    }
    fn kill_tree(&mut self) -> io::Result<()> {
        self.teardown()
    }
}

impl Drop for GvisorTree {
    fn drop(&mut self) {
        if self.bundle.is_some() {
            let _ = self.teardown();
        }
    }
}
