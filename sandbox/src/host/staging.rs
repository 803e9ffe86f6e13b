//! The plugin binary, staged in the host-private state directory.
//!
//! A bind mount shows its source's path within the source filesystem in
//! the sandbox's mount table (`/proc/self/mountinfo`), so binding the
//! plugin from where the operator installed it would tell the plugin that
//! host path. The sandbox binds a hard link to it (a copy across
//! filesystems) instead, kept under
//! `<state dir>/plugins/<key>/<name>`: the key is derived from the
//! program's identity (device, inode, size, mtime; not ctime, which the
//! hard link itself changes), so the copy is made once per program version
//! and the path reveals nothing of the host.
//!
//! A pinned program ([`stage_pinned`]) is never a hard link: the bytes are
//! copied into the state directory and hashed as they are copied, the copy
//! is refused unless its digest is the pin, and it is kept under
//! `<state dir>/plugins/sha256-<digest>/<name>`, so two different files
//! never share a staged copy and nobody but the host can change it.

use std::hash::{Hash, Hasher};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::pin::ProgramDigest;
use crate::{SandboxError, statedir};

/// Programs this process staged: (program as given, its identity key,
/// the staged path). A spawn of the same version of a program then costs a
/// `stat` of it and an `lstat` of the staged file (another host's sweep
/// may have removed it), not the path walk and the directory checks.
type StagedCache = std::sync::Mutex<Vec<(PathBuf, u64, PathBuf)>>;
static STAGED: StagedCache = std::sync::Mutex::new(Vec::new());

/// The staged copy of `program` (made now if there is none for this
/// version of it).
pub fn stage_program(program: &Path) -> Result<PathBuf, SandboxError> {
    let bad = |reason: String| SandboxError::BadPath {
        what: "program",
        path: program.to_path_buf(),
        reason,
    };
    // The identity of the file itself (`metadata` follows symlinks). Not
    // its ctime: the hard link staging makes changes it, so every spawn
    // would have staged the program again under a new key.
    let md = std::fs::metadata(program).map_err(|e| bad(e.to_string()))?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (md.dev(), md.ino(), md.size(), md.mtime(), md.mtime_nsec()).hash(&mut h);
    let key = h.finish();
    let cached = STAGED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|(p, k, _)| p == program && *k == key)
        .map(|(_, _, staged)| staged.clone());
    if let Some(staged) = cached
        && std::fs::symlink_metadata(&staged).is_ok_and(|s| s.is_file() && s.size() == md.size())
    {
        return Ok(staged);
    }
    let staged = stage_anew(program, &md, key)?;
    let mut cache = STAGED.lock().unwrap_or_else(|p| p.into_inner());
    cache.retain(|(p, _, _)| p != program);
    cache.push((program.to_path_buf(), key, staged.clone()));
    Ok(staged)
}

/// Stages `program` (identity `md`, `key`) in the state directory unless
/// a copy of this version is there already.
fn stage_anew(program: &Path, md: &std::fs::Metadata, key: u64) -> Result<PathBuf, SandboxError> {
    let bad = |reason: String| SandboxError::BadPath {
        what: "program",
        path: program.to_path_buf(),
        reason,
    };
    // The file itself, not a symlink to it (`/bin/sh -> dash`): a hard
    // link to a relative symlink would dangle in the staging directory.
    let real = std::fs::canonicalize(program).map_err(|e| bad(e.to_string()))?;
    let name = program
        .file_name()
        .ok_or_else(|| bad("has no file name".into()))?;
    let plugins = statedir::subdir("plugins")?;
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| sweep_orphans(&plugins));
    let dir = plugins.join(format!("{key:016x}"));
    let staged = dir.join(name);
    if std::fs::symlink_metadata(&staged).is_ok_and(|s| s.is_file() && s.size() == md.size()) {
        return Ok(staged);
    }
    // Copy under a name of our own, then rename into place: a concurrent
    // host staging the same program never sees a half-written file.
    static N: AtomicU32 = AtomicU32::new(0);
    let tmp = plugins.join(format!(
        ".tmp-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let copy = || -> std::io::Result<()> {
        // A hard link where the program is on the same filesystem (no
        // space used; the mount table shows the link's path all the same),
        // else a copy.
        if std::fs::hard_link(&real, &tmp).is_err() {
            std::fs::copy(&real, &tmp)?;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
        }
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        std::fs::rename(&tmp, &staged)
    };
    copy().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        SandboxError::Io {
            op: "stage the plugin binary in the state directory",
            source: e,
        }
    })?;
    Ok(staged)
}

