//! The OCI bundle of one launch, in a private `0700` directory of its own
//! (`$TMPDIR/sharedos-gvisor-<host pid>-<random>`):
//! `bundle/config.json`, an empty `bundle/root` (read-only; everything
//! the plugin sees is a mount the policy grants), the sandbox's own
//! `passwd` and `group`, and `state/`, runsc's `--root` for this one
//! container. Removed whole with the tree.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use sharedos_sandbox::{SandboxPolicy, fsview, users};

/// Where the loopback relay (the helper binary, `sharedos`) is bound
/// inside, for a runtime with a network policy.
pub(super) const RELAY_INSIDE: &str = "/sharedos/relay";
/// The directory holding the egress gateway's unix socket, inside.
pub(super) const EGRESS_DIR_INSIDE: &str = "/sharedos/egress";
/// The gateway's socket's name in that directory.
const EGRESS_SOCKET: &str = "gateway.sock";

/// Every bundle directory is `$TMPDIR/sharedos-gvisor-<host pid>-<random>`,
/// so a host can tell the ones a dead host left ([`super::sweep`]).
pub(super) const PREFIX: &str = "sharedos-gvisor-";

/// A bundle on disk and what it grants, for the report.
pub(super) struct Bundle {
    /// The private directory holding everything; removed on drop.
    pub dir: tempfile::TempDir,
    /// The plugin's program, as the container sees it.
    pub program_inside: String,
    /// Every mount of the root: `(destination, "ro" | "rw", what)`.
    pub mounts: Vec<(String, &'static str, String)>,
    pub env_keys: Vec<String>,
    pub warnings: Vec<String>,
    /// The egress gateway's listener (a unix socket in the bundle, bound
    /// into the container), for a runtime with a network policy.
    pub egress_listener: Option<OwnedFd>,
}

impl Bundle {
    pub fn bundle_dir(&self) -> PathBuf {
        self.dir.path().join("bundle")
    }
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }
}

/// What the container runs: the program (the host path to bind, and
/// whether it is a staged copy), its arguments and environment.
pub(super) struct Process<'a> {
    pub program: &'a Path,
    pub staged: Option<&'a Path>,
    pub args: &'a [String],
    pub env: &'a [(String, String)],
    /// The binary serving `__sandbox-exec --loopback-relay`: the
    /// container's first process when the policy has an egress port.
    pub relay: Option<&'a Path>,
    /// Prepared ahead of a turn: the relay holds the program until the
    /// host writes one byte on its stdin.
    pub gate: bool,
}

/// Writes the bundle for `process` under `policy`, the plugin running as
/// `uid` (and the same gid) inside.
pub(super) fn write(policy: &SandboxPolicy, process: &Process, uid: u32) -> io::Result<Bundle> {
    let dir = tempfile::Builder::new()
        .prefix(&format!("{PREFIX}{}-", std::process::id()))
        .tempdir()?;
    let root = dir.path().join("bundle/root");
    std::fs::create_dir_all(&root)?;
    std::fs::create_dir(dir.path().join("state"))?;
    let etc = dir.path().join("etc");
    std::fs::create_dir(&etc)?;
    std::fs::write(etc.join("passwd"), users::passwd(uid, uid))?;
    std::fs::write(etc.join("group"), users::group(uid))?;
    set_mode(&root, 0o755)?;
    let mut b = Bundle {
        dir,
        program_inside: String::new(),
        mounts: Vec::new(),
        env_keys: Vec::new(),
        warnings: Vec::new(),
        egress_listener: None,
    };
    let mut mounts = private_mounts(policy, uid, &mut b);
    mounts.extend(read_only_mounts(policy, process, &etc, &mut b)?);
    let env = environment(policy, process.env, &mut b);
    let mut args = vec![b.program_inside.clone()];
    args.extend(process.args.iter().cloned());
    if policy.egress_port.is_some() || process.gate {
        let (relay_mounts, relayed) = relay(policy.egress_port, process, args, &mut b)?;
        mounts.extend(relay_mounts);
        args = relayed;
    }
    let config = json!({
        "ociVersion": "1.0.0",
        "process": {
            "terminal": false,
            "user": { "uid": uid, "gid": uid, "additionalGids": [] },
            "args": args,
            "env": env,
            "cwd": fsview::WORKSPACE,
            "noNewPrivileges": true,
            "capabilities": {
                "bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []
            },
            "rlimits": rlimits(policy),
        },
        "root": { "path": "root", "readonly": true },
        "hostname": "sharedos",
        "mounts": mounts,
        "linux": {
            "namespaces": [
                { "type": "pid" }, { "type": "network" }, { "type": "ipc" },
                { "type": "uts" }, { "type": "mount" }
            ]
        }
    });
    let text = serde_json::to_vec_pretty(&config).map_err(io::Error::other)?;
    std::fs::write(b.bundle_dir().join("config.json"), text)?;
    Ok(b)
}

