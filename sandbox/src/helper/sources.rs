//! The host files the root is built from, opened by the supervisor before
//! the uid drop (detached clones) or after it (`O_PATH` fds).

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{CWD, Mode, OFlags};
use rustix::mount::OpenTreeFlags;

use super::process::{Fail, errno_fail, fail};
use crate::mounts;
use crate::request::HelperRequest;

/// The host files the root is built from: the plugin binary (its staged
/// copy, unless it is executed in place), a host workspace if the request
/// names one, and the runtime's extra read-only paths, each as a
/// [`mounts::Source`] fd.
pub(super) struct HostSources {
    pub(super) program: Option<(mounts::Source, OwnedFd)>,
    pub(super) workspace: Option<(mounts::Source, OwnedFd)>,
    /// Clones of the runtime's extra read-only paths (path, is a
    /// directory, fd), taken as root before the uid drop: the sandbox uid
    /// needs no right on their parents, and pid 1 hides the host's `/tmp`
    /// before it binds. Empty when the helper is not root (then pid 1
    /// binds them by path).
    pub(super) extras: Vec<(PathBuf, bool, OwnedFd)>,
}

impl HostSources {
    /// Detached clones (`open_tree`), taken as uid 0 before the uid drop;
    /// they attach with `move_mount` in the new mount namespace.
    pub(super) fn clone_trees(req: &HelperRequest) -> Result<HostSources, Fail> {
        let tree = |p: &Path, dir: bool| {
            let fd = open_tree(p, dir)?;
            Ok::<_, Fail>((mounts::Source::Tree(fd.as_raw_fd()), fd))
        };
        let mut extras = Vec::new();
        for entry in req.policy.extra_ro_paths.iter() {
            // The host checked each at load; one that is gone now fails
            // the spawn rather than running the plugin without it.
            let real = std::fs::canonicalize(entry)
                .map_err(|e| fail("paths", format!("extra read-only path {entry}: {e}")))?;
            let md = std::fs::metadata(&real)
                .map_err(|e| fail("paths", format!("extra read-only path {entry}: {e}")))?;
            let fd = open_tree(&real, md.is_dir())?;
            extras.push((PathBuf::from(entry), md.is_dir(), fd));
        }
        Ok(HostSources {
            program: match program_source(req) {
                Some(p) => Some(tree(p, false)?),
                None => None,
            },
            workspace: req
                .workspace
                .as_deref()
                .map(|w| tree(w, true))
                .transpose()?,
            extras,
        })
    }

    /// `O_PATH` fds opened inside the new mount namespace (no uid change:
    /// the helper reaches what the host could), refusing a symlinked
    /// workspace (spec C#62).
    pub(super) fn open_paths(req: &HelperRequest) -> Result<HostSources, Fail> {
        let path = |p: &Path, dir: bool| {
            let fd = open_path(p, dir)?;
            Ok::<_, Fail>((mounts::Source::Path(fd.as_raw_fd()), fd))
        };
        Ok(HostSources {
            program: match program_source(req) {
                Some(p) if req.policy.layers.mountns => Some(path(p, false)?),
                _ => None,
            },
            workspace: req
                .workspace
                .as_deref()
                .map(|w| path(w, true))
                .transpose()?,
            extras: Vec::new(),
        })
    }
}

/// The file bound at `/plugin/<name>`: the staged copy, or the program
/// itself where nothing was staged; `None` when the program is executed
/// from its own path inside a read-only path.
fn program_source(req: &HelperRequest) -> Option<&Path> {
    if req.program_in_place {
        return None;
    }
    Some(req.program_staged.as_deref().unwrap_or(&req.program))
}

/// `open_tree(OPEN_TREE_CLONE)`: a detached copy of the mount of `p`,
/// limited to `p` (a directory must not be a symlink).
fn open_tree(p: &Path, dir: bool) -> Result<OwnedFd, Fail> {
    let c = CString::new(p.as_os_str().as_bytes()).map_err(|_| fail("paths", "NUL in path"))?;
    // Recursive, as the binds by path are: a mount below an install
    // directory stays visible.
    let mut flags = OpenTreeFlags::OPEN_TREE_CLONE
        | OpenTreeFlags::OPEN_TREE_CLOEXEC
        | OpenTreeFlags::AT_RECURSIVE;
    if dir {
        flags |= OpenTreeFlags::AT_SYMLINK_NOFOLLOW;
    }
    rustix::mount::open_tree(CWD, c.as_c_str(), flags)
        .map_err(|e| errno_fail("paths", &format!("open_tree {p:?}"), e))
}

fn open_path(p: &Path, dir: bool) -> Result<OwnedFd, Fail> {
    let c = CString::new(p.as_os_str().as_bytes()).map_err(|_| fail("paths", "NUL in path"))?;
    let mut flags = OFlags::PATH | OFlags::CLOEXEC;
    if dir {
        flags |= OFlags::DIRECTORY | OFlags::NOFOLLOW;
    }
    rustix::fs::open(c.as_c_str(), flags, Mode::empty())
        .map_err(|e| errno_fail("paths", &format!("open {p:?}"), e))
}