/// The identity of a file as far as a change of its bytes goes: any write,
/// truncation, `rename` over it or `chmod` changes its ctime (which only
/// the kernel sets), a replacement its inode.
type Identity = (u64, u64, u64, i64, i64, i64, i64);

fn identity(md: &std::fs::Metadata) -> Identity {
    let m = md;
    (
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    )
}

/// Pinned programs this process staged: (program as given, the identity
/// it had when its bytes were hashed, the pin, the staged copy).
type PinnedCache = std::sync::Mutex<Vec<(PathBuf, Identity, ProgramDigest, PathBuf)>>;
static PINNED: PinnedCache = std::sync::Mutex::new(Vec::new());

/// The staged copy of `program` whose bytes hash to `pin`, made now unless
/// this process staged the file unchanged since (same inode, same ctime).
/// Refuses a program whose bytes are not the pinned ones with
/// [`SandboxError::PinMismatch`]; nothing of it is staged then.
pub fn stage_pinned(program: &Path, pin: &ProgramDigest) -> Result<PathBuf, SandboxError> {
    let bad = |reason: String| SandboxError::BadPath {
        what: "program",
        path: program.to_path_buf(),
        reason,
    };
    let md = std::fs::metadata(program).map_err(|e| bad(e.to_string()))?;
    let cached = PINNED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|(p, id, d, _)| p == program && *id == identity(&md) && d == pin)
        .map(|(_, _, _, staged)| staged.clone());
    if let Some(staged) = cached
        && std::fs::symlink_metadata(&staged).is_ok_and(|s| s.is_file() && s.size() == md.size())
    {
        return Ok(staged);
    }
    let (staged, id) = copy_pinned(program, pin)?;
    let mut cache = PINNED.lock().unwrap_or_else(|p| p.into_inner());
    cache.retain(|(p, _, _, _)| p != program);
    cache.push((program.to_path_buf(), id, *pin, staged.clone()));
    Ok(staged)
}

/// Copies `program` into the state directory, hashing the bytes it copies,
/// and moves the copy to its digest's place if the digest is `pin`.
/// Returns the staged path and the identity the source had while read.
fn copy_pinned(program: &Path, pin: &ProgramDigest) -> Result<(PathBuf, Identity), SandboxError> {
    use std::io::{Read, Write};
    let bad = |reason: String| SandboxError::BadPath {
        what: "program",
        path: program.to_path_buf(),
        reason,
    };
    let name = program
        .file_name()
        .ok_or_else(|| bad("has no file name".into()))?;
    let mut src = std::fs::File::open(program).map_err(|e| bad(e.to_string()))?;
    let before = src.metadata().map_err(|e| bad(e.to_string()))?;
    if !before.is_file() {
        return Err(bad("not a file".into()));
    }
    let plugins = statedir::subdir("plugins")?;
    static N: AtomicU32 = AtomicU32::new(0);
    let tmp = plugins.join(format!(
        ".tmp-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let io = |e| SandboxError::Io {
        op: "copy the pinned plugin binary into the state directory",
        source: e,
    };
    let mut hasher = ProgramDigest::hasher();
    let copied = (|| -> std::io::Result<()> {
        let mut dst = std::fs::File::create_new(&tmp)?;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = match src.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            sha2::Digest::update(&mut hasher, &buf[..n]);
            dst.write_all(&buf[..n])?;
        }
        dst.set_permissions(std::fs::Permissions::from_mode(0o555))?;
        dst.sync_all()
    })();
    let actual = ProgramDigest::from_hasher(hasher);
    let placed = copied.and_then(|()| {
        if actual != *pin {
            return Ok(None);
        }
        let dir = plugins.join(format!("sha256-{actual}"));
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let staged = dir.join(name);
        std::fs::rename(&tmp, &staged)?;
        Ok(Some(staged))
    });
    let _ = std::fs::remove_file(&tmp);
    match placed.map_err(io)? {
        Some(staged) => Ok((staged, identity(&before))),
        None => Err(SandboxError::PinMismatch {
            program: program.to_path_buf(),
            expected: *pin,
            actual,
        }),
    }
}

