//! The memory axis from the host's side, through the real host and the
//! real sandbox: on a host without a delegated memory controller the
//! report says the tree's memory is unbounded, names the kinds nothing
//! bounds and never claims `strong`; `requireMemoryBound = true` refuses
//! to start the runtime with the typed error naming the fix. The tmpfs
//! sizes hold: a plugin writing past its workspace, `/tmp` or `HOME` gets
//! `ENOSPC`, and the host is fine.

use std::io::Read;

use sharedos_host::executor::TurnError;
use sharedos_plugin_sdk::RuntimeError;
use sharedos_sandbox::{SandboxError, SandboxLevel, SandboxPolicy, SpawnSpec, spawn};
use sharedos_tests::bait::*;
use sharedos_tests::plugin_bin;

const MIB: u64 = 1 << 20;

#[test]
fn without_a_controller_the_report_says_unbounded_and_require_memory_bound_refuses() {
    let _serial = serial();
    if sharedos_sandbox::cgroup::memory_delegated() {
        // A host with a controller bounds the tree: the refusal cannot
        // be shown here, the bound can.
        let run = run_turn(TurnSpec::new(
            SandboxPolicy::default(),
            serde_json::json!({}),
        ));
        assert_eq!(run.level(), "strong", "{}", run.sandbox_report());
        return;
    }
    // The default policy runs, and says what is unbounded.
    let run =
        run_turn(TurnSpec::new(SandboxPolicy::default(), serde_json::json!({})).only(&["C10"]));
    let report = run.sandbox_report();
    assert_eq!(run.level(), "isolated", "{report}");
    let memory = &report["memory"];
    assert_eq!(
        memory["tree_bound_bytes"],
        serde_json::Value::Null,
        "{report}"
    );
    let unbounded: Vec<&str> = memory["unbounded"]
        .as_array()
        .unwrap_or_else(|| panic!("{report}"))
        .iter()
        .filter_map(|k| k.as_str())
        .collect();
    for kind in [
        "shared anonymous mappings",
        "socket buffers",
        "kernel objects",
    ] {
        assert!(
            unbounded.iter().any(|k| k.starts_with(kind)),
            "{kind} not named unbounded: {unbounded:?}"
        );
    }
    let missing = report["missing"].to_string();
    assert!(
        missing.contains("\"memory\"") && missing.contains("Delegate=yes"),
        "{missing}"
    );

    // requireMemoryBound (host.toml's `[runtimes.sandbox]`) refuses the
    // runtime before any plugin code runs: the helper checks the report
    // against the policy's minimums and ends the plugin's process before
    // its execve (a_sandbox_below_its_minimums_never_executes_the_plugin).
    let policy: SandboxPolicy = toml::from_str("requireMemoryBound = true").expect("the policy");
    assert!(policy.require_memory_bound);
    let run = run_turn(TurnSpec::new(policy, serde_json::json!({})).only(&["C10"]));
    assert_eq!(run.status(), "failed", "{}", run.json());
    assert_eq!(run.code().as_deref(), Some("runtime_failed"));
    let load: Vec<&String> = run
        .turn_errors
        .iter()
        .filter_map(|e| match e {
            TurnError::Runtime(RuntimeError::Load(m)) => Some(m),
            _ => None,
        })
        .collect();
    assert_eq!(load.len(), 1, "on_turn_error: {}", run.error_text());
    for part in [
        "sandbox.requireMemoryBound",
        "socket buffers",
        "kernel objects",
        "delegated cgroup v2 memory controller",
        "Delegate=yes",
    ] {
        assert!(load[0].contains(part), "{part:?} not in {}", load[0]);
    }
    assert!(
        run.receipts().is_empty(),
        "the plugin ran: {:?}",
        run.receipts()
    );
    assert!(run.survivors.is_empty(), "left: {:?}", run.survivors);
    assert!(
        run.leftover_cgroups.is_empty(),
        "left: {:?}",
        run.leftover_cgroups
    );
}

