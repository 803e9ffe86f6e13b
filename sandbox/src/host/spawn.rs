//! Host side: launch a plugin inside the sandbox, or prepare one ahead.
//!
//! A plain blocking API (the host calls it from `spawn_blocking` or its own
//! thread): check the paths, compile the filters, take the sandbox's uid,
//! stage the program, create the cgroup, then launch the helper
//! ([`super::launch`]) and read its report ([`super::report_reader`]).

use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Instant;

use super::child::SandboxedChild;
use super::launch::{Launched, launch};
use super::report_reader::{ReportReader, SETUP_TIMEOUT, no_report};
use crate::SandboxError;
use crate::cgroup;
use crate::policy::SandboxPolicy;
use crate::report::SandboxReport;
use crate::request::HelperRequest;
use crate::seccomp::{self, FilterMode};
use crate::timing::HostClock;
use crate::uid::{self, UidLease};

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
    let root = rustix::process::geteuid().is_root();
    let userns = l.userns && !policy.emulate_no_userns;
    !(l.mountns && (userns || (root && !l.drop_uid)))
}

/// Launch `spec.program` in the sandbox. Returns once the helper has built
/// every layer and the plugin's `execve` succeeded, with the report checked
/// against `spec.policy.min_level` and `require_memory_bound` (below them,
/// the tree is killed and [`SandboxError::BelowMinimum`] or
/// [`SandboxError::MemoryUnbounded`] names what is missing). The helper runs
/// the same check on the same report before the `execve`, so a sandbox
/// below its minimums never runs any of the plugin's code.
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
    let euid = rustix::process::geteuid().as_raw();
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
    let filters = Filters::compile(policy)?;
    clock.stamp("seccomp_compiled");

    let lease = own_uid(policy)?;
    if let (Some(ws), Some(lease)) = (&spec.workspace, &lease) {
        // The plugin writes its host workspace as its sandbox uid.
        let uid = lease.uid();
        std::os::unix::fs::chown(ws, Some(uid), Some(uid))
            .map_err(SandboxError::io("chown the workspace to the sandbox uid"))?;
    }
    clock.stamp("uid_allocated");
    let (program_in_place, program_staged) = stage(spec)?;
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
        seccomp_namespace: filters.namespace,
        seccomp_strict: filters.strict,
        emulation_filter: filters.emulation,
        cgroup_paths: cg.paths.clone(),
        cgroup: cgroup_report,
        dropped_env: dropped_env.into_iter().map(|(k, _)| k).collect(),
        origin_ns: clock.origin_ns,
        hold,
    };

    let l = match launch(&spec.helper_exe, &req, &mut clock) {
        Ok(l) => l,
        Err(e) => {
            cg.kill();
            cg.remove();
            return Err(e);
        }
    };
    read_report(l, cg, lease, clock, policy)
}

/// The seccomp programs of one spawn, compiled in the host.
struct Filters {
    namespace: Vec<seccomp::Insn>,
    strict: Vec<seccomp::Insn>,
    emulation: Option<Vec<seccomp::Insn>>,
}

impl Filters {
    fn compile(policy: &SandboxPolicy) -> Result<Filters, SandboxError> {
        let memfd = policy.memfd_create;
        // Only a runtime with an egress listener or the harness mode's MCP
        // port may create TCP sockets.
        let namespace_mode = if policy.egress_port.is_some() || policy.mcp_port.is_some() {
            FilterMode::NamespaceEgress
        } else {
            FilterMode::Namespace
        };
        let emulation = if policy.emulate_no_userns {
            Some(seccomp::compile_no_userns_emulation().map_err(SandboxError::Seccomp)?)
        } else {
            None
        };
        Ok(Filters {
            namespace: seccomp::compile(namespace_mode, memfd).map_err(SandboxError::Seccomp)?,
            strict: seccomp::compile(FilterMode::Strict, memfd).map_err(SandboxError::Seccomp)?,
            emulation,
        })
    }
}

/// Where the program comes from: a program inside one of the runtime's
/// read-only paths runs from its own path (a venv's interpreter finds its
/// pyvenv.cfg). Any other is bound from a copy in the host-private state
/// directory, so the mount table names no host path of it.
///
/// A pinned program always runs from its staged copy (a copy, keyed by its
/// digest, checked against the pin as it is made), so it needs the mount
/// namespace that binds the copy in.
fn stage(spec: &SpawnSpec) -> Result<(bool, Option<PathBuf>), SandboxError> {
    if let Some(pin) = &spec.policy.program_sha256 {
        if !spec.policy.layers.mountns {
            return Err(SandboxError::BadPath {
                what: "program",
                path: spec.program.clone(),
                reason: "it is pinned (sha256), and a pinned program runs only from its staged \
                         copy, which the mount namespace binds in; turn sandbox.layers.mountns \
                         back on, or remove the pin"
                    .into(),
            });
        }
        return Ok((
            false,
            Some(crate::staging::stage_pinned(&spec.program, pin)?),
        ));
    }
    let program_in_place = crate::fsview::program_in_place(&spec.policy, &spec.program);
    let program_staged = if spec.policy.layers.mountns && !program_in_place {
        Some(crate::staging::stage_program(&spec.program)?)
    } else {
        None
    };
    Ok((program_in_place, program_staged))
}

/// The launched helper as a [`SandboxedChild`], once its report is read
/// and checked against the policy's minimum.
fn read_report(
    l: Launched,
    cg: cgroup::PluginCgroup,
    lease: Option<UidLease>,
    mut clock: HostClock,
    policy: &SandboxPolicy,
) -> Result<PreparedSandbox, SandboxError> {
    let mut sc = SandboxedChild {
        stdin: Some(l.stdin_w),
        stdout: Some(l.stdout_r),
        stderr: Some(l.stderr_r),
        report: SandboxReport::default(),
        pid: l.pid,
        egress_listener: None,
        pidfd: l.pidfd,
        ns_init: None,
        helper: l.helper,
        lifeline: Some(l.lifeline),
        cgroup: cg,
        status: None,
        uid: lease,
    };
    if sc.pidfd.is_none() {
        // Our own child, not yet reaped: the pid cannot be recycled.
        sc.pidfd = rustix::process::Pid::from_raw(sc.pid).and_then(|pid| {
            rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
        });
    }
    // From here on an error drops `sc`: tree killed, cgroup removed.
    let mut reader = ReportReader {
        file: std::fs::File::from(l.report_r),
        buf: Vec::new(),
        deadline: Instant::now() + SETUP_TIMEOUT,
    };
    sc.report = reader.until_report(&mut sc)?;
    clock.stamp("report received");
    if sc.cgroup.paths.is_empty() && sc.report.pidns.is_enforced() {
        // Only waited for without a cgroup (whose `populated 0` covers the
        // tree), so only opened then. The report is written from inside
        // the namespace: its pid 1 is up.
        sc.ns_init = super::child::ns_init_pidfd(sc.pid);
    }
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
    sc.report
        .require_memory_bound(policy.require_memory_bound)?;
    Ok(PreparedSandbox {
        child: sc,
        start: l.start,
        reader,
        clock,
    })
}
