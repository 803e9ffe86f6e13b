//! Resource accounting and atomic kill through a throwaway cgroup.
//!
//! The host creates one cgroup per plugin where it can write a hierarchy:
//! a cgroup v1 `pids` child (for `pids.max`) and a cgroup v2 child (for
//! `cgroup.kill`, and `memory.max` when the memory controller is delegated
//! there). The helper joins them first thing, before it forks. Processes
//! are never moved between v1 *memory* cgroups. Everything is removed
//! when the plugin is gone.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::layers::layer::{Layer, Need, Slot, Stage};
use crate::policy::CgroupPolicy;
use crate::report::{CgroupReport, LayerStatus};

const V1_PIDS: &str = "/sys/fs/cgroup/pids";
const V2_CANDIDATES: [&str; 2] = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"];

/// The cgroups created for one plugin.
#[derive(Debug, Default)]
pub struct PluginCgroup {
    pub paths: Vec<PathBuf>,
    /// The v2 directory, where `cgroup.kill` lives.
    pub v2: Option<PathBuf>,
    pub pids_max: Option<u64>,
    pub memory_max: Option<u64>,
    pub problems: Vec<String>,
}

fn is_v2_root(p: &Path) -> bool {
    p.join("cgroup.controllers").exists() && p.join("cgroup.procs").exists()
}

/// The host's own v2 cgroup, relative to the hierarchy root.
fn own_v2_path() -> Option<String> {
    let s = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim_start_matches('/').to_string())
}

fn unique_name() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "sharedos-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The v2 cgroup the sandboxes' cgroups are made in: the host's own.
fn v2_parent() -> Option<PathBuf> {
    let root = V2_CANDIDATES
        .iter()
        .map(Path::new)
        .find(|p| is_v2_root(p))?;
    Some(match own_v2_path() {
        Some(rel) if !rel.is_empty() => root.join(rel),
        _ => root.to_path_buf(),
    })
}

/// Where `policy` makes the sandboxes' v2 cgroups: its `parent`, which must
/// be a cgroup v2 directory, or the host's own cgroup.
fn parent_for(policy: &CgroupPolicy) -> Result<Option<PathBuf>, String> {
    match &policy.parent {
        None => Ok(v2_parent()),
        Some(p) if is_v2_root(Path::new(p)) => Ok(Some(PathBuf::from(p))),
        Some(p) => Err(format!(
            "cgroup.parent {p:?} is not a cgroup v2 directory (no cgroup.controllers and \
             cgroup.procs there)"
        )),
    }
}

/// The load-time check of `policy.parent`: `Err` names why the sandboxes'
/// cgroups could not be made there.
pub fn check_parent(policy: &CgroupPolicy) -> Result<(), String> {
    parent_for(policy).map(|_| ())
}

/// Whether the memory controller is delegated to the cgroups `policy`'s
/// sandboxes are made in (`memory` in the parent's
/// `cgroup.subtree_control`): only then can a sandbox's tree be bounded as
/// a whole, and reach [`crate::SandboxLevel::Strong`].
pub fn memory_delegated_for(policy: &CgroupPolicy) -> bool {
    parent_for(policy)
        .ok()
        .flatten()
        .and_then(|p| std::fs::read_to_string(p.join("cgroup.subtree_control")).ok())
        .is_some_and(|s| s.split_whitespace().any(|c| c == "memory"))
}

/// [`memory_delegated_for`] the default policy (the host's own cgroup).
pub fn memory_delegated() -> bool {
    memory_delegated_for(&CgroupPolicy::default())
}

/// Remove the empty cgroups left by sharedos hosts that died before they
/// could clean up (named `sharedos-<host pid>-<n>`, host pid no longer
/// alive). Runs once per process from [`create`]; returns what it removed.
pub fn sweep_stale() -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let mut parents: Vec<PathBuf> = vec![PathBuf::from(V1_PIDS)];
    parents.extend(v2_parent());
    for parent in parents {
        let Ok(dir) = std::fs::read_dir(&parent) else {
            continue;
        };
        for e in dir.flatten() {
            let name = e.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix("sharedos-"))
                .and_then(|r| r.split('-').next())
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            let alive = Path::new(&format!("/proc/{pid}")).exists();
            if alive {
                continue;
            }
            // rmdir only succeeds on a cgroup without processes or children.
            if std::fs::remove_dir(e.path()).is_ok() {
                removed.push(e.path());
            }
        }
    }
    removed
}