/// Writes 4 MiB past each tmpfs's 2 MiB size from inside the sandbox:
/// `/workspace` (the sandbox's own tmpfs), `/tmp` and `HOME`.
const FILL: &str = "for d in /workspace /tmp \"$HOME\"; do \
    if head -c 4194304 /dev/zero > \"$d/fill\" 2>/dev/null; then echo \"$d: wrote all\"; \
    else echo \"$d: $(wc -c < \"$d/fill\") bytes, then $(head -c 4194304 /dev/zero 2>&1 >> \"$d/fill\" | tail -n1)\"; fi; \
    done";

#[test]
fn a_plugin_writing_past_its_tmpfs_sizes_gets_enospc_and_the_host_is_fine() {
    let _serial = serial();
    let policy = SandboxPolicy {
        workspace_size_bytes: 2 * MIB,
        tmp_size_bytes: 2 * MIB,
        home_size_bytes: 2 * MIB,
        ..SandboxPolicy::default()
    };
    let spec = SpawnSpec {
        helper_exe: plugin_bin("sharedos"),
        program: "/bin/sh".into(),
        args: vec!["-c".into(), FILL.into()],
        env: vec![],
        policy,
        workspace: None,
    };
    let mut child = spawn(&spec).expect("spawn the sandbox");
    let rows = &child.report.memory.layers;
    let ws = rows.iter().find(|l| l.name == "tmpfs /workspace");
    assert_eq!(ws.and_then(|l| l.bytes), Some(2 * MIB), "{rows:?}");
    drop(child.stdin.take());
    let mut out = String::new();
    std::fs::File::from(child.stdout.take().unwrap())
        .read_to_string(&mut out)
        .unwrap();
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status}: {out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    for line in lines {
        let bytes: u64 = line
            .split_once(": ")
            .and_then(|(_, r)| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a write went through: {out}"));
        assert!(bytes <= 2 * MIB, "{line}");
        assert!(line.ends_with("No space left on device"), "{line}");
    }
    // The host is fine: the next sandbox starts and runs.
    let mut next = spawn(&SpawnSpec {
        args: vec!["-c".into(), "echo ok".into()],
        ..spec
    })
    .expect("a second sandbox");
    drop(next.stdin.take());
    let mut out = String::new();
    std::fs::File::from(next.stdout.take().unwrap())
        .read_to_string(&mut out)
        .unwrap();
    assert!(next.wait().expect("wait").success());
    assert_eq!(out.trim(), "ok");
}

#[test]
fn sandbox_check_runtime_says_a_required_memory_bound_is_missing() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("host.toml");
    let text = sharedos_tests::turns::testplugin_host_toml("check-memory", "sandbox", 30_000)
        .replace(
            "launcher = \"sandbox\"\n",
            "launcher = \"sandbox\"\nsandbox = { requireMemoryBound = true }\n",
        );
    std::fs::write(&config, text).unwrap();
    let out = std::process::Command::new(plugin_bin("sharedos"))
        .args([
            "sandbox",
            "check",
            "--runtime",
            "sharedos-testplugin",
            "--config",
        ])
        .arg(&config)
        .env_remove("SHAREDOS_LOG")
        .output()
        .expect("run sharedos sandbox check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    if sharedos_sandbox::cgroup::memory_delegated() {
        assert_eq!(out.status.code(), Some(0), "{stdout}");
        return;
    }
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let refused = stdout
        .lines()
        .find(|l| l.starts_with("refused: "))
        .unwrap_or_else(|| panic!("no refusal in\n{stdout}"));
    assert!(refused.contains("sandbox.requireMemoryBound"), "{refused}");
    assert!(refused.contains("kernel objects"), "{refused}");
}

/// The plugin's first act: a marker in its workspace, a host directory.
const MARKER: &str = ": > started";

