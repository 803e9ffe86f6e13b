//! The helper: `sharedos __sandbox-exec`. Single-threaded, no async
//! runtime. It builds the layers in the order of spec B.2 and `execve`s
//! the plugin:
//!
//! ```text
//! supervisor (the helper itself, outside the pid ns): lifeline, setsid, fds,
//!   │  cgroup, uid drop, userns, other namespaces; then waits and watches the
//!   │  lifeline (host gone → SIGKILL pid 1)
//!   └─ pid 1 (non-dumpable reaper): minimal root, hostname
//!       └─ plugin: rlimits → caps → no_new_privs → Landlock → seccomp
//!          → self-check → report → execve
//! ```

use std::convert::Infallible;
use std::ffi::{CString, OsString};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::fds;
use crate::landlock::{self as ll, Grants};
use crate::mounts::{self, RootSpec};
use crate::namespaces;
use crate::report::{
    HelperMessage, LandlockReport, LayerStatus, SandboxLevel, SandboxReport, SeccompReport,
    SelfCheck,
};
use crate::request::{self, HelperRequest};
use crate::seccomp;
use crate::{caps, cgroup, rlimits};

/// The control socket arrives as fd 0.
const CONTROL_FD: RawFd = 0;

struct Fail {
    stage: &'static str,
    message: String,
    errno: Option<i32>,
}

fn fail(stage: &'static str, message: impl std::fmt::Display) -> Fail {
    Fail {
        stage,
        message: message.to_string(),
        errno: None,
    }
}

fn os_fail(stage: &'static str, what: &str) -> Fail {
    let e = std::io::Error::last_os_error();
    Fail {
        stage,
        message: format!("{what}: {e}"),
        errno: e.raw_os_error(),
    }
}

/// The report pipe (close-on-exec: it closes by itself when `execve`
/// succeeds, so EOF without a report means the exec failed).
struct ReportPipe(OwnedFd);

impl ReportPipe {
    fn send(&self, msg: &HelperMessage) {
        let mut line = serde_json::to_vec(msg).unwrap_or_default();
        line.push(b'\n');
        // SAFETY: the fd is owned by `self.0` and stays open for the call;
        // ManuallyDrop keeps the temporary File from closing it.
        let mut f =
            std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(self.0.as_raw_fd()) });
        let _ = f.write_all(&line);
    }

    fn fail(&self, f: Fail) -> ! {
        self.send(&HelperMessage::Error {
            stage: f.stage.to_string(),
            message: f.message,
            errno: f.errno,
        });
        // SAFETY: _exit ends the process without running destructors,
        // which is what a forked child must do.
        unsafe { libc::_exit(125) }
    }
}

fn prctl(opt: libc::c_int, arg: libc::c_ulong) -> libc::c_int {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(opt, arg, 0, 0, 0) }
}

fn arm_parent_death_signal() {
    prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
}

/// Entry point of `sharedos __sandbox-exec`. `args` (after the subcommand)
/// are not used: everything arrives on the control socket at fd 0.
pub fn helper_main(args: Vec<OsString>) -> ! {
    if !args.is_empty() {
        eprintln!("sharedos __sandbox-exec takes no arguments; the policy comes on fd 0");
        std::process::exit(2);
    }
    // unshare(CLONE_NEWUSER) and a safe fork need a single-threaded
    // process: the host must dispatch here before it starts any runtime.
    let threads = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse::<u32>().ok())
        });
    if threads.is_some_and(|t| t != 1) {
        eprintln!(
            "sharedos __sandbox-exec: the helper must run single-threaded, found {} threads; \
             call sharedos_sandbox::helper_main before starting tokio or any thread",
            threads.unwrap_or(0)
        );
        std::process::exit(125);
    }
    // Lifeline, part 1: armed before anything else, so a host that dies from
    // here on takes the helper with it (checked against the host pid below).
    arm_parent_death_signal();
    let (req, stdin_r, report_w) = match request::receive(CONTROL_FD) {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "sharedos __sandbox-exec: no request on fd 0 ({e}). This is the sandbox helper of \
                 sharedos; it is not meant to be run by hand."
            );
            std::process::exit(125);
        }
    };
    let pipe = ReportPipe(report_w);
    match supervise(req, stdin_r, &pipe) {
        Ok(never) => match never {},
        Err(f) => pipe.fail(f),
    }
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
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        host_uid: 0,
        uid_drop: off(l.drop_uid),
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
        },
        caps: LayerStatus::unavailable("not reached"),
        no_new_privs: false,
        rlimits: Default::default(),
        rlimits_status: off(l.rlimits),
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
    }
}

