//! What bounds a sandbox's memory on this host, and the bound that results.
//!
//! Every kind of memory a plugin can hold is named with the mechanism that
//! caps it: mappings of any kind (private, shared anonymous, SysV shm
//! attached, memfd mapped) count in `RLIMIT_AS` per process, and the
//! processes are capped by `RLIMIT_NPROC`; SysV segments outlive their
//! mappings, so the ipc namespace's `shmall` caps them; tmpfs files
//! (`/tmp`, `/dev/shm`, the home) are capped by their mount's size; a memfd that is
//! written but never mapped is capped per file by `RLIMIT_FSIZE`, and the
//! number of them by `RLIMIT_NOFILE` per process. `memory.max` caps the
//! whole tree where a memory controller is delegated.

use crate::report::{LayerStatus, MemoryLayer, MemoryReport, SandboxReport};

fn row(name: &str, bytes: Option<u64>, detail: String) -> MemoryLayer {
    MemoryLayer {
        name: name.into(),
        status: match bytes {
            Some(_) => LayerStatus::Applied,
            None => LayerStatus::unavailable("no limit set"),
        },
        bytes,
        detail,
    }
}

/// SysV segments: the ipc namespace's `shmall`, where the sandbox has
/// its limits.
fn shmall_row(rep: &SandboxReport) -> MemoryLayer {
    let shmall = rep.ipc_limits.get("shmall").copied();
    let page = 4096u64;
    if rep.ipc_limits_status.is_enforced() && shmall.is_some() {
        row(
            "kernel.shmall (SysV segments, mapped or not)",
            shmall.map(|p| p.saturating_mul(page)),
            format!("{} pages of the sandbox's ipc namespace", opt(shmall)),
        )
    } else {
        MemoryLayer {
            name: "kernel.shmall (SysV segments, mapped or not)".into(),
            status: rep.ipc_limits_status.clone(),
            bytes: None,
            detail: "no private ipc namespace limit".into(),
        }
    }
}

/// A memfd written but never mapped: refused, or bounded per file by
/// `RLIMIT_FSIZE`, times the fds and processes.
fn memfd_row(
    memfd_refused: bool,
    fsize: Option<u64>,
    nofile: Option<u64>,
    nproc: Option<u64>,
) -> MemoryLayer {
    let memfd_name = "memfd written, not mapped (RLIMIT_FSIZE x RLIMIT_NOFILE x RLIMIT_NPROC)";
    if memfd_refused {
        MemoryLayer {
            name: memfd_name.into(),
            status: LayerStatus::Applied,
            bytes: Some(0),
            detail: "memfd_create refused by the seccomp filter (policy memfdCreate = deny)".into(),
        }
    } else {
        row(
            memfd_name,
            [fsize, nofile, nproc]
                .into_iter()
                .try_fold(1u64, |acc, v| v.map(|v| acc.saturating_mul(v))),
            format!(
                "{} bytes a file x {} fds x {} processes",
                opt(fsize),
                opt(nofile),
                opt(nproc)
            ),
        )
    }
}

/// The memory section for a report whose layers are filled in.
/// `memfd_refused`: the seccomp filter in force refuses `memfd_create`.
pub(crate) fn assess(
    rep: &SandboxReport,
    tmp_size: u64,
    shm_size: u64,
    home_size: u64,
    memfd_refused: bool,
) -> MemoryReport {
    let rl = |k: &str| rep.rlimits.get(k).copied();
    let (as_, nproc, fsize, nofile) = (rl("as"), rl("nproc"), rl("fsize"), rl("nofile"));
    let mut layers = vec![row(
        "RLIMIT_AS x RLIMIT_NPROC (every mapping: private, shared, SysV, memfd)",
        as_.zip(nproc).map(|(a, n)| a.saturating_mul(n)),
        format!("{} bytes a process x {} processes", opt(as_), opt(nproc)),
    )];
    layers.push(shmall_row(rep));
    let root = rep.root == LayerStatus::Applied;
    for (name, size) in [
        ("tmpfs /tmp", tmp_size),
        ("tmpfs /dev/shm", shm_size),
        ("tmpfs HOME (/sandbox/home)", home_size),
    ] {
        layers.push(if root {
            row(name, Some(size), "size= of the private mount".into())
        } else {
            MemoryLayer {
                name: name.into(),
                status: LayerStatus::unavailable("no private root"),
                bytes: None,
                detail: "the host's own filesystem".into(),
            }
        });
    }
    layers.push(memfd_row(memfd_refused, fsize, nofile, nproc));
    let sum = layers
        .iter()
        .try_fold(0u64, |acc, l| l.bytes.map(|b| acc.saturating_add(b)));
    let cg = rep.cgroup.memory_max;
    layers.push(MemoryLayer {
        name: "cgroup memory.max + memory.swap.max (the whole tree)".into(),
        status: match cg {
            Some(_) => LayerStatus::Applied,
            None => LayerStatus::unavailable("no delegated memory controller"),
        },
        bytes: cg,
        detail: "charged by the kernel for every page of the tree".into(),
    });
    let tree = match (sum, cg) {
        (Some(s), Some(c)) => Some(s.min(c)),
        (s, c) => s.or(c),
    };
    MemoryReport {
        layers,
        per_process_bytes: as_,
        tree_bound_bytes: tree,
    }
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "unlimited".into(), |v| v.to_string())
}

/// Human form of a byte count for `sandbox check`.
pub(crate) fn human(b: u64) -> String {
    match b {
        b if b >= 1 << 40 => format!("{:.1} TiB", b as f64 / (1u64 << 40) as f64),
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b => format!("{} MiB", b >> 20),
    }
}
