//! The host-private state directory: everything of a sandbox that still
//! lives on the host's filesystem (the staged plugin binaries) sits under
//! it, so no other host user can find, read or execute any of it.
//!
//! `/run/sharedos` when the host is root, else `$XDG_RUNTIME_DIR/sharedos`
//! (or, without that variable, `<temp dir>/sharedos-<uid>`). It is created
//! mode 0700 and checked on every use: a directory (not a symlink), owned
//! by the host's uid, with no group or other permission bits. Anything else
//! is refused with an error that names the path and what is wrong with it.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::SandboxError;

/// Where the state directory is for this process (not created).
pub fn location() -> PathBuf {
    let euid = rustix::process::geteuid().as_raw();
    if euid == 0 {
        return PathBuf::from("/run/sharedos");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if Path::new(&d).is_absolute() => Path::new(&d).join("sharedos"),
        _ => std::env::temp_dir().join(format!("sharedos-{euid}")),
    }
}

/// The state directory, created if missing and checked.
pub fn state_dir() -> Result<PathBuf, SandboxError> {
    let dir = location();
    private_dir(&dir)?;
    Ok(dir)
}

/// `<state dir>/<name>`, created if missing and checked like the state
/// directory itself.
pub fn subdir(name: &str) -> Result<PathBuf, SandboxError> {
    let dir = state_dir()?.join(name);
    private_dir(&dir)?;
    Ok(dir)
}

/// Create `dir` (mode 0700) unless it exists, then check it is a private
/// directory of this uid.
pub fn private_dir(dir: &Path) -> Result<(), SandboxError> {
    let bad = |reason: String| SandboxError::BadPath {
        what: "state directory",
        path: dir.to_path_buf(),
        reason,
    };
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(bad(format!("cannot create it: {e}"))),
    }
    let md = std::fs::symlink_metadata(dir).map_err(|e| bad(e.to_string()))?;
    check(&md).map_err(bad)
}

/// What makes a state directory unusable, if anything.
fn check(md: &std::fs::Metadata) -> Result<(), String> {
    if md.file_type().is_symlink() {
        return Err("it is a symlink; remove it (the host creates a real directory)".into());
    }
    if !md.is_dir() {
        return Err("it is not a directory; remove it".into());
    }
    let euid = rustix::process::geteuid().as_raw();
    if md.uid() != euid {
        return Err(format!(
            "it is owned by uid {}, not by the host's uid {euid}; remove it",
            md.uid()
        ));
    }
    let mode = md.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "its mode is {mode:04o}; other users must have no access (chmod 0700 it)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_dir_is_private_and_a_loose_one_is_refused() {
        let base = tempfile::tempdir().unwrap();
        let d = base.path().join("state");
        private_dir(&d).unwrap();
        let md = std::fs::symlink_metadata(&d).unwrap();
        assert_eq!(md.permissions().mode() & 0o7777, 0o700);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = private_dir(&d).unwrap_err().to_string();
        assert!(e.contains("0755"), "{e}");
    }

    #[test]
    fn a_symlinked_state_dir_is_refused() {
        let base = tempfile::tempdir().unwrap();
        let real = base.path().join("real");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&real)
            .unwrap();
        let link = base.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = private_dir(&link).unwrap_err().to_string();
        assert!(e.contains("symlink"), "{e}");
    }
}
