//! Layer: capabilities. Inside a user namespace the helper holds every
//! capability of that namespace (observed: bwrap as root kept CapEff full);
//! the plugin must hold none, and we check it with `capget` rather than
//! trusting the calls that cleared them.

use super::layer::{Layer, Need, Slot, Stage, no_detail};
use crate::report::LayerStatus;

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The highest capability the kernel knows, read once per process (the
/// helper asks four times per spawn, from the supervisor and the plugin;
/// the supervisor's first read is inherited across the forks).
fn last_cap() -> u32 {
    static LAST: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *LAST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(40)
    })
}

/// Drop every capability from the bounding set (needs CAP_SETPCAP; done
/// before leaving uid 0, and again inside the user namespace).
pub fn drop_bounding() -> Result<(), String> {
    for cap in 0..=last_cap() {
        // Only drop what is there: without CAP_SETPCAP (after the uid
        // change, outside a user namespace) an already-empty set is fine.
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) } == 0 {
            continue;
        }
        // SAFETY: prctl with integer arguments only.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            // EINVAL: the kernel does not know this cap; fine.
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(format!("PR_CAPBSET_DROP({cap}): {e}"));
            }
        }
    }
    Ok(())
}

/// Drop all capabilities and lock the securebits so none can come back.
/// `Ok(Some(reason))`: everything is gone except the bounding set, which a
/// non-root process without CAP_SETPCAP cannot clear (a host without user
/// namespaces running as non-root); with no_new_privs and a non-root uid it
/// can never be used, so the layer is reported degraded, not missing.
pub fn drop_all() -> Result<Option<String>, String> {
    let bounding = drop_bounding();
    // Lock "root is not special" so an exec cannot regain caps via uid 0
    // or file caps, and forbid raising ambient caps.
    let bits = libc::SECBIT_NOROOT
        | libc::SECBIT_NOROOT_LOCKED
        | libc::SECBIT_NO_SETUID_FIXUP
        | libc::SECBIT_NO_SETUID_FIXUP_LOCKED
        | libc::SECBIT_KEEP_CAPS_LOCKED
        | libc::SECBIT_NO_CAP_AMBIENT_RAISE
        | libc::SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits as libc::c_ulong, 0, 0, 0) } != 0 {
        let e = std::io::Error::last_os_error();
        // EPERM without CAP_SETPCAP (no userns and non-root host): the
        // uid is already non-root there, so nothing to lock.
        if e.raw_os_error() != Some(libc::EPERM) {
            return Err(format!("PR_SET_SECUREBITS: {e}"));
        }
    }
    // SAFETY: prctl with integer arguments only.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: capset reads one header and two data structs (version 3),
    // both valid for the duration of the call.
    if unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) } != 0 {
        return Err(format!("capset(0): {}", std::io::Error::last_os_error()));
    }
    verify_sets()?;
    match bounding {
        Ok(()) => verify_bounding().map(|()| None),
        Err(e) if !rustix::process::getuid().is_root() => Ok(Some(format!(
            "bounding set left in place ({e}); unusable without uid 0 under no_new_privs"
        ))),
        Err(e) => Err(e),
    }
}

/// Check with the kernel that no capability is left.
pub fn verify() -> Result<(), String> {
    verify_sets()?;
    verify_bounding()
}

/// Effective, permitted, inheritable and ambient sets are empty.
fn verify_sets() -> Result<(), String> {
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two data structs into `data`, which is large
    // enough for version 3.
    if unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) } != 0 {
        return Err(format!("capget: {}", std::io::Error::last_os_error()));
    }
    for d in data {
        if d.effective != 0 || d.permitted != 0 || d.inheritable != 0 {
            return Err(format!(
                "capabilities left: eff={:#x} prm={:#x} inh={:#x}",
                d.effective, d.permitted, d.inheritable
            ));
        }
    }
    for cap in 0..=last_cap() {
        // SAFETY: prctl with integer arguments only.
        let amb = unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_IS_SET as libc::c_ulong,
                cap as libc::c_ulong,
                0,
                0,
            )
        };
        if amb > 0 {
            return Err(format!("ambient capability {cap} is still set"));
        }
    }
    Ok(())
}

/// The bounding set is empty.
fn verify_bounding() -> Result<(), String> {
    for cap in 0..=last_cap() {
        // SAFETY: prctl with integer arguments only.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) };
        if rc > 0 {
            return Err(format!("capability {cap} still in the bounding set"));
        }
    }
    Ok(())
}

/// No capabilities, dropped and checked in the plugin's process (step 13).
pub(crate) const LAYER: Layer = Layer {
    name: "caps",
    stage: Stage::Plugin,
    toggle: None,
    slot: Slot::Status(|r| &r.caps, |r| &mut r.caps),
    need: Need::Applied,
    fix: "do not run the helper with ambient capabilities or a locked bounding set",
    detail: no_detail,
    apply: Some(|_, _| {
        Ok(match drop_all() {
            Ok(None) => LayerStatus::Applied,
            Ok(Some(reason)) => LayerStatus::Degraded { reason },
            Err(e) => LayerStatus::unavailable(e),
        })
    }),
};
