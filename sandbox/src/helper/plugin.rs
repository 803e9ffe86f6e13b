//! The plugin process: steps 12–17 of spec B.2 (rlimits, capabilities,
//! no_new_privs, Landlock, seccomp, self-check, report, execve).

use std::convert::Infallible;
use std::ffi::{CString, OsString};
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::sys::signal::{SigmaskHow, sigprocmask};

use super::process::{Fail, ReportPipe, errno_fail, fail, os_fail, sigset};
use crate::landlock::{self as ll, Grants};
use crate::layers::{self, Stage};
use crate::mounts;
use crate::policy::MemfdPolicy;
use crate::report::{HelperMessage, LayerStatus, SandboxReport, SelfCheck};
use crate::request::{HelperRequest, START_BYTE};
use crate::seccomp;
use crate::timing::stamp;

/// Steps 12–17 in the plugin process.
pub(super) fn plugin_exec(
    req: &HelperRequest,
    rep: &mut SandboxReport,
    mountns: bool,
    workdir: &Path,
    tmpdir: &Path,
    exe: &Path,
    pipe: &ReportPipe,
) -> Result<Infallible, Fail> {
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

    // The pinned program: opened and hashed here, executed through this
    // very descriptor, so the bytes checked are the bytes run.
    let pinned = open_pinned(req, mountns, exe)?;
    stamp("plugin", "workdir_and_status_opened");
    lock_down(req, rep, &grants(req, mountns, workdir, tmpdir, exe))?;

    // SIGPIPE: the helper (a Rust binary) ignores it; an ignored signal
    // would stay ignored across execve, and so would pid 1's blocked mask.
    // SAFETY: resetting a disposition to the default; no handler is
    // installed.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&sigset(&[])), None);

    // Self-check: what the kernel itself reports now. Without a /proc in
    // the root (a mount namespace without a pid namespace cannot mount
    // one), the same facts come from the syscalls that report them.
    let checked = match status_fd {
        Some(f) => parse_status(f),
        None => syscall_self_check(),
    };
    rep.self_check = SelfCheck {
        uid_map: std::mem::take(&mut rep.self_check.uid_map),
        ..checked
    };
    let env = environment(req, rep, mountns, tmpdir);
    rep.env_keys = env.iter().map(|(k, _)| k.clone()).collect();
    rep.fds = inheritable_fds();
    rep.self_check.fds = rep.fds.clone();
    let p = &req.policy;
    let memfd_refused =
        rep.seccomp.status.is_enforced() && p.memfd_create == crate::policy::MemfdPolicy::Deny;
    let tmpfs_workspace =
        rep.root == crate::report::LayerStatus::Applied && req.workspace.is_none();
    rep.memory = crate::memory::assess(rep, p, tmpfs_workspace, memfd_refused);
    layers::finalize(rep);
    stamp("plugin", "report_ready (execve next)");
    rep.timings_us = crate::timing::take();
    // 17. The exec's arguments, built before the report goes out, so a
    // prepared sandbox only calls execve once started (no allocation, no
    // copy-on-write fault on the way).
    let exec = Exec::new(exe, &req.args, &env, pinned)?;
    pipe.send(&HelperMessage::Report(Box::new(rep.clone())));
    // The policy's minimums, checked here with the same functions the host
    // runs on this report, so a sandbox below them never executes a byte
    // of the plugin: the host gets the report (and names what is missing
    // in its typed error), this process ends without `execve`.
    meets_minimums(req, rep)?;
    if req.hold {
        wait_for_start(pipe);
    }
    // Then execve with exactly the environment the host built.
    exec.run();
    Err(os_fail("exec", &format!("execve {exe:?}")))
}

/// `minLevel` and `requireMemoryBound` against the finished report: `Err`
/// ends the plugin's process before its `execve`.
fn meets_minimums(req: &HelperRequest, rep: &SandboxReport) -> Result<(), Fail> {
    let p = &req.policy;
    rep.require(p.min_level)
        .and_then(|()| rep.require_memory_bound(p.require_memory_bound))
        .map_err(|e| fail("minimum", format!("{e}; the plugin was not executed")))
}

