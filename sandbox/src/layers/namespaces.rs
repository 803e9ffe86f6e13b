//! Layer: namespaces. A user namespace first (so an unprivileged helper
//! may create the others), then mount, pid, net, ipc, uts and cgroup in one
//! `unshare`, retried one flag at a time when the batch fails so the report
//! says exactly which one is missing.

use super::layer::{Layer, Need, Slot, Stage, USERNS_FIX, listing, no_detail};
use crate::policy::SandboxPolicy;
use crate::report::LayerStatus;

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// `unshare(CLONE_NEWUSER)` and an identity map of the current uid/gid
/// (the only mapping an unprivileged process may write itself).
pub fn enter_user(uid: u32, gid: u32) -> Result<(), std::io::Error> {
    // SAFETY: unshare takes a flag word; the helper is single-threaded,
    // which CLONE_NEWUSER requires.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER) } != 0 {
        return Err(errno());
    }
    // setgroups must be denied before an unprivileged gid_map write.
    std::fs::write("/proc/self/setgroups", "deny")?;
    std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
    std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    Ok(())
}

/// The namespaces besides the user one, with their clone flag.
pub(crate) const OTHERS: [(&Layer, libc::c_int); 6] = [
    (&MOUNTNS, libc::CLONE_NEWNS),
    (&PIDNS, libc::CLONE_NEWPID),
    (&NETNS, libc::CLONE_NEWNET),
    (&IPCNS, libc::CLONE_NEWIPC),
    (&UTSNS, libc::CLONE_NEWUTS),
    (&CGROUPNS, libc::CLONE_NEWCGROUP),
];

/// Unshare every namespace of [`OTHERS`] that `wanted` names; returns one
/// status per entry. A pid namespace applies to the children of the
/// caller, so the caller must fork next.
pub(crate) fn enter_others(wanted: impl Fn(&Layer) -> bool) -> Vec<(&'static Layer, LayerStatus)> {
    let flags = OTHERS
        .iter()
        .filter(|(l, _)| wanted(l))
        .fold(0, |acc, (_, f)| acc | f);
    // SAFETY: unshare takes a flag word; single-threaded caller.
    let batch_ok = flags == 0 || unsafe { libc::unshare(flags) } == 0;
    OTHERS
        .iter()
        .map(|&(layer, flag)| {
            let name = layer.name;
            if !wanted(layer) {
                return (layer, LayerStatus::Disabled);
            }
            if batch_ok {
                return (layer, LayerStatus::Applied);
            }
            // SAFETY: as above, one flag at a time.
            let st = if unsafe { libc::unshare(flag) } == 0 {
                LayerStatus::Applied
            } else {
                LayerStatus::unavailable(format!("unshare({name}): {}", errno()))
            };
            (layer, st)
        })
        .collect()
}