/// Steps 1–8, then fork pid 1 and wait.
fn supervise(req: HelperRequest, stdin_r: OwnedFd, pipe: &ReportPipe) -> Result<Infallible, Fail> {
    let mut rep = skeleton(&req);
    let l = req.policy.layers.clone();

    // 1. Lifeline: the parent-death signal is racy (bubblewrap#633): if the
    // host died before it was armed we were reparented; check the pid.
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } != req.host_pid {
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
    // SAFETY: dup2 onto 0 replaces the control socket's old slot, which we
    // no longer use; stdin_r stays owned by its OwnedFd and is dropped next.
    if unsafe { libc::dup2(stdin_r.as_raw_fd(), 0) } < 0 {
        return Err(os_fail("fds", "dup2 plugin stdin"));
    }
    drop(stdin_r);
    fds::close_all_except(&[ctl.as_raw_fd(), pipe.0.as_raw_fd()])
        .map_err(|e| fail("fds", format!("close inherited fds: {e}")))?;

    // Test-only: emulate a host whose seccomp profile refuses user namespaces.
    if let Some(f) = &req.emulation_filter {
        seccomp::install(f).map_err(|e| fail("emulate_no_userns", e))?;
        rep.warnings
            .push("test mode: user namespaces refused by an emulation filter".into());
    }

    // 4. Join the plugin's cgroups before anything forks.
    if !req.cgroup_paths.is_empty() {
        cgroup::join(&req.cgroup_paths, &mut rep.cgroup);
    }

    // 5. Leave uid 0. Root without capabilities still reads /etc/shadow and
    // writes root-owned files (DAC owner), and RLIMIT_NPROC ignores uid 0.
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root && l.drop_uid {
        drop_uid(req.policy.sandbox_uid)?;
        rep.uid_drop = LayerStatus::Applied;
        // The signal was re-armed after setresuid cleared it: close the
        // window in which the host could have died unnoticed.
        // SAFETY: getppid has no preconditions.
        if unsafe { libc::getppid() } != req.host_pid {
            return Err(fail("lifeline", "the host exited during the uid change"));
        }
    } else if !root {
        rep.uid_drop = LayerStatus::Applied; // nothing to leave
    }
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    rep.host_uid = uid;
    if uid == 0 {
        rep.warnings
            .push("the plugin runs as host uid 0 (drop_uid is off)".into());
    }

    // 6. User namespace.
    if l.userns {
        rep.userns = match namespaces::enter_user(uid, gid) {
            Ok(()) => LayerStatus::Applied,
            Err(e) => LayerStatus::unavailable(format!("unshare(CLONE_NEWUSER): {e}")),
        };
    }
    // 7. The other namespaces (need the user namespace unless still root).
    let mut wanted = Vec::new();
    for (name, on) in [
        ("mountns", l.mountns),
        ("pidns", l.pidns),
        ("netns", l.netns),
        ("ipcns", l.ipcns),
        ("utsns", l.utsns),
        ("cgroupns", l.cgroupns),
    ] {
        if on {
            wanted.push(name);
        }
    }
    for (name, st) in namespaces::enter_others(&wanted) {
        let slot = match name {
            "mountns" => &mut rep.mountns,
            "pidns" => &mut rep.pidns,
            "netns" => &mut rep.netns,
            "ipcns" => &mut rep.ipcns,
            "utsns" => &mut rep.utsns,
            _ => &mut rep.cgroupns,
        };
        *slot = st;
    }
    if rep.mountns != LayerStatus::Applied && l.mountns {
        rep.root = LayerStatus::unavailable("no mount namespace");
    }

    // Open the workspace and the plugin binary now, with the host's view of
    // the filesystem, refusing a symlinked workspace (spec C#62).
    let ws_fd = open_path(&req.workspace, true)?;
    let prog_fd = open_path(&req.program, false)?;

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
        match pid_one(req, rep, ws_fd, prog_fd, pipe) {
            Ok(never) => match never {},
            Err(f) => pipe.fail(f),
        }
    }
    drop(alive_r);
    drop(ws_fd);
    drop(prog_fd);
    wait_and_watch(child, pidns, &ctl, pipe)
}

