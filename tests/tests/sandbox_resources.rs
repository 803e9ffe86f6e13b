//! Resource exhaustion (sandbox.md C30–C35) through the whole host, one
//! bounded turn each (fork ≤ 300, allocation ≤ 1 GiB here, fills ≤ 64 MiB):
//! the layer of sandbox.md C stops each attack, the turn completes, the
//! host process's memory does not move, and nothing is left (processes,
//! workspace, cgroup). Limits are tightened in the runtime's policy so the
//! attacks hit them quickly.

use std::time::Duration;

use serde_json::{Value, json};
use sharedos_sandbox::SandboxPolicy;
use sharedos_tests::bait::*;

fn resource_turn(id: &str, policy: SandboxPolicy, bait: Value) -> (TurnRun, Value) {
    let _serial = serial();
    let (hwm0, _) = memory_kib();
    let run = run_turn(TurnSpec::new(policy, bait).only(&[id]).timeout_ms(30_000));
    let (hwm1, _) = memory_kib();
    let label = format!(
        "{id} ({} {:?}; {})",
        run.status(),
        run.code(),
        run.error_text()
    );
    assert_eq!(run.status(), "succeeded", "{label}");
    assert_eq!(run.level(), sharedos_tests::full_level(), "{label}");
    assert!(
        run.elapsed < Duration::from_secs(30),
        "{label}: {:?}",
        run.elapsed
    );
    assert!(
        hwm1.saturating_sub(hwm0) < 256 * 1024,
        "{label}: host VmHWM grew by {} KiB",
        hwm1.saturating_sub(hwm0)
    );
    assert!(
        run.survivors.is_empty(),
        "{label}: survivors {:?}",
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
    let receipt = run.receipts().get(id).cloned().unwrap_or(Value::Null);
    eprintln!("{id}: {} in {:?}", receipt["observed"], run.elapsed);
    (run, receipt)
}

fn stopped(receipt: &Value, id: &str, layer: &str, needle: &str) {
    assert_eq!(receipt["attempted"], true, "{id}: {receipt}");
    assert_eq!(
        receipt["blocked"], true,
        "{id} must be stopped by {layer}: {}",
        receipt["observed"]
    );
    let observed = receipt["observed"].as_str().unwrap_or_default();
    assert!(
        observed.contains(needle),
        "{id} must be stopped by {layer} ({needle}): {observed}"
    );
}

#[test]
fn c30_fork_bomb_stops_at_nproc() {
    let mut policy = SandboxPolicy::default();
    policy.rlimits.nproc = Some(64);
    let (_, r) = resource_turn("C30", policy, json!({"fork_count": 300}));
    stopped(
        &r,
        "C30 fork-bomb",
        "RLIMIT_NPROC (non-root uid) / cgroup pids.max",
        "EAGAIN",
    );
}

#[test]
fn c31_memory_bomb_stops_at_rlimit_data() {
    let mut policy = SandboxPolicy::default();
    policy.rlimits.data = Some(256 << 20);
    let (_, r) = resource_turn("C31", policy, json!({"alloc_mib": 1024}));
    stopped(&r, "C31 memory-bomb", "RLIMIT_DATA", "ENOMEM");
}

#[test]
fn c32_workspace_fill_stops_at_rlimit_fsize() {
    let mut policy = SandboxPolicy::default();
    policy.rlimits.fsize = Some(16 << 20);
    let (_, r) = resource_turn("C32", policy, json!({"fill_mib": 64}));
    stopped(&r, "C32 disk-fill-workspace", "RLIMIT_FSIZE", "EFBIG");
}

#[test]
fn c33_tmp_and_dev_shm_fill_stop_at_the_tmpfs_caps() {
    let policy = SandboxPolicy {
        tmp_size_bytes: 16 << 20,
        shm_size_bytes: 8 << 20,
        ..SandboxPolicy::default()
    };
    let (_, r) = resource_turn("C33", policy, json!({"fill_mib": 64}));
    stopped(
        &r,
        "C33 disk-fill-tmp-and-dev-shm",
        "tmpfs size caps",
        "ENOSPC",
    );
}

#[test]
fn c34_inode_exhaustion_stops_at_the_tmpfs_inode_cap() {
    // Aimed at the private /tmp (`workspace` is where the attack makes its
    // files): the tmpfs `nr_inodes` cap stops it.
    let policy = SandboxPolicy {
        tmpfs_nr_inodes: 2048,
        ..SandboxPolicy::default()
    };
    let (_, r) = resource_turn(
        "C34",
        policy,
        json!({"inode_count": 5000, "workspace": "/tmp"}),
    );
    stopped(
        &r,
        "C34 inode-exhaustion (/tmp)",
        "tmpfs nr_inodes",
        "ENOSPC",
    );
}

#[test]
fn c34_inode_exhaustion_of_the_workspace_stops_at_its_tmpfs_inode_cap() {
    // The workspace is a tmpfs of the sandbox's own (sandbox.md C34), with
    // the same inode cap as /tmp.
    let policy = SandboxPolicy {
        tmpfs_nr_inodes: 2048,
        ..SandboxPolicy::default()
    };
    let (_, r) = resource_turn("C34", policy, json!({"inode_count": 5000}));
    stopped(
        &r,
        "C34 inode-exhaustion (workspace)",
        "tmpfs nr_inodes",
        "ENOSPC",
    );
}

#[test]
fn c35_fd_exhaustion_stops_at_rlimit_nofile() {
    let (_, r) = resource_turn("C35", SandboxPolicy::default(), json!({"fd_count": 65536}));
    stopped(&r, "C35 fd-exhaustion", "RLIMIT_NOFILE", "EMFILE");
}
