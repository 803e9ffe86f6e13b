//! Real processes: the sandbox's policy and its level. Disabled layers
//! lower the level, `min_level` refuses below it, a missing user namespace
//! degrades to reduced, exec failures and a symlinked workspace are
//! reported, `check` names every layer, the policy's TOML form, timings.

// Tests tweak one field of the default policy at a time, which reads best
// as an assignment.
#![allow(clippy::field_reassign_with_default)]

mod common;

use std::time::Duration;

use common::*;
use sharedos_sandbox::{LayerStatus, SandboxError, SandboxLevel, SandboxPolicy, spawn};

#[test]
fn disabling_layers_lowers_the_level() {
    let mut policy = SandboxPolicy::default();
    policy.min_level = SandboxLevel::Minimal;
    policy.layers.landlock = false;
    let (report, _, _) = run(policy, &["status"]);
    assert!(report.level < SandboxLevel::Strong);
    assert_eq!(report.landlock.status, LayerStatus::Disabled);
    assert!(report.missing.iter().any(|m| m.layer == "landlock"));

    // Without a pid namespace the minimal root still holds (no /proc).
    let mut policy = SandboxPolicy::default();
    policy.min_level = SandboxLevel::Minimal;
    policy.layers.pidns = false;
    let (report, out, _) = run(policy, &["uid", "read:/etc/shadow"]);
    assert!(report.level < SandboxLevel::Strong);
    assert_eq!(report.root, LayerStatus::Applied);
    assert_eq!(report.pidns, LayerStatus::Disabled);
    assert!(is_sandbox_uid(&ok(&out, "uid")), "{out}");
    assert!(ok(&out, "read:/etc/shadow").starts_with("err:"));

    let mut policy = SandboxPolicy::default();
    policy.min_level = SandboxLevel::Minimal;
    policy.layers.seccomp = false;
    let (report, out, _) = run(policy, &["status", "socket:inet"]);
    assert_eq!(report.level, SandboxLevel::Minimal);
    assert!(ok(&out, "status").contains("Seccomp: 0"));
}

#[test]
fn min_level_refuses_below_the_minimum() {
    let ws = workspace();
    let mut policy = SandboxPolicy::default();
    policy.layers.landlock = false; // min_level stays `isolated`
    let token = format!("daemon:refused-{}", std::process::id());
    let err = spawn(&spec(ws.path(), policy, std::slice::from_ref(&token))).unwrap_err();
    match &err {
        SandboxError::BelowMinimum {
            required,
            achieved,
            missing,
        } => {
            assert_eq!(*required, SandboxLevel::Isolated);
            assert!(achieved < required);
            let ll = missing.iter().find(|m| m.layer == "landlock").unwrap();
            assert!(ll.reason.contains("disabled"));
            assert!(!ll.fix.is_empty());
        }
        other => panic!("expected BelowMinimum, got {other}"),
    }
    assert!(err.to_string().contains("landlock"));
    // Nothing of the refused plugin survives.
    assert!(eventually(Duration::from_secs(10), || pids_with_token(
        &token
    )
    .is_empty()));
}

