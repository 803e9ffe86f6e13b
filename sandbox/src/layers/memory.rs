//! What holds each kind of memory a sandbox's tree can use, and whether
//! the whole tree is bounded (docs/SECURITY.md, "Memory").
//!
//! Only a memory controller bounds the whole tree: cgroup v2 charges every
//! page the tree touches (anonymous, shared, tmpfs, page cache) and its
//! kernel objects (page tables, pipe and socket buffers, inodes) to the
//! cgroup's `memory.max`. Without one the report names each kind with the
//! mechanism that holds it, or says that nothing does: private mappings
//! stop at `RLIMIT_DATA` a process, SysV segments at the ipc namespace's
//! `shmall`, tmpfs files (the workspace included) at their mount's size,
//! pipe buffers at the sandbox uid's `pipe-user-pages-soft`; socket buffers
//! (`net.core.[rw]mem_max`, `tcp_mem` and `udp_mem` are host-wide, not per
//! network namespace) and kernel objects have no bound, so the tree is
//! unbounded and the level is at most `isolated`.

use crate::policy::SandboxPolicy;
use crate::report::{LayerStatus, MemoryLayer, MemoryReport, MissingLayer, SandboxReport};

const PAGE: u64 = 4096;

fn held(name: &str, bytes: u64, detail: String) -> MemoryLayer {
    MemoryLayer {
        name: name.into(),
        status: LayerStatus::Applied,
        bytes: Some(bytes),
        detail,
    }
}

fn unbounded(name: &str, reason: &str, detail: String) -> MemoryLayer {
    MemoryLayer {
        name: name.into(),
        status: LayerStatus::unavailable(reason),
        bytes: None,
        detail,
    }
}

fn product(vals: &[Option<u64>]) -> Option<u64> {
    vals.iter()
        .try_fold(1u64, |acc, v| v.map(|v| acc.saturating_mul(v)))
}

/// Private and shared anonymous mappings.
fn mapping_rows(rep: &SandboxReport) -> [MemoryLayer; 2] {
    let rl = |k: &str| rep.rlimits.get(k).copied();
    let (data, as_, nproc) = (rl("data"), rl("as"), rl("nproc"));
    let private_name = "private mappings (heap, anonymous, private file copies)";
    let private = match product(&[data.or(as_), nproc]) {
        Some(b) => held(
            private_name,
            b,
            format!(
                "RLIMIT_DATA {} a process x RLIMIT_NPROC {}",
                opt(data.or(as_)),
                opt(nproc)
            ),
        ),
        None => unbounded(
            private_name,
            "no RLIMIT_DATA or RLIMIT_NPROC",
            String::new(),
        ),
    };
    let shared_name = "shared anonymous mappings (MAP_SHARED|MAP_ANONYMOUS)";
    let shared = match product(&[as_, nproc]) {
        Some(b) => held(
            shared_name,
            b,
            format!(
                "RLIMIT_AS {} a process x RLIMIT_NPROC {}",
                opt(as_),
                opt(nproc)
            ),
        ),
        None => unbounded(
            shared_name,
            "no RLIMIT_AS and no memory controller",
            "shmem pages, outside RLIMIT_DATA".into(),
        ),
    };
    [private, shared]
}

/// SysV segments: the ipc namespace's `shmall`, where the sandbox has
/// its limits.
fn shmall_row(rep: &SandboxReport) -> MemoryLayer {
    let name = "SysV shared memory (segments, mapped or not)";
    match rep.ipc_limits.get("shmall").copied() {
        Some(pages) if rep.ipc_limits_status.is_enforced() => held(
            name,
            pages.saturating_mul(PAGE),
            format!("kernel.shmall {pages} pages of the sandbox's ipc namespace"),
        ),
        _ => unbounded(
            name,
            "no private ipc namespace limit",
            "the ipc namespace's defaults".into(),
        ),
    }
}

/// A memfd: refused, or bounded per file by `RLIMIT_FSIZE`, times the
/// fds and processes.
fn memfd_row(rep: &SandboxReport, memfd_refused: bool) -> MemoryLayer {
    let name = "memfd files";
    if memfd_refused {
        return held(
            name,
            0,
            "memfd_create refused by the seccomp filter (memfdCreate = deny)".into(),
        );
    }
    let rl = |k: &str| rep.rlimits.get(k).copied();
    let (fsize, nofile, nproc) = (rl("fsize"), rl("nofile"), rl("nproc"));
    match product(&[fsize, nofile, nproc]) {
        Some(b) => held(
            name,
            b,
            format!(
                "RLIMIT_FSIZE {} a file x RLIMIT_NOFILE {} x RLIMIT_NPROC {}",
                opt(fsize),
                opt(nofile),
                opt(nproc)
            ),
        ),
        None => unbounded(name, "no RLIMIT_FSIZE, NOFILE or NPROC", String::new()),
    }
}

