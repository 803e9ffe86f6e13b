//! Issue 14, items 3 and 4, through the real sandbox: the adversary runs
//! `--standalone` as the sandboxed plugin, takes what it can and holds it
//! while the host measures from `/proc`.
//!
//! - C31b: shared anonymous memory, SysV shm, POSIX shm in /dev/shm, a
//!   memfd and a tmpfs file each stop at their bound, and the memory the
//!   host sees held (the tree's anonymous memory plus the growth of the
//!   system's `Shmem`) stays under the sum of the bounds.
//! - C35b: one sandbox holding every inotify instance and queued signal it
//!   can get leaves a second, concurrent sandbox its own, and host
//!   processes theirs.

use std::io::{BufRead, BufReader};
use std::time::Duration;

use serde_json::{Value, json};
use sharedos_sandbox::{SandboxPolicy, SandboxedChild, SpawnSpec, spawn};
use sharedos_tests::{plugin_bin, serial};

const MIB: u64 = 1 << 20;

struct Held {
    child: SandboxedChild,
    receipt: Value,
    plugin: i32,
    _ws: tempfile::TempDir,
}

/// The adversary running `attack` in a sandbox, its receipt read (what it
/// got is held until the tree is killed).
fn hold(policy: SandboxPolicy, attack: &str, bait: Value) -> Held {
    let ws = tempfile::Builder::new()
        .prefix("sharedos-bounds-")
        .tempdir()
        .unwrap();
    let mut child = spawn(&SpawnSpec {
        helper_exe: plugin_bin("sharedos"),
        program: plugin_bin("sharedos-adversary"),
        args: [
            "--standalone",
            "--only",
            attack,
            "--bait-json",
            &bait.to_string(),
        ]
        .map(Into::into)
        .to_vec(),
        env: vec![],
        policy,
        workspace: Some(ws.path().to_path_buf()),
    })
    .expect("spawn the adversary");
    let mut out = BufReader::new(std::fs::File::from(child.stdout.take().unwrap()));
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let receipt: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
    std::mem::forget(out); // keep the pipe open while the attack holds
    let plugin = *tree(child.pid).last().expect("the plugin process");
    Held {
        child,
        receipt,
        plugin,
        _ws: ws,
    }
}

/// `pid` and its descendants, parents first.
fn tree(pid: i32) -> Vec<i32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        let p = all[i];
        for task in std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten()
        {
            let Ok(task) = task else { continue };
            let kids = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            all.extend(
                kids.split_whitespace()
                    .filter_map(|k| k.parse::<i32>().ok()),
            );
        }
        i += 1;
    }
    all
}

fn kib_field(text: &str, field: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn shmem_bytes() -> u64 {
    kib_field(&std::fs::read_to_string("/proc/meminfo").unwrap(), "Shmem:") * 1024
}

fn observed(r: &Value) -> String {
    r["observed"].as_str().unwrap_or_default().to_string()
}

#[test]
fn c31b_every_kind_of_memory_stops_at_its_bound_and_the_tree_stays_under_it() {
    if !sharedos_tests::needs_root(
        "sandbox_bounds::c31b_every_kind_of_memory_stops_at_its_bound_and_the_tree_stays_under_it",
        "SysV segments are bounded by the ipc namespace's shmall, which only a root host can write (a sandbox of a host that is not root reports them unbounded)",
    ) {
        return;
    }
    let _serial = serial();
    let mut policy = SandboxPolicy::default();
    policy.rlimits.address_space = Some(256 * MIB);
    policy.rlimits.fsize = Some(128 * MIB);
    policy.ipc.shmall_bytes = Some(32 * MIB);
    policy.tmp_size_bytes = 64 * MIB;
    policy.shm_size_bytes = 32 * MIB;
    // The worst case: memfd allowed (the default refuses memfd_create, see
    // `sandbox_check_states_...`), bounded per file by RLIMIT_FSIZE.
    policy.memfd_create = sharedos_sandbox::MemfdPolicy::AllowNoExec;
    let bound = 256 * MIB + 32 * MIB + 64 * MIB + 32 * MIB + 128 * MIB;
    let shmem0 = shmem_bytes();
    let mut h = hold(policy, "C31b", json!({"alloc_mib": 1024, "hang_secs": 300}));
    let o = observed(&h.receipt);
    assert_eq!(h.receipt["blocked"], true, "{o}");
    for stop in [
        "shared-anonymous: ",
        "mmap ENOMEM",
        "shmget ENOSPC",
        "posix-shm: ",
        "memfd: 128 of 1024 MiB, then write EFBIG",
        "tmpfs-file: ",
    ] {
        assert!(o.contains(stop), "missing {stop:?} in {o}");
    }
    assert!(!o.contains("all 1024 MiB"), "{o}");
    // Host side: what the tree holds now, with the attack waiting.
    let anon: u64 = tree(h.child.pid)
        .iter()
        .map(|p| {
            let t = std::fs::read_to_string(format!("/proc/{p}/smaps_rollup")).unwrap_or_default();
            kib_field(&t, "Anonymous:") * 1024
        })
        .sum();
    let held = anon + shmem_bytes().saturating_sub(shmem0);
    eprintln!(
        "C31b: {o}\nheld {} MiB, bound {} MiB",
        held / MIB,
        bound / MIB
    );
    assert!(
        held > 128 * MIB,
        "the measure must see the held memory: {held}"
    );
    assert!(
        held < bound + 64 * MIB,
        "the tree holds {} MiB, over the bound of {} MiB",
        held / MIB,
        bound / MIB
    );
    let mem = &h.child.report.memory;
    assert_eq!(mem.per_process_bytes, Some(256 * MIB));
    // Only a memory controller bounds the tree as a whole (socket buffers
    // and kernel objects have no other bound); the report says so.
    let delegated = sharedos_sandbox::cgroup::memory_delegated();
    assert_eq!(mem.tree_bound_bytes.is_some(), delegated, "{mem:?}");
    if !delegated {
        assert!(
            mem.unbounded
                .iter()
                .any(|k| k.starts_with("socket buffers")),
            "{mem:?}"
        );
    }
    assert_eq!(
        h.child.report.ipc_limits.get("shmall"),
        Some(&(32 * MIB / 4096))
    );
    h.child.kill_tree();
    h.child.wait().unwrap();
    // The memory went with the tree (the ipc namespace and tmpfs included).
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while shmem_bytes() > shmem0 + 64 * MIB && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(shmem_bytes() <= shmem0 + 64 * MIB, "Shmem stayed up");
}

fn status_field(pid: i32, field: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field).map(|v| v.trim().to_string()))
        .unwrap_or_default()
}

