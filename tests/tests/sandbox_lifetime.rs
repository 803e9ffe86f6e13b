//! Outliving the turn (sandbox.md C36–C40) through the whole host: every
//! process of the turn dies with it, whether it spins or sleeps through the
//! abort, double-forks into a daemon, starts its own process group, or
//! clears its parent-death signal and waits for the host to die. Checked on
//! the host by scanning `/proc` for this test's plugin marker (every process
//! of the tree keeps it in its cmdline, wherever it was reparented) and for
//! descendants of the test process; nothing is ever killed by name.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use sharedos_sandbox::{LayerToggles, SandboxLevel, SandboxPolicy};
use sharedos_tests::bait::*;

const MARGIN: Duration = Duration::from_secs(5);

fn lifetime_turn(id: &str, policy: SandboxPolicy, timeout_ms: u64) -> TurnRun {
    let _serial = serial();
    let run = run_turn(
        TurnSpec::new(policy, json!({"hang_secs": 120}))
            .only(&[id])
            .timeout_ms(timeout_ms),
    );
    let label = format!(
        "{id} ({} {:?}; {})",
        run.status(),
        run.code(),
        run.error_text()
    );
    attempted(&run.receipts(), id, "host deadline + pidns kill");
    assert!(
        run.elapsed <= Duration::from_millis(timeout_ms) + MARGIN,
        "{label}: the turn took {:?}, past its {timeout_ms} ms deadline",
        run.elapsed
    );
    assert!(
        run.survivors.is_empty(),
        "{label}: processes of the turn survived it: {:?}",
        run.survivors
    );
    assert!(
        run.leftover_workspaces.is_empty(),
        "{label}: {:?}",
        run.leftover_workspaces
    );
    assert!(
        run.leftover_cgroups.is_empty(),
        "{label}: {:?}",
        run.leftover_cgroups
    );
    run
}

fn ended_at_the_deadline(run: &TurnRun, id: &str, timeout_ms: u64) {
    assert!(
        run.status() == "cancelled" || run.code().as_deref() == Some("runtime_failed"),
        "{id}: {} {:?}",
        run.status(),
        run.code()
    );
    assert!(
        run.elapsed >= Duration::from_millis(timeout_ms - 100),
        "{id}: ended before its deadline ({:?}): {}",
        run.elapsed,
        run.error_text()
    );
}

#[test]
fn c36_cpu_spin_ignoring_the_abort_is_killed_at_the_deadline() {
    let run = lifetime_turn("C36", SandboxPolicy::default(), 3000);
    ended_at_the_deadline(
        &run,
        "C36 cpu-spin-ignoring-abort (host deadline + pidns kill)",
        3000,
    );
}

#[test]
fn c37_sleep_ignoring_the_abort_is_killed_at_the_deadline() {
    let run = lifetime_turn("C37", SandboxPolicy::default(), 3000);
    ended_at_the_deadline(
        &run,
        "C37 sleep-ignoring-abort (host deadline → helper → pidns)",
        3000,
    );
}

#[test]
fn c38_double_fork_daemon_dies_with_the_turn() {
    let run = lifetime_turn("C38", SandboxPolicy::default(), 5000);
    // The plugin completes; its setsid'd grandchild must not outlive the
    // turn (pidns: pid 1 dies → the namespace is SIGKILLed; cgroup.kill).
    assert_eq!(run.status(), "succeeded", "C38: {}", run.error_text());
    let r = run.receipts();
    assert!(
        r["C38"]["observed"]
            .as_str()
            .unwrap()
            .contains("daemon pid"),
        "C38: {}",
        r["C38"]
    );
}

#[test]
fn c39_new_process_group_dies_with_the_turn() {
    let run = lifetime_turn("C39", SandboxPolicy::default(), 5000);
    assert_eq!(run.status(), "succeeded", "C39: {}", run.error_text());
}

#[test]
fn c38_c39_without_a_pid_namespace_the_subreaper_and_cgroup_still_kill_the_daemons() {
    // min_level minimal: the no-pidns level bug (sandbox_degraded
    // `no_pidns_reports_reduced`) must not hide this path.
    let policy = SandboxPolicy {
        min_level: SandboxLevel::Minimal,
        layers: LayerToggles {
            pidns: false,
            ..LayerToggles::default()
        },
        ..SandboxPolicy::default()
    };
    for id in ["C38", "C39"] {
        let run = lifetime_turn(id, policy.clone(), 5000);
        assert_eq!(
            run.status(),
            "succeeded",
            "{id} without pidns: {}",
            run.error_text()
        );
    }
}

/// Without a pid namespace and without a cgroup (a host that is not root
/// and has no delegated cgroup; here the cgroup is switched off), pid 1's
/// subreaper alone still kills a double-forked and a `setsid` daemon: it
/// lists its adopted children through the host's `/proc`, since the
/// sandbox's own is empty without a pid namespace.
#[test]
fn c38_c39_without_a_pid_namespace_or_a_cgroup_the_subreaper_kills_the_daemons() {
    let mut policy = SandboxPolicy {
        min_level: SandboxLevel::Minimal,
        layers: LayerToggles {
            pidns: false,
            ..LayerToggles::default()
        },
        ..SandboxPolicy::default()
    };
    policy.cgroup.enabled = false;
    for id in ["C38", "C39"] {
        let run = lifetime_turn(id, policy.clone(), 5000);
        assert_eq!(
            run.status(),
            "succeeded",
            "{id} without pidns or cgroup: {}",
            run.error_text()
        );
    }
}