/// The tmpfs mounts of the sandbox's root, the workspace included when it
/// is one of them (no host workspace), and the page cache of host files.
fn tmpfs_rows(rep: &SandboxReport, p: &SandboxPolicy, tmpfs_workspace: bool) -> Vec<MemoryLayer> {
    let root = rep.root == LayerStatus::Applied;
    let mut mounts = vec![
        ("tmpfs /tmp", p.tmp_size_bytes),
        ("tmpfs /dev/shm", p.shm_size_bytes),
        ("tmpfs HOME (/sandbox/home)", p.home_size_bytes),
    ];
    if tmpfs_workspace {
        mounts.push(("tmpfs /workspace", p.workspace_size_bytes));
    }
    let mut rows: Vec<MemoryLayer> = mounts
        .into_iter()
        .map(|(name, size)| match root {
            true => held(name, size, "size= of the sandbox's own mount".into()),
            false => unbounded(name, "no private root", "the host's filesystem".into()),
        })
        .collect();
    rows.push(match root {
        true => held(
            "page cache of host files",
            0,
            "read-only and clean: the kernel reclaims it, the tree cannot hold it".into(),
        ),
        false => unbounded(
            "page cache of host files",
            "no private root",
            "files the tree writes outside its tmpfs mounts".into(),
        ),
    });
    rows
}