/// The staged copy of a pinned program, opened (close-on-exec) and
/// checked: its bytes, read through the descriptor that will be executed,
/// must hash to the pin. `None` for a program without a pin.
fn open_pinned(
    req: &HelperRequest,
    mountns: bool,
    exe: &Path,
) -> Result<Option<std::fs::File>, Fail> {
    let Some(pin) = req.policy.program_sha256 else {
        return Ok(None);
    };
    if !mountns || req.program_in_place {
        return Err(fail(
            "pin",
            "a pinned program runs only from its staged copy, which needs the sandbox's mount \
             namespace; it is not available here",
        ));
    }
    let file = std::fs::File::open(exe).map_err(|e| fail("pin", format!("open {exe:?}: {e}")))?;
    let actual = crate::pin::ProgramDigest::of_file(&file)
        .map_err(|e| fail("pin", format!("read {exe:?}: {e}")))?;
    if actual != pin {
        return Err(fail(
            "pin",
            format!(
                "the staged program's sha256 is {actual}, the runtime's pin is {pin}; it was \
                 not executed"
            ),
        ));
    }
    Ok(Some(file))
}

/// Steps 13–16: capabilities (checked with `capget`) and any other layer
/// with a step of its own here, no_new_privs, Landlock with `grants`, and
/// seccomp last. The rlimits (12) were set by the supervisor and are
/// inherited as hard limits.
fn lock_down(req: &HelperRequest, rep: &mut SandboxReport, grants: &Grants) -> Result<(), Fail> {
    layers::apply_at(Stage::Plugin, req, rep).map_err(|(layer, e)| fail(layer, e))?;
    stamp("plugin", "caps_dropped");
    // 14. no_new_privs: setuid and file-capability binaries are inert.
    rustix::thread::set_no_new_privs(true)
        .map_err(|e| errno_fail("no_new_privs", "PR_SET_NO_NEW_PRIVS", e))?;
    rep.no_new_privs = rustix::thread::no_new_privs() == Ok(true);

    // 15. Landlock, with grants that exist in the namespace we are in.
    if req.policy.layers.landlock {
        rep.landlock = ll::apply(grants);
        stamp("plugin", "landlock_applied");
    }
    if req.policy.layers.seccomp {
        install_seccomp(req, rep)?;
    }
    Ok(())
}

/// Step 16: seccomp, last. Strict mode whenever a namespace that the namespace
/// filter relies on is missing.
fn install_seccomp(req: &HelperRequest, rep: &mut SandboxReport) -> Result<(), Fail> {
    let strict = [
        &rep.userns,
        &rep.mountns,
        &rep.netns,
        &rep.ipcns,
        &rep.pidns,
    ]
    .iter()
    .any(|s| **s != LayerStatus::Applied);
    let prog = if strict {
        &req.seccomp_strict
    } else {
        &req.seccomp_namespace
    };
    rep.seccomp.mode = if strict {
        "strict"
    } else if req.policy.mcp_port.is_some() {
        // The harness mode: the egress filter (TCP sockets), named apart so
        // the report says which runtimes have it.
        "namespace+harness"
    } else if req.policy.egress_port.is_some() {
        "namespace+egress"
    } else {
        "namespace"
    }
    .into();
    rep.seccomp.insns = prog.len();
    rep.seccomp.x32_guard = seccomp::has_x32_guard(prog);
    rep.seccomp.default_action = "ENOSYS".into();
    rep.seccomp.memfd_create = match req.policy.memfd_create {
        MemfdPolicy::Deny => "deny",
        MemfdPolicy::AllowNoExec => "allowNoExec",
    }
    .into();
    seccomp::install(prog).map_err(|e| fail("seccomp", e))?;
    rep.seccomp.status = LayerStatus::Applied;
    stamp("plugin", "seccomp_installed");
    Ok(())
}