/// The relay bound at [`RELAY_INSIDE`] as the container's first process,
/// starting `args`: for a prepared container once the host's byte arrives
/// on stdin (`process.gate`), and for an `egress` port listening on
/// `127.0.0.1:<port>` of the container's own loopback ([`egress_socket`]).
/// Returns the mounts and the container's command line.
fn relay(
    egress: Option<u16>,
    process: &Process,
    args: Vec<String>,
    b: &mut Bundle,
) -> io::Result<(Vec<Value>, Vec<String>)> {
    let relay = process.relay.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "the gVisor launcher has no sharedos binary to run the container's relay with (a network policy or a prepared container needs it)",
        )
    })?;
    let mut mounts = vec![bind_ro(relay, RELAY_INSIDE)];
    let mut routes = Vec::new();
    if let Some(port) = egress {
        let (mount, socket) = egress_socket(port, b)?;
        mounts.push(mount);
        routes.push((port, socket.into()));
    }
    b.mounts.push((
        RELAY_INSIDE.into(),
        "ro",
        format!(
            "the relay ({}): the container's first process{}{}",
            relay.display(),
            if process.gate {
                ", holding the program until its turn takes the container"
            } else {
                ""
            },
            match egress {
                Some(port) => format!(", 127.0.0.1:{port} to the gateway's socket"),
                None => String::new(),
            }
        ),
    ));
    let program: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    let mut line = vec![
        RELAY_INSIDE.to_owned(),
        sharedos_sandbox::HELPER_SUBCOMMAND.to_owned(),
        sharedos_sandbox::RELAY_ARG.to_owned(),
    ];
    for a in sharedos_sandbox::relay_args(&routes, process.gate, &program) {
        line.push(a.into_string().map_err(|a| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("an argument of the plugin is not UTF-8: {a:?}"),
            )
        })?);
    }
    Ok((mounts, line))
}

/// The egress gateway of a runtime with a network policy: a unix socket
/// in the bundle (`egress/gateway.sock`, mode 0666 in a 0755 directory
/// of the 0700 bundle: only this host and the container reach it), its
/// directory bound read-only at [`EGRESS_DIR_INSIDE`]. Returns the mount
/// and the socket's path inside.
fn egress_socket(port: u16, b: &mut Bundle) -> io::Result<(Value, String)> {
    let dir = b.dir.path().join("egress");
    std::fs::create_dir(&dir)?;
    set_mode(&dir, 0o755)?;
    let socket = dir.join(EGRESS_SOCKET);
    let listener = std::os::unix::net::UnixListener::bind(&socket)?;
    set_mode(&socket, 0o666)?;
    b.egress_listener = Some(listener.into());
    let inside = format!("{EGRESS_DIR_INSIDE}/{EGRESS_SOCKET}");
    b.mounts.push((
        EGRESS_DIR_INSIDE.into(),
        "ro",
        format!(
            "the egress gateway's unix socket {inside} (runsc --host-uds=open); port {port} inside"
        ),
    ));
    Ok((bind_ro(&dir, EGRESS_DIR_INSIDE), inside))
}

fn set_mode(p: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
}

fn tmpfs(dest: &str, size: u64, mode: &str, uid: u32, nr_inodes: u64) -> Value {
    json!({
        "destination": dest,
        "type": "tmpfs",
        "source": "tmpfs",
        "options": [
            "nosuid", "nodev", format!("size={size}"), format!("mode={mode}"),
            format!("uid={uid}"), format!("gid={uid}"), format!("nr_inodes={nr_inodes}")
        ]
    })
}

/// `/proc`, and the tmpfs mounts of the container's own: the workspace,
/// `HOME`, `/tmp`, `/dev/shm` (gVisor gives `/dev` its own devices).
fn private_mounts(policy: &SandboxPolicy, uid: u32, b: &mut Bundle) -> Vec<Value> {
    let n = policy.tmpfs_nr_inodes;
    let rows = [
        (fsview::WORKSPACE, policy.workspace_size_bytes, "0700"),
        (fsview::HOME, policy.home_size_bytes, "0700"),
        (fsview::TMP, policy.tmp_size_bytes, "1777"),
        ("/dev/shm", policy.shm_size_bytes, "1777"),
    ];
    let mut mounts = vec![json!({ "destination": "/proc", "type": "proc", "source": "proc" })];
    for (dest, size, mode) in rows {
        mounts.push(tmpfs(dest, size, mode, uid, n));
        b.mounts
            .push((dest.to_owned(), "rw", format!("tmpfs of {size} bytes")));
    }
    for (dest, what) in [
        ("/proc", "the gVisor kernel's own procfs"),
        (
            "/dev",
            "the gVisor kernel's own device files (added by runsc)",
        ),
        (
            "/sys",
            "the gVisor kernel's own synthetic sysfs (added by runsc)",
        ),
    ] {
        b.mounts.push((dest.into(), "rw", what.into()));
    }
    mounts
}