#[test]
fn a_sandbox_below_its_minimums_never_executes_the_plugin() {
    let _serial = serial();
    if sharedos_sandbox::cgroup::memory_delegated() {
        // Both minimums can be met on a host with a controller.
        return;
    }
    let strong = SandboxPolicy {
        min_level: SandboxLevel::Strong,
        ..SandboxPolicy::default()
    };
    let bounded = SandboxPolicy {
        require_memory_bound: true,
        ..SandboxPolicy::default()
    };
    // Several times each: without the check in the helper, the plugin's
    // execve raced the host's check and the marker was written.
    for round in 0..8 {
        for policy in [&strong, &bounded] {
            let ws = tempfile::tempdir().expect("workspace");
            let spec = SpawnSpec {
                helper_exe: plugin_bin("sharedos"),
                program: "/bin/sh".into(),
                args: vec!["-c".into(), MARKER.into()],
                env: vec![],
                policy: policy.clone(),
                workspace: Some(ws.path().to_path_buf()),
            };
            let err = match spawn(&spec) {
                Ok(mut child) => {
                    let _ = child.wait();
                    panic!("round {round}: started below the minimum: {policy:?}");
                }
                Err(e) => e,
            };
            let text = err.to_string();
            match (&err, policy.require_memory_bound) {
                (SandboxError::BelowMinimum { required, .. }, false) => {
                    assert_eq!(*required, SandboxLevel::Strong);
                    assert!(text.contains("memory"), "{text}");
                }
                (SandboxError::MemoryUnbounded { unbounded }, true) => {
                    assert!(!unbounded.is_empty());
                    assert!(text.contains("sandbox.requireMemoryBound"), "{text}");
                }
                _ => panic!("round {round}: not the typed refusal: {err:?}"),
            }
            let marker = ws.path().join("started");
            assert!(
                !marker.exists(),
                "round {round}: the plugin ran before the refusal ({text})"
            );
        }
    }
}

/// Read from inside the sandbox: its network namespace's socket sysctls.
const NET_SYSCTLS: &str = "for f in ipv4/tcp_rmem ipv4/tcp_wmem core/optmem_max unix/max_dgram_qlen; \
    do printf '%s=' \"$f\"; tr -s '\\t' ' ' < /proc/sys/net/$f; done";

#[test]
fn the_sandbox_network_namespace_has_the_policy_socket_sysctls() {
    let _serial = serial();
    let mut policy = SandboxPolicy::default();
    // Values no kernel defaults to, so a value seen inside is the policy's.
    policy.net.tcp_rmem = Some([4096, 32_768, 786_432]);
    policy.net.unix_max_dgram_qlen = Some(7);
    let spec = SpawnSpec {
        helper_exe: plugin_bin("sharedos"),
        program: "/bin/sh".into(),
        args: vec!["-c".into(), NET_SYSCTLS.into()],
        env: vec![],
        policy,
        workspace: None,
    };
    let mut child = spawn(&spec).expect("spawn the sandbox");
    drop(child.stdin.take());
    let mut out = String::new();
    std::fs::File::from(child.stdout.take().unwrap())
        .read_to_string(&mut out)
        .unwrap();
    let report = child.report.clone();
    assert!(child.wait().expect("wait").success(), "{out}");
    let seen: Vec<&str> = out.lines().collect();
    assert_eq!(
        seen,
        [
            "ipv4/tcp_rmem=4096 32768 786432",
            "ipv4/tcp_wmem=4096 16384 1048576",
            "core/optmem_max=20480",
            "unix/max_dgram_qlen=7",
        ],
        "{out}"
    );
    // The report says what was written, in the memory axis' socket row.
    assert!(report.net_limits_status.is_enforced(), "{report:?}");
    assert_eq!(
        report.net_limits.get("ipv4/tcp_rmem").map(String::as_str),
        Some("4096 32768 786432")
    );
    let row = report
        .memory
        .layers
        .iter()
        .find(|l| l.name.starts_with("socket buffers"))
        .expect("the socket row");
    for part in [
        "net.ipv4.tcp_rmem 4096 32768 786432",
        "net.unix.max_dgram_qlen 7",
    ] {
        assert!(row.detail.contains(part), "{part:?} not in {}", row.detail);
    }
}