#[test]
fn no_user_namespace_degrades_to_reduced() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "s3cret").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let read_secret = format!("read:{}", secret.display());
    let write_host = format!("write:{}", dir.path().join("pwned").display());

    let mut policy = SandboxPolicy::default();
    policy.emulate_no_userns = true;
    policy.min_level = SandboxLevel::Reduced;
    let ws = workspace();
    let (report, out, _) = run_in(
        &ws,
        policy.clone(),
        &[
            "status",
            "uid",
            &read_secret,
            &write_host,
            "write:/tmp/pwned-by-degraded",
            "socket:unix",
            "socket:inet",
            "socket:vsock",
        ],
    );
    assert_eq!(report.level, SandboxLevel::Reduced, "{:?}", report.missing);
    assert!(matches!(report.userns, LayerStatus::Unavailable { .. }));
    assert_eq!(report.seccomp.mode, "strict");
    assert!(report.missing.iter().any(|m| m.layer == "userns"));
    assert!(is_sandbox_uid(&ok(&out, "uid")), "{out}");
    assert!(ok(&out, "status").contains("Seccomp: 2"));
    // Landlock is the filesystem boundary now.
    assert!(ok(&out, &read_secret).starts_with("err:"), "{out}");
    assert!(ok(&out, &write_host).starts_with("err:"), "{out}");
    assert!(!dir.path().join("pwned").exists());
    assert!(ok(&out, "write:/tmp/pwned-by-degraded").starts_with("err:"));
    assert!(!std::path::Path::new("/tmp/pwned-by-degraded").exists());
    // Strict seccomp: no socket() at all.
    let eperm = format!("err:{}", libc::EPERM);
    for op in ["socket:unix", "socket:inet", "socket:vsock"] {
        assert_eq!(ok(&out, op), eperm, "{op}");
    }

    // The same host with the default minimum refuses the plugin.
    policy.min_level = SandboxLevel::Isolated;
    let ws = workspace();
    let err = spawn(&spec(ws.path(), policy, &["status".into()])).unwrap_err();
    assert!(
        matches!(
            err,
            SandboxError::BelowMinimum {
                achieved: SandboxLevel::Reduced,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn exec_failure_is_reported() {
    let ws = workspace();
    let not_exec = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(not_exec.path(), "not a program").unwrap();
    let mut s = spec(ws.path(), SandboxPolicy::default(), &[]);
    s.program = not_exec.path().to_path_buf();
    match spawn(&s) {
        Err(SandboxError::Setup { stage, .. }) => assert!(stage == "exec" || stage == "paths"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a non-executable program was started"),
    }
}

/// A prepared sandbox whose `execve` fails at its start: the start says
/// so, and the tree is gone.
#[test]
fn exec_failure_of_a_prepared_sandbox_is_reported_at_start() {
    let ws = workspace();
    let not_exec = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(not_exec.path(), "not a program").unwrap();
    let mut s = spec(ws.path(), SandboxPolicy::default(), &[]);
    s.program = not_exec.path().to_path_buf();
    let prepared = sharedos_sandbox::prepare(&s).expect("every layer builds");
    let helper = prepared.pid();
    match prepared.start() {
        Err(SandboxError::Setup { stage, .. }) => assert_eq!(stage, "exec"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a non-executable program was started"),
    }
    assert!(eventually(Duration::from_secs(10), || is_dead(helper)));
}

#[test]
fn symlinked_workspace_is_refused() {
    let ws = workspace();
    let link_dir = tempfile::tempdir().unwrap();
    let link = link_dir.path().join("ws");
    std::os::unix::fs::symlink(ws.path(), &link).unwrap();
    let mut s = spec(ws.path(), SandboxPolicy::default(), &[]);
    s.workspace = Some(link);
    assert!(matches!(spawn(&s), Err(SandboxError::BadPath { .. })));
}

#[test]
fn check_reports_every_layer_and_the_level() {
    let mut out = Vec::new();
    let level = sharedos_sandbox::check::check_with(&helper(), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(level, full_level(), "{text}");
    for layer in [
        "userns", "mountns", "pidns", "netns", "landlock", "seccomp", "caps", "rlimits", "cgroup",
    ] {
        assert!(text.contains(layer), "{layer} missing from:\n{text}");
    }
    assert!(
        text.contains(&format!("level: {}\n", full_level())),
        "{text}"
    );
    // The memory section names each kind and what holds it, and, without
    // a controller, what is unbounded.
    for kind in [
        "pipe buffers",
        "socket buffers",
        "kernel objects",
        "tmpfs /tmp",
    ] {
        assert!(text.contains(kind), "{kind} missing from:\n{text}");
    }
    if !sharedos_sandbox::cgroup::memory_delegated() {
        assert!(text.contains("unbounded the whole tree"), "{text}");
        assert!(text.contains("missing memory: "), "{text}");
    }
}

#[test]
fn policy_round_trips_through_toml() {
    let toml_text = r#"
        minLevel = "reduced"
        tmpSizeBytes = 1048576
        [layers]
        netns = false
        [rlimits]
        nofile = 512
        [cgroup]
        pidsMax = 64
    "#;
    let p: SandboxPolicy = toml::from_str(toml_text).unwrap();
    assert_eq!(p.min_level, SandboxLevel::Reduced);
    assert!(!p.layers.netns && p.layers.userns);
    assert_eq!(p.rlimits.nofile, Some(512));
    assert_eq!(p.rlimits.core, Some(0));
    assert_eq!(p.cgroup.pids_max, Some(64));
    let back: SandboxPolicy = toml::from_str(&toml::to_string(&p).unwrap()).unwrap();
    assert_eq!(back, p);
    assert_eq!(
        toml::from_str::<SandboxPolicy>("").unwrap(),
        SandboxPolicy::default()
    );
    assert!(toml::from_str::<SandboxPolicy>("min_level = \"strong\"").is_err());
}

#[test]
fn timings_are_recorded_only_when_asked() {
    let (report, _, _) = run(SandboxPolicy::default(), &["uid"]);
    assert!(report.timings_us.is_empty());
    let mut policy = SandboxPolicy::default();
    policy.timings = true;
    let (report, _, _) = run(policy, &["uid"]);
    let t = &report.timings_us;
    assert!(t.windows(2).all(|w| w[0].us <= w[1].us), "{t:?}");
    let last = t.last().unwrap();
    assert!(last.stage.starts_with("report_eof") && last.process == "host");
    for p in ["host", "helper", "pid1", "plugin"] {
        assert!(t.iter().any(|s| s.process == p), "{p}: {t:?}");
    }
}