/// Write `(file, value)` pairs under `/proc/sys/<dir>/`: the values of the
/// namespace the caller is in (user sysctls follow the caller's user
/// namespace, ipc ones its ipc namespace). The caller must own both
/// namespaces, or it would change the host's values. Returns what was
/// written; a file the kernel lacks degrades the layer, any other failure
/// fails it.
pub fn write_sysctls(
    dir: &str,
    values: &[(&'static str, u64)],
) -> (std::collections::BTreeMap<String, u64>, LayerStatus) {
    let text: Vec<(&'static str, String)> =
        values.iter().map(|(n, v)| (*n, v.to_string())).collect();
    let (set, st) = write_text_sysctls(dir, &text);
    let set = values
        .iter()
        .filter(|(n, _)| set.contains_key(*n))
        .map(|(n, v)| ((*n).to_string(), *v))
        .collect();
    (set, st)
}

/// [`write_sysctls`] with values as the file takes them (a vector such as
/// `tcp_rmem`'s three numbers, separated by spaces); `name` may be a path
/// under `dir` (`ipv4/tcp_rmem`).
pub fn write_text_sysctls(
    dir: &str,
    values: &[(&'static str, String)],
) -> (std::collections::BTreeMap<String, String>, LayerStatus) {
    let mut set = std::collections::BTreeMap::new();
    let mut missing = Vec::new();
    // Each file opened relative to the directory, looked up once.
    let parent = format!("/proc/sys/{dir}");
    let d = match std::fs::File::open(&parent) {
        Ok(d) => d,
        Err(e) => return (set, LayerStatus::unavailable(format!("open {parent}: {e}"))),
    };
    for (name, v) in values {
        match write_at(&d, name, v) {
            Ok(()) => {
                set.insert((*name).to_string(), v.clone());
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => missing.push(*name),
            Err(e) => {
                let path = format!("{parent}/{name}");
                return (set, LayerStatus::unavailable(format!("write {path}: {e}")));
            }
        }
    }
    let st = if missing.is_empty() {
        LayerStatus::Applied
    } else {
        LayerStatus::Degraded {
            reason: format!("this kernel has no /proc/sys/{dir}/{}", missing.join(", ")),
        }
    };
    (set, st)
}

/// The socket sysctls of `l` as `/proc/sys/net` takes them.
pub fn net_values(l: &crate::policy::NetLimits) -> Vec<(&'static str, String)> {
    let triple = |t: Option<[u64; 3]>| t.map(|[a, b, c]| format!("{a} {b} {c}"));
    [
        ("ipv4/tcp_rmem", triple(l.tcp_rmem)),
        ("ipv4/tcp_wmem", triple(l.tcp_wmem)),
        ("core/optmem_max", l.optmem_max.map(|v| v.to_string())),
        (
            "unix/max_dgram_qlen",
            l.unix_max_dgram_qlen.map(|v| v.to_string()),
        ),
    ]
    .into_iter()
    .filter_map(|(n, v)| v.map(|v| (n, v)))
    .collect()
}

/// `name` under the directory `d`, opened for writing and given `text` in
/// one `write`.
fn write_at(d: &std::fs::File, name: &str, text: &str) -> std::io::Result<()> {
    use rustix::fs::{Mode, OFlags};
    use std::io::Write;
    let c = std::ffi::CString::new(name).map_err(std::io::Error::other)?;
    let fd = rustix::fs::openat(
        d,
        c.as_c_str(),
        OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )?;
    std::fs::File::from(fd).write_all(text.as_bytes())
}

/// The user-namespace ceilings of the policy, as `/proc/sys/user` files.
pub fn ceiling_values(c: &crate::policy::NsCeilings) -> Vec<(&'static str, u64)> {
    let mut v = Vec::new();
    let mut add = |name, value: Option<u64>| {
        if let Some(x) = value {
            v.push((name, x));
        }
    };
    add("max_inotify_instances", c.max_inotify_instances);
    add("max_inotify_watches", c.max_inotify_watches);
    add("max_fanotify_groups", c.max_fanotify_groups);
    add("max_fanotify_marks", c.max_fanotify_marks);
    for ns in [
        "max_user_namespaces",
        "max_mnt_namespaces",
        "max_pid_namespaces",
        "max_net_namespaces",
        "max_ipc_namespaces",
        "max_uts_namespaces",
        "max_cgroup_namespaces",
        "max_time_namespaces",
    ] {
        add(ns, c.max_namespaces);
    }
    v
}

/// The SysV IPC limits of the policy, as `/proc/sys/kernel` files
/// (`shmall` in pages).
pub fn ipc_values(l: &crate::policy::IpcLimits) -> Vec<(&'static str, u64)> {
    // SAFETY: sysconf has no memory preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    [
        ("shmmax", l.shmmax),
        ("shmall", l.shmall_bytes.map(|b| b.div_ceil(page))),
        ("shmmni", l.shmmni),
        ("msgmax", l.msgmax),
        ("msgmnb", l.msgmnb),
        ("msgmni", l.msgmni),
    ]
    .into_iter()
    .filter_map(|(n, v)| v.map(|v| (n, v)))
    .collect()
}

/// A namespace entered in the supervisor's one `unshare` (step 7).
const fn namespace(
    name: &'static str,
    toggle: fn(&SandboxPolicy) -> bool,
    slot: Slot,
    need: Need,
) -> Layer {
    Layer {
        name,
        stage: Stage::Supervisor,
        toggle: Some(toggle),
        slot,
        need,
        fix: USERNS_FIX,
        detail: no_detail,
        apply: None,
    }
}

pub(crate) const USERNS: Layer = namespace(
    "userns",
    |p| p.layers.userns,
    Slot::Status(|r| &r.userns, |r| &mut r.userns),
    Need::Applied,
);
pub(crate) const MOUNTNS: Layer = namespace(
    "mountns",
    |p| p.layers.mountns,
    Slot::Status(|r| &r.mountns, |r| &mut r.mountns),
    Need::Applied,
);
pub(crate) const PIDNS: Layer = namespace(
    "pidns",
    |p| p.layers.pidns,
    Slot::Status(|r| &r.pidns, |r| &mut r.pidns),
    Need::Applied,
);
pub(crate) const NETNS: Layer = namespace(
    "netns",
    |p| p.layers.netns,
    Slot::Status(|r| &r.netns, |r| &mut r.netns),
    Need::Applied,
);
pub(crate) const IPCNS: Layer = namespace(
    "ipcns",
    |p| p.layers.ipcns,
    Slot::Status(|r| &r.ipcns, |r| &mut r.ipcns),
    Need::Applied,
);
pub(crate) const UTSNS: Layer = namespace(
    "utsns",
    |p| p.layers.utsns,
    Slot::Status(|r| &r.utsns, |r| &mut r.utsns),
    Need::Applied,
);
pub(crate) const CGROUPNS: Layer = namespace(
    "cgroupns",
    |p| p.layers.cgroupns,
    Slot::Status(|r| &r.cgroupns, |r| &mut r.cgroupns),
    Need::Reported,
);

/// The user namespace's ceilings (`/proc/sys/user/*`).
pub(crate) const CEILINGS: Layer = Layer {
    name: "ceilings",
    stage: Stage::Supervisor,
    toggle: Some(|p| p.layers.userns),
    slot: Slot::Status(|r| &r.ceilings_status, |r| &mut r.ceilings_status),
    need: Need::AppliedOrDegraded,
    fix: "give the sandbox a user namespace of its own (layers.userns) on a kernel with \
          /proc/sys/user",
    detail: |r| listing(&r.ceilings),
    apply: None,
};

/// The ipc namespace's SysV limits (`/proc/sys/kernel/shm*`, `msg*`).
pub(crate) const IPC_LIMITS: Layer = Layer {
    name: "ipc_limits",
    stage: Stage::Supervisor,
    toggle: Some(|p| p.layers.ipcns),
    slot: Slot::Status(|r| &r.ipc_limits_status, |r| &mut r.ipc_limits_status),
    need: Need::Reported,
    fix: "run the host as root, so the ipc namespace is made before the uid drop",
    detail: |r| listing(&r.ipc_limits),
    apply: None,
};
