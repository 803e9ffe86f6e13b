//! `sharedos sandbox check`: what this kernel and host can enforce.
//!
//! It does not guess from kernel versions: it launches the real helper
//! with the default policy (minimum lowered so the report always comes
//! back) against `/bin/true`, and prints the report layer by layer, the
//! level a plugin would get, and the fix for each missing layer.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::report::{LayerStatus, SandboxLevel, SandboxReport};
use crate::{SandboxPolicy, SpawnSpec, spawn};

/// Probe with the running binary as the helper (the `sharedos` binary,
/// which dispatches `__sandbox-exec` to [`crate::helper_main`]).
pub fn check(out: &mut dyn Write) -> std::io::Result<SandboxLevel> {
    let exe = std::env::current_exe()?;
    check_with(&exe, out)
}

/// Probe with an explicit helper binary.
pub fn check_with(helper_exe: &Path, out: &mut dyn Write) -> std::io::Result<SandboxLevel> {
    let report = probe(helper_exe, SandboxPolicy::default());
    writeln!(out, "sharedos sandbox check")?;
    writeln!(
        out,
        "kernel {}, arch {}",
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        std::env::consts::ARCH
    )?;
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            writeln!(out, "the sandbox helper could not start a probe: {e}")?;
            writeln!(out, "level: minimal (nothing could be verified)")?;
            return Ok(SandboxLevel::Minimal);
        }
    };
    print_report(&report, out)?;
    Ok(report.level)
}

fn probe(
    helper_exe: &Path,
    mut policy: SandboxPolicy,
) -> Result<SandboxReport, crate::SandboxError> {
    policy.min_level = SandboxLevel::Minimal;
    let ws = TempWorkspace::new()?;
    let program = ["/bin/true", "/usr/bin/true"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| helper_exe.to_path_buf());
    let mut child = spawn(&SpawnSpec {
        helper_exe: helper_exe.to_path_buf(),
        program,
        args: vec![],
        env: vec![],
        policy,
        // A host directory, so the probe reports the layers even where no
        // mount namespace (and so no tmpfs workspace) can be had.
        workspace: Some(ws.0.clone()),
    })?;
    let report = child.report.clone();
    let _ = child.wait();
    Ok(report)
}

/// Print one line per layer, then the level and what to fix.
pub fn print_report(r: &SandboxReport, out: &mut dyn Write) -> std::io::Result<()> {
    let line = |out: &mut dyn Write, name: &str, st: &LayerStatus, extra: String| {
        let (mark, why) = match st {
            LayerStatus::Applied => ("ok", String::new()),
            LayerStatus::Degraded { reason } => ("degraded", format!(": {reason}")),
            LayerStatus::Unavailable { reason } => ("MISSING", format!(": {reason}")),
            LayerStatus::Disabled => ("off", " (disabled by policy)".to_string()),
        };
        writeln!(out, "  {name:<14} {mark}{extra}{why}")
    };
    writeln!(out, "layers:")?;
    for layer in crate::layers::LAYERS {
        line(out, layer.name, &layer.status(r), (layer.detail)(r))?;
    }
    print_memory(&r.memory, out)?;
    let sc = &r.self_check;
    writeln!(
        out,
        "self-check inside: Uid {}, CapEff {}, NoNewPrivs {}, Seccomp {}, fds {:?}",
        opt(sc.uid),
        sc.cap_eff.map_or("?".into(), |c| format!("{c:016x}")),
        opt(sc.no_new_privs.map(u8::from)),
        opt(sc.seccomp),
        sc.fds
    )?;
    writeln!(out, "level: {}", r.level)?;
    for m in &r.missing {
        writeln!(
            out,
            "  missing {}: {}\n    fix: {}",
            m.layer, m.reason, m.fix
        )?;
    }
    if matches!(r.cgroup.status, LayerStatus::Unavailable { .. }) {
        writeln!(
            out,
            "  note: no cgroup: the pid namespace and rlimits still bound the plugin; \
             fix: run the host as root or delegate a cgroup v2 subtree to its user"
        )?;
    }
    for w in &r.warnings {
        writeln!(out, "  warning: {w}")?;
    }
    Ok(())
}

/// What bounds memory on this host, one mechanism a line, and the result.
fn print_memory(m: &crate::report::MemoryReport, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(out, "memory:")?;
    for l in &m.layers {
        let state = match &l.status {
            LayerStatus::Applied => "ok".to_string(),
            LayerStatus::Degraded { reason } => format!("degraded: {reason}"),
            LayerStatus::Unavailable { reason } => format!("none: {reason}"),
            LayerStatus::Disabled => "off".to_string(),
        };
        let bytes = l.bytes.map_or("-".into(), crate::memory::human);
        writeln!(out, "  {:<10} {state} ({}) {}", bytes, l.detail, l.name)?;
    }
    writeln!(
        out,
        "  bound: {} a process, {} the whole tree",
        m.per_process_bytes
            .map_or("unbounded".into(), crate::memory::human),
        m.tree_bound_bytes
            .map_or("unbounded".into(), crate::memory::human)
    )
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "none".to_string(), |v| v.to_string())
}

/// A throwaway workspace for the probe, removed on drop.
pub(crate) struct TempWorkspace(pub PathBuf);

impl TempWorkspace {
    pub(crate) fn new() -> Result<Self, crate::SandboxError> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "sharedos-probe-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&p).map_err(crate::SandboxError::io("create the probe workspace"))?;
        Ok(TempWorkspace(p))
    }
}

impl Drop for TempWorkspace {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
