//! One uid per sandbox. Each live sandbox runs as a uid (and gid) of its
//! own from the policy's range, so per-uid kernel counters (inotify,
//! queued signals, processes), the user namespaces it owns and `/proc`
//! access are per sandbox.
//!
//! Allocation is machine-wide, across host processes: one lock file per
//! uid under `<state dir>/uids/`, held with `flock` by the host for the
//! sandbox's whole life (a prepared sandbox included) and released when
//! the [`UidLease`] drops, which the spawn code does only after the tree
//! is dead. A host that dies releases its locks with it (the kernel drops
//! the `flock`), and its trees die by their parent-death signal.

use rustix::fs::FlockOperation;
use rustix::io::Errno;

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::policy::UidPolicy;

pub use crate::error::UidError;

/// A uid held for one sandbox; dropping it releases the uid.
#[derive(Debug)]
pub struct UidLease {
    uid: u32,
    _lock: File,
}

impl UidLease {
    /// The uid (and gid) of the sandbox.
    pub fn uid(&self) -> u32 {
        self.uid
    }
}

/// The host's private state directory ([`crate::statedir`]).
pub fn state_dir() -> Result<PathBuf, UidError> {
    crate::statedir::state_dir().map_err(state_dir_error)
}

/// `dir` created 0700 unless it exists, and checked private to this uid.
fn private_dir(dir: &Path) -> Result<(), UidError> {
    crate::statedir::private_dir(dir).map_err(state_dir_error)
}

fn state_dir_error(e: crate::SandboxError) -> UidError {
    match e {
        crate::SandboxError::BadPath { path, reason, .. } => UidError::StateDir { path, reason },
        other => UidError::StateDir {
            path: crate::statedir::location(),
            reason: other.to_string(),
        },
    }
}

/// Check the range: non-empty, inside the valid uids, no account or group
/// of the system in it, none of the host's own ids, neither 0 nor
/// `nobody`, and no subordinate range of `/etc/subuid`/`/etc/subgid`.
pub fn check_range(p: &UidPolicy) -> Result<(), UidError> {
    check_range_against(p, Path::new("/etc"), &host_ids())
}

/// [`check_range`], once per range and process (the host checks at start;
/// this covers every other caller of `spawn` before its first sandbox).
pub(crate) fn check_range_once(p: &UidPolicy) -> Result<(), UidError> {
    static CHECKED: std::sync::Mutex<Vec<(u32, u32)>> = std::sync::Mutex::new(Vec::new());
    let key = (p.first, p.count);
    if CHECKED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&key)
    {
        return Ok(());
    }
    check_range(p)?;
    CHECKED.lock().unwrap_or_else(|e| e.into_inner()).push(key);
    Ok(())
}

fn host_ids() -> Vec<u32> {
    use rustix::process::{getegid, geteuid, getgid, getuid};
    let mut ids = vec![
        getuid().as_raw(),
        geteuid().as_raw(),
        getgid().as_raw(),
        getegid().as_raw(),
    ];
    ids.push(65534);
    ids
}

pub(crate) fn check_range_against(p: &UidPolicy, etc: &Path, host: &[u32]) -> Result<(), UidError> {
    let end = p.first as u64 + p.count as u64;
    let bad = |reason: String| UidError::BadRange {
        first: p.first,
        end,
        reason,
    };
    if p.count == 0 {
        return Err(bad("the range is empty".into()));
    }
    // (u32)-1 means "no change" to setresuid; 0 is root.
    if p.first == 0 || end > u32::MAX as u64 {
        return Err(bad("uid 0 and 4294967295 are never sandbox uids".into()));
    }
    let inside = |id: u64| (p.first as u64..end).contains(&id);
    if let Some(id) = host.iter().find(|id| inside(**id as u64)) {
        return Err(bad(format!(
            "it contains id {id}, which the host itself uses"
        )));
    }
    for file in ["passwd", "group"] {
        let text = std::fs::read_to_string(etc.join(file)).unwrap_or_default();
        for line in text.lines() {
            let f: Vec<&str> = line.split(':').collect();
            if let Some(id) = f.get(2).and_then(|v| v.parse::<u64>().ok())
                && inside(id)
            {
                return Err(bad(format!("/etc/{file} names `{}` with id {id}", f[0])));
            }
        }
    }
    for file in ["subuid", "subgid"] {
        let text = std::fs::read_to_string(etc.join(file)).unwrap_or_default();
        for line in text.lines() {
            let f: Vec<&str> = line.split(':').collect();
            let (Some(s), Some(n)) = (
                f.get(1).and_then(|v| v.parse::<u64>().ok()),
                f.get(2).and_then(|v| v.parse::<u64>().ok()),
            ) else {
                continue;
            };
            if s < end && (p.first as u64) < s + n {
                return Err(bad(format!(
                    "/etc/{file} gives `{}` the overlapping range {s}..{}",
                    f[0],
                    s + n
                )));
            }
        }
    }
    Ok(())
}

