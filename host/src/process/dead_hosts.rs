//! What a host that died (SIGKILL, a crash) left in the temp directory:
//! its plugins die with it (a parent-death signal, the reaper's kill), but
//! the directories it made for them stay. The first launch of each kind in
//! a host process removes every `<prefix><host pid>-…` directory whose
//! host pid is no longer alive (the microVM's run directories, the direct
//! launcher's working directories).

use std::path::Path;

/// The host pid a directory's name carries after `prefix`.
fn host_pid(name: &str, prefix: &str) -> Option<i32> {
    name.strip_prefix(prefix)?.split('-').next()?.parse().ok()
}

/// Removes the directories of dead hosts named `<prefix><pid>-…` under
/// `tmp`. A pid that is alive again (reused) keeps its directories; `what`
/// names them in the log.
pub(super) fn sweep(tmp: &Path, prefix: &str, what: &str) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = host_pid(&name, prefix) else {
            continue;
        };
        if pid == std::process::id() as i32 || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dir = e.path();
        if !dir.is_dir() {
            continue;
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => tracing::info!(dir = %dir.display(), "removed a dead host's {what}"),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), "cannot remove a dead host's {what}: {e}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_dead_hosts_directory_is_removed_and_a_live_ones_kept() {
        let prefix = "sharedos-microvm-";
        assert_eq!(
            super::host_pid("sharedos-microvm-4242-AbC1", prefix),
            Some(4242)
        );
        assert_eq!(super::host_pid("sharedos-gvisor-4242-AbC1", prefix), None);
        assert_eq!(
            super::host_pid("sharedos-direct-4242-cwd7-ab", "sharedos-direct-"),
            Some(4242)
        );
        let tmp = tempfile::tempdir().unwrap();
        // A pid above the kernel's maximum is never alive.
        let dead = tmp.path().join("sharedos-microvm-99999999-x");
        let live = tmp
            .path()
            .join(format!("sharedos-microvm-{}-y", std::process::id()));
        let other = tmp.path().join("sharedos-direct-99999999-cwd0-z");
        for d in [&dead, &live, &other] {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("initrd"), b"x").unwrap();
        }
        super::sweep(tmp.path(), prefix, "microVM run");
        assert!(!dead.exists());
        assert!(live.exists());
        assert!(other.exists(), "another prefix is not touched");
        super::sweep(tmp.path(), "sharedos-direct-", "working directory");
        assert!(!other.exists());
    }
}
