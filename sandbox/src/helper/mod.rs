//! The helper: `sharedos __sandbox-exec`. Single-threaded, no async
//! runtime. It builds the layers in the order of spec B.2 and `execve`s
//! the plugin:
//!
//! ```text
//! supervisor (the helper itself, outside the pid ns): lifeline, setsid, fds,
//!   │  cgroup, ipc ns + limits, own uid, userns, non-dumpable, other
//!   │  namespaces, ceilings, rlimits ([`credentials`]); then waits and watches the
//!   │  lifeline (host gone → SIGKILL pid 1)
//!   └─ pid 1 (non-dumpable reaper): minimal root, hostname
//!       └─ plugin: caps → no_new_privs → Landlock → seccomp
//!          → self-check → report → execve
//! ```

use std::convert::Infallible;
use std::ffi::{CString, OsString};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

mod credentials;
pub(crate) mod egress;
pub mod fds;
mod plugin;
mod reaper;
pub(crate) mod server;

use reaper::{block_term_and_chld, pid_one};

use crate::cgroup;
use crate::landlock as ll;
use crate::mounts;
use crate::report::{
    HelperMessage, LandlockReport, LayerStatus, SandboxLevel, SandboxReport, SeccompReport,
    SelfCheck,
};
use crate::request::{self, HelperRequest};
use crate::seccomp;
use crate::timing::{self, stamp};

/// The control socket arrives as fd 0.
const CONTROL_FD: RawFd = 0;

pub(super) struct Fail {
    stage: &'static str,
    message: String,
    errno: Option<i32>,
}

pub(super) fn fail(stage: &'static str, message: impl std::fmt::Display) -> Fail {
    Fail {
        stage,
        message: message.to_string(),
        errno: None,
    }
}

pub(super) fn os_fail(stage: &'static str, what: &str) -> Fail {
    let e = std::io::Error::last_os_error();
    Fail {
        stage,
        message: format!("{what}: {e}"),
        errno: e.raw_os_error(),
    }
}

/// The report pipe (close-on-exec: it closes by itself when `execve`
/// succeeds, so EOF without a report means the exec failed), and the start
/// pipe of a prepared sandbox (read end, close-on-exec too).
pub(super) struct ReportPipe(pub(super) OwnedFd, pub(super) Option<OwnedFd>);

impl ReportPipe {
    pub(super) fn send(&self, msg: &HelperMessage) {
        let mut line = serde_json::to_vec(msg).unwrap_or_default();
        line.push(b'\n');
        // SAFETY: the fd is owned by `self.0` and stays open for the call;
        // ManuallyDrop keeps the temporary File from closing it.
        let mut f =
            std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(self.0.as_raw_fd()) });
        let _ = f.write_all(&line);
    }

    pub(super) fn fail(&self, f: Fail) -> ! {
        self.send(&HelperMessage::Error {
            stage: f.stage.to_string(),
            message: f.message,
            errno: f.errno,
        });
        exit_status_to_host(125);
        // SAFETY: _exit ends the process without running destructors,
        // which is what a forked child must do.
        unsafe { libc::_exit(125) }
    }
}

