//! The sandbox report of a microVM: the common shape (`engine`, `level`,
//! `missing`, `memory`, `env_keys`, `warnings`) and the microVM layer
//! (QEMU, kernel, accelerator, the VM's shape, the image). The memory axis
//! is the guest's RAM: every kind of memory the plugin can make (its
//! pages, its tmpfs files, the guest kernel's own allocations, the image)
//! lives inside it.

use std::path::Path;

use serde_json::{Value, json};
use sharedos_sandbox::ProgramDigest;

use super::{Accel, MICROVM_LEVEL, MicrovmLauncher};

/// What QEMU holds outside the guest's RAM.
const OUTSIDE_RAM: &str = "QEMU's own process is outside the guest's RAM: its code and device state, the TCG translation cache under TCG (capped at 64 MiB), and its copies of the kernel and the image (kept to reset the guest); no cgroup bounds the QEMU process here";

/// A harness's read-only disk on the memory axis.
const DISK_NOT_RAM: &str = "the read-only disk (extraRoPaths, the CLI) is not guest RAM: its image stays in the host's cache directory; the pages the guest reads of it sit in the guest's page cache, inside the VM's RAM and its bound";

/// One run's part of the report.
pub(super) struct Run<'a> {
    pub dir: &'a Path,
    pub program_inside: &'a str,
    pub pin: Option<&'a ProgramDigest>,
    pub image_bytes: u64,
    /// A harness's read-only disk.
    pub disk: Option<&'a super::disk::RoDisk>,
    pub env_keys: Vec<String>,
    pub warnings: Vec<String>,
}

/// The fields every microVM report has, a refusal's included.
pub(super) fn base(l: &MicrovmLauncher, accel: &Accel) -> Value {
    json!({
        "engine": "microvm",
        "level": MICROVM_LEVEL.to_string(),
        "qemu": { "path": l.qemu.path.display().to_string(), "version": l.qemu.version },
        "kernel": l.kernel.display().to_string(),
        "accelerator": { "name": accel.name, "why": accel.why },
        "vm": {
            "machine": "microvm,isa-serial=on,pit=on,pic=on,rtc=on",
            "memory_mib": l.memory_mib,
            "vcpus": l.vcpus,
        },
    })
}

/// The report of a VM about to boot.
pub(super) fn launched(l: &MicrovmLauncher, accel: &Accel, run: &Run) -> Value {
    let mut r = base(l, accel);
    let p = &l.policy;
    let rlimits: serde_json::Map<String, Value> = crate::process::gvisor::rlimit_rows(p)
        .into_iter()
        .map(|(k, v)| (k.trim_start_matches("RLIMIT_").to_lowercase(), v.into()))
        .collect();
    let fields = json!({
        "isolation": "a guest kernel of its own in a QEMU microVM: the plugin's system calls are served by the guest kernel, the host sees only QEMU's device emulation (two ISA serial ports, a third with a network policy, a debug-exit port, the PIT, PIC and RTC; a harness's read-only virtio-blk disk)",
        "run_dir": run.dir.display().to_string(),
        "uid": p.uids.first,
        "network": network(p.egress_port),
        "protocol": "stdin and stdout on the guest's virtio serial port /dev/vport0p1, wired to QEMU's stdio",
        "stderr": "the guest's ttyS1, written to QEMU's stderr with the guest kernel's console",
        "image": {
            "bytes": run.image_bytes,
            "holds": if run.disk.is_some() {
                "the guest init, the program, the shared libraries both need, the virtio modules of the read-only disk, /etc/passwd and /etc/group"
            } else {
                "the guest init, the program, the shared libraries both need, extraRoPaths (read-only), /etc/passwd and /etc/group"
            },
            "root": "read-only after the init's mounts",
        },
        "extra_ro_paths": p.extra_ro_paths,
        "disk": run.disk.map(|d| json!({
            "image": d.image.display().to_string(),
            "bytes": d.bytes,
            "holds": "extraRoPaths and the harness CLI's shared libraries, each bound read-only at its host path",
            "device": "virtio-blk (virtio-mmio), read-only in QEMU and mounted read-only by the guest",
            "memory": DISK_NOT_RAM,
        })),
        "program": run.program_inside,
        "program_sha256": run.pin.map(|d| d.to_string()),
        "rlimits": rlimits,
        "no_new_privs": true,
        "memory": memory(l),
        "missing": [],
        "env_keys": run.env_keys,
        "warnings": run.warnings,
    });
    if let (Some(r), Value::Object(f)) = (r.as_object_mut(), fields) {
        r.extend(f);
    }
    r
}

/// The guest's network: none, or the gateway's port on its own loopback
/// carried over a serial line (host/src/process/microvm/egress.rs).
fn network(egress_port: Option<u16>) -> String {
    match egress_port {
        None => "none (no network device in the VM; no egress gateway)".into(),
        Some(port) => format!(
            "no network device in the VM; the egress gateway at 127.0.0.1:{port} on the guest's own loopback, each connection carried over the guest's virtio serial port /dev/vport0p2 to the host's gateway"
        ),
    }
}

/// The memory axis: the tmpfs sizes inside the guest, and the guest's RAM
/// as the bound of the whole.
fn memory(l: &MicrovmLauncher) -> Value {
    let p = &l.policy;
    let ram = l.memory_mib << 20;
    let mut layers: Vec<Value> = [
        ("tmpfs /workspace", p.workspace_size_bytes),
        ("tmpfs HOME (/sandbox/home)", p.home_size_bytes),
        ("tmpfs /tmp", p.tmp_size_bytes),
        ("tmpfs /dev/shm", p.shm_size_bytes),
    ]
    .into_iter()
    .map(|(name, bytes)| {
        json!({
            "name": name,
            "status": { "state": "applied" },
            "bytes": bytes,
            "detail": "the size option of the guest's tmpfs, enforced by the guest kernel (and inside the guest's RAM)",
        })
    })
    .collect();
    layers.push(json!({
        "name": "the whole guest (kernel, image, tmpfs, every process)",
        "status": { "state": "applied" },
        "bytes": ram,
        "detail": "the VM's RAM (QEMU -m): the guest cannot use more; past it the guest kernel's OOM killer ends the plugin and the turn says so",
    }));
    let mut axis = json!({
        "layers": layers,
        "per_process_bytes": p.rlimits.address_space,
        "tree_bound_bytes": ram,
        "unbounded": [],
        "outside": OUTSIDE_RAM,
    });
    if l.disk.is_some() {
        axis["disk"] = DISK_NOT_RAM.into();
    }
    axis
}
