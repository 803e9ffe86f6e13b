//! The program an engine runs its plugins through (gVisor's `runsc`,
//! QEMU): the configured path or the first on `PATH`, checked by running
//! `--version` and reading its first line.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Why an engine's program cannot be used.
pub(super) enum ToolProblem {
    /// Not configured and not on `PATH` (its value).
    Missing { path: String },
    /// Found at `path`, but it does not start or is not what it should be.
    Broken { path: PathBuf, reason: String },
}

/// `configured`, or `name` on `PATH`; its `--version`'s first line must
/// start with `expected`. Returns the path and that line.
pub(super) fn locate(
    configured: Option<&Path>,
    name: &str,
    expected: &str,
) -> Result<(PathBuf, String), ToolProblem> {
    let path = match configured {
        Some(p) => p.to_path_buf(),
        None => on_path(name).ok_or_else(|| ToolProblem::Missing {
            path: std::env::var("PATH").unwrap_or_default(),
        })?,
    };
    let broken = |reason: String| ToolProblem::Broken {
        path: path.clone(),
        reason,
    };
    let out = Command::new(&path)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| broken(format!("it does not start: {e}")))?;
    if !out.status.success() {
        return Err(broken(format!("`{name} --version` exited {}", out.status)));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text.lines().next().unwrap_or_default().trim().to_owned();
    if !version.starts_with(expected) {
        return Err(broken(format!(
            "`{name} --version` printed {version:?}, not a {name} version"
        )));
    }
    Ok((path, version))
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