/// Create the plugin's cgroups. Never fails: what could not be done is in
/// `problems` and ends up in the report.
/// `memory.max`, `memory.swap.max` and `memory.oom.group` (1: an OOM
/// kill takes the whole tree, never leaves half of it running) of a fresh
/// v2 cgroup `dir` the sandbox created, whose parent delegates the memory
/// controller (`delegated`). The files must already exist (the kernel
/// makes them with the controller): nothing is created, and no process is
/// moved here. Without `memory.swap.max` (no swap accounting) the swap
/// limit is refused rather than skipped, since swapped-out pages would
/// escape `memory.max`. The bound returned, the one the report claims, is
/// `memory.max` read back: what the kernel holds (it rounds to pages), and
/// no bound at all if the write did not take.
pub(crate) fn write_memory_limits(
    dir: &Path,
    delegated: bool,
    max: u64,
    swap: Option<u64>,
) -> Result<u64, String> {
    if !delegated {
        return Err(
            "memory.max: the memory controller is not delegated to the v2 hierarchy".into(),
        );
    }
    let write = |file: &str, v: u64| {
        std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(dir.join(file))
            .and_then(|mut f| std::io::Write::write_all(&mut f, v.to_string().as_bytes()))
            .map_err(|e| format!("{file} in {}: {e}", dir.display()))
    };
    write("memory.max", max)?;
    if let Some(sw) = swap {
        write("memory.swap.max", sw)?;
    }
    write("memory.oom.group", 1)?;
    let held = std::fs::read_to_string(dir.join("memory.max"))
        .map_err(|e| format!("memory.max in {}: {e}", dir.display()))?;
    held.trim().parse().map_err(|_| {
        format!(
            "memory.max in {} reads back {:?}, not the bound written",
            dir.display(),
            held.trim()
        )
    })
}

pub fn create(policy: &CgroupPolicy) -> PluginCgroup {
    let mut cg = PluginCgroup::default();
    if !policy.enabled {
        return cg;
    }
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        sweep_stale();
    });
    let name = unique_name();
    // v1 pids: a child of the hierarchy root; the pids controller holds no
    // memory state, so joining it is harmless.
    if let Some(max) = policy.pids_max
        && Path::new(V1_PIDS).join("cgroup.procs").exists()
    {
        let dir = Path::new(V1_PIDS).join(&name);
        match std::fs::create_dir(&dir)
            .and_then(|_| std::fs::write(dir.join("pids.max"), max.to_string()))
        {
            Ok(()) => {
                cg.paths.push(dir);
                cg.pids_max = Some(max);
            }
            Err(e) => {
                let _ = std::fs::remove_dir(&dir);
                cg.problems
                    .push(format!("v1 pids cgroup {}: {e}", dir.display()));
            }
        }
    }
    // v2: a child of the host's own cgroup.
    let parent = match parent_for(policy) {
        Ok(parent) => parent,
        Err(e) => {
            cg.problems.push(e);
            None
        }
    };
    if let Some(parent) = parent {
        let dir = parent.join(&name);
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                let subtree = std::fs::read_to_string(parent.join("cgroup.subtree_control"))
                    .unwrap_or_default();
                let ctl = |c: &str| subtree.split_whitespace().any(|x| x == c);
                if let Some(max) = policy.pids_max
                    && cg.pids_max.is_none()
                    && ctl("pids")
                    && std::fs::write(dir.join("pids.max"), max.to_string()).is_ok()
                {
                    cg.pids_max = Some(max);
                }
                if let Some(max) = policy.memory_max {
                    match write_memory_limits(&dir, ctl("memory"), max, policy.memory_swap_max) {
                        Ok(held) => cg.memory_max = Some(held),
                        Err(e) => cg.problems.push(e),
                    }
                }
                cg.v2 = dir.join("cgroup.kill").exists().then(|| dir.clone());
                cg.paths.push(dir);
            }
            Err(e) => cg
                .problems
                .push(format!("v2 cgroup {}: {e}", dir.display())),
        }
    }
    if cg.paths.is_empty() && cg.problems.is_empty() {
        cg.problems
            .push("no writable cgroup hierarchy found".into());
    }
    cg
}