/// Inotify instances `pid` holds, and its queued signals (`SigQ` numerator).
fn counters(pid: i32) -> (usize, u64) {
    let inotify = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t.to_string_lossy() == "anon_inode:inotify")
        .count();
    let sigq = status_field(pid, "SigQ:");
    let queued = sigq.split('/').next().unwrap_or("0").parse().unwrap_or(0);
    (inotify, queued)
}

/// A host process (root) still gets an inotify instance and queues a signal.
fn host_still_gets_its_own() {
    let out = std::process::Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import ctypes,os,signal\n\
             fd=ctypes.CDLL(None,use_errno=True).inotify_init1(0)\n\
             assert fd>=0, ctypes.get_errno()\n\
             signal.pthread_sigmask(signal.SIG_BLOCK,[signal.SIGRTMIN])\n\
             os.kill(os.getpid(),signal.SIGRTMIN)\n\
             q=[l for l in open('/proc/self/status') if l.startswith('SigQ:')][0]\n\
             assert int(q.split()[1].split('/')[0])>=1, q\n\
             print('ok')",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ok",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn second_sandbox_unaffected(policy: SandboxPolicy, inotify_max: usize, sigq_max: u64) {
    let bait = json!({"fd_count": 200_000, "hang_secs": 300});
    let mut a = hold(policy.clone(), "C35b", bait.clone());
    let got_a = counters(a.plugin);
    assert_eq!(
        got_a,
        (inotify_max, sigq_max),
        "A: {}",
        observed(&a.receipt)
    );
    assert_eq!(a.receipt["blocked"], true, "{}", observed(&a.receipt));
    let mut b = hold(policy, "C35b", bait);
    let got_b = counters(b.plugin);
    assert_eq!(
        got_b,
        got_a,
        "B, while A holds its share: {}",
        observed(&b.receipt)
    );
    assert_ne!(a.child.own_uid(), b.child.own_uid());
    host_still_gets_its_own();
    for h in [&mut a, &mut b] {
        h.child.kill_tree();
        h.child.wait().unwrap();
    }
}

#[test]
fn c35b_inotify_and_queued_signals_stop_at_the_sandbox_ceilings_and_spare_the_next() {
    if !sharedos_tests::needs_root(
        "sandbox_bounds::c35b_inotify_and_queued_signals_stop_at_the_sandbox_ceilings_and_spare_the_next",
        "separating two sandboxes' per-user counts needs a uid of their own each, which only a root host gives",
    ) {
        return;
    }
    let _serial = serial();
    // The policy's per-namespace ceiling and RLIMIT_SIGPENDING.
    let policy = SandboxPolicy::default();
    let ino = policy.ceilings.max_inotify_instances.unwrap() as usize;
    let sig = policy.rlimits.sigpending.unwrap();
    second_sandbox_unaffected(policy, ino, sig);
}

#[test]
fn c35b_without_ceilings_the_per_uid_limits_still_separate_sandboxes() {
    if !sharedos_tests::needs_root(
        "sandbox_bounds::c35b_without_ceilings_the_per_uid_limits_still_separate_sandboxes",
        "per-uid limits separate sandboxes only when each has a uid of its own, which only a root host gives",
    ) {
        return;
    }
    let _serial = serial();
    // No ceilings: the host's per-uid limits bind, per sandbox uid. With a
    // uid shared between sandboxes the second would get nothing.
    let mut policy = SandboxPolicy::default();
    policy.ceilings.max_inotify_instances = None;
    policy.rlimits.sigpending = Some(4096);
    let per_uid: usize = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    second_sandbox_unaffected(policy, per_uid, 4096);
}
