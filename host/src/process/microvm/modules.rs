//! The guest kernel's modules a microVM's image carries: the virtio
//! serial port's driver in every image, a harness's block device driver
//! on its read-only disk ([`super::disk`]), found beside the kernel.

use std::path::{Path, PathBuf};

/// A module of the kernel that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the guest kernel's module {} cannot be read ({reason}); the microVM's protocol port and read-only disk need the kernel's virtio modules: install the kernel package whole (`apt-get install linux-image-cloud-amd64`; its lib/modules next to its boot/)",
    path.display()
)]
pub struct ModuleError {
    pub path: PathBuf,
    pub reason: String,
}

/// The virtio modules the protocol port needs (virtio-serial), in the
/// order they are loaded (each after what it depends on), under
/// `lib/modules/<release>/kernel/`. Every guest image holds them.
pub const PORT_MODULES: [&str; 4] = [
    "drivers/virtio/virtio_ring.ko",
    "drivers/virtio/virtio.ko",
    "drivers/virtio/virtio_mmio.ko",
    "drivers/char/virtio_console.ko",
];

/// The virtio modules the disk needs, in load order, as
/// [`PORT_MODULES`].
pub const MODULES: [&str; 4] = [
    "drivers/virtio/virtio_ring.ko",
    "drivers/virtio/virtio.ko",
    "drivers/virtio/virtio_mmio.ko",
    "drivers/block/virtio_blk.ko",
];

/// The disk's modules of `kernel` ([`MODULES`]).
pub fn modules(kernel: &Path) -> Result<Vec<(String, PathBuf)>, ModuleError> {
    modules_of(kernel, &MODULES)
}

/// The modules `list` of `kernel` (`<root>/boot/vmlinuz-<release>`):
/// from `<root>/lib/modules/<release>`, else `/lib/modules/<release>`;
/// `(file name, host path)` in the list's order.
pub fn modules_of(kernel: &Path, list: &[&str]) -> Result<Vec<(String, PathBuf)>, ModuleError> {
    let release = kernel
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
        .unwrap_or_default();
    let near = kernel
        .parent()
        .and_then(Path::parent)
        .map(|root| root.join("lib/modules").join(release));
    let dir = near
        .filter(|d| d.is_dir())
        .unwrap_or_else(|| Path::new("/lib/modules").join(release));
    list.iter()
        .map(|m| {
            let path = dir.join("kernel").join(m);
            match std::fs::metadata(&path) {
                Ok(md) if md.is_file() => {
                    let name = m.rsplit('/').next().unwrap_or(m).to_owned();
                    Ok((name, path))
                }
                Ok(_) => Err(ModuleError {
                    path,
                    reason: "not a file".into(),
                }),
                Err(e) => Err(ModuleError {
                    path,
                    reason: e.to_string(),
                }),
            }
        })
        .collect()
}
