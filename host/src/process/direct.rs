//! The direct launcher: a plugin started without a sandbox, for
//! development only, but with its whole tree contained.
//!
//! - **A cgroup per plugin.** The child joins a fresh cgroup v2 directory
//!   (`sharedos-direct-<host pid>-<n>`, a child of the host's own v2
//!   cgroup) before it runs the plugin, so every descendant, a
//!   double-forked `setsid` daemon included, is in it; the end of the turn
//!   is one write to `cgroup.kill`, a wait for `populated 0`, and `rmdir`.
//!   Only a subtree without the memory controller is used: a process is
//!   never moved between memory cgroups.
//! - **A subreaper where no cgroup can be made** (a host that is not root
//!   and has no delegated cgroup): the plugin's parent is a small process
//!   that adopts every orphan of the tree and kills it when the plugin
//!   ends ([`super::shim`]). The turn's
//!   `metadata.runtime.sandbox.containment` says `subreaper` and why no
//!   cgroup was made, and a warning says what it cannot contain.
//! - **`PR_SET_PDEATHSIG`.** The plugin gets SIGKILL when the host dies, so
//!   a SIGKILLed host leaves no plugin. The signal follows the *thread*
//!   that forked, so every direct child is forked by one long-lived thread
//!   (a blocking-pool thread that retires would kill its plugins). A
//!   daemon of a host that was SIGKILLed is killed by the next host's
//!   sweep of dead hosts' cgroups.
//! - **The sandbox's environment and an empty working directory.** The
//!   environment is the spec's alone (the entry's `env`, filtered by its
//!   `envAllowlist` when seated, plus `SHAREDOS_PLUGIN`); nothing of the
//!   host's is inherited. The working directory is a fresh empty `0700`
//!   directory under the host's temp dir, removed with the tree.

pub(crate) mod config;

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use sharedos_sandbox::cgroup::PluginCgroup;

use super::into_cgroup::RawChild;
use super::launcher::{LaunchError, LaunchSpec, LaunchedChild, Launcher, ProcessTree};
use super::pinned::PinnedExec;
use super::shim::PidPipe;

/// An unsandboxed launch (see the module docs). Development only: every
/// result says `launcher: direct`.
#[derive(Debug, Clone, Copy, Default)]
pub struct DirectLauncher;

/// The prefix of every direct cgroup and working directory.
const PREFIX: &str = "sharedos-direct-";
const V2_CANDIDATES: [&str; 2] = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"];
/// How long the teardown waits for a killed cgroup to empty.
const EMPTY_WAIT: Duration = Duration::from_secs(5);

impl Launcher for DirectLauncher {
    fn launch(&self, spec: &LaunchSpec) -> Result<LaunchedChild, LaunchError> {
        let spec = spec.clone();
        let program = spec.program.clone();
        on_spawn_thread(move || launch_contained(&spec))
            .unwrap_or_else(|e| Err(LaunchError::Spawn { program, source: e }))
    }

    /// At seating: what a host that was SIGKILLed left running is killed
    /// now, before this host's first turn.
    fn prewarm(&self, _spec: &LaunchSpec) {
        sweep_once();
    }
}

/// Sweeps the dead hosts' cgroups once per host process.
fn sweep_once() {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        if let Some(parent) = host_v2_dir() {
            sweep_dead_hosts(&parent);
        }
    });
}

type Job = Box<dyn FnOnce() + Send>;

/// Runs `job` on the one thread that forks every direct plugin, and waits
/// for it. That thread lives as long as the host: a plugin's parent-death
/// signal fires when the thread that forked it exits.
pub(super) fn on_spawn_thread<T: Send + 'static>(
    job: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    static QUEUE: OnceLock<Option<Mutex<mpsc::Sender<Job>>>> = OnceLock::new();
    let queue = QUEUE.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("sharedos-direct-spawn".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            })
            .ok()
            .map(|_| Mutex::new(tx))
    });
    let Some(queue) = queue else {
        return Err(io::Error::other(
            "the direct launcher's spawn thread could not be started",
        ));
    };
    let (done_tx, done_rx) = mpsc::sync_channel(1);
    let sent = queue
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send(Box::new(move || {
            let _ = done_tx.send(job());
        }));
    if sent.is_err() {
        return Err(io::Error::other(
            "the direct launcher's spawn thread is gone",
        ));
    }
    done_rx
        .recv()
        .map_err(|_| io::Error::other("the direct launcher's spawn thread dropped a launch"))
}