/// The environment: the host's (already allowlisted) pairs, plus defaults
/// that point inside the sandbox for the keys it left out.
fn environment(
    req: &HelperRequest,
    rep: &mut SandboxReport,
    mountns: bool,
    tmpdir: &Path,
) -> Vec<(String, String)> {
    let mut env = req.env.clone();
    let tmp = tmpdir.to_string_lossy().into_owned();
    // The per-turn home, a tmpfs of its own; without a mount namespace,
    // the private temp directory in the workspace.
    let home = if mountns {
        crate::fsview::HOME.to_string()
    } else {
        tmp.clone()
    };
    if mountns {
        // A host's HOME or TMPDIR names a host path, which does not exist
        // inside: the sandbox's own home and /tmp replace it.
        let before = env.len();
        env.retain(|(k, _)| k != "HOME" && k != "TMPDIR");
        if env.len() != before {
            rep.warnings.push(format!(
                "HOME/TMPDIR from the host replaced by the sandbox's {home} and {tmp}"
            ));
        }
    }
    for (k, v) in [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", home.as_str()),
        ("TMPDIR", tmp.as_str()),
        ("LANG", "C.UTF-8"),
    ] {
        if !env.iter().any(|(ek, _)| ek == k) {
            env.push((k.to_string(), v.to_string()));
        }
    }
    env
}

/// The arguments of the plugin's `execve`, as NUL-terminated strings and
/// the null-terminated pointer arrays into them.
struct Exec {
    path: CString,
    /// The pinned program's checked descriptor: executed with
    /// `execveat(fd, "", AT_EMPTY_PATH)`, no path resolved again.
    fd: Option<std::fs::File>,
    _strings: (Vec<CString>, Vec<CString>),
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
}

impl Exec {
    fn new(
        exe: &Path,
        args: &[OsString],
        env: &[(String, String)],
        fd: Option<std::fs::File>,
    ) -> Result<Exec, Fail> {
        let path =
            CString::new(exe.as_os_str().as_bytes()).map_err(|_| fail("exec", "NUL in path"))?;
        let mut argv = vec![path.clone()];
        for a in args {
            argv.push(CString::new(a.as_bytes()).map_err(|_| fail("exec", "NUL in an argument"))?);
        }
        let mut envp = Vec::new();
        for (k, v) in env {
            envp.push(CString::new(format!("{k}={v}")).map_err(|_| fail("exec", "NUL in env"))?);
        }
        let pointers = |v: &[CString]| -> Vec<*const libc::c_char> {
            v.iter()
                .map(|c| c.as_ptr())
                .chain([std::ptr::null()])
                .collect()
        };
        Ok(Exec {
            argv: pointers(&argv),
            envp: pointers(&envp),
            path,
            fd,
            _strings: (argv, envp),
        })
    }

    /// `execve`; returns only when it failed.
    fn run(&self) {
        if let Some(fd) = &self.fd {
            use std::os::fd::AsRawFd;
            // SAFETY: an empty NUL-terminated path with AT_EMPTY_PATH
            // executes the open file `fd` itself; `argv` and `envp` as
            // below. The descriptor is close-on-exec, so the plugin does
            // not inherit it.
            unsafe {
                libc::syscall(
                    libc::SYS_execveat,
                    fd.as_raw_fd(),
                    c"".as_ptr(),
                    self.argv.as_ptr(),
                    self.envp.as_ptr(),
                    libc::AT_EMPTY_PATH,
                )
            };
            return;
        }
        // SAFETY: `path` is NUL-terminated; `argv` and `envp` are
        // null-terminated arrays of pointers into CStrings that `self`
        // owns (moving a CString does not move its heap buffer), all alive
        // for the call.
        unsafe { libc::execve(self.path.as_ptr(), self.argv.as_ptr(), self.envp.as_ptr()) };
    }
}

