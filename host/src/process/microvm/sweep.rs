//! What a host that died (SIGKILL, a crash) left of its VMs: QEMU dies
//! with it (a parent-death signal), but the run directories stay. The
//! first microVM seat of a host process removes every
//! `sharedos-microvm-<pid>-*` directory whose host pid is no longer alive.

use std::path::Path;

use super::PREFIX;

/// Sweeps the temp directory once per host process.
pub(super) fn sweep_once() {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| sweep(&std::env::temp_dir()));
}

/// The host pid a run directory's name carries.
fn host_pid(name: &str) -> Option<i32> {
    name.strip_prefix(PREFIX)?.split('-').next()?.parse().ok()
}

/// Removes the run directories of dead hosts under `tmp`. A pid that is
/// alive again (reused) keeps its directories.
fn sweep(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = host_pid(&name) else {
            continue;
        };
        if pid == std::process::id() as i32 || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dir = e.path();
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => tracing::info!(dir = %dir.display(), "removed a dead host's microVM run"),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), "cannot remove a dead host's microVM run: {e}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_dead_hosts_run_is_removed_and_a_live_ones_kept() {
        assert_eq!(super::host_pid("sharedos-microvm-4242-AbC1"), Some(4242));
        assert_eq!(super::host_pid("sharedos-gvisor-4242-AbC1"), None);
        let tmp = tempfile::tempdir().unwrap();
        // A pid above the kernel's maximum is never alive.
        let dead = tmp.path().join("sharedos-microvm-99999999-x");
        let live = tmp
            .path()
            .join(format!("sharedos-microvm-{}-y", std::process::id()));
        for d in [&dead, &live] {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("initrd"), b"x").unwrap();
        }
        super::sweep(tmp.path());
        assert!(!dead.exists());
        assert!(live.exists());
    }
}