fn bind_ro(source: &Path, dest: &str) -> Value {
    json!({
        "destination": dest,
        "type": "bind",
        "source": source,
        "options": ["rbind", "ro", "nosuid", "nodev"]
    })
}

/// The policy's read-only paths (a missing default one is skipped, a
/// missing `extraRoPaths` one fails the launch), the generated `passwd`
/// and `group`, and the program: at its own path when a read-only path
/// holds it and it is not pinned, else (its staged copy when pinned) at
/// `/plugin/<name>`.
fn read_only_mounts(
    policy: &SandboxPolicy,
    process: &Process,
    etc: &Path,
    b: &mut Bundle,
) -> io::Result<Vec<Value>> {
    let mut mounts = Vec::new();
    for p in &policy.ro_paths {
        if users::is_generated(p) || !Path::new(p).exists() {
            continue;
        }
        mounts.push(bind_ro(Path::new(p), p));
        b.mounts
            .push((p.clone(), "ro", "host path (roPaths)".into()));
    }
    for p in &policy.extra_ro_paths {
        if !Path::new(p).exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("sandbox.extraRoPaths: {p} does not exist (any more)"),
            ));
        }
        mounts.push(bind_ro(Path::new(p), p));
        b.mounts
            .push((p.clone(), "ro", "host path (extraRoPaths)".into()));
    }
    for name in ["passwd", "group"] {
        let dest = format!("/etc/{name}");
        mounts.push(bind_ro(&etc.join(name), &dest));
        b.mounts
            .push((dest, "ro", "generated: the sandbox user only".into()));
    }
    let in_place = process.staged.is_none()
        && process.program.is_absolute()
        && fsview::visible(policy, process.program);
    if in_place {
        b.program_inside = process.program.display().to_string();
    } else {
        let name = process
            .program
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "plugin".into());
        b.program_inside = format!("{}/{name}", fsview::PLUGIN_DIR);
        let source = process.staged.unwrap_or(process.program);
        mounts.push(bind_ro(source, &b.program_inside));
        let what = match process.staged {
            Some(s) => format!("the pinned program's staged copy {}", s.display()),
            None => format!("the program {}", process.program.display()),
        };
        b.mounts.push((b.program_inside.clone(), "ro", what));
    }
    Ok(mounts)
}

/// The spec's environment through the policy's allowlist, with the
/// container's own `HOME` and `TMPDIR`, and `PATH` and `LANG` defaulted.
fn environment(policy: &SandboxPolicy, env: &[(String, String)], b: &mut Bundle) -> Vec<String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (k, v) in env {
        if k == "HOME" || k == "TMPDIR" {
            b.warnings
                .push(format!("{k} from the host replaced by the container's own"));
        } else if policy.env_allowed(k) {
            out.push((k.clone(), v.clone()));
        } else {
            b.warnings
                .push(format!("env key {k:?} is not in envAllowlist; dropped"));
        }
    }
    for (k, v) in [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("LANG", "C.UTF-8"),
    ] {
        if !out.iter().any(|(key, _)| key == k) {
            out.push((k.into(), v.into()));
        }
    }
    out.push(("HOME".into(), fsview::HOME.into()));
    out.push(("TMPDIR".into(), fsview::TMP.into()));
    b.env_keys = out.iter().map(|(k, _)| k.clone()).collect();
    out.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// The policy's rlimits as OCI `process.rlimits` (soft = hard), and the
/// same as a name → value map for the report.
pub(crate) fn rlimit_rows(policy: &SandboxPolicy) -> Vec<(&'static str, u64)> {
    let r = &policy.rlimits;
    [
        ("RLIMIT_CORE", r.core),
        ("RLIMIT_NOFILE", r.nofile),
        ("RLIMIT_FSIZE", r.fsize),
        ("RLIMIT_DATA", r.data),
        ("RLIMIT_AS", r.address_space),
        ("RLIMIT_NPROC", r.nproc),
        ("RLIMIT_CPU", r.cpu_seconds),
        ("RLIMIT_MEMLOCK", r.memlock),
        ("RLIMIT_MSGQUEUE", r.msgqueue),
        ("RLIMIT_RTPRIO", r.rtprio),
        ("RLIMIT_SIGPENDING", r.sigpending),
    ]
    .into_iter()
    .filter_map(|(name, v)| v.map(|v| (name, v)))
    .collect()
}

fn rlimits(policy: &SandboxPolicy) -> Vec<Value> {
    rlimit_rows(policy)
        .into_iter()
        .map(|(name, v)| json!({ "type": name, "soft": v, "hard": v }))
        .collect()
}
