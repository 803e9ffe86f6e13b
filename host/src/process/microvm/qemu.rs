//! Finding QEMU, the guest kernel and the guest init, and the errors that
//! say what to install when one is missing.

use std::path::{Path, PathBuf};

/// Why the microVM engine cannot be used on this host, with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MicrovmError {
    #[error(
        "QEMU is not installed: no `qemu-system-x86_64` on PATH ({path}); install it with \
         `apt-get install --no-install-recommends qemu-system-x86`, or set \
         runtimes.microvm.qemu to its absolute path"
    )]
    QemuMissing { path: String },
    #[error(
        "QEMU at {} cannot be used: {reason}; reinstall it (`apt-get install --reinstall \
         qemu-system-x86`) or point runtimes.microvm.qemu at a working one",
        qemu.display()
    )]
    QemuBroken { qemu: PathBuf, reason: String },
    #[error(
        "the guest kernel {} cannot be used: {reason}; install one with `apt-get install \
         --no-install-recommends linux-image-cloud-amd64`, or set runtimes.microvm.kernel to a \
         readable bzImage",
        kernel.display()
    )]
    KernelMissing { kernel: PathBuf, reason: String },
    #[error(
        "the guest init {} cannot be used: {reason}; build it (`cargo build -p \
         sharedos-guest-init`, it is installed next to `sharedos`) or set runtimes.microvm.init",
        init.display()
    )]
    InitMissing { init: PathBuf, reason: String },
    /// A harness's read-only disk (host/src/process/microvm/disk.rs).
    #[error(transparent)]
    Disk(#[from] super::disk::DiskError),
    /// The kernel modules every image carries (the protocol port's).
    #[error(transparent)]
    Modules(#[from] super::modules::ModuleError),
}

/// A located, working QEMU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qemu {
    pub path: PathBuf,
    /// The first line of `qemu-system-x86_64 --version`.
    pub version: String,
}

impl Qemu {
    /// `configured`, or `qemu-system-x86_64` on `PATH`; checked by running
    /// `--version`.
    pub fn locate(configured: Option<&Path>) -> Result<Qemu, MicrovmError> {
        use crate::process::engine_tool::{ToolProblem, locate};
        match locate(configured, "qemu-system-x86_64", "QEMU emulator version") {
            Ok((path, version)) => Ok(Qemu { path, version }),
            Err(ToolProblem::Missing { path }) => Err(MicrovmError::QemuMissing { path }),
            Err(ToolProblem::Broken { path, reason }) => {
                Err(MicrovmError::QemuBroken { qemu: path, reason })
            }
        }
    }
}

/// The environment variable naming the guest kernel when a runtime's
/// `microvm.kernel` does not (docs/SECURITY.md, "microVM"): a kernel
/// unpacked outside `/boot`, as the test command's provisioning does.
pub const KERNEL_ENV: &str = "SHAREDOS_MICROVM_KERNEL";

/// `configured`, or the kernel [`KERNEL_ENV`] names, or the newest
/// `/boot/vmlinuz-*-cloud-amd64` (the kernel Debian builds for VMs), or
/// `/vmlinuz`; checked to be a readable x86 bzImage (its `HdrS` boot
/// header).
pub fn kernel(configured: Option<&Path>) -> Result<PathBuf, MicrovmError> {
    let from_env = std::env::var_os(KERNEL_ENV).filter(|v| !v.is_empty());
    let path = match (configured, from_env) {
        (Some(p), _) => p.to_path_buf(),
        (None, Some(v)) => PathBuf::from(v),
        (None, None) => {
            newest_cloud_kernel(Path::new("/boot")).unwrap_or_else(|| "/vmlinuz".into())
        }
    };
    let missing = |reason: String| MicrovmError::KernelMissing {
        kernel: path.clone(),
        reason,
    };
    let mut head = [0u8; 0x206];
    let read = std::fs::File::open(&path).and_then(|mut f| {
        use std::io::Read;
        f.read_exact(&mut head)
    });
    match read {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(missing("it does not exist".into()))
        }
        Err(e) => Err(missing(format!("it cannot be read: {e}"))),
        Ok(()) if &head[0x202..0x206] != b"HdrS" => Err(missing(
            "it is not an x86 bzImage (no HdrS boot header)".into(),
        )),
        Ok(()) => Ok(path),
    }
}

fn newest_cloud_kernel(boot: &Path) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(boot)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-") && n.ends_with("-cloud-amd64"))
        })
        .collect();
    found.sort();
    found.pop()
}

/// `configured`, or `sharedos-guest-init` next to the running executable;
/// checked to be an ELF file.
pub fn init(configured: Option<&Path>) -> Result<PathBuf, MicrovmError> {
    let path = match configured {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()
            .ok()
            .and_then(|e| Some(e.parent()?.join("sharedos-guest-init")))
            .unwrap_or_else(|| "sharedos-guest-init".into()),
    };
    match super::image::interpreter(&path) {
        Ok(_) => Ok(path),
        Err(e) => Err(MicrovmError::InitMissing {
            init: path,
            reason: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_that_is_missing_or_not_a_bzimage_is_named_with_the_fix() {
        let e = kernel(Some(Path::new("/nonexistent/vmlinuz"))).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("/nonexistent/vmlinuz cannot be used: it does not exist"));
        assert!(text.contains("apt-get install --no-install-recommends linux-image-cloud-amd64"));
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), vec![0u8; 4096]).unwrap();
        let e = kernel(Some(f.path())).unwrap_err();
        assert!(e.to_string().contains("not an x86 bzImage"), "{e}");
    }

    #[test]
    fn a_missing_qemu_is_named_with_the_fix() {
        let e = Qemu::locate(Some(Path::new("/nonexistent/qemu"))).unwrap_err();
        assert!(e.to_string().contains("does not start"), "{e}");
        assert!(
            e.to_string()
                .contains("apt-get install --reinstall qemu-system-x86")
        );
    }
}