/// Once per process: remove staged binaries nothing else links to any
/// more (the program they link to was deleted, or a copy) and whose inode
/// has not changed for an hour. A host still using one stages it again
/// at its next spawn.
fn sweep_orphans(plugins: &Path) {
    let Ok(entries) = std::fs::read_dir(plugins) else {
        return;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    for dir in entries.flatten() {
        let Ok(files) = std::fs::read_dir(dir.path()) else {
            continue;
        };
        let orphaned = files.flatten().all(|f| {
            f.metadata()
                .is_ok_and(|m| m.nlink() == 1 && now - m.ctime() > 3600)
        });
        if orphaned && !dir.file_name().to_string_lossy().starts_with('.') {
            let _ = crate::removal::remove_tree(&dir.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_is_staged_once_per_version() {
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("plugin");
        std::fs::write(&program, b"#!/bin/sh\n").unwrap();
        let first = stage_program(&program).unwrap();
        assert_eq!(std::fs::read(&first).unwrap(), b"#!/bin/sh\n");
        assert_eq!(stage_program(&program).unwrap(), first, "cached");
        // A new version is staged anew, under a new key.
        std::fs::write(&program, b"#!/bin/sh\nexit 0\n").unwrap();
        let second = stage_program(&program).unwrap();
        assert_ne!(second, first);
        assert_eq!(std::fs::read(&second).unwrap(), b"#!/bin/sh\nexit 0\n");
        // A staged copy removed meanwhile (another host's sweep) is made
        // again.
        std::fs::remove_file(&second).unwrap();
        assert_eq!(stage_program(&program).unwrap(), second);
        assert!(second.is_file());
        for p in [&first, &second] {
            let _ = std::fs::remove_dir_all(p.parent().unwrap());
        }
    }

    #[test]
    fn a_pinned_program_is_a_copy_keyed_by_its_digest_and_refused_when_it_differs() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("plugin");
        let bytes = format!("#!/bin/sh\n# {:?}\n", dir.path());
        std::fs::write(&program, &bytes).unwrap();
        let pin = ProgramDigest::of_reader(bytes.as_bytes()).unwrap();
        let staged = stage_pinned(&program, &pin).unwrap();
        assert!(
            staged.ends_with(format!("sha256-{pin}/plugin")),
            "{staged:?}"
        );
        assert_eq!(std::fs::read(&staged).unwrap(), bytes.as_bytes());
        let (src, copy) = (program.metadata().unwrap(), staged.metadata().unwrap());
        assert_ne!(
            (src.dev(), src.ino()),
            (copy.dev(), copy.ino()),
            "a copy, not a link"
        );
        assert_eq!(copy.mode() & 0o7777, 0o555);
        // Changed in place: refused with both digests, nothing new staged.
        std::fs::write(&program, b"#!/bin/sh\necho other\n").unwrap();
        let actual = ProgramDigest::of_reader(&b"#!/bin/sh\necho other\n"[..]).unwrap();
        match stage_pinned(&program, &pin) {
            Err(SandboxError::PinMismatch {
                expected,
                actual: a,
                ..
            }) => assert_eq!((expected, a), (pin, actual)),
            other => panic!("{other:?}"),
        }
        let other_dir = staged
            .parent()
            .unwrap()
            .with_file_name(format!("sha256-{actual}"));
        assert!(!other_dir.exists());
        assert_eq!(std::fs::read(&staged).unwrap(), bytes.as_bytes());
        let _ = std::fs::remove_dir_all(staged.parent().unwrap());
    }
}
