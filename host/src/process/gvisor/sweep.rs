//! What a host that died (SIGKILL, a crash) left of its containers: their
//! runsc processes die with it (a parent-death signal), but their bundle
//! and state directories stay. The first gVisor seat of a host process
//! removes every `sharedos-gvisor-<pid>-*` directory whose host pid is no
//! longer alive, after `runsc delete --force` of each container its state
//! names.

use std::path::Path;

use super::bundle::PREFIX;
use super::runsc::{COMMAND_TIMEOUT, Runsc};

/// Sweeps the temp directory once per host process.
pub(super) fn sweep_once(runsc: &Runsc) {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| sweep(runsc, &std::env::temp_dir()));
}

/// The host pid a bundle directory's name carries.
fn host_pid(name: &str) -> Option<i32> {
    name.strip_prefix(PREFIX)?.split('-').next()?.parse().ok()
}

fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes the bundles of dead hosts under `tmp`, each container deleted
/// first. A pid that is alive again (reused) keeps its directories: they
/// are only ever removed when nothing with that pid runs.
fn sweep(runsc: &Runsc, tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = host_pid(&name) else {
            continue;
        };
        if pid == std::process::id() as i32 || alive(pid) {
            continue;
        }
        let dir = e.path();
        let state = dir.join("state");
        for id in containers(&state) {
            let _ = runsc.bounded(&state, &["kill", "--all", &id, "KILL"], COMMAND_TIMEOUT);
            let _ = runsc.bounded(&state, &["delete", "--force", &id], COMMAND_TIMEOUT);
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => tracing::info!(dir = %dir.display(), "removed a dead host's gVisor bundle"),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), "cannot remove a dead host's gVisor bundle: {e}")
            }
        }
    }
}

/// The container ids runsc's state directory names (`<id>_sandbox:<id>.state`).
fn containers(state: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(state) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let id = name.strip_suffix(".state")?.rsplit(':').next()?.to_owned();
            id.starts_with("sharedos-").then_some(id)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_bundle_name_gives_its_host_pid_and_a_state_file_its_container() {
        assert_eq!(super::host_pid("sharedos-gvisor-4242-AbC1"), Some(4242));
        assert_eq!(super::host_pid("sharedos-gvisor-x-AbC1"), None);
        assert_eq!(super::host_pid("sharedos-ws-1-a"), None);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("sharedos-7-0_sandbox:sharedos-7-0.state"),
            "",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("sharedos-7-0_sandbox:sharedos-7-0.lock"),
            "",
        )
        .unwrap();
        assert_eq!(
            super::containers(dir.path()),
            vec!["sharedos-7-0".to_owned()]
        );
    }
}
