//! `launcher = "microvm"` of a runtime entry checked at load: QEMU, the
//! guest kernel and init, the VM's shape, and the tool that builds a
//! harness's read-only disk (docs/SECURITY.md, "microVM").

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
    /// `mkfs.ext4` (e2fsprogs), an absolute path, for a harness's
    /// read-only disk. Absent: found in /usr/sbin, /sbin or on `PATH`.
    #[serde(default)]
    pub mkfs: Option<PathBuf>,
}

/// The launcher's settings from an entry's `[runtimes.microvm]` table and
/// its policy's `cgroup.memoryMax` (`RuntimeEntry::microvm_settings`);
/// `harness_cli`: the entry's harness command, whose `extraRoPaths` and
/// libraries go on the guest's read-only disk.
pub fn settings(
    section: Option<&MicrovmSection>,
    memory_max: Option<u64>,
    harness_cli: Option<PathBuf>,
) -> super::MicrovmSettings {
    let s = section.cloned().unwrap_or_default();
    let from_policy = memory_max.map(|b| b.div_ceil(1 << 20));
    super::MicrovmSettings {
        qemu: s.qemu,
        kernel: s.kernel,
        init: s.init,
        memory_mib: s.memory_mib.or(from_policy).unwrap_or(DEFAULT_MEMORY_MIB),
        vcpus: s.vcpus.unwrap_or(1),
        mkfs: s.mkfs,
        harness_cli,
    }
}

/// The `[runtimes.microvm]` table of entry `i` (`section`; `microvm`: the
/// entry's launcher is it).
pub(crate) fn check(
    i: usize,
    microvm: bool,
    section: Option<&MicrovmSection>,
    memory_max: Option<u64>,
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
    for (field, path) in [
        ("qemu", &s.qemu),
        ("kernel", &s.kernel),
        ("init", &s.init),
        ("mkfs", &s.mkfs),
    ] {
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
    let set = settings(section, memory_max, None);
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
    Ok(())
}