/// The supervisor's control socket (-1 in pid 1 and the plugin, which do
/// not hold it).
static CTL_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// Tell the host the supervisor's exit code on the control socket: a
/// helper forked by the fork server is not the host's child, so the host
/// cannot `waitpid` it (one killed outright sends nothing, and the host
/// reports SIGKILL). A no-op outside the supervisor.
fn exit_status_to_host(code: i32) {
    let fd = CTL_FD.load(std::sync::atomic::Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: sending one byte from a local buffer on the control
        // socket, which the supervisor holds until it exits.
        unsafe {
            libc::send(
                fd,
                (&(code as u8) as *const u8).cast(),
                1,
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
    }
}

pub(super) fn prctl(opt: libc::c_int, arg: libc::c_ulong) -> libc::c_int {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(opt, arg, 0, 0, 0) }
}

pub(super) fn arm_parent_death_signal() {
    prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
}

/// Entry point of `sharedos __sandbox-exec`. Without arguments, one helper:
/// everything arrives on the control socket at fd 0. With `--fork-server`,
/// the fork server ([`server`]), which forks one helper per spawn.
pub fn helper_main(args: Vec<OsString>) -> ! {
    let entered = timing::now_ns();
    let server = match args.as_slice() {
        [] => false,
        [a] if a == server::FORK_SERVER_ARG => true,
        _ => {
            eprintln!("sharedos __sandbox-exec takes no arguments; the policy comes on fd 0");
            std::process::exit(2);
        }
    };
    // unshare(CLONE_NEWUSER) and a safe fork need a single-threaded
    // process: the host must dispatch here before it starts any runtime.
    // procfs counts the threads in the link count of /proc/self/task (2 +
    // threads): one statx instead of generating /proc/self/status.
    let threads = std::fs::metadata("/proc/self/task")
        .ok()
        .map(|m| std::os::unix::fs::MetadataExt::nlink(&m).saturating_sub(2));
    if threads.is_some_and(|t| t != 1) {
        eprintln!(
            "sharedos __sandbox-exec: the helper must run single-threaded, found {} threads; \
             call sharedos_sandbox::helper_main before starting tokio or any thread",
            threads.unwrap_or(0)
        );
        std::process::exit(125);
    }
    if server {
        server::serve();
    }
    run(entered, None);
}

/// One helper, executed by the host or forked by the fork server (then
/// `parent` is the server's pid, which the lifeline checks against instead
/// of the host's).
fn run(entered: u64, parent: Option<i32>) -> ! {
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
    let off = |on: bool| {
        if on {
            LayerStatus::unavailable("not reached")
        } else {
            LayerStatus::Disabled
        }
    };
    let l = &req.policy.layers;
    SandboxReport {
        level: SandboxLevel::Minimal,
        missing: Vec::new(),
        kernel: kernel_release(),
        host_uid: 0,
        uid_drop: off(l.drop_uid),
        own_uid: off(l.drop_uid),
        supervisor_non_dumpable: false,
        userns: off(l.userns),
        mountns: off(l.mountns),
        pidns: off(l.pidns),
        netns: off(l.netns),
        ipcns: off(l.ipcns),
        utsns: off(l.utsns),
        cgroupns: off(l.cgroupns),
        root: off(l.mountns),
        landlock: LandlockReport {
            status: off(l.landlock),
            kernel_abi: ll::kernel_abi(),
            requested_abi: 6,
            ruleset: "NotEnforced".into(),
            scopes: Vec::new(),
            net: "none".into(),
        },
        seccomp: SeccompReport {
            status: off(l.seccomp),
            arch: seccomp::arch_name().into(),
            insns: 0,
            x32_guard: false,
            mode: "none".into(),
            default_action: "none".into(),
            memfd_create: "none".into(),
        },
        caps: LayerStatus::unavailable("not reached"),
        no_new_privs: false,
        rlimits: Default::default(),
        rlimits_status: off(l.rlimits),
        ceilings: Default::default(),
        ceilings_status: off(l.userns),
        ipc_limits: Default::default(),
        ipc_limits_status: off(l.ipcns),
        memory: Default::default(),
        cgroup: req.cgroup.clone(),
        lifeline: LayerStatus::unavailable("not reached"),
        setsid: LayerStatus::unavailable("not reached"),
        fds: Vec::new(),
        env_keys: req.env.iter().map(|(k, _)| k.clone()).collect(),
        self_check: SelfCheck::default(),
        warnings: req
            .dropped_env
            .iter()
            .map(|k| format!("environment variable {k} is not in the allowlist; dropped"))
            .collect(),
        timings_us: Vec::new(),
        prepared: false,
        view: None,
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
    // The harness mode: the plugin binds its own MCP listener on the
    // sandbox's loopback (Landlock admits that one port).
    if req.policy.mcp_port.is_some() {
        if rep.netns != LayerStatus::Applied {
            return Err(fail(
                "harness",
                "the sandbox has no network namespace of its own; the harness's MCP listener \
                 is never bound in the host's",
            ));
        }
        egress::loopback_up()?;
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

/// The host files the root is built from: the plugin binary (its staged
/// copy, unless it is executed in place), a host workspace if the request
/// names one, and the runtime's extra read-only paths, each as a
/// [`mounts::Source`] fd.
pub(super) struct HostSources {
    pub(super) program: Option<(mounts::Source, OwnedFd)>,
    pub(super) workspace: Option<(mounts::Source, OwnedFd)>,
    /// Clones of the runtime's extra read-only paths (path, is a
    /// directory, fd), taken as root before the uid drop: the sandbox uid
    /// needs no right on their parents, and pid 1 hides the host's `/tmp`
    /// before it binds. Empty when the helper is not root (then pid 1
    /// binds them by path).
    pub(super) extras: Vec<(PathBuf, bool, OwnedFd)>,
}

impl HostSources {
    /// Detached clones (`open_tree`), taken as uid 0 before the uid drop;
    /// they attach with `move_mount` in the new mount namespace.
    fn clone_trees(req: &HelperRequest) -> Result<HostSources, Fail> {
        let tree = |p: &Path, dir: bool| {
            let fd = open_tree(p, dir)?;
            Ok::<_, Fail>((mounts::Source::Tree(fd.as_raw_fd()), fd))
        };
        let mut extras = Vec::new();
        for entry in req.policy.extra_ro_paths.iter() {
            // The host checked each at load; one that is gone now fails
            // the spawn rather than running the plugin without it.
            let real = std::fs::canonicalize(entry)
                .map_err(|e| fail("paths", format!("extra read-only path {entry}: {e}")))?;
            let md = std::fs::metadata(&real)
                .map_err(|e| fail("paths", format!("extra read-only path {entry}: {e}")))?;
            let fd = open_tree(&real, md.is_dir())?;
            extras.push((PathBuf::from(entry), md.is_dir(), fd));
        }
        Ok(HostSources {
            program: match program_source(req) {
                Some(p) => Some(tree(p, false)?),
                None => None,
            },
            workspace: req
                .workspace
                .as_deref()
                .map(|w| tree(w, true))
                .transpose()?,
            extras,
        })
    }

    /// `O_PATH` fds opened inside the new mount namespace (no uid change:
    /// the helper reaches what the host could), refusing a symlinked
    /// workspace (spec C#62).
    fn open_paths(req: &HelperRequest) -> Result<HostSources, Fail> {
        let path = |p: &Path, dir: bool| {
            let fd = open_path(p, dir)?;
            Ok::<_, Fail>((mounts::Source::Path(fd.as_raw_fd()), fd))
        };
        Ok(HostSources {
            program: match program_source(req) {
                Some(p) if req.policy.layers.mountns => Some(path(p, false)?),
                _ => None,
            },
            workspace: req
                .workspace
                .as_deref()
                .map(|w| path(w, true))
                .transpose()?,
            extras: Vec::new(),
        })
    }
}

/// The file bound at `/plugin/<name>`: the staged copy, or the program
/// itself where nothing was staged; `None` when the program is executed
/// from its own path inside a read-only path.
fn program_source(req: &HelperRequest) -> Option<&Path> {
    if req.program_in_place {
        return None;
    }
    Some(req.program_staged.as_deref().unwrap_or(&req.program))
}

/// `open_tree(OPEN_TREE_CLONE)`: a detached copy of the mount of `p`,
/// limited to `p` (a directory must not be a symlink).
fn open_tree(p: &Path, dir: bool) -> Result<OwnedFd, Fail> {
    let c = CString::new(p.as_os_str().as_bytes()).map_err(|_| fail("paths", "NUL in path"))?;
    // Recursive, as the binds by path are: a mount below an install
    // directory stays visible.
    let mut flags =
        libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_RECURSIVE as libc::c_uint;
    if dir {
        flags |= libc::AT_SYMLINK_NOFOLLOW as libc::c_uint;
    }
    // SAFETY: `c` is NUL-terminated; the returned fd is owned below.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c.as_ptr(), flags) };
    if fd < 0 {
        return Err(os_fail("paths", &format!("open_tree {p:?}")));
    }
    // SAFETY: `fd` was just returned by open_tree and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn open_path(p: &Path, dir: bool) -> Result<OwnedFd, Fail> {
    let c = CString::new(p.as_os_str().as_bytes()).map_err(|_| fail("paths", "NUL in path"))?;
    let mut flags = libc::O_PATH | libc::O_CLOEXEC;
    if dir {
        flags |= libc::O_DIRECTORY | libc::O_NOFOLLOW;
    }
    // SAFETY: `c` is NUL-terminated; the returned fd is owned below.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd < 0 {
        return Err(os_fail("paths", &format!("open {p:?}")));
    }
    // SAFETY: `fd` was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn pipe_cloexec() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut p = [0; 2];
    // SAFETY: `p` has room for the two fds pipe2 writes.
    if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) })
}

fn parent_gone(alive_r: &OwnedFd) -> bool {
    let mut pfd = libc::pollfd {
        fd: alive_r.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n > 0 && pfd.revents & (libc::POLLHUP | libc::POLLIN) != 0
}

pub(super) fn exit_code(status: libc::c_int) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        1
    }
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
