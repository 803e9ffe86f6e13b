//! `sharedos run` leaves no zombie behind: a sandbox's pid 1 that outlives
//! its helper by an instant is re-parented to the nearest subreaper, and
//! the host, which makes itself one, reaps it before it exits. The test
//! process is a subreaper too (its own binary, so no other test shares the
//! setting): without the host's reaping, the orphan lands here, a zombie.

use std::process::Command;

use serde_json::json;
use sharedos_tests::turns::{request, testplugin_host_toml, workspace_bin};

/// Our children that are zombies: re-parented orphans nobody reaped.
fn zombie_children() -> Vec<(u32, String)> {
    let me = std::process::id().to_string();
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(1) == Some(&me.as_str()) && fields.first() == Some(&"Z") {
            let name = head.split_once('(').map(|(_, n)| n).unwrap_or_default();
            out.push((pid, name.to_owned()));
        }
    }
    out
}

#[test]
fn sharedos_run_reaps_its_orphans_before_it_exits() {
    // SAFETY: prctl with integer arguments only.
    let set = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(set, 0);
    for launcher in ["sandbox", "direct"] {
        let dir = tempfile::tempdir().unwrap();
        let marker = format!("run-reaps-{launcher}-{}", std::process::id());
        std::fs::write(
            dir.path().join("host.toml"),
            testplugin_host_toml(&marker, launcher, 30_000),
        )
        .unwrap();
        let script = json!([{"op": "fork", "n": 1, "setsid": true, "double": true}, {"op": "emit", "type": "x", "data": 1}]);
        std::fs::write(
            dir.path().join("turn.json"),
            request("reap-turn", script, &["files.read"], 30_000).to_string(),
        )
        .unwrap();
        let out = Command::new(workspace_bin("sharedos"))
            .current_dir(dir.path())
            .args(["run", "--config", "host.toml", "--request", "turn.json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{launcher}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Give an orphan that was re-parented to us the time to die.
        std::thread::sleep(std::time::Duration::from_millis(500));
        let zombies = zombie_children();
        // Reap them, so a failure leaves nothing behind either.
        for (pid, _) in &zombies {
            // SAFETY: waitpid on a child of ours, status discarded.
            unsafe { libc::waitpid(*pid as i32, std::ptr::null_mut(), 0) };
        }
        assert!(
            zombies.is_empty(),
            "{launcher}: `sharedos run` left zombies for its parent to reap: {zombies:?}"
        );
    }
}
