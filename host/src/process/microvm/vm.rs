//! The QEMU command line of a sharedos microVM, the accelerator probe,
//! and how QEMU's exit status carries the plugin's.
//!
//! The machine: `-M microvm` with the ISA serial line, PIT, PIC and RTC
//! (the cloud kernel needs them to boot under TCG), no default devices,
//! no user configuration, no display, no network device, no disk: the
//! kernel and the initramfs only. The protocol is a virtio serial port
//! wired to QEMU's stdio (the guest's [`PORT_DEVICE`]), `ttyS1` a second
//! ISA serial port written to QEMU's stderr (the plugin's stderr and the
//! guest kernel's console; `ttyS0` has no backend), and an
//! `isa-debug-exit` port through which the guest init reports how the
//! plugin ended (guest-init/src/main.rs).

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::image::{self, Tree};
use super::qemu::Qemu;

/// How long a KVM probe guest may take to reach init (a KVM guest boots
/// the cloud kernel in well under a second; one that never gets past the
/// firmware is killed at this bound).
pub const KVM_PROBE_TIMEOUT: Duration = Duration::from_secs(4);
/// How long a TCG probe guest may take (`sandbox check` only).
pub const TCG_PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// The kernel command line: console and kernel messages on the stderr
/// line only, quiet (errors still shown: the kernel says once that it
/// finds no PCI configuration space, as there is no PCI bus; `pci=off`
/// hangs this kernel under TCG), and any panic
/// ends the VM at once.
const APPEND: &str = "console=ttyS1 quiet loglevel=4 edd=off panic=-1 reboot=t";
/// Under TCG on a loaded host the kernel's calibration of the TSC against
/// the emulated PIT fails and the boot hangs: the TSC's rate and the
/// delay loop are given instead, so no boot step depends on the host's
/// timing.
const TCG_APPEND: &str = " tsc_early_khz=1000000 lpj=4000000 no_timer_check";

/// The protocol port's device node in the guest (the first virtio-serial
/// device's port 1).
pub const PORT_DEVICE: &str = "/dev/vport0p1";
/// The egress channel's port's device node in the guest (port 2).
pub const EGRESS_DEVICE: &str = "/dev/vport0p2";

/// The TCG translation cache's size in MiB (`-accel tcg,tb-size=`).
pub const TCG_TB_MIB: u64 = 64;

/// What a VM is made of.
pub struct Machine<'a> {
    pub qemu: &'a Qemu,
    pub kernel: &'a Path,
    pub initrd: &'a Path,
    pub accel: &'static str,
    pub memory_mib: u64,
    pub vcpus: u32,
}

impl Machine<'_> {
    /// The QEMU command; stdio is the caller's to set.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.qemu.path);
        cmd.args(["-M", "microvm,isa-serial=on,pit=on,pic=on,rtc=on"])
            .arg("-accel")
            .arg(match self.accel {
                // The translation cache is QEMU's own memory, outside the
                // guest's RAM: its default (1 GiB, filled as code is
                // translated) is capped so that QEMU's whole footprint
                // stays RAM + a known slack (docs/SECURITY.md, "microVM").
                "tcg" => format!("tcg,tb-size={TCG_TB_MIB}"),
                other => other.to_owned(),
            })
            .args(["-nodefaults", "-no-user-config", "-nographic", "-no-reboot"])
            // QEMU's own seccomp filter: no obsolete system calls, no
            // privilege change, no new processes or programs, no
            // scheduling or affinity changes, for the VMM that holds the
            // boundary (docs/SECURITY.md, "microVM").
            .args([
                "-sandbox",
                "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
            ])
            .args(["-m", &format!("{}M", self.memory_mib)])
            .args(["-smp", &self.vcpus.to_string()])
            .arg("-kernel")
            .arg(self.kernel)
            .arg("-initrd")
            .arg(self.initrd)
            .arg("-append")
            .arg(match self.accel {
                "tcg" => format!("{APPEND}{TCG_APPEND}"),
                _ => APPEND.to_owned(),
            })
            // The protocol: a virtio serial port on the machine's
            // virtio-mmio bus (port 1; port 0 is a console's), wired to
            // QEMU's stdio; port 2 is the egress channel's, when the
            // policy has a network (egress.rs).
            .args(["-device", "virtio-serial-device,max_ports=3"])
            .args(["-chardev", "stdio,id=proto,signal=off"])
            .args(["-device", "virtserialport,chardev=proto,nr=1"])
            .args(["-chardev", "file,id=err,path=/proc/self/fd/2"])
            .args(["-device", "isa-serial,chardev=err,index=1"])
            .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=0x04"])
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        cmd
    }
}

