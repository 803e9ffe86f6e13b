//! The workspace's binaries the suites launch (`sharedos`, the plugins,
//! the sandbox helper), built on first use so that `cargo test --workspace`
//! alone passes on a fresh clone.
//!
//! Cargo builds a test's own package's binaries for it, but not another
//! package's: the first call in a test process runs
//! `$CARGO build --workspace --bins` into the same target directory and
//! profile as the test executable (offline when cargo is, as it inherits
//! the environment). Test processes that build at once are serialized by
//! cargo's own lock on the build directory; a build that has nothing to do
//! costs well under a second.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// `target/<profile>` (or `target/<triple>/<profile>`): where the running
/// test executable (`<profile>/deps/<test>-<hash>`) was built.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let deps = exe.parent().expect("the test executable's deps directory");
    deps.parent()
        .expect("the test executable's profile directory")
        .to_path_buf()
}

/// The workspace binary `name`, built (once per test process) if needed.
pub fn workspace_bin(name: &str) -> PathBuf {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    if let Err(e) = BUILT.get_or_init(|| build_workspace_bins(&profile_dir())) {
        panic!("building the workspace's binaries for the tests failed: {e}");
    }
    let path = profile_dir().join(name);
    assert!(
        path.is_file(),
        "{} is not a binary of the workspace (`cargo build --workspace --bins` built none by that name)",
        path.display()
    );
    path
}

/// `cargo build --workspace --bins` for the profile and target of `profile`.
fn build_workspace_bins(profile: &Path) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf();
    let name = profile
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("the profile directory has no name")?;
    let parent = profile
        .parent()
        .ok_or("the profile directory has no parent")?;
    let mut command = Command::new(&cargo);
    command
        .arg("build")
        .arg("--workspace")
        .arg("--bins")
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"));
    // `debug` is the dev profile's directory; any other is its profile's name.
    match name {
        "debug" => {}
        "release" => {
            command.arg("--release");
        }
        other => {
            command.arg("--profile").arg(other);
        }
    }
    // Cargo keeps .rustc_info.json (and, lately, CACHEDIR.TAG) at the
    // target directory's root; below it a directory named by a target
    // triple holds that target's profiles.
    let is_root =
        |d: &Path| d.join(".rustc_info.json").is_file() || d.join("CACHEDIR.TAG").is_file();
    let target_dir = if is_root(parent) {
        parent.to_path_buf()
    } else {
        let triple = parent
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or("the target triple's directory has no name")?;
        command.arg("--target").arg(triple);
        parent.parent().ok_or("no target directory")?.to_path_buf()
    };
    command.env("CARGO_TARGET_DIR", &target_dir);
    let out = command
        .output()
        .map_err(|e| format!("cannot run {}: {e}", Path::new(&cargo).display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{:?} exited with {}:\n{}",
            command,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
