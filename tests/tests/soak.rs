//! `sharedos-bench soak` from the outside: 200 turns of the testplugin's hostile
//! scripts and the adversary through long-lived executors in the full
//! sandbox. It exits 0 only when no report saw a live descendant, a
//! workspace or a cgroup of the host, and memory and descriptors did not
//! grow (the judge and the measurements are unit-tested in
//! cli/src/soak.rs, with a live child seen as a descendant).

use std::process::Command;

use sharedos_tests::turns::workspace_bin;

#[test]
fn a_short_soak_leaves_nothing_and_does_not_grow() {
    let tmp = tempfile::tempdir().unwrap();
    // The sandbox uid enters TMPDIR to reach its workspace.
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    // A host that is not root keeps its state directory in
    // $XDG_RUNTIME_DIR, else in TMPDIR: its own here, so TMPDIR shows only
    // what the turns leave.
    let runtime_dir = tempfile::tempdir().unwrap();
    let out = Command::new(workspace_bin("sharedos-bench"))
        .args(["soak", "--turns", "200", "--every", "50"])
        .env("TMPDIR", tmp.path())
        .env("XDG_RUNTIME_DIR", runtime_dir.path())
        .env("SHAREDOS_LOG", "error")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let reports: Vec<&str> = stdout.lines().filter(|l| l.starts_with("turn ")).collect();
    assert_eq!(reports.len(), 4, "{stdout}");
    for r in &reports {
        assert!(r.contains("descendants 0  workspaces 0  cgroups 0"), "{r}");
    }
    assert!(reports[3].contains("turn    200/200"), "{stdout}");
    // The hostile plugins really ran: some turns succeeded, some failed
    // (the crashes, floods and framing violations), one was cancelled.
    let last = reports[3];
    assert!(
        !last.contains("(succeeded 0,")
            && !last.contains("failed 0,")
            && !last.contains("cancelled 0,"),
        "{last}"
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
}