fn sigset(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigemptyset initializes the zeroed set; sigaddset only adds
    // valid signal numbers to it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in signals {
            libc::sigaddset(&mut set, *s);
        }
        set
    }
}

/// Block SIGTERM and SIGCHLD so pid 1 can wait for either with
/// `sigtimedwait` without a race between a check and a blocking wait.
fn block_term_and_chld() {
    let set = sigset(&[libc::SIGTERM, libc::SIGCHLD]);
    // SAFETY: `set` is initialized; the old mask is not needed.
    unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

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

fn drop_uid(uid: u32) -> Result<(), Fail> {
    // The bounding set must go before the uid change: PR_CAPBSET_DROP needs
    // CAP_SETPCAP, which setresuid takes away (observed: CapBnd stayed full).
    caps::drop_bounding().map_err(|e| fail("uid_drop", e))?;
    // SAFETY: setgroups with size 0 does not read the list pointer.
    if unsafe { libc::setgroups(0, std::ptr::null()) } != 0 {
        return Err(os_fail("uid_drop", "setgroups([])"));
    }
    // SAFETY: plain id arguments.
    if unsafe { libc::setresgid(uid, uid, uid) } != 0 {
        return Err(os_fail("uid_drop", "setresgid"));
    }
    // SAFETY: plain id arguments.
    if unsafe { libc::setresuid(uid, uid, uid) } != 0 {
        return Err(os_fail("uid_drop", "setresuid"));
    }
    // setresuid clears the parent-death signal and dumpability: re-arm the
    // first, and restore the second so /proc/self/uid_map stays ours.
    arm_parent_death_signal();
    prctl(libc::PR_SET_DUMPABLE, 1);
    Ok(())
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

fn exit_code(status: libc::c_int) -> i32 {
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
    // SAFETY: closing our copies of fds 0-2 and of the report pipe; the
    // report fd's owner (`pipe`) is never used again in this process.
    unsafe {
        libc::close(pipe.0.as_raw_fd());
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
            // SAFETY: plain exit of the supervisor.
            unsafe { libc::_exit(exit_code(status)) }
        }
    }
    let mut status = 0;
    // SAFETY: as above, blocking this time.
    unsafe { libc::waitpid(child, &mut status, 0) };
    // SAFETY: plain exit.
    unsafe { libc::_exit(137) }
}

/// Pid 1 of the new pid namespace (or a plain reaper without one).
fn pid_one(
    req: HelperRequest,
    mut rep: SandboxReport,
    ws_fd: OwnedFd,
    prog_fd: OwnedFd,
    pipe: &ReportPipe,
) -> Result<Infallible, Fail> {
    let pidns = rep.pidns == LayerStatus::Applied;
    // Nothing inside may ptrace or read the memory of the reaper.
    prctl(libc::PR_SET_DUMPABLE, 0);
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
        let warnings = mounts::build(&RootSpec {
            workspace_fd: ws_fd.as_raw_fd(),
            program_fd: prog_fd.as_raw_fd(),
            program_name: &program_name,
            tmp_size: p.tmp_size_bytes,
            shm_size: p.shm_size_bytes,
            nr_inodes: p.tmpfs_nr_inodes,
            extra_ro: &p.extra_ro_paths,
            with_proc: pidns,
        })
        .map_err(|e| fail("root", e))?;
        rep.warnings.extend(warnings);
        rep.root = LayerStatus::Applied;
    }
    drop(ws_fd);
    drop(prog_fd);
    // 10. Hostname.
    if rep.utsns == LayerStatus::Applied {
        // SAFETY: the name pointer and length describe a static buffer.
        unsafe { libc::sethostname(c"sandbox".as_ptr(), 7) };
    }

    let (workdir, tmpdir, exe) = if mountns {
        (
            PathBuf::from(mounts::WORKSPACE),
            PathBuf::from("/tmp"),
            Path::new(mounts::PLUGIN_DIR).join(&program_name),
        )
    } else {
        // No private /tmp: a private dir inside the workspace instead of the
        // host's /tmp (the degraded reference launcher leaked through it).
        let t = req.workspace.join(".sharedos-tmp");
        let _ = std::fs::create_dir(&t);
        (req.workspace.clone(), t, req.program.clone())
    };

    // 11. Fork the plugin and reap until it exits.
    // SAFETY: pid 1 is single-threaded.
    let plugin = unsafe { libc::fork() };
    if plugin < 0 {
        return Err(os_fail("fork", "fork plugin"));
    }
    if plugin == 0 {
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

/// Steps 12–17 in the plugin process.
fn plugin_exec(
    req: &HelperRequest,
    rep: &mut SandboxReport,
    mountns: bool,
    workdir: &Path,
    tmpdir: &Path,
    exe: &Path,
    pipe: &ReportPipe,
) -> Result<Infallible, Fail> {
    let l = &req.policy.layers;
    std::env::set_current_dir(workdir).map_err(|e| fail("workdir", format!("{workdir:?}: {e}")))?;
    // Opened before Landlock so the self-check can re-read it at the end.
    let status_fd = std::fs::File::open("/proc/self/status").ok();
    rep.self_check.uid_map = std::fs::read_to_string("/proc/self/uid_map")
        .map(|s| {
            s.lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect()
        })
        .unwrap_or_default();

    // 12. rlimits.
    if l.rlimits {
        match rlimits::apply(&req.policy.rlimits) {
            Ok(set) => {
                rep.rlimits = set;
                rep.rlimits_status = LayerStatus::Applied;
            }
            Err(e) => return Err(fail("rlimits", e)),
        }
    }
    // 13. Capabilities, checked with capget.
    rep.caps = match caps::drop_all() {
        Ok(None) => LayerStatus::Applied,
        Ok(Some(reason)) => LayerStatus::Degraded { reason },
        Err(e) => LayerStatus::unavailable(e),
    };
    // 14. no_new_privs: setuid and file-capability binaries are inert.
    if prctl(libc::PR_SET_NO_NEW_PRIVS, 1) != 0 {
        return Err(os_fail("no_new_privs", "PR_SET_NO_NEW_PRIVS"));
    }
    rep.no_new_privs = prctl(libc::PR_GET_NO_NEW_PRIVS, 0) == 1;

    // 15. Landlock, with grants that exist in the namespace we are in.
    if l.landlock {
        rep.landlock = ll::apply(&grants(req, mountns, workdir, tmpdir, exe));
    }
    // 16. seccomp, last. Strict mode whenever a namespace that the
    // namespace filter relies on is missing.
    let strict = [
        &rep.userns,
        &rep.mountns,
        &rep.netns,
        &rep.ipcns,
        &rep.pidns,
    ]
    .iter()
    .any(|s| **s != LayerStatus::Applied);
    if l.seccomp {
        let prog = if strict {
            &req.seccomp_strict
        } else {
            &req.seccomp_namespace
        };
        rep.seccomp.mode = if strict { "strict" } else { "namespace" }.into();
        rep.seccomp.insns = prog.len();
        rep.seccomp.x32_guard = seccomp::has_x32_guard(prog);
        seccomp::install(prog).map_err(|e| fail("seccomp", e))?;
        rep.seccomp.status = LayerStatus::Applied;
    }

    // SIGPIPE: the helper (a Rust binary) ignores it; an ignored signal
    // would stay ignored across execve, and so would pid 1's blocked mask.
    let empty = sigset(&[]);
    // SAFETY: resetting a disposition to the default and clearing the mask.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
    }

    // Self-check: what the kernel itself reports now.
    if let Some(f) = status_fd {
        rep.self_check = SelfCheck {
            uid_map: std::mem::take(&mut rep.self_check.uid_map),
            ..parse_status(f)
        };
    }
    // The environment: the host's (already allowlisted) pairs, plus
    // defaults that point inside the sandbox for the keys it left out.
    let mut env = req.env.clone();
    let tmp = tmpdir.to_string_lossy().into_owned();
    for (k, v) in [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", tmp.as_str()),
        ("TMPDIR", tmp.as_str()),
        ("LANG", "C.UTF-8"),
    ] {
        if !env.iter().any(|(ek, _)| ek == k) {
            env.push((k.to_string(), v.to_string()));
        }
    }
    rep.env_keys = env.iter().map(|(k, _)| k.clone()).collect();
    rep.fds = inheritable_fds();
    rep.self_check.fds = rep.fds.clone();
    rep.finalize();
    pipe.send(&HelperMessage::Report(Box::new(rep.clone())));

    // 17. execve with exactly the environment the host built.
    let path = CString::new(exe.as_os_str().as_bytes()).map_err(|_| fail("exec", "NUL in path"))?;
    let mut argv = vec![path.clone()];
    for a in &req.args {
        argv.push(CString::new(a.as_bytes()).map_err(|_| fail("exec", "NUL in an argument"))?);
    }
    let mut envp = Vec::new();
    for (k, v) in &env {
        envp.push(CString::new(format!("{k}={v}")).map_err(|_| fail("exec", "NUL in env"))?);
    }
    let argv_p: Vec<*const libc::c_char> = argv
        .iter()
        .map(|c| c.as_ptr())
        .chain([std::ptr::null()])
        .collect();
    let envp_p: Vec<*const libc::c_char> = envp
        .iter()
        .map(|c| c.as_ptr())
        .chain([std::ptr::null()])
        .collect();
    // SAFETY: all three arrays are NUL-terminated C strings / null-terminated
    // pointer arrays that outlive the call.
    unsafe { libc::execve(path.as_ptr(), argv_p.as_ptr(), envp_p.as_ptr()) };
    Err(os_fail("exec", &format!("execve {exe:?}")))
}

fn grants(req: &HelperRequest, mountns: bool, workdir: &Path, tmpdir: &Path, exe: &Path) -> Grants {
    let mut read: Vec<PathBuf> = mounts::SYSTEM_DIRS.iter().map(PathBuf::from).collect();
    read.extend(req.policy.extra_ro_paths.iter().map(PathBuf::from));
    let mut write = vec![workdir.to_path_buf(), tmpdir.to_path_buf()];
    if mountns {
        // Inside the minimal root: /etc holds only the selected entries,
        // /proc is our own.
        read.extend(["/etc", "/proc", mounts::PLUGIN_DIR].map(PathBuf::from));
        write.push(PathBuf::from("/dev/shm"));
    } else {
        // Host view: only the selected /etc entries, and the binary.
        read.extend(
            [
                "/etc/passwd",
                "/etc/group",
                "/etc/hosts",
                "/etc/resolv.conf",
                "/etc/nsswitch.conf",
                "/etc/ld.so.cache",
                "/etc/ssl",
                "/etc/localtime",
            ]
            .map(PathBuf::from),
        );
        read.push(exe.to_path_buf());
        // The host's procfs: only the plugin's own /proc/<pid> (the rule is
        // taken on the directory `/proc/self` resolves to now, before exec,
        // which keeps the pid). Its children and every host process stay
        // unreadable through Landlock, though /proc listings stay visible.
        read.push(PathBuf::from("/proc/self"));
    }
    let devices = ["null", "zero", "full", "random", "urandom"]
        .iter()
        .map(|n| Path::new("/dev").join(n))
        .collect();
    Grants {
        read,
        write,
        devices,
    }
}

fn parse_status(mut f: std::fs::File) -> SelfCheck {
    use std::io::{Read, Seek};
    let mut s = String::new();
    let _ = f.rewind();
    let _ = f.read_to_string(&mut s);
    let mut c = SelfCheck::default();
    for line in s.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        let hex = || u64::from_str_radix(v, 16).ok();
        let first = || v.split_whitespace().next().and_then(|x| x.parse().ok());
        match k {
            "Uid" => c.uid = first(),
            "Gid" => c.gid = first(),
            "CapEff" => c.cap_eff = hex(),
            "CapPrm" => c.cap_prm = hex(),
            "CapInh" => c.cap_inh = hex(),
            "CapBnd" => c.cap_bnd = hex(),
            "CapAmb" => c.cap_amb = hex(),
            "NoNewPrivs" => c.no_new_privs = Some(v == "1"),
            "Seccomp" => c.seccomp = v.parse().ok(),
            "Seccomp_filters" => c.seccomp_filters = v.parse().ok(),
            _ => {}
        }
    }
    c
}

/// Fds that survive `execve` (open and not close-on-exec).
fn inheritable_fds() -> Vec<RawFd> {
    (0..1024)
        .filter(|fd| {
            // SAFETY: F_GETFD only queries the flags of an fd number.
            let fl = unsafe { libc::fcntl(*fd, libc::F_GETFD) };
            fl >= 0 && fl & libc::FD_CLOEXEC == 0
        })
        .collect()
}
