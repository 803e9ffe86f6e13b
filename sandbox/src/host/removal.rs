//! Removing a directory tree the host did not build (a workspace an older
//! host version left on the host's filesystem, or one of the degraded
//! no-mount-namespace mode) without trusting its shape.
//!
//! A plugin can build a chain of tens of thousands of directories: a
//! recursive walk overflows the host's stack (a 13,000-level chain aborted
//! the host in `remove_dir_all`), and a walk that holds one fd per level
//! runs out of fds. This one is iterative: it keeps the names of the levels
//! above it on the heap and at most three directory fds open, climbs back
//! with `..` checked against the device and inode recorded on the way
//! down (a directory moved meanwhile stops the removal with an error
//! instead of deleting elsewhere), and never follows a symlink.

use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

/// What a removal did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    /// Entries removed (files, links, directories).
    pub entries: u64,
    /// The deepest level reached below the top directory.
    pub depth: usize,
}

/// Remove `path` and everything below it, iteratively (see the module
/// docs). A symlink is removed itself, never followed. A missing `path` is
/// not an error.
pub fn remove_tree(path: &Path) -> std::io::Result<Removed> {
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    let Some(name) = path.file_name() else {
        return Err(std::io::Error::other(format!(
            "{path:?} names no directory entry"
        )));
    };
    let parent = open_dir(
        rustix::fs::CWD,
        parent.map_or(OsStr::new("."), |p| p.as_os_str()),
    )?;
    let mut removed = Removed::default();
    let top = match open_dir(&parent, name) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(removed),
        // Not a directory (a file, or a symlink O_NOFOLLOW refused): unlink it.
        Err(e) if [libc::ENOTDIR, libc::ELOOP].contains(&e.raw_os_error().unwrap_or(0)) => {
            rustix::fs::unlinkat(&parent, name, AtFlags::empty())?;
            removed.entries = 1;
            return Ok(removed);
        }
        Err(e) => return Err(e),
    };
    // One entry per level below the top: the name of the directory we are
    // in, and the (device, inode) of the one holding it.
    let mut above: Vec<(OsString, u64, u64)> = Vec::new();
    let mut cur = top;
    loop {
        match clear_pass(&cur, &mut removed)? {
            Pass::Progress => continue,
            Pass::Descend(child) => {
                let st = rustix::fs::fstat(&cur)?;
                let fd = open_dir(&cur, &child)?;
                above.push((child, st.st_dev, st.st_ino));
                removed.depth = removed.depth.max(above.len());
                cur = fd;
            }
            Pass::Empty => {
                let Some((name_here, dev, ino)) = above.pop() else {
                    drop(cur);
                    rmdir(&parent, name, &mut removed)?;
                    return Ok(removed);
                };
                let up = open_dir(&cur, OsStr::new(".."))?;
                let st = rustix::fs::fstat(&up)?;
                if (st.st_dev, st.st_ino) != (dev, ino) {
                    return Err(std::io::Error::other(format!(
                        "a directory of {path:?} moved during its removal; stopped"
                    )));
                }
                drop(cur);
                rmdir(&up, &name_here, &mut removed)?;
                cur = up;
            }
        }
    }
}

enum Pass {
    /// Entries were removed; list the directory again.
    Progress,
    /// A non-empty subdirectory to go into.
    Descend(OsString),
    /// The directory is empty.
    Empty,
}

/// One listing of `dir`: unlink what is not a directory, remove empty
/// subdirectories, stop at the first non-empty one.
fn clear_pass(dir: &OwnedFd, removed: &mut Removed) -> std::io::Result<Pass> {
    let mut listing = Dir::read_from(dir)?;
    let mut any = false;
    while let Some(entry) = listing.read() {
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes()).to_os_string();
        if name == "." || name == ".." {
            continue;
        }
        any = true;
        if entry.file_type() != FileType::Directory {
            match rustix::fs::unlinkat(dir, &name, AtFlags::empty()) {
                Ok(()) => {
                    removed.entries += 1;
                    continue;
                }
                Err(Errno::ISDIR) => {} // an unknown type that is a directory
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        match rustix::fs::unlinkat(dir, &name, AtFlags::REMOVEDIR) {
            Ok(()) => removed.entries += 1,
            Err(Errno::NOENT) => {}
            Err(Errno::NOTEMPTY | Errno::EXIST) => return Ok(Pass::Descend(name)),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(if any { Pass::Progress } else { Pass::Empty })
}

fn rmdir(dir: &OwnedFd, name: &OsStr, removed: &mut Removed) -> std::io::Result<()> {
    match rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
        Ok(()) => {
            removed.entries += 1;
            Ok(())
        }
        Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Open a directory below `at` without following a symlink. A directory
/// the plugin made unreadable (mode 0; matters only to a host that is not
/// root) is given back its owner's permissions first.
fn open_dir<Fd: std::os::fd::AsFd>(at: Fd, name: &OsStr) -> std::io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match rustix::fs::openat(&at, name, flags, Mode::empty()) {
        Err(Errno::ACCESS) if name != ".." => {
            rustix::fs::chmodat(&at, name, Mode::RWXU, AtFlags::empty())?;
            Ok(rustix::fs::openat(&at, name, flags, Mode::empty())?)
        }
        r => Ok(r?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain `depth` levels deep below `top`, built with `mkdirat` one
    /// level at a time (no recursion, two fds at a time), with a file at
    /// each tenth level.
    fn chain(top: &Path, depth: usize) {
        std::fs::create_dir(top).unwrap();
        let mut cur =
            rustix::fs::open(top, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        for i in 0..depth {
            rustix::fs::mkdirat(&cur, "d", Mode::RWXU).unwrap();
            if i % 10 == 0 {
                let f = rustix::fs::openat(&cur, "f", OFlags::CREATE | OFlags::WRONLY, Mode::RUSR)
                    .unwrap();
                drop(f);
            }
            cur = rustix::fs::openat(&cur, "d", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
                .unwrap();
        }
    }

    #[test]
    fn a_deep_chain_is_removed_on_a_small_stack() {
        const DEPTH: usize = 20_000;
        // In /dev/shm: on a disk mounted with `discard` each rmdir waits
        // for the device, which makes the test slow, not the removal.
        let base = tempfile::tempdir_in("/dev/shm").unwrap();
        let top = base.path().join("ws");
        let t0 = std::time::Instant::now();
        chain(&top, DEPTH);
        eprintln!("chain built in {:?}", t0.elapsed());
        let t0 = std::time::Instant::now();
        // 64 KiB of stack: a recursive walk of 20,000 levels overflows it.
        let t = top.clone();
        let r = std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(move || remove_tree(&t))
            .unwrap()
            .join()
            .unwrap()
            .unwrap();
        eprintln!("removed in {:?}", t0.elapsed());
        assert!(!top.exists());
        assert_eq!(
            r.depth,
            DEPTH - 1,
            "the empty last level is removed from above"
        );
        assert_eq!(r.entries as usize, DEPTH + 1 + DEPTH / 10);
    }

    #[test]
    fn a_symlink_is_removed_not_followed() {
        let base = tempfile::tempdir().unwrap();
        let target = base.path().join("target");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("keep"), b"x").unwrap();
        let link = base.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        remove_tree(&link).unwrap();
        assert!(!link.exists());
        assert!(target.join("keep").exists());
        assert_eq!(remove_tree(&base.path().join("gone")).unwrap().entries, 0);
    }
}