/// In the helper: move the calling process into every plugin cgroup.
///
/// A cgroup the process could not join bounds nothing of the tree, so the
/// report stops claiming what it would have held: `memory.max` whatever
/// the path (the memory axis trusts it as the whole tree's bound, and a
/// tree split across cgroups is not bounded as a whole), `pids.max` and
/// `cgroup.kill` where that directory carries them.
pub fn join(paths: &[PathBuf], report: &mut CgroupReport) {
    let pid = std::process::id().to_string();
    let mut joined = Vec::new();
    let mut failed = Vec::new();
    for p in paths {
        match std::fs::write(p.join("cgroup.procs"), &pid) {
            Ok(()) => joined.push(p.display().to_string()),
            Err(e) => {
                failed.push(format!("joining {}: {e}", p.display()));
                report.memory_max = None;
                if p.join("pids.max").exists() {
                    report.pids_max = None;
                }
                if p.join("cgroup.kill").exists() {
                    report.kill = false;
                }
            }
        }
    }
    if !failed.is_empty() {
        report.status = LayerStatus::Degraded {
            reason: format!(
                "{}; the tree is outside that cgroup, so no bound of it is claimed",
                failed.join("; ")
            ),
        };
    }
    report.paths = joined;
}

impl PluginCgroup {
    /// The report skeleton the host sends to the helper.
    pub fn report(&self, enabled: bool) -> CgroupReport {
        let status = if !enabled {
            LayerStatus::Disabled
        } else if self.paths.is_empty() {
            LayerStatus::unavailable(self.problems.join("; "))
        } else if self.problems.is_empty() {
            LayerStatus::Applied
        } else {
            LayerStatus::Degraded {
                reason: self.problems.join("; "),
            }
        };
        CgroupReport {
            status,
            paths: Vec::new(),
            kill: self.v2.is_some(),
            pids_max: self.pids_max,
            memory_max: self.memory_max,
        }
    }

    /// SIGKILL every process in the cgroups (`cgroup.kill` when present,
    /// else each pid listed in `cgroup.procs`).
    pub fn kill(&self) {
        kill_paths(self.v2.as_deref(), &self.paths);
    }

    /// True when no process is left in any of the cgroups.
    pub fn is_empty(&self) -> bool {
        self.paths.iter().all(|p| {
            std::fs::read_to_string(p.join("cgroup.procs"))
                .map(|s| s.trim().is_empty())
                .unwrap_or(true)
        })
    }

    /// Wait, up to `timeout`, until no process is left. With a v2 cgroup
    /// this is one wait on `cgroup.events` (`populated 0`; the kernel
    /// notifies the file, so `poll` wakes on the change, no sleep loop);
    /// the v1 `pids` cgroup holds the same processes and is empty then.
    /// Without one, `cgroup.procs` is re-read every few milliseconds.
    pub fn wait_empty(&self, timeout: std::time::Duration) -> bool {
        let end = std::time::Instant::now() + timeout;
        if let Some(v2) = &self.v2
            && let Ok(events) = std::fs::File::open(v2.join("cgroup.events"))
        {
            return wait_unpopulated(&events, end);
        }
        while !self.is_empty() {
            if std::time::Instant::now() >= end {
                return false;
            }
            self.kill();
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        true
    }

    /// Remove the directories (they must be empty of processes).
    pub fn remove(&mut self) {
        let mut left = Vec::new();
        for p in self.paths.drain(..) {
            if std::fs::remove_dir(&p).is_err() && p.exists() {
                left.push(p);
            }
        }
        self.paths = left;
        if self.paths.is_empty() {
            self.v2 = None;
        }
    }
}

/// Limits the kernel enforced on a plugin's tree, from its cgroups' event
/// counters (`pids.events`, `memory.events`); zero where nothing was hit
/// or the counter does not exist.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitsHit {
    /// `pids.max`, when set.
    pub pids_max: Option<u64>,
    /// Forks and clones refused at `pids.max` (`pids.events` `max`).
    pub pids_refused: u64,
    /// `memory.max`, when set.
    pub memory_max: Option<u64>,
    /// Times the tree's usage reached `memory.max` (`memory.events` `max`).
    pub memory_reached: u64,
    /// Processes the OOM killer ended inside the tree (`memory.events`
    /// `oom_kill`).
    pub oom_kills: u64,
}

impl LimitsHit {
    /// True when no limit was hit.
    pub fn is_empty(&self) -> bool {
        self.pids_refused == 0 && self.memory_reached == 0 && self.oom_kills == 0
    }
}

/// The value of `key` in a flat-keyed cgroup file (`max 3\n`).
fn event_count(file: &Path, key: &str) -> u64 {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|text| {
            text.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse().ok()).flatten()
            })
        })
        .unwrap_or(0)
}

