//! Issue 28, item 3's bounded case, in a microVM: the adversary's C31c
//! kinds (shared mappings, SysV, memfd, the tmpfs mounts and the
//! workspace, pipes, unix socket queues, processes; each asking 160 MiB,
//! 1.6 GiB in all) run in a guest of 256 MiB while the host watches
//! QEMU's resident memory and the system's `MemAvailable` from `/proc`.
//! Whatever the guest does, the host never sees QEMU hold more than the
//! VM's RAM plus QEMU's own documented slack, and the report's memory
//! axis says the VM's RAM bounds the whole tree. (The namespace
//! sandbox's version is tests/tests/sandbox_bounds.rs.)
//!
//! A machine without QEMU or the guest kernel fails this test with the
//! fix (`scripts/test` provisions both).

use std::io::{BufRead, BufReader};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use sharedos_host::process::launcher::{LaunchSpec, Launcher};
use sharedos_host::process::microvm::{MicrovmLauncher, MicrovmSettings};
use sharedos_sandbox::SandboxPolicy;
use sharedos_tests::meminfo::{kib_field, mem_available};
use sharedos_tests::plugin_bin;

const MIB: u64 = 1 << 20;
/// The VM's RAM.
const RAM_MIB: u64 = 256;
/// QEMU's own code, libraries, heap and device state, besides the
/// guest's RAM, its translation cache and its copies of the kernel and
/// the image (docs/SECURITY.md, "microVM", "The memory bound").
const QEMU_OWN: u64 = 64 * MIB;

/// What QEMU may hold besides the guest's RAM: the TCG translation cache
/// (capped), the kernel and the image it keeps to reset the guest, and
/// its own.
fn qemu_slack(report: &Value) -> u64 {
    let kernel = std::fs::metadata(report["kernel"].as_str().unwrap_or_default())
        .map(|m| m.len())
        .unwrap_or(0);
    let image = report["image"]["bytes"].as_u64().unwrap_or(0);
    sharedos_host::process::microvm::vm::TCG_TB_MIB * MIB + kernel + image + QEMU_OWN
}
/// What other processes of a shared machine may take from `MemAvailable`
/// while the attack runs (as in sandbox_bounds.rs).
const AVAILABLE_NOISE: u64 = 4 << 30;

fn rss(pid: u32) -> u64 {
    kib_field(
        &std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default(),
        "VmRSS:",
    ) * 1024
}

/// QEMU's largest RSS, the largest fall of `MemAvailable`, the samples.
type Peak = (u64, u64, u32);

/// Samples QEMU (`pid`) every 50 ms until `stop`.
fn watch(pid: u32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Peak> {
    let avail0 = mem_available();
    std::thread::spawn(move || {
        let mut peak: Peak = (0, 0, 0);
        loop {
            peak.0 = peak.0.max(rss(pid));
            peak.1 = peak.1.max(avail0.saturating_sub(mem_available()));
            peak.2 += 1;
            if stop.load(Ordering::Relaxed) {
                return peak;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
}

#[test]
fn c31c_in_a_microvm_is_bounded_by_the_vms_ram() {
    let settings = MicrovmSettings {
        qemu: None,
        kernel: None,
        init: Some(plugin_bin("sharedos-guest-init")),
        memory_mib: RAM_MIB,
        vcpus: 1,
        mkfs: None,
        harness_cli: None,
    };
    let launcher = MicrovmLauncher::new(SandboxPolicy::default(), &settings)
        .unwrap_or_else(|e| panic!("the microVM engine: {e}"));
    let bait = json!({"alloc_mib": 160, "hang_secs": 300});
    let spec = LaunchSpec {
        program: plugin_bin("sharedos-adversary"),
        args: [
            "--standalone",
            "--only",
            "C31c",
            "--bait-json",
            &bait.to_string(),
        ]
        .map(Into::into)
        .to_vec(),
        env: vec![],
        program_sha256: None,
        runtime_id: "adversary".into(),
        execution_id: "microvm-bounds".into(),
        turn_id: "t-1".into(),
    };
    let mut child = launcher.launch(&spec).expect("the VM boots");
    let report = child.report.clone().expect("the report");
    assert_eq!(
        report["memory"]["tree_bound_bytes"],
        RAM_MIB * MIB,
        "{report}"
    );
    assert_eq!(report["memory"]["unbounded"], json!([]), "{report}");
    let slack = qemu_slack(&report);
    let pid = child.tree.pid();
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch(pid, stop.clone());
    // The receipt, if the adversary lives to write it: the guest kernel's
    // OOM killer may end it first (1.6 GiB asked of 256 MiB).
    let mut out = BufReader::new(std::fs::File::from(child.stdout));
    let mut line = String::new();
    let _ = out.read_line(&mut line);
    let receipt: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
    // A few samples more with everything held (or the VM ended).
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let (held, available_drop, samples) = watcher.join().expect("the watcher");
    let ended = child.tree.try_wait().ok().flatten();
    eprintln!(
        "C31c in a {RAM_MIB} MiB microVM: receipt {receipt}; QEMU ended {ended:?}; QEMU peak RSS {} MiB (bound {} MiB), MemAvailable fell by at most {} MiB, {samples} samples",
        held / MIB,
        (RAM_MIB * MIB + slack) / MIB,
        available_drop / MIB
    );
    assert!(samples >= 2);
    // The guest used its RAM: the measure sees it.
    assert!(held > (RAM_MIB / 2) * MIB, "QEMU held {} MiB", held / MIB);
    assert!(
        held <= RAM_MIB * MIB + slack,
        "QEMU held {} MiB, over the VM's {RAM_MIB} MiB + {} MiB",
        held / MIB,
        slack / MIB
    );
    assert!(
        available_drop <= RAM_MIB * MIB + slack + AVAILABLE_NOISE,
        "MemAvailable fell by {} MiB",
        available_drop / MIB
    );
    child.tree.kill_tree().expect("QEMU killed and reaped");
    assert!(rss(pid) == 0, "QEMU {pid} outlived its kill");
}