/// Take a free uid of the range for one sandbox, machine-wide.
pub fn allocate(p: &UidPolicy) -> Result<UidLease, UidError> {
    let dir = state_dir()?.join("uids");
    allocate_in(p, &dir)
}

pub(crate) fn allocate_in(p: &UidPolicy, dir: &Path) -> Result<UidLease, UidError> {
    private_dir(dir)?;
    // Start where this process left off, from a per-process offset: a uid
    // just released is the last one taken again, and concurrent hosts
    // rarely try the same file first.
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let start = match NEXT.load(Ordering::Relaxed) {
        u32::MAX => std::process::id().wrapping_mul(2_654_435_761),
        n => n,
    };
    for i in 0..p.count {
        let slot = start.wrapping_add(i) % p.count;
        let uid = p.first + slot;
        let path = dir.join(uid.to_string());
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|source| UidError::Io {
                op: "open the uid lock",
                path: path.clone(),
                source,
            })?;
        match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {
                NEXT.store(slot.wrapping_add(1) % p.count, Ordering::Relaxed);
                return Ok(UidLease { uid, _lock: file });
            }
            Err(Errno::WOULDBLOCK) => {}
            Err(e) => {
                return Err(UidError::Io {
                    op: "flock the uid lock",
                    path,
                    source: e.into(),
                });
            }
        }
    }
    Err(UidError::Exhausted {
        first: p.first,
        end: p.first as u64 + p.count as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(first: u32, count: u32) -> UidPolicy {
        UidPolicy {
            first,
            count,
            required: false,
        }
    }

    fn etc(passwd: &str, subuid: &str) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("passwd"), passwd).unwrap();
        std::fs::write(d.path().join("group"), "root:x:0:\n").unwrap();
        std::fs::write(d.path().join("subuid"), subuid).unwrap();
        d
    }

    #[test]
    fn a_range_with_an_account_a_host_id_or_a_subuid_is_refused() {
        let e = etc(
            "root:x:0:0::/root:/bin/sh\nsvc:x:1610612800:1::/:/bin/false\n",
            "",
        );
        let err = check_range_against(&range(0x6000_0000, 4096), e.path(), &[0]).unwrap_err();
        assert!(err.to_string().contains("`svc`"), "{err}");
        let e = etc("root:x:0:0::/root:/bin/sh\n", "");
        assert!(check_range_against(&range(0x6000_0000, 4096), e.path(), &[0]).is_ok());
        let err = check_range_against(&range(65000, 1000), e.path(), &[65534]).unwrap_err();
        assert!(err.to_string().contains("65534"), "{err}");
        let err = check_range_against(&range(u32::MAX - 10, 11), e.path(), &[0]).unwrap_err();
        assert!(err.to_string().contains("4294967295"), "{err}");
        assert!(check_range_against(&range(5, 0), e.path(), &[0]).is_err());
        let e = etc("", "alice:1610612000:65536\n");
        let err = check_range_against(&range(0x6000_0000, 4096), e.path(), &[0]).unwrap_err();
        assert!(err.to_string().contains("subuid"), "{err}");
    }

    #[test]
    fn a_held_uid_is_never_handed_out_again_until_released() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("uids");
        let p = range(0x6000_0000, 3);
        let a = allocate_in(&p, &dir).unwrap();
        let b = allocate_in(&p, &dir).unwrap();
        let c = allocate_in(&p, &dir).unwrap();
        let mut got = [a.uid(), b.uid(), c.uid()];
        got.sort();
        assert_eq!(got, [0x6000_0000, 0x6000_0001, 0x6000_0002]);
        assert!(matches!(
            allocate_in(&p, &dir),
            Err(UidError::Exhausted { .. })
        ));
        let freed = b.uid();
        drop(b);
        assert_eq!(allocate_in(&p, &dir).unwrap().uid(), freed);
    }

    #[test]
    fn a_state_dir_others_can_reach_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("uids");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let err = allocate_in(&range(0x6000_0000, 3), &dir).unwrap_err();
        assert!(err.to_string().contains("0700"), "{err}");
    }
}
