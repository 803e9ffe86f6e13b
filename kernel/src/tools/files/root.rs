//! The agent directories' tree ([`FilesRoot`]): every path resolved
//! beneath it with `openat2`, reads, atomic writes, listings and deletes,
//! and the failures a caller may see (see the parent module's docs).

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use serde_json::{Value, json};
use sharedos_protocol::PathSegment;
use sharedos_protocol::text::first_unsafe_in_name;

use crate::config::FilesConfig;
use crate::tools::leftovers::TEMP_PREFIX;

/// The directory tree all agents' files live under, opened once.
#[derive(Debug)]
pub struct FilesRoot {
    root: OwnedFd,
    pub(super) config: FilesConfig,
    /// The root is on a local disk filesystem ([`is_local`]): a small read
    /// is made on the caller's thread rather than handed to a blocking
    /// pool.
    pub(super) local: bool,
}

/// A read of a file this small (after `open` and `fstat`) on a local
/// filesystem is made on the caller's thread: a few µs of page-cache copy,
/// against the blocking pool's hand-off (two wake-ups, about 5 futex calls
/// a read). A larger file, or a root on a network or FUSE filesystem (where
/// any call may wait on a server), goes to the pool.
pub const INLINE_READ_BYTES: u64 = 64 * 1024;

/// Whether `fd` is on a filesystem whose calls wait only on a local disk
/// (or on none): ext2/3/4, XFS, Btrfs, F2FS, ZFS, tmpfs, overlayfs. Any
/// other (NFS, SMB, FUSE, 9p, Ceph, ...) is not.
fn is_local(fd: &OwnedFd) -> bool {
    const LOCAL: [u64; 7] = [
        0xEF53,      // ext2/3/4
        0x5846_5342, // XFS
        0x9123_683E, // Btrfs
        0xF2F5_2010, // F2FS
        0x2FC1_2FC1, // ZFS
        0x0102_1994, // tmpfs
        0x794C_7630, // overlayfs
    ];
    rustix::fs::fstatfs(fd).is_ok_and(|st| LOCAL.contains(&(st.f_type as u64)))
}

/// A refusal or failure a caller may see (code, fixed message).
#[derive(Debug)]
pub(super) enum FileFail {
    Result(&'static str, &'static str),
    Io(String),
}

impl From<Errno> for FileFail {
    fn from(e: Errno) -> Self {
        match e {
            Errno::NOENT => FileFail::Result(
                "file_not_found",
                "No such file or directory in the agent's memory.",
            ),
            Errno::LOOP | Errno::XDEV => FileFail::Result(
                "path_not_allowed",
                "The path leaves the agent's directory or crosses a symbolic link.",
            ),
            Errno::NOTDIR => FileFail::Result(
                "not_a_directory",
                "A segment of the path is not a directory.",
            ),
            Errno::ISDIR => FileFail::Result("is_a_directory", "The path names a directory."),
            Errno::NOTEMPTY => {
                FileFail::Result("directory_not_empty", "The directory is not empty.")
            }
            Errno::NAMETOOLONG => FileFail::Result("path_too_long", "The path is too long."),
            other => FileFail::Io(other.to_string()),
        }
    }
}

impl From<std::io::Error> for FileFail {
    fn from(e: std::io::Error) -> Self {
        match e.raw_os_error() {
            Some(code) => FileFail::from(Errno::from_raw_os_error(code)),
            None => FileFail::Io(e.to_string()),
        }
    }
}

/// Why [`FilesRoot::read_file`] or [`FilesRoot::write_file`] failed:
/// `code` is the file tools' own (`path_not_allowed` for a symlink or a
/// path leaving the directory, `file_not_found`, `not_a_file`, ...), or
/// `io_error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct FileError {
    pub code: &'static str,
    pub message: String,
}