/// A prepared sandbox: every layer is in place and the report is sent;
/// wait for the host's start order (one byte on the start pipe). EOF (the
/// host discarded this sandbox) or anything else ends the process before
/// the plugin ever runs. `read` is the only syscall made here, and the
/// seccomp filter allows it.
fn wait_for_start(pipe: &ReportPipe) {
    let Some(start) = &pipe.1 else {
        // SAFETY: _exit in a forked child.
        unsafe { libc::_exit(125) }
    };
    let mut b = [0u8; 1];
    loop {
        match rustix::io::read(start, &mut b) {
            Ok(1) if b[0] == START_BYTE => return,
            Err(rustix::io::Errno::INTR) => continue,
            _ => {}
        }
        // SAFETY: _exit in a forked child: the plugin never ran.
        unsafe { libc::_exit(0) }
    }
}

fn grants(req: &HelperRequest, mountns: bool, workdir: &Path, tmpdir: &Path, exe: &Path) -> Grants {
    let mut read: Vec<PathBuf> = Vec::new();
    let mut write = vec![workdir.to_path_buf(), tmpdir.to_path_buf()];
    if mountns {
        // Inside the minimal root, a top directory holds only what the
        // policy bound there: one rule per top directory instead of one
        // per bound path (each rule costs an open), /etc holding only the
        // selected entries, /proc our own.
        const TOPS: [&str; 10] = [
            "/usr",
            "/bin",
            "/sbin",
            "/lib",
            "/lib64",
            "/lib32",
            "/libx32",
            "/etc",
            "/proc",
            mounts::PLUGIN_DIR,
        ];
        read.extend(TOPS.map(PathBuf::from));
        let all = req.policy.ro_paths.iter().chain(&req.policy.extra_ro_paths);
        read.extend(
            all.map(PathBuf::from)
                .filter(|p| !TOPS.iter().any(|t| p.starts_with(t))),
        );
        write.push(PathBuf::from("/dev/shm"));
        write.push(PathBuf::from(crate::fsview::HOME));
    } else {
        read.extend(req.policy.ro_paths.iter().map(PathBuf::from));
        read.extend(req.policy.extra_ro_paths.iter().map(PathBuf::from));
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
        connect_tcp: req.policy.egress_port,
        bind_connect_tcp: req.policy.mcp_port,
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

/// Fds that survive `execve` (open and not close-on-exec), from the
/// listing of `/proc/self/fd` (a handful of entries; probing 1024 numbers
/// one `fcntl` at a time cost ~0.1 ms under the seccomp filter), or by
/// probing when the listing is unavailable.
fn inheritable_fds() -> Vec<RawFd> {
    let candidates = crate::fds::list().unwrap_or_else(|_| (0..1024).collect());
    candidates
        .into_iter()
        .filter(|fd| {
            // SAFETY: F_GETFD only queries the flags of an fd number.
            let fl = unsafe { libc::fcntl(*fd, libc::F_GETFD) };
            fl >= 0 && fl & libc::FD_CLOEXEC == 0
        })
        .collect()
}

/// The self-check from syscalls: uid and gid, `capget` for the capability
/// sets, `prctl` for no_new_privs and the seccomp mode. The bounding and
/// ambient sets and the filter count are only in `/proc`, so they stay
/// unknown here.
fn syscall_self_check() -> SelfCheck {
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Default, Clone, Copy)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget with a valid v3 header and room for the two data
    // structs a v3 call writes; both outlive the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut CapHeader,
            data.as_mut_ptr(),
        )
    };
    let set = |f: fn(&CapData) -> u32| {
        (r == 0).then(|| u64::from(f(&data[0])) | (u64::from(f(&data[1])) << 32))
    };

    SelfCheck {
        uid: Some(rustix::process::getuid().as_raw()),
        gid: Some(rustix::process::getgid().as_raw()),
        cap_eff: set(|d| d.effective),
        cap_prm: set(|d| d.permitted),
        cap_inh: set(|d| d.inheritable),
        no_new_privs: rustix::thread::no_new_privs().ok(),
        seccomp: rustix::thread::secure_computing_mode()
            .ok()
            .map(|m| m as u32),
        ..SelfCheck::default()
    }
}
