//! Where things are inside the sandbox, and the lexical form of a host
//! path the sandbox binds at the same path: what the root's view
//! ([`super::fsview`]) and the sandbox's own user files ([`super::users`])
//! both need, kept in a module that needs neither.

use std::path::{Component, Path, PathBuf};

/// The per-turn home inside the sandbox (`HOME`): a tmpfs of the
/// sandbox's own, `homeSizeBytes` large, gone with the sandbox. Not under
/// `/home`, so no host user's home directory is ever confused with it.
pub const HOME: &str = "/sandbox/home";
/// The per-turn temp directory inside the sandbox (`TMPDIR`).
pub const TMP: &str = "/tmp";
/// Where the workspace appears inside.
pub const WORKSPACE: &str = "/workspace";
/// Where the plugin binary appears inside.
pub const PLUGIN_DIR: &str = "/plugin";

/// `p` made lexically clean: absolute, no `.` or `..`, no trailing slash.
/// `None` for a relative path or one with `..` (never bound: what it
/// names depends on symlinks at bind time).
pub fn clean(p: &str) -> Option<PathBuf> {
    let path = Path::new(p);
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return None;
    }
    Some(path.components().collect())
}