impl From<FileFail> for FileError {
    fn from(f: FileFail) -> Self {
        match f {
            FileFail::Result(code, message) => FileError {
                code,
                message: message.to_owned(),
            },
            FileFail::Io(message) => FileError {
                code: "io_error",
                message,
            },
        }
    }
}

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_SYMLINKS);

// No `O_NOFOLLOW` here: with `O_DIRECTORY` it turns a symlink into ENOTDIR,
// while `RESOLVE_NO_SYMLINKS` already refuses one on every component, the
// last included, with ELOOP (reported `path_not_allowed`).
fn open_dir(base: &OwnedFd, name: &str) -> Result<OwnedFd, Errno> {
    rustix::fs::openat2(
        base,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        RESOLVE,
    )
}

fn ensure_dir(base: &OwnedFd, name: &str) -> Result<OwnedFd, Errno> {
    match rustix::fs::mkdirat(base, name, Mode::from_raw_mode(0o700)) {
        Ok(()) => {
            rustix::fs::fsync(base)?;
        }
        Err(Errno::EXIST) => {}
        Err(e) => return Err(e),
    }
    open_dir(base, name)
}

/// At most `max` bytes of an opened file whose `fstat` said `size` (the
/// buffer is sized from it; a file that grew is still cut at `max`).
fn read_open(file: std::fs::File, size: u64, max: u64) -> Result<Vec<u8>, FileFail> {
    let mut bytes = Vec::with_capacity(size.min(max) as usize + 1);
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(FileFail::Result(
            "file_too_large",
            "The file is larger than the read limit.",
        ));
    }
    Ok(bytes)
}

/// The namespace and agent ids each name one directory.
fn check_ids(namespace_id: &str, agent: &str) -> Result<(), FileFail> {
    for s in [namespace_id, agent] {
        if !PathSegment::new(s).is_ok_and(|p| p.as_str() == s)
            || s.starts_with(TEMP_PREFIX)
            || first_unsafe_in_name(s).is_some()
        {
            return Err(FileFail::Result(
                "path_not_allowed",
                "The namespace or agent id cannot name a directory.",
            ));
        }
    }
    Ok(())
}

impl FilesRoot {
    /// Opens (creating) the root directory and removes the temp files of
    /// writes a crashed host left behind.
    pub fn open(root: &Path, config: FilesConfig) -> std::io::Result<Self> {
        std::fs::create_dir_all(root)?;
        let root = rustix::fs::open(
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let swept = crate::tools::leftovers::sweep(&root);
        if swept.truncated || swept.errors > 0 {
            tracing::warn!(
                ?swept,
                "the sweep of interrupted writes' temp files was incomplete"
            );
        } else if swept.removed > 0 {
            tracing::info!(
                removed = swept.removed,
                "removed temp files of interrupted writes"
            );
        }
        let local = is_local(&root);
        Ok(Self {
            root,
            config,
            local,
        })
    }

    /// The bytes of the agent's file `path` (relative, as [`parse_path`]
    /// takes it), at most `max`; resolved beneath the agent's directory
    /// without following any symlink. For a host moving files in and out
    /// of a session; a turn reads through `files.read`.
    pub fn read_file(
        &self,
        namespace_id: &str,
        agent: &str,
        segments: &[String],
        max: u64,
    ) -> Result<Vec<u8>, FileError> {
        self.read_at_most(namespace_id, agent, segments, max)
            .map_err(FileError::from)
    }

    /// Writes the agent's file `path` atomically (0600, its directories
    /// 0700 when made), resolved as [`FilesRoot::read_file`].
    pub fn write_file(
        &self,
        namespace_id: &str,
        agent: &str,
        segments: &[String],
        content: &[u8],
    ) -> Result<(), FileError> {
        self.refuse_symlink_leaf(namespace_id, agent, segments)?;
        self.write_all(namespace_id, agent, segments, content)
            .map_err(FileError::from)
    }

    /// A symlink where the file would go is refused, not replaced: the
    /// host application is told, where a turn's `files.write` replaces
    /// the link itself (never following it).
    fn refuse_symlink_leaf(
        &self,
        namespace_id: &str,
        agent: &str,
        segments: &[String],
    ) -> Result<(), FileError> {
        let Some((leaf, parents)) = segments.split_last() else {
            return Ok(());
        };
        let dir = match self.agent_dir(namespace_id, agent, false) {
            Ok(base) => Self::walk(base, parents, false),
            Err(e) => Err(e),
        };
        let Ok(dir) = dir else {
            return Ok(()); // not there yet: the write makes it, or says why not
        };
        match rustix::fs::statat(&dir, leaf.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
                Err(FileFail::from(Errno::LOOP).into())
            }
            _ => Ok(()),
        }
    }

