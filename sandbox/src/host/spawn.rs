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

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::SandboxError;
use crate::cgroup::{self, PluginCgroup};
use crate::forkserver::{self, ForkError};
use crate::policy::SandboxPolicy;
use crate::report::{HelperMessage, SandboxReport};
use crate::request::{self, HelperRequest};
use crate::seccomp::{self, FilterMode};
use crate::timing::HostClock;
use crate::uid::{self, UidLease};

/// The subcommand the host binary dispatches to [`crate::helper_main`].
pub const HELPER_SUBCOMMAND: &str = "__sandbox-exec";

/// The helper's argv[0] (and pid 1's name inside the sandbox): the host
/// path of the `sharedos` binary never appears in a command line the plugin
/// can read.
pub(crate) const NEUTRAL_NAME: &str = "sandbox-init";

/// How long the helper may take to build the sandbox and send its report.
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest report accepted.
const MAX_REPORT: usize = 1 << 20;

/// What to launch and how.
#[derive(Clone, Debug)]
pub struct SpawnSpec {
    /// The binary that runs [`crate::helper_main`] for `__sandbox-exec`
    /// (the `sharedos` binary itself, `std::env::current_exe()`).
    pub helper_exe: PathBuf,
    /// The plugin binary (host path).
    pub program: PathBuf,
    /// Arguments after argv[0].
    pub args: Vec<OsString>,
    /// Environment for the plugin; keys outside `policy.env_allowlist` are
    /// dropped. `PATH`, `HOME`, `TMPDIR` and `LANG` get sandbox defaults
    /// when absent.
    pub env: Vec<(String, String)>,
    pub policy: SandboxPolicy,
    /// A host directory for the workspace (a real directory, not a
    /// symlink; chowned to the sandbox uid when the host is root). `None`,
    /// the default: the workspace is a size- and inode-capped tmpfs in the
    /// sandbox's mount namespace that goes away with it, so nothing the
    /// plugin writes is ever on the host. Only a sandbox without a mount
    /// namespace needs a host directory (and refuses to start without one).
    pub workspace: Option<PathBuf>,
}

/// A running sandboxed plugin. Dropping it kills the whole tree and
/// removes its cgroup.
#[derive(Debug)]
pub struct SandboxedChild {
    /// Write end of the plugin's stdin (take it with `Option::take`).
    pub stdin: Option<OwnedFd>,
    /// Read end of the plugin's stdout.
    pub stdout: Option<OwnedFd>,
    /// Read end of the plugin's stderr.
    pub stderr: Option<OwnedFd>,
    /// What the sandbox enforced (at least `policy.min_level`).
    pub report: SandboxReport,
    /// Pid of the helper (the supervisor); the plugin's tree dies with it.
    pub pid: i32,
    /// The egress gateway's listening socket, bound to 127.0.0.1 in the
    /// sandbox's network namespace (`policy.egress_port`); no process of
    /// the sandbox holds a copy. Take it with `Option::take`.
    pub egress_listener: Option<OwnedFd>,
    pidfd: Option<OwnedFd>,
    helper: HelperProc,
    lifeline: Option<UnixStream>,
    cgroup: PluginCgroup,
    status: Option<ExitStatus>,
    /// The sandbox's own uid, released when this drops, after `Drop` has
    /// killed and waited for the tree (fields drop after `drop` runs).
    uid: Option<UidLease>,
}

/// How the helper was started.
#[derive(Debug)]
enum HelperProc {
    /// Executed by the host: its child, waited for with `waitpid`.
    Exec(Child),
    /// Forked by the fork server: watched through its pidfd, exit status
    /// read from the control socket.
    Forked,
}

type Job = Box<dyn FnOnce() + Send>;

/// Run `f` on the long-lived spawner thread.
pub(crate) fn on_spawner_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let tx = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("sharedos-spawner".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            })
            .expect("start the sandbox spawner thread");
        Mutex::new(tx)
    });
    let (rtx, rrx) = mpsc::sync_channel(1);
    let job: Job = Box::new(move || {
        let _ = rtx.send(f());
    });
    tx.lock()
        .unwrap_or_else(|p| p.into_inner())
        .send(job)
        .expect("the spawner thread is alive");
    rrx.recv().expect("the spawner thread answers")
}