/// The plugin's end as QEMU's exit status carries it (see the guest
/// init): `(code << 1) | 1`. An exit code comes back as that code, a
/// signal N and the out-of-memory kill as `128 + N` (the sandbox helper's
/// convention, so the result names the signal); a status QEMU gave for
/// itself (0: the guest ended without a report; a signal: QEMU killed)
/// is returned as it is.
pub fn plugin_status(qemu: ExitStatus) -> ExitStatus {
    let Some(c) = qemu.code() else {
        return qemu;
    };
    if c & 1 == 0 {
        return qemu;
    }
    let v = c >> 1;
    let code = match v {
        0..=95 => v,
        96..=125 => 128 + (v - 96),
        126 => 126,
        _ => 128 + libc::SIGKILL,
    };
    ExitStatus::from_raw(code << 8)
}

/// The accelerator VMs run under, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accel {
    /// `kvm` or `tcg`.
    pub name: &'static str,
    pub why: String,
}

/// The accelerator, chosen once per host process by the first probe:
/// `kvm` when a probe guest under KVM reached its init within
/// [`KVM_PROBE_TIMEOUT`], `tcg` otherwise.
pub fn accel(qemu: &Qemu, kernel: &Path, init: &Path) -> Accel {
    static CHOSEN: OnceLock<Accel> = OnceLock::new();
    CHOSEN.get_or_init(|| probe_kvm(qemu, kernel, init)).clone()
}

fn probe_kvm(qemu: &Qemu, kernel: &Path, init: &Path) -> Accel {
    let tcg = |why: String| Accel { name: "tcg", why };
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        return tcg(
            "/dev/kvm cannot be opened here, so KVM is out; QEMU emulates the CPU (TCG)".into(),
        );
    }
    match boot_probe(qemu, kernel, init, "kvm", KVM_PROBE_TIMEOUT) {
        Ok(ms) => Accel {
            name: "kvm",
            why: format!("a probe guest under KVM reached its init in {ms} ms"),
        },
        Err(e) => tcg(format!(
            "/dev/kvm opens, but a probe guest under KVM did not reach its init: {e}; QEMU emulates the CPU (TCG)"
        )),
    }
}

/// Boots a guest whose init powers off at once, under `accel`, within
/// `bound`: its milliseconds when the init reported, else why not (QEMU
/// killed by its pid at the bound). Its directory is removed either way.
pub fn boot_probe(
    qemu: &Qemu,
    kernel: &Path,
    init: &Path,
    accel: &'static str,
    bound: Duration,
) -> Result<u128, String> {
    let dir = super::run_dir().map_err(|e| format!("its directory: {e}"))?;
    let mut tree = Tree::default();
    tree.copy(image::INIT, init).map_err(|e| e.to_string())?;
    for lib in image::libraries(init).map_err(|e| e.to_string())? {
        tree.copy(&lib.to_string_lossy(), &lib)
            .map_err(|e| e.to_string())?;
    }
    tree.file("sharedos/probe", 0o444, Vec::new());
    let initrd = dir.path().join("initrd");
    std::fs::write(&initrd, tree.cpio()).map_err(|e| e.to_string())?;
    let machine = Machine {
        qemu,
        kernel,
        initrd: &initrd,
        accel,
        memory_mib: 128,
        vcpus: 1,
    };
    let mut cmd = machine.command();
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    crate::process::gvisor::runsc::dies_with_host(&mut cmd);
    let started = Instant::now();
    let child = crate::process::direct::on_spawn_thread(move || cmd.spawn())
        .and_then(|r| r)
        .map_err(|e| format!("QEMU did not start: {e}"))?;
    match crate::process::gvisor::runsc::wait_bounded(child, bound) {
        Ok(Some(s)) if plugin_status(s).code() == Some(0) && s.code() == Some(1) => {
            Ok(started.elapsed().as_millis())
        }
        Ok(Some(s)) => Err(format!("QEMU exited {s} before the guest's init reported")),
        Ok(None) => Err(format!(
            "nothing within {} s; QEMU was killed",
            bound.as_secs()
        )),
        Err(e) => Err(format!("waiting for QEMU: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemus_exit_status_gives_back_the_plugins() {
        let st = |code: i32| plugin_status(ExitStatus::from_raw(code << 8)).code();
        assert_eq!(st(1), Some(0));
        assert_eq!(st((3 << 1) | 1), Some(3));
        assert_eq!(st(((96 + 9) << 1) | 1), Some(137));
        assert_eq!(st((127 << 1) | 1), Some(137));
        assert_eq!(st((126 << 1) | 1), Some(126));
        assert_eq!(st(0), Some(0));
        let killed = ExitStatus::from_raw(libc::SIGKILL);
        assert_eq!(plugin_status(killed).signal(), Some(libc::SIGKILL));
    }
}