impl PluginCgroup {
    /// What the kernel refused or killed at the cgroups' bounds so far
    /// (read while the cgroups exist: before [`PluginCgroup::remove`]).
    pub fn limits_hit(&self) -> LimitsHit {
        let mut hit = LimitsHit {
            pids_max: self.pids_max,
            memory_max: self.memory_max,
            ..LimitsHit::default()
        };
        for p in &self.paths {
            hit.pids_refused += event_count(&p.join("pids.events"), "max");
        }
        if let Some(v2) = &self.v2 {
            let events = v2.join("memory.events");
            hit.memory_reached = event_count(&events, "max");
            hit.oom_kills = event_count(&events, "oom_kill");
        }
        hit
    }

    /// A reader of [`PluginCgroup::limits_hit`] that outlives this handle:
    /// it reads the same files by path, so it reads zeros once the cgroups
    /// are removed.
    pub fn limits_reader(&self) -> impl Fn() -> LimitsHit + Send + Sync + 'static {
        let cg = PluginCgroup {
            paths: self.paths.clone(),
            v2: self.v2.clone(),
            pids_max: self.pids_max,
            memory_max: self.memory_max,
            problems: Vec::new(),
        };
        move || cg.limits_hit()
    }
}

/// SIGKILL everything in the given cgroups: one write to `cgroup.kill`
/// when there is a v2 cgroup (every plugin process is in it, so the v1
/// `pids` cgroup needs no pass of its own); else each pid listed.
pub fn kill_paths(v2: Option<&Path>, paths: &[PathBuf]) {
    if let Some(v2) = v2
        && std::fs::write(v2.join("cgroup.kill"), "1").is_ok()
    {
        return;
    }
    for p in paths {
        if let Ok(s) = std::fs::read_to_string(p.join("cgroup.procs")) {
            for pid in s.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                // A pid read from the plugin's own cgroup, which only
                // holds the plugin's processes.
                if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
        }
    }
}

/// Whether `cgroup.events` says `populated 0`, read from the start.
fn unpopulated(events: &std::fs::File) -> Option<bool> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 256];
    let n = events.read_at(&mut buf, 0).ok()?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("populated "))
        .map(|v| v.trim() == "0")
}

/// Blocks until `cgroup.events` reports `populated 0` or `end` passes.
/// The kernel raises POLLPRI on the file at each change of its content.
fn wait_unpopulated(events: &std::fs::File, end: std::time::Instant) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    loop {
        match unpopulated(events) {
            Some(true) => return true,
            Some(false) => {}
            None => return false,
        }
        let left = end.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut pfd = [PollFd::new(events.as_fd(), PollFlags::POLLPRI)];
        let ms = i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX);
        let timeout = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
        if matches!(poll(&mut pfd, timeout), Err(e) if e != nix::errno::Errno::EINTR) {
            return false;
        }
    }
}

/// The plugin's cgroup, made by the host before the helper starts.
pub(crate) const LAYER: Layer = Layer {
    name: "cgroup",
    stage: Stage::Host,
    toggle: None,
    slot: Slot::Status(|r| &r.cgroup.status, |r| &mut r.cgroup.status),
    need: Need::Reported,
    fix: "run the host as root or delegate a cgroup v2 subtree to its user",
    detail: |r| {
        let opt = |v: Option<u64>| v.map_or_else(|| "none".to_string(), |v| v.to_string());
        format!(
            " (cgroup.kill {}, pids.max {}, memory.max {})",
            if r.cgroup.kill { "yes" } else { "no" },
            opt(r.cgroup.pids_max),
            opt(r.cgroup.memory_max)
        )
    },
    apply: None,
};

#[cfg(test)]
mod tests {
    use super::{LimitsHit, PluginCgroup, create, write_memory_limits};
    use crate::policy::CgroupPolicy;

    #[test]
    fn a_parent_that_is_not_a_cgroup_is_reported_and_left_untouched() {
        let d = tempfile::tempdir().unwrap();
        let policy = CgroupPolicy {
            pids_max: None,
            parent: Some(d.path().display().to_string()),
            ..CgroupPolicy::default()
        };
        let mut cg = create(&policy);
        assert!(
            cg.problems
                .iter()
                .any(|p| p.contains("is not a cgroup v2 directory")),
            "{:?}",
            cg.problems
        );
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
        assert!(!super::memory_delegated_for(&policy));
        cg.remove();
    }

    /// An emulated cgroup directory (plain files): this machine has no
    /// delegated memory controller, and no process may be moved between
    /// memory cgroups here.
    fn emulated(files: &[&str]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for f in files {
            std::fs::write(d.path().join(f), "max\n").unwrap();
        }
        d
    }