fn pipe() -> Result<(OwnedFd, OwnedFd), SandboxError> {
    let mut p = [0; 2];
    // SAFETY: `p` has room for the two fds pipe2 writes.
    if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(SandboxError::io("pipe2")(std::io::Error::last_os_error()));
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) })
}

fn check_paths(spec: &SpawnSpec) -> Result<(), SandboxError> {
    let bad = |what, path: &PathBuf, reason: String| SandboxError::BadPath {
        what,
        path: path.clone(),
        reason,
    };
    let md = std::fs::metadata(&spec.helper_exe)
        .map_err(|e| bad("helper", &spec.helper_exe, e.to_string()))?;
    if !md.is_file() {
        return Err(bad("helper", &spec.helper_exe, "not a file".into()));
    }
    let md = std::fs::metadata(&spec.program)
        .map_err(|e| bad("program", &spec.program, e.to_string()))?;
    if !md.is_file() {
        return Err(bad("program", &spec.program, "not a file".into()));
    }
    if !spec.program.is_absolute() {
        return Err(bad(
            "program",
            &spec.program,
            "must be an absolute path".into(),
        ));
    }
    let Some(ws) = &spec.workspace else {
        return Ok(());
    };
    let md = std::fs::symlink_metadata(ws).map_err(|e| bad("workspace", ws, e.to_string()))?;
    if !md.is_dir() {
        return Err(bad(
            "workspace",
            ws,
            "must be a directory, not a symlink or file".into(),
        ));
    }
    if !ws.is_absolute() {
        return Err(bad("workspace", ws, "must be an absolute path".into()));
    }
    Ok(())
}

/// Whether a sandbox under `policy` needs a host workspace directory: only
/// when it cannot have a mount namespace (the layer is off, or it would need
/// a user namespace the policy switches off or emulates away). Otherwise
/// [`SpawnSpec::workspace`] should be `None`.
pub fn needs_host_workspace(policy: &SandboxPolicy) -> bool {
    let l = &policy.layers;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let userns = l.userns && !policy.emulate_no_userns;
    !(l.mountns && (userns || (root && !l.drop_uid)))
}

/// Launch `spec.program` in the sandbox. Returns once the helper has built
/// every layer and the plugin's `execve` succeeded, with the report checked
/// against `spec.policy.min_level` (below it, the tree is killed and
/// [`SandboxError::BelowMinimum`] names each missing layer).
pub fn spawn(spec: &SpawnSpec) -> Result<SandboxedChild, SandboxError> {
    begin(spec, false)?.start()
}

/// Build a sandbox for `spec` ahead of need: every layer, the report (checked
/// against `policy.min_level`), the plugin process waiting right before its
/// `execve`. [`PreparedSandbox::start`] then only execs the plugin. Nothing
/// of the plugin runs before that; dropping the prepared sandbox kills it.
pub fn prepare(spec: &SpawnSpec) -> Result<PreparedSandbox, SandboxError> {
    begin(spec, true)
}

/// A sandbox built by [`prepare`], its plugin not yet executed.
#[derive(Debug)]
pub struct PreparedSandbox {
    child: SandboxedChild,
    /// Where the start order goes (`None` for a plain [`spawn`], whose
    /// plugin execs as soon as its report is written).
    start: Option<UnixStream>,
    reader: ReportReader,
    clock: HostClock,
}

impl PreparedSandbox {
    /// What the sandbox enforces (already checked against the minimum).
    pub fn report(&self) -> &SandboxReport {
        &self.child.report
    }

    /// Pid of the helper (the supervisor) of the prepared tree.
    pub fn pid(&self) -> i32 {
        self.child.pid
    }

    /// Whether the prepared tree is still there to be started (a tree
    /// killed from outside, by the OOM killer or an operator, is not).
    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Exec the plugin. Returns once its `execve` succeeded; an exec that
    /// failed is the helper's error, and the tree is gone.
    pub fn start(mut self) -> Result<SandboxedChild, SandboxError> {
        if let Some(start) = self.start.take() {
            self.clock.stamp("start order sent");
            let sent = nix::sys::socket::send(
                start.as_raw_fd(),
                &[crate::request::START_BYTE],
                nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
            );
            if sent != Ok(1) {
                return Err(no_report(&mut self.child));
            }
            self.child.report.prepared = true;
        }
        self.reader.deadline = Instant::now() + SETUP_TIMEOUT;
        self.reader.until_eof()?;
        self.clock.stamp("report_eof (plugin exec'd)");
        if !self.clock.stamps.is_empty() {
            let report = &mut self.child.report;
            let mut all = std::mem::take(&mut self.clock.stamps);
            all.append(&mut report.timings_us);
            all.sort_by_key(|t| t.us);
            report.timings_us = all;
        }
        Ok(self.child)
    }
}

