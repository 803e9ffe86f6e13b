//! The sandbox's own `/etc/passwd` and `/etc/group`: with a mount
//! namespace, the plugin reads files the sandbox writes, never the host's.
//! They name the sandbox uid (`sandbox`, its home the sandbox's `HOME`, a
//! shell that only refuses a login) and `nobody`, the overflow id the
//! kernel shows for every file owner outside the sandbox's user namespace
//! (the system files bound from the host). No host user or group is there,
//! root's included, so `os.userInfo()`, `getpwuid`, `getpass.getuser()`
//! and `id` work and learn nothing of the host.

use std::path::Path;

/// The name of the sandbox uid inside.
pub const USER: &str = "sandbox";
/// Its login shell: one that does nothing but refuse.
pub const SHELL: &str = "/usr/sbin/nologin";
/// The overflow uid and gid (`/proc/sys/kernel/overflowuid`'s default):
/// the owner a process in the user namespace sees on unmapped files.
const NOBODY: u32 = 65_534;

/// The files the sandbox writes in place of the host's, by path inside.
pub const GENERATED: [&str; 2] = ["/etc/passwd", "/etc/group"];

/// The `/etc/passwd` text for a sandbox running as `uid`/`gid`.
pub fn passwd(uid: u32, gid: u32) -> String {
    let home = super::inside::HOME;
    let mut s = format!("{USER}:x:{uid}:{gid}:sharedos sandbox:{home}:{SHELL}\n");
    if uid != NOBODY {
        s.push_str(&format!(
            "nobody:x:{NOBODY}:{NOBODY}:nobody:/nonexistent:{SHELL}\n"
        ));
    }
    s
}

/// The `/etc/group` text for a sandbox running as `gid`.
pub fn group(gid: u32) -> String {
    let mut s = format!("{USER}:x:{gid}:\n");
    if gid != NOBODY {
        s.push_str(&format!("nogroup:x:{NOBODY}:\n"));
    }
    s
}

/// Whether `entry` (a read-only path of the policy) is a generated file:
/// it is not bound, the sandbox's own file is there instead.
pub fn is_generated(entry: &str) -> bool {
    super::inside::clean(entry).is_some_and(|p| GENERATED.iter().any(|g| p == Path::new(g)))
}

/// Whether binding `entry` whole would show a generated file's host
/// original (`/etc` itself): such an entry is refused.
pub fn would_show_host_users(entry: &str) -> bool {
    super::inside::clean(entry).is_some_and(|p| {
        GENERATED
            .iter()
            .any(|g| Path::new(g).starts_with(&p) && p != Path::new(g))
    })
}

/// For the root's binds: `Ok(true)` when `entry` is a generated file (not
/// bound), an error when binding it would show the host's users.
pub(crate) fn replaces(entry: &str) -> Result<bool, String> {
    if would_show_host_users(entry) {
        return Err(format!(
            "read-only path {entry} would show the host's users: name the entries of it the \
             runtime needs (/etc/passwd and /etc/group are the sandbox's own)"
        ));
    }
    Ok(is_generated(entry))
}

/// Write both files under `root` (the staging root, before it is sealed
/// read-only), for the calling process's uid and gid (the plugin's: the
/// user namespace maps them to themselves).
pub(crate) fn write(root: &Path) -> Result<(), String> {
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    let etc = root.join("etc");
    std::fs::create_dir_all(&etc).map_err(|e| format!("mkdir {etc:?}: {e}"))?;
    for (name, text) in [("passwd", passwd(uid, gid)), ("group", group(gid))] {
        let path = etc.join(name);
        std::fs::write(&path, text).map_err(|e| format!("write {path:?}: {e}"))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| format!("chmod {path:?}: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwd_names_only_the_sandbox_and_nobody() {
        let p = passwd(1_610_612_737, 1_610_612_737);
        let lines: Vec<&str> = p.lines().collect();
        assert_eq!(
            lines,
            [
                "sandbox:x:1610612737:1610612737:sharedos sandbox:/sandbox/home:/usr/sbin/nologin",
                "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin",
            ]
        );
        assert!(!p.contains("root"));
        assert_eq!(
            group(1_610_612_737),
            "sandbox:x:1610612737:\nnogroup:x:65534:\n"
        );
    }

    #[test]
    fn a_sandbox_running_as_the_overflow_id_is_listed_once() {
        assert_eq!(passwd(NOBODY, NOBODY).lines().count(), 1);
        assert_eq!(group(NOBODY).lines().count(), 1);
    }

    #[test]
    fn generated_and_hiding_entries_are_recognised() {
        assert!(is_generated("/etc/passwd"));
        assert!(is_generated("/etc//group"));
        assert!(!is_generated("/etc/hosts"));
        assert!(would_show_host_users("/etc"));
        assert!(would_show_host_users("/etc/"));
        assert!(!would_show_host_users("/etc/passwd"));
        assert!(!would_show_host_users("/etc/ssl"));
        assert!(!would_show_host_users("/usr"));
    }
}