    #[test]
    fn a_cgroup_the_helper_could_not_join_claims_no_bound() {
        use crate::report::{CgroupReport, LayerStatus};
        let skeleton = || CgroupReport {
            status: LayerStatus::Applied,
            kill: true,
            pids_max: Some(64),
            memory_max: Some(512 << 20),
            ..CgroupReport::default()
        };
        // Joined: an emulated cgroup directory takes the pid, the bounds stand.
        let d = emulated(&["memory.max", "pids.max", "cgroup.kill"]);
        let mut rep = skeleton();
        super::join(&[d.path().to_path_buf()], &mut rep);
        assert_eq!(rep.status, LayerStatus::Applied);
        assert_eq!(rep.memory_max, Some(512 << 20));
        assert_eq!(rep.paths, [d.path().display().to_string()]);
        // Not joined (its cgroup.procs refuses the write): no bound, no
        // kill, degraded.
        let refusing = d.path().join("refusing");
        std::fs::create_dir(&refusing).unwrap();
        for f in ["memory.max", "pids.max", "cgroup.kill"] {
            std::fs::write(refusing.join(f), "max\n").unwrap();
        }
        std::fs::create_dir(refusing.join("cgroup.procs")).unwrap();
        let mut rep = skeleton();
        super::join(std::slice::from_ref(&refusing), &mut rep);
        assert_eq!(rep.memory_max, None);
        assert_eq!(rep.pids_max, None);
        assert!(!rep.kill);
        assert!(rep.paths.is_empty());
        match &rep.status {
            LayerStatus::Degraded { reason } => {
                assert!(reason.contains("no bound of it is claimed"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        // And the memory axis then says the tree is unbounded.
        let mut full = crate::report::SandboxReport {
            cgroup: rep,
            ..Default::default()
        };
        full.memory =
            crate::memory::assess(&full, &crate::policy::SandboxPolicy::default(), true, true);
        assert_eq!(full.memory.tree_bound_bytes, None);
        assert!(full.require_memory_bound(true).is_err());
    }

    #[test]
    fn the_limits_hit_are_read_from_the_event_counters() {
        let dir = emulated(&["pids.events", "memory.events", "cgroup.kill"]);
        std::fs::write(dir.path().join("pids.events"), "max 7\n").unwrap();
        std::fs::write(
            dir.path().join("memory.events"),
            "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 1\n",
        )
        .unwrap();
        let cg = PluginCgroup {
            paths: vec![dir.path().to_path_buf()],
            v2: Some(dir.path().to_path_buf()),
            pids_max: Some(16),
            memory_max: Some(1 << 20),
            problems: Vec::new(),
        };
        let hit = cg.limits_hit();
        assert_eq!(
            hit,
            LimitsHit {
                pids_max: Some(16),
                pids_refused: 7,
                memory_max: Some(1 << 20),
                memory_reached: 12,
                oom_kills: 1,
            }
        );
        assert!(!hit.is_empty());
        assert!(PluginCgroup::default().limits_hit().is_empty());
    }

    #[test]
    fn memory_max_and_swap_are_written_where_the_controller_is_delegated() {
        let d = emulated(&["memory.max", "memory.swap.max", "memory.oom.group"]);
        let held = write_memory_limits(d.path(), true, 512 << 20, Some(0)).unwrap();
        assert_eq!(held, 512 << 20);
        let read = |f: &str| std::fs::read_to_string(d.path().join(f)).unwrap();
        assert_eq!(read("memory.max"), (512u64 << 20).to_string());
        assert_eq!(read("memory.swap.max"), "0");
        assert_eq!(read("memory.oom.group"), "1");
    }

    #[test]
    fn memory_limits_are_refused_without_the_controller_or_swap_accounting() {
        let d = emulated(&["memory.max", "memory.swap.max"]);
        let e = write_memory_limits(d.path(), false, 1 << 30, Some(0)).unwrap_err();
        assert!(e.contains("not delegated"), "{e}");
        assert_eq!(
            std::fs::read_to_string(d.path().join("memory.max")).unwrap(),
            "max\n"
        );
        let d = emulated(&["memory.max"]);
        let e = write_memory_limits(d.path(), true, 1 << 30, Some(0)).unwrap_err();
        assert!(e.contains("memory.swap.max"), "{e}");
        // Nothing is created in a directory without the controller's files.
        let d = emulated(&[]);
        assert!(write_memory_limits(d.path(), true, 1 << 30, None).is_err());
        assert!(!d.path().join("memory.max").exists());
    }
}