/// The sandbox's own uid when the host can give one (root, `drop_uid` on);
/// a policy that requires one is refused otherwise, never run as a uid
/// shared with other sandboxes.
fn own_uid(policy: &SandboxPolicy) -> Result<Option<UidLease>, SandboxError> {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if euid == 0 && policy.layers.drop_uid {
        uid::check_range_once(&policy.uids)?;
        return Ok(Some(uid::allocate(&policy.uids)?));
    }
    if policy.uids.required {
        return Err(SandboxError::NoOwnUid(if euid == 0 {
            "drop_uid is off".into()
        } else {
            format!("the host runs as uid {euid}, not root, and cannot change uid")
        }));
    }
    Ok(None)
}

fn begin(spec: &SpawnSpec, hold: bool) -> Result<PreparedSandbox, SandboxError> {
    let policy = &spec.policy;
    let mut clock = HostClock::new(policy.timings);
    check_paths(spec)?;
    clock.stamp("paths_checked");
    let (env, dropped_env): (Vec<_>, Vec<_>) = spec
        .env
        .iter()
        .cloned()
        .partition(|(k, _)| policy.env_allowed(k));
    let memfd = policy.memfd_create;
    // Only a runtime with an egress listener or the harness mode's MCP
    // port may create TCP sockets.
    let namespace_mode = if policy.egress_port.is_some() || policy.mcp_port.is_some() {
        FilterMode::NamespaceEgress
    } else {
        FilterMode::Namespace
    };
    let seccomp_namespace =
        seccomp::compile(namespace_mode, memfd).map_err(SandboxError::Seccomp)?;
    let seccomp_strict =
        seccomp::compile(FilterMode::Strict, memfd).map_err(SandboxError::Seccomp)?;
    let emulation_filter = if policy.emulate_no_userns {
        Some(seccomp::compile_no_userns_emulation().map_err(SandboxError::Seccomp)?)
    } else {
        None
    };
    clock.stamp("seccomp_compiled");

    let lease = own_uid(policy)?;
    if let (Some(ws), Some(lease)) = (&spec.workspace, &lease) {
        // The plugin writes its host workspace as its sandbox uid.
        let uid = lease.uid();
        std::os::unix::fs::chown(ws, Some(uid), Some(uid))
            .map_err(SandboxError::io("chown the workspace to the sandbox uid"))?;
    }
    clock.stamp("uid_allocated");
    // A program inside one of the runtime's read-only paths runs from its
    // own path (a venv's interpreter finds its pyvenv.cfg). Any other is
    // bound from a copy in the host-private state directory, so the mount
    // table names no host path of it.
    let program_in_place = crate::fsview::program_in_place(policy, &spec.program);
    let program_staged = if policy.layers.mountns && !program_in_place {
        Some(crate::staging::stage_program(&spec.program)?)
    } else {
        None
    };
    clock.stamp("program_staged");

    let mut cg = cgroup::create(&policy.cgroup);
    let cgroup_report = cg.report(policy.cgroup.enabled);
    clock.stamp("cgroup_created");
    let req = HelperRequest {
        policy: policy.clone(),
        program: spec.program.clone(),
        args: spec.args.clone(),
        env,
        workspace: spec.workspace.clone(),
        program_staged,
        program_in_place,
        uid: lease.as_ref().map(UidLease::uid),
        host_pid: std::process::id() as i32,
        seccomp_namespace,
        seccomp_strict,
        emulation_filter,
        cgroup_paths: cg.paths.clone(),
        cgroup: cgroup_report,
        dropped_env: dropped_env.into_iter().map(|(k, _)| k).collect(),
        origin_ns: clock.origin_ns,
        hold,
    };

    let l = match launch(spec, &req, &mut clock) {
        Ok(l) => l,
        Err(e) => {
            cg.kill();
            cg.remove();
            return Err(e);
        }
    };
    let mut sc = SandboxedChild {
        stdin: Some(l.stdin_w),
        stdout: Some(l.stdout_r),
        stderr: Some(l.stderr_r),
        report: SandboxReport::default(),
        pid: l.pid,
        egress_listener: None,
        pidfd: l.pidfd,
        helper: l.helper,
        lifeline: Some(l.lifeline),
        cgroup: cg,
        status: None,
        uid: lease,
    };
    if sc.pidfd.is_none() {
        // SAFETY: pidfd_open on our own child, not yet reaped.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, sc.pid, 0) };
        if fd >= 0 {
            // SAFETY: `fd` was just returned by pidfd_open.
            sc.pidfd = Some(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        }
    }
    // From here on an error drops `sc`: tree killed, cgroup removed.
    let mut reader = ReportReader {
        file: std::fs::File::from(l.report_r),
        buf: Vec::new(),
        deadline: Instant::now() + SETUP_TIMEOUT,
    };
    sc.report = reader.until_report(&mut sc)?;
    clock.stamp("report received");
    if policy.egress_port.is_some() {
        // Sent by the supervisor before it forked pid 1, so it is queued
        // by the time the report (written by the plugin's process) is read.
        let listener = match sc.lifeline.as_ref() {
            Some(lifeline) => crate::listener::receive(lifeline)?,
            None => return Err(no_report(&mut sc)),
        };
        sc.egress_listener = Some(listener);
    }
    sc.report.require(policy.min_level)?;
    Ok(PreparedSandbox {
        child: sc,
        start: l.start,
        reader,
        clock,
    })
}

struct Launched {
    helper: HelperProc,
    pid: i32,
    pidfd: Option<OwnedFd>,
    lifeline: UnixStream,
    stdin_w: OwnedFd,
    stdout_r: OwnedFd,
    stderr_r: OwnedFd,
    report_r: OwnedFd,
    start: Option<UnixStream>,
}

fn launch(
    spec: &SpawnSpec,
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
    if req.policy.fork_server {
        let fds = [ctl_child.as_fd(), stdout_w.as_fd(), stderr_w.as_fd()];
        match forkserver::fork_helper(&spec.helper_exe, fds) {
            Ok(f) => {
                clock.stamp("helper forked by the fork server");
                drop((ctl_child, stdout_w, stderr_w));
                if let Err(e) = request::send_rest(&ctl_host, rest) {
                    kill_helper(Some(&f.pidfd), f.pid);
                    return Err(SandboxError::io("send the request to the helper")(e));
                }
                return Ok(Launched {
                    helper: HelperProc::Forked,
                    pid: f.pid,
                    pidfd: Some(f.pidfd),
                    lifeline: ctl_host,
                    stdin_w,
                    stdout_r,
                    stderr_r,
                    report_r,
                    start,
                });
            }
            Err(ForkError::Sent(source)) => {
                return Err(SandboxError::SpawnHelper {
                    helper: spec.helper_exe.clone(),
                    source,
                });
            }
            // No server (an old helper binary, or none could start):
            // execute the helper directly.
            Err(ForkError::NotSent) => {}
        }
    }
    let helper = spec.helper_exe.clone();
    let (child, on_thread, spawned) = on_spawner_thread(move || {
        let on_thread = crate::timing::now_ns();
        let child = Command::new(&helper)
            .arg0(NEUTRAL_NAME)
            .arg(HELPER_SUBCOMMAND)
            .env_clear()
            .current_dir("/")
            .stdin(Stdio::from(OwnedFd::from(ctl_child)))
            .stdout(Stdio::from(stdout_w))
            .stderr(Stdio::from(stderr_w))
            .spawn();
        (child, on_thread, crate::timing::now_ns())
    });
    let child = child.map_err(|source| SandboxError::SpawnHelper {
        helper: spec.helper_exe.clone(),
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
    if let Err(e) = request::send_rest(&ctl_host, rest) {
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
        return Err(SandboxError::io("send the request to the helper")(e));
    }
    Ok(Launched {
        pid: child.id() as i32,
        helper: HelperProc::Exec(child),
        pidfd: None,
        lifeline: ctl_host,
        stdin_w,
        stdout_r,
        stderr_r,
        report_r,
        start,
    })
}

/// The host's end of the report pipe: newline-delimited messages, then EOF
/// when the plugin's `execve` closes the helper's close-on-exec copy.
#[derive(Debug)]
struct ReportReader {
    file: std::fs::File,
    buf: Vec<u8>,
    deadline: Instant,
}

impl ReportReader {
    /// The next whole line, or `None` at EOF.
    fn next_line(&mut self) -> Result<Option<Vec<u8>>, SandboxError> {
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Ok(Some(line));
            }
            let left = self.deadline.saturating_duration_since(Instant::now());
            let mut pfd = libc::pollfd {
                fd: self.file.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let n =
                unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
            if n == 0 {
                return Err(SandboxError::Timeout(SETUP_TIMEOUT));
            }
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(SandboxError::io("poll the report pipe")(e));
            }
            let mut chunk = [0u8; 16 << 10];
            let r = self
                .file
                .read(&mut chunk)
                .map_err(SandboxError::io("read the report pipe"))?;
            if r == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                // A last line without its newline.
                return Ok(Some(std::mem::take(&mut self.buf)));
            }
            self.buf.extend_from_slice(&chunk[..r]);
            if self.buf.len() > MAX_REPORT {
                return Err(SandboxError::BadReport("report larger than 1 MiB".into()));
            }
        }
    }

    /// The next report, skipping empty lines; `None` at EOF. An error
    /// message from the helper is returned as that error.
    fn next_report(&mut self) -> Result<Option<SandboxReport>, SandboxError> {
        loop {
            let Some(line) = self.next_line()? else {
                return Ok(None);
            };
            let line = line.trim_ascii();
            if line.is_empty() {
                continue;
            }
            return match serde_json::from_slice::<HelperMessage>(line) {
                Ok(HelperMessage::Report(r)) => Ok(Some(*r)),
                Ok(HelperMessage::Error {
                    stage,
                    message,
                    errno,
                }) => Err(SandboxError::Setup {
                    stage,
                    message,
                    errno,
                }),
                Err(e) => Err(SandboxError::BadReport(e.to_string())),
            };
        }
    }

    /// Read until the helper's report (written right before `execve`).
    fn until_report(&mut self, sc: &mut SandboxedChild) -> Result<SandboxReport, SandboxError> {
        self.next_report()?.ok_or_else(|| no_report(sc))
    }

    /// After the report: EOF means the `execve` succeeded; an error
    /// message means it failed.
    fn until_eof(&mut self) -> Result<(), SandboxError> {
        match self.next_report()? {
            None => Ok(()),
            Some(_) => Err(SandboxError::BadReport("a second report".into())),
        }
    }
}