fn unique(kind: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{PREFIX}{}-{kind}{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// How the plugin's tree is held together.
#[derive(Clone, Copy)]
enum Holder {
    /// Joins the cgroup whose `cgroup.procs` is this descriptor.
    Cgroup(RawFd),
    /// Forks through a subreaper that reports the plugin's pid on this
    /// descriptor.
    Subreaper(RawFd),
}

/// The plugin's command: a cleared environment with the spec's, `cwd`, piped
/// stdio, its own process group; before exec it joins its cgroup, or goes
/// through its subreaper, and takes a parent-death signal.
// The child's `pre_exec` (cgroup join, parent-death signal, the subreaper's
// fork) is a system call sequence std has no safe form for.
#[allow(unsafe_code)]
fn contained_command(
    spec: &LaunchSpec,
    cwd: &Path,
    holder: Holder,
    pinned: Option<Arc<PinnedExec>>,
) -> Command {
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .env_clear()
        .envs(
            spec.env
                .iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v))),
        )
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let host = rustix::process::getpid().as_raw_nonzero().get();
    // SAFETY: the closures run in the forked child before exec and call
    // only async-signal-safe functions (write, prctl, getppid, the shim's
    // raw system calls, and a pinned program's execveat on arrays built
    // before the fork) on values copied in; they allocate nothing.
    unsafe {
        cmd.pre_exec(move || {
            let procs_fd = match holder {
                Holder::Cgroup(fd) => fd,
                Holder::Subreaper(pid_fd) => return super::shim::become_shim(host, pid_fd),
            };
            // "0" moves the calling process: the child joins its cgroup
            // before the plugin runs, so all it starts is in it.
            if libc::write(procs_fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The host died between the fork and the prctl.
            if libc::getppid() != host {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
        if let Some(pinned) = pinned {
            // Last: a pinned program is executed through the descriptor
            // whose bytes were checked, never by its path.
            cmd.pre_exec(move || Err(pinned.exec()));
        }
    }
    cmd
}

fn launch_contained(spec: &LaunchSpec) -> Result<LaunchedChild, LaunchError> {
    let spawn_err = |source| LaunchError::Spawn {
        program: spec.program.clone(),
        source,
    };
    let pinned = match &spec.program_sha256 {
        Some(pin) => Some(Arc::new(PinnedExec::open(spec, pin)?)),
        None => None,
    };
    let cwd = fresh_workdir().map_err(spawn_err)?;
    let mut tree = DirectTree {
        child: None,
        pid: 0,
        cgroup: None,
        shim: false,
        cwd: Some(cwd.clone()),
    };
    let (containment, mut child) = match direct_cgroup() {
        Ok(cg) => {
            let dir = cg.v2.clone().unwrap_or_default();
            let procs = open_procs(&cg).map_err(spawn_err)?;
            tree.cgroup = Some(cg);
            // Made inside its cgroup when the kernel can; else moved in.
            let made = super::into_cgroup::spawn_in(spec, &cwd, &dir, pinned.as_ref());
            if let Some(s) = made.map_err(spawn_err)? {
                tree.pid = s.child.id();
                tree.child = Some(Leader::Raw(s.child));
                return Ok(launched(s.stdin, s.stdout, s.stderr, tree, "cgroup"));
            }
            let holder = Holder::Cgroup(procs.as_raw_fd());
            let mut cmd = contained_command(spec, &cwd, holder, pinned);
            let child = cmd.spawn().map_err(spawn_err)?;
            drop(procs);
            tree.pid = child.id();
            ("cgroup".to_owned(), child)
        }
        Err(why) => {
            tracing::warn!(
                runtime = %spec.runtime_id,
                "direct launcher: no cgroup for the plugin ({why}); a subreaper holds its tree, which a plugin that kills the subreaper leaves"
            );
            let pipe = PidPipe::new().map_err(spawn_err)?;
            let holder = Holder::Subreaper(pipe.write_fd());
            let mut cmd = contained_command(spec, &cwd, holder, pinned);
            let mut child = cmd.spawn().map_err(spawn_err)?;
            tree.shim = true;
            match pipe.plugin_pid() {
                Ok(pid) => tree.pid = pid,
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(spawn_err(e));
                }
            }
            (format!("subreaper (no cgroup: {why})"), child)
        }
    };
    let pipes = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    tree.child = Some(Leader::Std(child));
    let (Some(stdin), Some(stdout), Some(stderr)) = pipes else {
        return Err(spawn_err(io::Error::other("stdio was not piped")));
    };
    Ok(launched(
        OwnedFd::from(stdin),
        OwnedFd::from(stdout),
        OwnedFd::from(stderr),
        tree,
        &containment,
    ))
}

/// The launched child with its stdio, its tree and its report.
fn launched(
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    tree: DirectTree,
    containment: &str,
) -> LaunchedChild {
    LaunchedChild {
        stdin,
        stdout,
        stderr,
        tree: Box::new(tree),
        // Said explicitly, so a result never leaves its isolation unsaid.
        report: Some(serde_json::json!({
            "engine": "direct",
            "launcher": "direct",
            "level": "none",
            "reason": "launched without a sandbox",
            "use": "development only",
            "containment": containment,
        })),
        egress_listener: None,
    }
}

/// The host's child at the top of a direct tree: made by `Command`, or
/// inside its cgroup by `into_cgroup::spawn`.
enum Leader {
    Std(Child),
    Raw(RawChild),
}

impl Leader {
    fn id(&self) -> u32 {
        match self {
            Leader::Std(c) => c.id(),
            Leader::Raw(c) => c.id(),
        }
    }
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        match self {
            Leader::Std(c) => c.try_wait(),
            Leader::Raw(c) => c.try_wait(),
        }
    }
    fn wait(&mut self) -> io::Result<ExitStatus> {
        match self {
            Leader::Std(c) => c.wait(),
            Leader::Raw(c) => c.wait(),
        }
    }
}

/// A fresh empty `0700` directory for the plugin's working directory.
/// The first one of a host process removes those dead hosts left
/// (`process/dead_hosts.rs`): a SIGKILLed host cannot remove its own.
fn fresh_workdir() -> io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT
        .call_once(|| super::dead_hosts::sweep(&std::env::temp_dir(), PREFIX, "working directory"));
    let dir = std::env::temp_dir().join(format!(
        "{}-{}",
        unique("cwd"),
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

fn open_procs(cg: &PluginCgroup) -> io::Result<std::fs::File> {
    let dir = cg.v2.as_deref().unwrap_or(Path::new("/nonexistent"));
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.procs"))
}

/// The host's own v2 cgroup directory.
fn host_v2_dir() -> Option<PathBuf> {
    let root = V2_CANDIDATES
        .iter()
        .map(Path::new)
        .find(|p| p.join("cgroup.controllers").exists() && p.join("cgroup.procs").exists())?;
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(root.join(rel.trim_start_matches('/')))
}

/// A fresh cgroup for one plugin, in a subtree without the memory
/// controller; why not, otherwise.
fn direct_cgroup() -> Result<PluginCgroup, String> {
    let parent = host_v2_dir().ok_or("no cgroup v2 hierarchy")?;
    let subtree = std::fs::read_to_string(parent.join("cgroup.subtree_control"))
        .map_err(|e| format!("{}: {e}", parent.join("cgroup.subtree_control").display()))?;
    if subtree.split_whitespace().any(|c| c == "memory") {
        return Err(format!(
            "{} delegates the memory controller, and a process is never moved between memory cgroups",
            parent.display()
        ));
    }
    sweep_once();
    let dir = parent.join(unique("cg"));
    std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !dir.join("cgroup.kill").exists() {
        let _ = std::fs::remove_dir(&dir);
        return Err("the kernel has no cgroup.kill".into());
    }
    Ok(PluginCgroup {
        paths: vec![dir.clone()],
        v2: Some(dir),
        ..PluginCgroup::default()
    })
}

/// Kills and removes the direct cgroups of hosts that died without
/// cleaning up (a SIGKILLed host's plugin died with it by its parent-death
/// signal; a daemon it started did not).
pub(crate) fn sweep_dead_hosts(parent: &Path) -> Vec<PathBuf> {
    let mut swept = Vec::new();
    let Ok(dir) = std::fs::read_dir(parent) else {
        return swept;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let mut cg = PluginCgroup {
            paths: vec![e.path()],
            v2: Some(e.path()),
            ..PluginCgroup::default()
        };
        cg.kill();
        cg.wait_empty(EMPTY_WAIT);
        cg.remove();
        if cg.paths.is_empty() {
            tracing::warn!(
                "killed and removed {} of a host that died",
                e.path().display()
            );
            swept.push(e.path());
        }
    }
    swept
}

/// The direct launch's tree: the plugin (or the subreaper above it), its
/// cgroup (when there is one), and its working directory.
struct DirectTree {
    /// The host's child: the plugin, or its subreaper when `shim`.
    child: Option<Leader>,
    /// The plugin's pid.
    pid: u32,
    cgroup: Option<PluginCgroup>,
    /// `child` is the subreaper, which kills the tree on SIGTERM.
    shim: bool,
    cwd: Option<PathBuf>,
}

impl DirectTree {
    /// SIGKILLs every process of the tree: one `cgroup.kill`, and the
    /// process group while its leader is not yet reaped (after that its
    /// pgid may name another group).
    fn signal(&mut self) {
        if let Some(cg) = &self.cgroup {
            cg.kill();
        }
        let leader_unreaped = match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        };
        if leader_unreaped
            && self.shim
            && let Some(shim) = self
                .child
                .as_ref()
                .and_then(|c| i32::try_from(c.id()).ok())
                .and_then(rustix::process::Pid::from_raw)
        {
            // The subreaper SIGKILLs the plugin and every process it
            // adopted, then exits.
            let _ = rustix::process::kill_process(shim, rustix::process::Signal::TERM);
            return;
        }
        if leader_unreaped
            && let Some(pid) = i32::try_from(self.pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
        {
            // ESRCH once everything in the group is gone: nothing to do.
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }

    /// Everything after the signal: reap, wait for the cgroup to empty,
    /// remove it and the working directory.
    fn finish(&mut self) -> io::Result<()> {
        self.signal();
        if let Some(mut c) = self.child.take() {
            c.wait()?;
        }
        if let Some(mut cg) = self.cgroup.take() {
            if !cg.wait_empty(EMPTY_WAIT) {
                tracing::warn!("a direct plugin's cgroup did not empty within {EMPTY_WAIT:?}");
            }
            cg.remove();
            if !cg.paths.is_empty() {
                tracing::warn!("a direct plugin's cgroup could not be removed");
            }
        }
        if let Some(cwd) = self.cwd.take() {
            sharedos_sandbox::removal::remove_tree(&cwd)?;
        }
        Ok(())
    }
}

impl ProcessTree for DirectTree {
    fn pid(&self) -> u32 {
        self.pid
    }
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        match &mut self.child {
            Some(c) => c.try_wait(),
            None => Ok(None),
        }
    }
    fn start_kill(&mut self) {
        self.signal();
    }
    fn kill_tree(&mut self) -> io::Result<()> {
        self.finish()
    }
}

impl Drop for DirectTree {
    fn drop(&mut self) {
        if self.child.is_none() && self.cgroup.is_none() && self.cwd.is_none() {
            return;
        }
        self.signal();
        // The rest may block: off the async thread, joined by
        // `settle_kills`.
        let mut rest = DirectTree {
            child: self.child.take(),
            pid: self.pid,
            cgroup: self.cgroup.take(),
            shim: self.shim,
            cwd: self.cwd.take(),
        };
        match std::thread::Builder::new()
            .name("sharedos-direct-reap".into())
            .spawn(move || {
                let _ = rest.finish();
            }) {
            Ok(handle) => super::track_thread(handle),
            Err(e) => tracing::warn!("no thread to reap a direct plugin ({e})"),
        }
    }
}
