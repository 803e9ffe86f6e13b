//! Layer: namespaces. A user namespace first (so an unprivileged helper
//! may create the others), then mount, pid, net, ipc, uts and cgroup in one
//! `unshare`, retried one flag at a time when the batch fails so the report
//! says exactly which one is missing.

use crate::report::LayerStatus;

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// `unshare(CLONE_NEWUSER)` and an identity map of the current uid/gid
/// (the only mapping an unprivileged process may write itself).
pub fn enter_user(uid: u32, gid: u32) -> Result<(), std::io::Error> {
    // SAFETY: unshare takes a flag word; the helper is single-threaded,
    // which CLONE_NEWUSER requires.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER) } != 0 {
        return Err(errno());
    }
    // setgroups must be denied before an unprivileged gid_map write.
    std::fs::write("/proc/self/setgroups", "deny")?;
    std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
    std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    Ok(())
}

/// The namespaces besides the user one, with their clone flag.
pub const OTHERS: [(&str, libc::c_int); 6] = [
    ("mountns", libc::CLONE_NEWNS),
    ("pidns", libc::CLONE_NEWPID),
    ("netns", libc::CLONE_NEWNET),
    ("ipcns", libc::CLONE_NEWIPC),
    ("utsns", libc::CLONE_NEWUTS),
    ("cgroupns", libc::CLONE_NEWCGROUP),
];

/// Unshare every namespace in `wanted` (by name); returns one status per
/// entry of [`OTHERS`]. A pid namespace applies to the children of the
/// caller, so the caller must fork next.
pub fn enter_others(wanted: &[&str]) -> Vec<(&'static str, LayerStatus)> {
    let flags = OTHERS
        .iter()
        .filter(|(n, _)| wanted.contains(n))
        .fold(0, |acc, (_, f)| acc | f);
    // SAFETY: unshare takes a flag word; single-threaded caller.
    let batch_ok = flags == 0 || unsafe { libc::unshare(flags) } == 0;
    OTHERS
        .iter()
        .map(|(name, flag)| {
            if !wanted.contains(name) {
                return (*name, LayerStatus::Disabled);
            }
            if batch_ok {
                return (*name, LayerStatus::Applied);
            }
            // SAFETY: as above, one flag at a time.
            let st = if unsafe { libc::unshare(*flag) } == 0 {
                LayerStatus::Applied
            } else {
                LayerStatus::unavailable(format!("unshare({name}): {}", errno()))
            };
            (*name, st)
        })
        .collect()
}
