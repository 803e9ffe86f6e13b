//! Temp files of writes a crash interrupted. A write goes through a
//! `.sharedos-tmp-*` file that holds an exclusive `flock` for its whole
//! life; a host killed mid-write leaves the file, and the lock dies with
//! the process. [`sweep`] runs when the files root is opened: it removes
//! every temp file whose lock it can take (its writer is gone) and leaves
//! the ones a live writer (another host on the same root) still holds.
//!
//! The walk is iterative (an explicit stack of relative paths, no
//! recursion), opens at most two descriptors at a time, never follows a
//! symlink (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` from the
//! root for every directory, `O_NOFOLLOW` for the temp file), and stops at
//! a depth and an entry bound, so a hostile or huge tree costs a bounded
//! amount of work and can never take the host down.

use std::os::fd::OwnedFd;

use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// Temp files of in-flight writes start with this; user paths may not.
pub(crate) const TEMP_PREFIX: &str = ".sharedos-tmp-";

/// Directory levels below the root: namespace, agent, then at most 63
/// path segments.
pub const MAX_DEPTH: usize = 2 + 63;
/// Directory entries looked at in one sweep.
pub const MAX_ENTRIES: usize = 1_000_000;

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Swept {
    /// Temp files removed (their writer was gone).
    pub removed: usize,
    /// Temp files left because a live writer holds them.
    pub in_use: usize,
    /// The walk hit [`MAX_DEPTH`] or [`MAX_ENTRIES`] and did not look
    /// at everything.
    pub truncated: bool,
    /// Directories or files that could not be opened or removed.
    pub errors: usize,
}

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_SYMLINKS);

fn open_dir(root: &OwnedFd, rel: &str) -> Result<OwnedFd, Errno> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    rustix::fs::openat2(root, rel, flags, Mode::empty(), RESOLVE)
}

/// Removes the temp file `name` in `dir` if no live writer holds it.
fn take_leftover(dir: &OwnedFd, name: &str, swept: &mut Swept) {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat2(dir, name, flags, Mode::empty(), RESOLVE) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return,
        Err(_) => {
            swept.errors += 1;
            return;
        }
    };
    match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) => swept.removed += 1,
            Err(Errno::NOENT) => {}
            Err(_) => swept.errors += 1,
        },
        Err(Errno::WOULDBLOCK) => swept.in_use += 1,
        Err(_) => swept.errors += 1,
    }
}

/// Sweeps every directory under `root` for leftover temp files.
pub fn sweep(root: &OwnedFd) -> Swept {
    let mut swept = Swept::default();
    let mut seen = 0usize;
    // (path relative to the root, depth); "." is the root itself.
    let mut stack: Vec<(String, usize)> = vec![(".".to_owned(), 0)];
    while let Some((rel, depth)) = stack.pop() {
        let dir = match open_dir(root, &rel) {
            Ok(d) => d,
            Err(Errno::NOENT) => continue,
            Err(_) => {
                swept.errors += 1;
                continue;
            }
        };
        let Ok(mut reader) = rustix::fs::Dir::read_from(&dir) else {
            swept.errors += 1;
            continue;
        };
        while let Some(entry) = reader.read() {
            let Ok(entry) = entry else {
                swept.errors += 1;
                break;
            };
            seen += 1;
            if seen > MAX_ENTRIES {
                swept.truncated = true;
                return swept;
            }
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            if name == "." || name == ".." {
                continue;
            }
            let kind = match entry.file_type() {
                FileType::Unknown => {
                    match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                        Ok(st) => FileType::from_raw_mode(st.st_mode),
                        Err(_) => continue,
                    }
                }
                k => k,
            };
            match kind {
                FileType::RegularFile if name.starts_with(TEMP_PREFIX) => {
                    take_leftover(&dir, name, &mut swept);
                }
                FileType::Directory if depth < MAX_DEPTH => {
                    let child = if rel == "." {
                        name.to_owned()
                    } else {
                        format!("{rel}/{name}")
                    };
                    stack.push((child, depth + 1));
                }
                FileType::Directory => swept.truncated = true,
                _ => {}
            }
        }
    }
    swept
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(dir: &std::path::Path) -> OwnedFd {
        rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    }

    #[test]
    fn leftovers_go_live_writes_real_files_and_symlinked_trees_stay() {
        let t = tempfile::tempdir().unwrap();
        let agent = t.path().join("ns/agent/notes");
        std::fs::create_dir_all(&agent).unwrap();
        let dead = agent.join(format!("{TEMP_PREFIX}dead"));
        std::fs::write(&dead, "half").unwrap();
        std::fs::write(agent.join("real.txt"), "kept").unwrap();
        // A live writer: the lock is held by this open file.
        let live = agent.join(format!("{TEMP_PREFIX}live"));
        let held = std::fs::File::create(&live).unwrap();
        rustix::fs::flock(&held, FlockOperation::LockExclusive).unwrap();
        // A symlink to a directory holding a "temp" file: never followed.
        let outside = tempfile::tempdir().unwrap();
        let bait = outside.path().join(format!("{TEMP_PREFIX}outside"));
        std::fs::write(&bait, "not ours").unwrap();
        std::os::unix::fs::symlink(outside.path(), agent.join("link")).unwrap();

        let swept = sweep(&root(t.path()));
        assert_eq!(swept.removed, 1, "{swept:?}");
        assert_eq!(swept.in_use, 1, "{swept:?}");
        assert!(!dead.exists());
        assert!(live.exists());
        assert!(bait.exists(), "a symlinked directory is never entered");
        assert_eq!(
            std::fs::read_to_string(agent.join("real.txt")).unwrap(),
            "kept"
        );
    }

    #[test]
    fn a_tree_deeper_than_the_bound_is_cut_not_walked() {
        let t = tempfile::tempdir().unwrap();
        let mut p = t.path().to_path_buf();
        for _ in 0..MAX_DEPTH + 3 {
            p.push("d");
        }
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join(format!("{TEMP_PREFIX}deep")), "x").unwrap();
        let swept = sweep(&root(t.path()));
        assert!(swept.truncated, "{swept:?}");
        assert_eq!(swept.removed, 0);
    }
}