    fn agent_dir(
        &self,
        namespace_id: &str,
        agent: &str,
        create: bool,
    ) -> Result<OwnedFd, FileFail> {
        check_ids(namespace_id, agent)?;
        let step = |base: &OwnedFd, name: &str| {
            if create {
                ensure_dir(base, name)
            } else {
                open_dir(base, name)
            }
        };
        let ns = step(&self.root, namespace_id)?;
        Ok(step(&ns, agent)?)
    }

    fn walk(base: OwnedFd, segments: &[String], create: bool) -> Result<OwnedFd, FileFail> {
        let mut cur = base;
        for s in segments {
            cur = if create {
                ensure_dir(&cur, s)?
            } else {
                open_dir(&cur, s)?
            };
        }
        Ok(cur)
    }

    /// The agent's regular file `segs`, opened for reading, and its size.
    /// One `openat2` of `ns/agent/segs..` beneath the root: the ids and
    /// every segment are single names (no `/`, `.` or `..`, checked by
    /// [`check_ids`] and [`parse_path`]) and `RESOLVE_NO_SYMLINKS` refuses a
    /// symlink on every component, so the path can name only the file in
    /// the agent's directory, as the walk segment by segment did.
    pub(super) fn open_regular(
        &self,
        ns: &str,
        agent: &str,
        segs: &[String],
    ) -> Result<(std::fs::File, u64), FileFail> {
        check_ids(ns, agent)?;
        if segs.is_empty() {
            return Err(FileFail::Result(
                "is_a_directory",
                "The path names a directory.",
            ));
        }
        let mut path = String::with_capacity(
            ns.len() + agent.len() + segs.iter().map(|s| s.len() + 1).sum::<usize>() + 1,
        );
        path.push_str(ns);
        path.push('/');
        path.push_str(agent);
        for s in segs {
            path.push('/');
            path.push_str(s);
        }
        let fd = rustix::fs::openat2(
            &self.root,
            path.as_str(),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )?;
        let st = rustix::fs::fstat(&fd)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(FileFail::Result(
                "not_a_file",
                "The path does not name a regular file.",
            ));
        }
        Ok((std::fs::File::from(fd), st.st_size.max(0) as u64))
    }

    /// The bytes of a regular file, at most `max` of them.
    fn read_at_most(
        &self,
        ns: &str,
        agent: &str,
        segs: &[String],
        max: u64,
    ) -> Result<Vec<u8>, FileFail> {
        let (file, size) = self.open_regular(ns, agent, segs)?;
        read_open(file, size, max)
    }

    pub(super) fn read(&self, ns: &str, agent: &str, segs: &[String]) -> Result<Value, FileFail> {
        let (file, size) = self.open_regular(ns, agent, segs)?;
        self.read_answer(file, size, segs)
    }

    /// `files.read`'s answer from the opened file.
    pub(super) fn read_answer(
        &self,
        file: std::fs::File,
        size: u64,
        segs: &[String],
    ) -> Result<Value, FileFail> {
        let bytes = read_open(file, size, self.config.max_read_bytes)?;
        let size = bytes.len();
        let content = String::from_utf8(bytes)
            .map_err(|_| FileFail::Result("file_not_text", "The file is not UTF-8 text."))?;
        Ok(json!({"path": segs.join("/"), "content": content, "bytes": size}))
    }

    pub(super) fn write(
        &self,
        ns: &str,
        agent: &str,
        segs: &[String],
        content: &str,
    ) -> Result<Value, FileFail> {
        self.write_all(ns, agent, segs, content.as_bytes())?;
        Ok(json!({"path": segs.join("/"), "bytes": content.len()}))
    }

    /// Writes `content` atomically: a temp file (0600), `fsync`,
    /// `renameat`, `fsync` of the directory.
    fn write_all(
        &self,
        ns: &str,
        agent: &str,
        segs: &[String],
        content: &[u8],
    ) -> Result<(), FileFail> {
        let (leaf, parents) = segs.split_last().ok_or(FileFail::Result(
            "is_a_directory",
            "The path names a directory.",
        ))?;
        let dir = Self::walk(self.agent_dir(ns, agent, true)?, parents, true)?;
        let temp = format!("{TEMP_PREFIX}{}", uuid::Uuid::new_v4().simple());
        let fd = rustix::fs::openat2(
            &dir,
            temp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
            RESOLVE,
        )?;
        let result = (|| -> Result<(), FileFail> {
            // Held until the file is closed: a sweep never takes a live
            // write's temp file.
            rustix::fs::flock(&fd, rustix::fs::FlockOperation::LockExclusive)?;
            let mut file = std::fs::File::from(fd);
            file.write_all(content)?;
            file.sync_all()?;
            rustix::fs::renameat(&dir, temp.as_str(), &dir, leaf.as_str())?;
            rustix::fs::fsync(&dir)?;
            Ok(())
        })();
        if result.is_err() {
            let _ = rustix::fs::unlinkat(&dir, temp.as_str(), AtFlags::empty());
        }
        result
    }

    pub(super) fn list(&self, ns: &str, agent: &str, segs: &[String]) -> Result<Value, FileFail> {
        let base = match self.agent_dir(ns, agent, false) {
            Err(FileFail::Result("file_not_found", _)) if segs.is_empty() => {
                return Ok(json!({"path": "", "entries": [], "truncated": false}));
            }
            other => other?,
        };
        let dir = Self::walk(base, segs, false)?;
        let mut entries = Vec::new();
        let mut truncated = false;
        let mut reader = rustix::fs::Dir::read_from(&dir)?;
        while let Some(entry) = reader.read() {
            let entry = entry?;
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            if name == "." || name == ".." || name.starts_with(TEMP_PREFIX) {
                continue;
            }
            if entries.len() >= self.config.max_list_entries {
                truncated = true;
                break;
            }
            let st = match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            let kind = match FileType::from_raw_mode(st.st_mode) {
                FileType::RegularFile => "file",
                FileType::Directory => "directory",
                FileType::Symlink => "symlink",
                _ => "other",
            };
            entries.push(json!({"name": name, "kind": kind, "bytes": st.st_size}));
        }
        entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        Ok(json!({"path": segs.join("/"), "entries": entries, "truncated": truncated}))
    }

    pub(super) fn delete(&self, ns: &str, agent: &str, segs: &[String]) -> Result<Value, FileFail> {
        let (leaf, parents) = segs.split_last().ok_or(FileFail::Result(
            "path_not_allowed",
            "The agent's root cannot be deleted.",
        ))?;
        let dir = Self::walk(self.agent_dir(ns, agent, false)?, parents, false)?;
        let st = rustix::fs::statat(&dir, leaf.as_str(), AtFlags::SYMLINK_NOFOLLOW)?;
        let flags = if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        rustix::fs::unlinkat(&dir, leaf.as_str(), flags)?;
        rustix::fs::fsync(&dir)?;
        Ok(json!({"path": segs.join("/"), "deleted": true}))
    }
}
