//! What a turn may leave behind on the host, looked up from the outside:
//! this process's sandbox cgroups and host workspaces; and a bounded poll
//! for them to go.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The sandbox's throwaway cgroups of this process (`sharedos-<pid>-<n>`)
/// that still exist, under the cgroup roots and this process's own cgroup.
pub fn own_cgroups() -> Vec<PathBuf> {
    let prefix = format!("sharedos-{}-", std::process::id());
    let mut roots = vec![
        PathBuf::from("/sys/fs/cgroup/pids"),
        PathBuf::from("/sys/fs/cgroup/unified"),
        PathBuf::from("/sys/fs/cgroup"),
    ];
    if let Ok(s) = std::fs::read_to_string("/proc/self/cgroup")
        && let Some(rel) = s.lines().find_map(|l| l.strip_prefix("0::"))
    {
        let rel = rel.trim_start_matches('/');
        if !rel.is_empty() {
            roots.push(Path::new("/sys/fs/cgroup/unified").join(rel));
            roots.push(Path::new("/sys/fs/cgroup").join(rel));
        }
    }
    let mut found = Vec::new();
    for r in roots {
        if let Ok(d) = std::fs::read_dir(&r) {
            for e in d.flatten() {
                if e.file_name().to_string_lossy().starts_with(&prefix) {
                    found.push(e.path());
                }
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// The names of the workspaces (`sharedos-ws-*`, any host's) in `dir`.
pub fn workspaces_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("sharedos-ws-"))
        .collect()
}

/// This process's host workspaces in `$TMPDIR` (`sharedos-ws-<pid>-*`; a
/// sandbox with a mount namespace keeps its workspace in its own tmpfs).
pub fn own_workspaces() -> Vec<PathBuf> {
    let prefix = format!("sharedos-ws-{}-", std::process::id());
    let mut found: Vec<PathBuf> = std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    found.sort();
    found
}

/// Polls `cond` every 20 ms until it holds or `limit` passed; whether it
/// held (a generous bound, never a pass/fail timing).
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// [`processes_naming`] `needle` once they are gone, or at `bound` (a
/// torn-down tree's processes may take a moment to be reaped): empty when
/// none is left.
pub fn processes_naming_after(needle: &str, bound: std::time::Duration) -> Vec<String> {
    let end = std::time::Instant::now() + bound;
    let mut left = processes_naming(needle);
    while !left.is_empty() && std::time::Instant::now() < end {
        std::thread::sleep(std::time::Duration::from_millis(50));
        left = processes_naming(needle);
    }
    left
}

/// Processes whose command line names `needle` (`pid: command line`).
pub fn processes_naming(needle: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains(needle).then(|| format!("{pid}: {cmd}"))
        })
        .collect()
}
