//! Where the two ends of a measured pair run (issue 31): both on one vCPU,
//! on two different vCPUs (this process, the client or host, on cpu 0, the
//! peer it starts, plugin or server, on cpu 1), or wherever the scheduler
//! puts them. `--only calls` measures each placement in turn, in one run.
//!
//! This process is placed by setting the affinity of each of its threads
//! (threads started later inherit it); a peer on another vCPU is started
//! through `taskset -c 1`, so it is on cpu 1 from its first instruction.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

/// A placement of the client (or host) and its peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Where the scheduler puts them (this process keeps the affinity it
    /// started with).
    Unpinned,
    /// Both on cpu 0.
    OneVcpu,
    /// This process on cpu 0, the peer on cpu 1.
    Split,
}

impl Placement {
    pub fn label(self) -> &'static str {
        match self {
            Placement::Unpinned => "unpinned",
            Placement::OneVcpu => "both ends on one vCPU (cpu 0)",
            Placement::Split => "different vCPUs (client/host cpu 0, peer cpu 1)",
        }
    }
}

/// No pinned peer.
const NONE: usize = usize::MAX;

/// The cpu a peer is started on, or [`NONE`].
static PEER_CPU: AtomicUsize = AtomicUsize::new(NONE);

/// The affinity this process started with (for [`Placement::Unpinned`]).
static ORIGINAL: std::sync::OnceLock<CpuSet> = std::sync::OnceLock::new();

/// Every thread of this process.
fn threads() -> std::io::Result<Vec<Pid>> {
    let mut tids = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task")? {
        if let Some(tid) = entry?.file_name().to_str().and_then(|s| s.parse().ok()) {
            tids.push(Pid::from_raw(tid));
        }
    }
    Ok(tids)
}

/// Places this process (every thread) and the peers it starts from now on;
/// an error when the machine has no cpu 1 for [`Placement::Split`] or the
/// affinity cannot be set.
pub fn apply(placement: Placement) -> Result<(), String> {
    let original = match ORIGINAL.get() {
        Some(o) => *o,
        None => {
            let o = sched_getaffinity(Pid::from_raw(0)).map_err(|e| e.to_string())?;
            *ORIGINAL.get_or_init(|| o)
        }
    };
    let mut cpu0 = CpuSet::new();
    cpu0.set(0).map_err(|e| e.to_string())?;
    let own = match placement {
        Placement::Unpinned => original,
        Placement::OneVcpu | Placement::Split => cpu0,
    };
    if placement == Placement::Split && !original.is_set(1).unwrap_or(false) {
        return Err("no cpu 1 to place the peer on".into());
    }
    for tid in threads().map_err(|e| e.to_string())? {
        // A thread that ended since the listing is not an error.
        match sched_setaffinity(tid, &own) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => return Err(format!("cannot set the affinity of thread {tid}: {e}")),
        }
    }
    let peer = if placement == Placement::Split {
        1
    } else {
        NONE
    };
    PEER_CPU.store(peer, Ordering::Relaxed);
    Ok(())
}

/// The program and arguments that start `program args` as a peer: through
/// `taskset -c <cpu>` when the placement puts peers on a cpu of their own.
pub fn peer(program: &Path, args: &[&str]) -> (PathBuf, Vec<String>) {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    match PEER_CPU.load(Ordering::Relaxed) {
        NONE => (program.to_path_buf(), args),
        cpu => {
            let mut wrapped = vec![
                "-c".to_owned(),
                cpu.to_string(),
                program.display().to_string(),
            ];
            wrapped.extend(args);
            (taskset(), wrapped)
        }
    }
}

/// `taskset` on the PATH (an absolute path, as a runtime's program must be).
fn taskset() -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("taskset"))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| PathBuf::from("/usr/bin/taskset"))
}

/// [`peer`] as a [`Command`].
pub fn command(program: &Path, args: &[&str]) -> Command {
    let (program, args) = peer(program, args);
    let mut c = Command::new(program);
    c.args(args);
    c
}