#[test]
fn c41b_without_a_pid_namespace_the_grandchild_holding_stdout_dies() {
    // The plugin exits and leaves a setsid'd grandchild holding its stdio:
    // without a pid namespace, pid 1 (a subreaper) and the cgroup must
    // still kill it, and the host must not wait for it.
    let policy = SandboxPolicy {
        min_level: SandboxLevel::Minimal,
        layers: LayerToggles {
            pidns: false,
            ..LayerToggles::default()
        },
        ..SandboxPolicy::default()
    };
    let run = lifetime_turn("C41b", policy, 5000);
    assert_eq!(
        run.code().as_deref(),
        Some("runtime_failed"),
        "C41b without pidns: {} {}",
        run.status(),
        run.error_text()
    );
    assert!(
        run.elapsed < Duration::from_millis(4500),
        "C41b without pidns: the host waited for the grandchild ({:?})",
        run.elapsed
    );
}

#[test]
fn reduced_level_without_user_namespaces_still_kills_every_escape() {
    // No namespaces at all (a host without user namespaces, emulated): the
    // tree kill relies on the cgroup and pid 1 as a subreaper.
    let policy = SandboxPolicy {
        min_level: SandboxLevel::Reduced,
        emulate_no_userns: true,
        ..SandboxPolicy::default()
    };
    for id in ["C38", "C39"] {
        let run = lifetime_turn(id, policy.clone(), 5000);
        assert_eq!(run.level(), "reduced", "{id}");
        assert_eq!(
            run.status(),
            "succeeded",
            "{id} reduced: {}",
            run.error_text()
        );
    }
    let run = lifetime_turn("C41b", policy.clone(), 5000);
    assert_eq!(
        run.code().as_deref(),
        Some("runtime_failed"),
        "C41b reduced"
    );
    let run = lifetime_turn("C37", policy, 3000);
    ended_at_the_deadline(
        &run,
        "C37 sleep-ignoring-abort (reduced: cgroup kill)",
        3000,
    );
}

#[test]
fn c40_plugin_that_clears_pdeathsig_dies_at_the_deadline() {
    let run = lifetime_turn("C40", SandboxPolicy::default(), 3000);
    ended_at_the_deadline(&run, "C40 outlive-the-host (deadline)", 3000);
}

/// C40 for real: the host itself (`sharedos run`, a child of this test)
/// is SIGKILLed mid-turn while the plugin, with its parent-death signal
/// cleared and SIGTERM ignored, sleeps. The lifeline (control-socket EOF,
/// PDEATHSIG re-armed on the helper and pid 1) and the pid namespace must
/// take the whole tree down.
#[test]
fn c40_host_death_takes_the_plugin_down() {
    host_death("");
}

/// The same without any namespace (a host without user namespaces,
/// emulated): the lifeline, the cgroup and pid 1 as a subreaper must do
/// what the pid namespace did.
#[test]
fn c40_host_death_takes_the_plugin_down_at_the_reduced_level() {
    host_death(r#"sandbox = { emulateNoUserns = true, minLevel = "reduced" }"#);
}

fn host_death(runtime_keys: &str) {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("host.toml");
    let request_file = dir.path().join("turn.json");
    std::fs::write(&config, host_config_text_with(runtime_keys)).unwrap();
    let spec = TurnSpec::new(SandboxPolicy::default(), json!({"hang_secs": 120}))
        .only(&["C40"])
        .timeout_ms(60_000);
    std::fs::write(&request_file, request(&spec, 9000).to_string()).unwrap();
    /// Our `sharedos run` child, SIGKILLed and reaped on every way out.
    struct Host(std::process::Child);
    impl Drop for Host {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut host = Command::new(helper_exe())
        .arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--request")
        .arg(&request_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Host)
        .expect("start sharedos run");
    // Wait for the plugin to have renamed itself: it is past its receipt
    // and sleeping with PDEATHSIG cleared.
    let end = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while Instant::now() < end {
        seen = marked_processes();
        if seen.iter().any(|(_, comm)| comm == "sdos-adv-c40") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        seen.iter().any(|(_, comm)| comm == "sdos-adv-c40"),
        "C40: the plugin never reached its hang: {seen:?}"
    );
    eprintln!("C40 [{runtime_keys}]: before the kill: {seen:?}");
    // SIGKILL the host (our own child, by its pid) and reap it.
    host.0.kill().unwrap();
    host.0.wait().unwrap();
    let end = Instant::now() + MARGIN;
    let mut left = marked_processes();
    while !left.is_empty() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
        left = marked_processes();
    }
    // The dead host could not remove its workspace; this test does.
    for ws in leftover_workspaces() {
        let _ = std::fs::remove_dir_all(ws);
    }
    assert!(
        left.is_empty(),
        "C40 outlive-the-host: plugin processes survived the host's death (lifeline + PDEATHSIG chain + pidns): {left:?}"
    );
    let desc = survivors();
    assert!(desc.is_empty(), "C40: processes left: {desc:?}");
}