/// The helper sent no report: why, as far as its exit status tells.
fn no_report(sc: &mut SandboxedChild) -> SandboxError {
    let status = sc
        .wait_timeout(Duration::from_secs(5))
        .map(|s| format!("{s}"))
        .unwrap_or_else(|| "still running".into());
    SandboxError::NoReport { status }
}

impl SandboxedChild {
    /// The uid (and gid) held for this sandbox alone, when the host could
    /// give one (root, `drop_uid` on).
    pub fn own_uid(&self) -> Option<u32> {
        self.uid.as_ref().map(UidLease::uid)
    }

    /// The helper's pidfd (poll it for exit; POLLIN when it is gone).
    pub fn pidfd(&self) -> Option<BorrowedFd<'_>> {
        self.pidfd.as_ref().map(|f| f.as_fd())
    }

    /// SIGKILL the whole tree: the helper (through its pidfd, so a recycled
    /// pid is never hit), whose pid 1 follows by parent-death signal and
    /// takes the pid namespace with it; plus `cgroup.kill` (or each pid of
    /// the cgroup) for what a degraded sandbox left outside a pid ns.
    /// Returns immediately; [`Self::wait`] reaps.
    pub fn kill_tree(&self) {
        if self.status.is_none() {
            kill_helper(self.pidfd.as_ref(), self.pid);
        }
        self.cgroup.kill();
    }

    /// A cloneable handle that can kill the tree from another thread while
    /// this one blocks in [`Self::wait`] (e.g. the turn's deadline timer).
    pub fn kill_handle(&self) -> std::io::Result<KillHandle> {
        Ok(KillHandle {
            pidfd: match &self.pidfd {
                Some(fd) => Some(std::sync::Arc::new(fd.try_clone()?)),
                None => None,
            },
            pid: self.pid,
            cgroup_v2: self.cgroup.v2.clone(),
            cgroup_paths: self.cgroup.paths.clone(),
        })
    }

    /// Wait for the helper to exit (it exits with the plugin's status, or
    /// 128 + signal), then for the cgroup to empty, and remove the cgroup.
    pub fn wait(&mut self) -> std::io::Result<ExitStatus> {
        let st = match self.status {
            Some(s) => s,
            None => {
                let s = match &mut self.helper {
                    HelperProc::Exec(child) => child.wait()?,
                    HelperProc::Forked => {
                        self.poll_exit(-1)?;
                        self.forked_status()
                    }
                };
                self.status = Some(s);
                s
            }
        };
        self.lifeline = None;
        self.cleanup_cgroup();
        Ok(st)
    }

    /// Non-blocking [`Self::wait`].
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = match &mut self.helper {
                HelperProc::Exec(child) => child.try_wait()?,
                HelperProc::Forked => {
                    if self.poll_exit(0)? {
                        Some(self.forked_status())
                    } else {
                        None
                    }
                }
            };
        }
        Ok(self.status)
    }

    /// A forked helper: whether it has exited (its pidfd is readable),
    /// waiting up to `timeout_ms` (-1: forever).
    fn poll_exit(&self, timeout_ms: i32) -> std::io::Result<bool> {
        let Some(fd) = &self.pidfd else {
            return Err(std::io::Error::other("forked helper without a pidfd"));
        };
        loop {
            let mut pfd = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
            if n >= 0 {
                return Ok(n > 0);
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
    }

    /// A forked helper that has exited: the status it sent on the control
    /// socket, or SIGKILL when it sent none (killed outright).
    fn forked_status(&self) -> ExitStatus {
        use std::os::unix::process::ExitStatusExt;
        let mut b = [0u8; 1];
        let got = self.lifeline.as_ref().map_or(-1, |l| {
            // SAFETY: reading at most one byte into a local buffer.
            unsafe { libc::recv(l.as_raw_fd(), b.as_mut_ptr().cast(), 1, libc::MSG_DONTWAIT) }
        });
        if got == 1 {
            ExitStatus::from_raw((b[0] as i32) << 8)
        } else {
            ExitStatus::from_raw(libc::SIGKILL)
        }
    }

    fn wait_timeout(&mut self, t: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + t;
        while Instant::now() < end {
            if let Ok(Some(s)) = self.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    fn cleanup_cgroup(&mut self) {
        if self.cgroup.paths.is_empty() {
            return;
        }
        // One `cgroup.kill`, one wait for `populated 0`; rmdir of a v1
        // cgroup whose last task is still exiting may need a retry.
        self.cgroup.kill();
        let end = Instant::now() + Duration::from_secs(10);
        self.cgroup.wait_empty(Duration::from_secs(10));
        self.cgroup.remove();
        while !self.cgroup.paths.is_empty() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(1));
            self.cgroup.kill();
            self.cgroup.remove();
        }
    }
}

fn kill_helper(pidfd: Option<&OwnedFd>, pid: i32) {
    match pidfd {
        Some(fd) => {
            // SAFETY: pidfd_send_signal on a pidfd we own; null info. A pidfd
            // never designates a recycled pid.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0u32,
                )
            };
        }
        None => {
            // SAFETY: kill with a pid; only used when pidfd_open is missing
            // (kernel < 5.3) while the child is unreaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Kills a sandboxed tree from any thread; see [`SandboxedChild::kill_handle`].
#[derive(Clone, Debug)]
pub struct KillHandle {
    pidfd: Option<std::sync::Arc<OwnedFd>>,
    pid: i32,
    cgroup_v2: Option<PathBuf>,
    cgroup_paths: Vec<PathBuf>,
}

impl KillHandle {
    /// Same as [`SandboxedChild::kill_tree`]. Without a pidfd (kernel < 5.3)
    /// this may only be used while the owner has not reaped the helper.
    pub fn kill_tree(&self) {
        kill_helper(self.pidfd.as_deref(), self.pid);
        cgroup::kill_paths(self.cgroup_v2.as_deref(), &self.cgroup_paths);
    }
}

impl Drop for SandboxedChild {
    fn drop(&mut self) {
        if self.status.is_none() {
            self.kill_tree();
        }
        let _ = self.wait();
    }
}