/// Pipe buffers: per user, past `fs.pipe-user-pages-soft` each new pipe
/// gets two pages; `pipe-user-pages-hard` (0: none) refuses more.
fn pipe_row(rep: &SandboxReport) -> MemoryLayer {
    let name = "pipe buffers";
    let read = |f: &str| {
        std::fs::read_to_string(format!("/proc/sys/fs/{f}"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    let rl = |k: &str| rep.rlimits.get(k).copied();
    let whose = match rep.own_uid {
        LayerStatus::Applied => "the sandbox's own uid",
        _ => "a uid shared with other processes",
    };
    match (read("pipe-user-pages-soft"), read("pipe-user-pages-hard")) {
        (_, Some(hard)) if hard > 0 => held(
            name,
            hard.saturating_mul(PAGE),
            format!("fs.pipe-user-pages-hard {hard} pages of {whose}"),
        ),
        (Some(soft), Some(_)) => match product(&[rl("nofile"), rl("nproc")]) {
            Some(fds) => held(
                name,
                (soft.saturating_add(fds.saturating_mul(2))).saturating_mul(PAGE),
                format!(
                    "fs.pipe-user-pages-soft {soft} pages of {whose}, then 2 pages a pipe x \
                     RLIMIT_NOFILE x RLIMIT_NPROC {fds} fds"
                ),
            ),
            None => unbounded(name, "no RLIMIT_NOFILE or RLIMIT_NPROC", String::new()),
        },
        _ => unbounded(
            name,
            "fs.pipe-user-pages-* unreadable",
            "per-user pipe limits".into(),
        ),
    }
}

/// The socket name of the memory section's row.
pub(crate) const SOCKETS: &str = "socket buffers (unix, tcp, udp queues)";

/// What the sandbox's own network namespace caps per socket, as written.
fn net_detail(rep: &SandboxReport) -> String {
    if !rep.net_limits_status.is_enforced() || rep.net_limits.is_empty() {
        return "no socket sysctl of the sandbox's own network namespace applied".into();
    }
    let set: Vec<String> = rep
        .net_limits
        .iter()
        .map(|(k, v)| format!("net.{} {v}", k.replace('/', ".")))
        .collect();
    format!(
        "per socket, in the sandbox's own network namespace: {}",
        set.join(", ")
    )
}

/// Socket buffers and kernel objects: only a memory controller charges
/// them. The network namespace's sysctls cap a TCP socket's buffers, the
/// ancillary data and a unix socket's datagram queue, one socket at a
/// time; unix stream queues (up to `net.core.wmem_max`) and the sum over
/// sockets stay host-wide, so the row is unbounded without a controller.
fn kernel_rows(rep: &SandboxReport) -> [MemoryLayer; 2] {
    [
        unbounded(
            SOCKETS,
            "no memory controller",
            format!(
                "{}; unix stream queues up to net.core.wmem_max and the sum over sockets \
                 (RLIMIT_NOFILE x RLIMIT_NPROC of them) are host-wide, not per network namespace",
                net_detail(rep)
            ),
        ),
        unbounded(
            "kernel objects (page tables, inodes, dentries, tasks, epoll, in-flight fds)",
            "no memory controller",
            "RLIMIT_NOFILE, RLIMIT_NPROC, pids.max and the user-namespace ceilings bound their \
             number, not their bytes"
                .into(),
        ),
    ]
}

/// The memory section for a report whose layers are filled in.
/// `tmpfs_workspace`: the workspace is a tmpfs of the sandbox's own;
/// `memfd_refused`: the seccomp filter in force refuses `memfd_create`.
pub(crate) fn assess(
    rep: &SandboxReport,
    policy: &SandboxPolicy,
    tmpfs_workspace: bool,
    memfd_refused: bool,
) -> MemoryReport {
    let mut layers: Vec<MemoryLayer> = mapping_rows(rep).into();
    layers.push(shmall_row(rep));
    layers.push(memfd_row(rep, memfd_refused));
    layers.extend(tmpfs_rows(rep, policy, tmpfs_workspace));
    layers.push(pipe_row(rep));
    layers.extend(kernel_rows(rep));
    let cg = rep.cgroup.memory_max;
    if let Some(max) = cg {
        for l in layers.iter_mut().filter(|l| l.bytes.is_none()) {
            l.status = LayerStatus::Applied;
            l.bytes = Some(max);
            // Socket buffers included: TCP and UDP ones are charged to
            // the socket's cgroup, and unix socket queues alone took a tree
            // to its memory.max and OOM kill in a guest kernel with the
            // controller (tests/tests/memory_controller_guest.rs).
            l.detail = format!("charged to the tree's memory.max; {}", l.detail);
        }
    }
    let kinds: Vec<String> = layers
        .iter()
        .filter(|l| l.bytes.is_none())
        .map(|l| l.name.clone())
        .collect();
    layers.push(match cg {
        Some(max) => held(
            "the whole tree",
            max,
            "cgroup v2 memory.max, memory.swap.max 0, memory.oom.group 1".into(),
        ),
        None => unbounded(
            "the whole tree",
            "no delegated cgroup v2 memory controller",
            "memory.max is what bounds every kind at once".into(),
        ),
    });
    MemoryReport {
        layers,
        per_process_bytes: rep.rlimits.get("as").copied(),
        tree_bound_bytes: cg,
        unbounded: kinds,
    }
}

/// What the operator does to bound the tree's memory.
pub(crate) const FIX: &str = "give the sandboxes a delegated cgroup v2 memory controller: \
    `memory` in the cgroup.subtree_control of sandbox.cgroup.parent (default: the host's own \
    cgroup), from a systemd scope or unit with Delegate=yes or a delegated subtree, and keep \
    sandbox.cgroup.memoryMax set (docs/SECURITY.md, \"Getting a memory controller\")";

/// The `missing` entry when the tree's memory is not bounded as a whole.
pub(crate) fn missing(rep: &SandboxReport) -> Option<MissingLayer> {
    if rep.memory.tree_bound_bytes.is_some() {
        return None;
    }
    Some(MissingLayer {
        layer: "memory".into(),
        reason: format!(
            "the tree's memory is not bounded as a whole; unbounded: {}",
            rep.memory.unbounded.join(", ")
        ),
        fix: FIX.into(),
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn strong_layers() -> SandboxReport {
        let mut rep = SandboxReport {
            root: LayerStatus::Applied,
            own_uid: LayerStatus::Applied,
            ipc_limits_status: LayerStatus::Applied,
            ..SandboxReport::default()
        };
        rep.ipc_limits.insert("shmall".into(), 8192);
        for (k, v) in [("data", 4u64 << 30), ("nproc", 256), ("nofile", 1024)] {
            rep.rlimits.insert(k.into(), v);
        }
        rep
    }

    #[test]
    fn without_a_controller_the_tree_is_unbounded_and_each_kind_is_named() {
        let rep = strong_layers();
        let m = assess(&rep, &SandboxPolicy::default(), true, true);
        assert_eq!(m.tree_bound_bytes, None);
        assert_eq!(m.per_process_bytes, None);
        assert_eq!(
            m.unbounded,
            [
                "shared anonymous mappings (MAP_SHARED|MAP_ANONYMOUS)",
                "socket buffers (unix, tcp, udp queues)",
                "kernel objects (page tables, inodes, dentries, tasks, epoll, in-flight fds)",
            ]
        );
        let ws = m.layers.iter().find(|l| l.name == "tmpfs /workspace");
        assert_eq!(ws.and_then(|l| l.bytes), Some(256 << 20));
        let mut rep = rep;
        rep.memory = m;
        let miss = missing(&rep).expect("memory is missing");
        assert!(miss.reason.contains("socket buffers"), "{}", miss.reason);
        assert!(miss.fix.contains("Delegate=yes"), "{}", miss.fix);
    }

    #[test]
    fn a_memory_max_bounds_every_kind_and_the_tree() {
        let mut rep = strong_layers();
        rep.cgroup.memory_max = Some(1 << 30);
        let m = assess(&rep, &SandboxPolicy::default(), false, false);
        assert_eq!(m.tree_bound_bytes, Some(1 << 30));
        assert!(m.unbounded.is_empty(), "{:?}", m.unbounded);
        assert!(m.layers.iter().all(|l| l.status == LayerStatus::Applied));
        assert!(!m.layers.iter().any(|l| l.name == "tmpfs /workspace"));
        rep.memory = m;
        assert!(missing(&rep).is_none());
    }
}
