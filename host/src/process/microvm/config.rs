//! `launcher = "microvm"` of a runtime entry checked at load: QEMU, the
//! guest kernel and init, the VM's shape, and what the microVM launcher
//! cannot carry yet, refused with the reason (docs/SECURITY.md, "microVM").

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The VM's RAM when neither `memoryMib` nor the policy's
/// `cgroup.memoryMax` says.
pub const DEFAULT_MEMORY_MIB: u64 = 256;
/// The range of `memoryMib`: enough for the kernel and a small image, at
/// most 64 GiB.
pub const MEMORY_MIB: std::ops::RangeInclusive<u64> = 64..=65_536;
/// The range of `vcpus`.
pub const VCPUS: std::ops::RangeInclusive<u32> = 1..=64;

/// `[runtimes.microvm]`: the microVM launcher's own settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MicrovmSection {
    /// `qemu-system-x86_64`, an absolute path. Absent: found on `PATH`.
    #[serde(default)]
    pub qemu: Option<PathBuf>,
    /// The guest kernel (a bzImage), an absolute path. Absent: the newest
    /// `/boot/vmlinuz-*-cloud-amd64`, else `/vmlinuz`.
    #[serde(default)]
    pub kernel: Option<PathBuf>,
    /// The guest init, an absolute path. Absent: `sharedos-guest-init`
    /// next to the running `sharedos`.
    #[serde(default)]
    pub init: Option<PathBuf>,
    /// The VM's RAM in MiB: the memory bound of everything in the guest.
    /// Absent: the policy's `cgroup.memoryMax` rounded up to MiB, else 256.
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// The VM's vCPUs (default 1).
    #[serde(default)]
    pub vcpus: Option<u32>,
}

/// The launcher's settings from an entry's `[runtimes.microvm]` table and
/// its policy's `cgroup.memoryMax` (`RuntimeEntry::microvm_settings`).
pub fn settings(
    section: Option<&MicrovmSection>,
    memory_max: Option<u64>,
) -> super::MicrovmSettings {
    let s = section.cloned().unwrap_or_default();
    let from_policy = memory_max.map(|b| b.div_ceil(1 << 20));
    super::MicrovmSettings {
        qemu: s.qemu,
        kernel: s.kernel,
        init: s.init,
        memory_mib: s.memory_mib.or(from_policy).unwrap_or(DEFAULT_MEMORY_MIB),
        vcpus: s.vcpus.unwrap_or(1),
    }
}

/// The `[runtimes.microvm]` table of entry `i` (`section`; `microvm`: the
/// entry's launcher is it) and what the microVM launcher cannot carry
/// (`harness`: the entry has a harness spec), refused now.
pub(crate) fn check(
    i: usize,
    microvm: bool,
    section: Option<&MicrovmSection>,
    memory_max: Option<u64>,
    harness: bool,
) -> Result<(), String> {
    if !microvm {
        if section.is_some() {
            return Err(format!(
                "runtimes[{i}].microvm: applies to launcher = \"microvm\" only; remove it or set the launcher"
            ));
        }
        return Ok(());
    }
    let s = section.cloned().unwrap_or_default();
    for (field, path) in [("qemu", &s.qemu), ("kernel", &s.kernel), ("init", &s.init)] {
        if let Some(p) = path
            && !p.is_absolute()
        {
            return Err(format!(
                "runtimes[{i}].microvm.{field}: must be an absolute path, got {:?}",
                p.display()
            ));
        }
    }
    if let Some(k) = &s.kernel
        && let Err(e) = std::fs::File::open(k)
    {
        return Err(format!(
            "runtimes[{i}].microvm.kernel: {} cannot be read: {e}; install a guest kernel (`apt-get install --no-install-recommends linux-image-cloud-amd64`) or fix the path",
            k.display()
        ));
    }
    let set = settings(section, memory_max);
    if !MEMORY_MIB.contains(&set.memory_mib) {
        return Err(format!(
            "runtimes[{i}].microvm.memoryMib: must be {}..={}, got {}",
            MEMORY_MIB.start(),
            MEMORY_MIB.end(),
            set.memory_mib
        ));
    }
    if !VCPUS.contains(&set.vcpus) {
        return Err(format!(
            "runtimes[{i}].microvm.vcpus: must be {}..={}, got {}",
            VCPUS.start(),
            VCPUS.end(),
            set.vcpus
        ));
    }
    refuse_unsupported(i, harness)
}

/// Harnesses are not carried yet (egress is: the gateway over a serial
/// channel, host/src/process/microvm/egress.rs; so are warm VMs).
fn refuse_unsupported(i: usize, harness: bool) -> Result<(), String> {
    if harness {
        return Err(format!(
            "runtimes[{i}].harness: not available with launcher = \"microvm\": the guest image holds the program, the shared libraries of the program and the init only, and extraRoPaths copied into the guest's RAM; a vendor CLI would be copied into every turn's image (Codex's binary alone is 301 MB) and a dynamically linked one or a node CLI would find no libraries (docs/SECURITY.md, \"microVM\"); use launcher = \"sandbox\""
        ));
    }
    Ok(())
}
