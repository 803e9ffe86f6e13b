//! Data at rest: the store and the files root are the owner's alone.
//!
//! The SQLite store holds every scope, payload, result, grant and audit
//! record; the files root every agent's files. The store creates its
//! database owner-only (its `-wal` and `-shm` take the database's mode);
//! `serve` creates a missing files root 0700, whatever the umask. Before
//! anything is opened, `serve` refuses a database, `-wal`, `-shm` or files
//! root that group or others may read or write, or that another user owns,
//! naming the path and the fix, unless host.toml says
//! `[serve] allowSharedStore = true` (docs/STORE.md, "Data at rest").

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{ServeError, StoreChoice};

/// What makes an existing path readable or writable by anyone else, if
/// anything: another owner, or a group or others bit in its mode.
fn exposure(path: &Path) -> Result<Option<String>, ServeError> {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(ServeError::Setup(format!(
                "cannot inspect {}: {e}",
                path.display()
            )));
        }
    };
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Ok(Some(format!(
            "is owned by uid {}, not by uid {me} that serves it",
            meta.uid()
        )));
    }
    let mode = meta.permissions().mode() & 0o7777;
    Ok((mode & 0o077 != 0)
        .then(|| format!("has mode {mode:04o}: its group or others may read or write it")))
}

/// Refuses (or, when allowed, reports) each exposed path of `paths`.
fn refuse_exposed(paths: &[(PathBuf, &str)], allow: bool) -> Result<(), ServeError> {
    for (path, fix) in paths {
        let Some(why) = exposure(path)? else {
            continue;
        };
        if allow {
            eprintln!(
                "sharedos serve: {} {why}; starting anyway ([serve] allowSharedStore = true)",
                path.display()
            );
            continue;
        }
        return Err(ServeError::Setup(format!(
            "{} {why}, and it holds the host's state (scopes, payloads, results, grants, audit): {fix} {}, or set `allowSharedStore = true` under [serve] in host.toml to start anyway",
            path.display(),
            path.display()
        )));
    }
    Ok(())
}

/// The SQLite database and its `-wal` and `-shm`, where they exist, must
/// be the serving user's alone. PostgreSQL keeps its files in its own
/// cluster, under its own rules.
pub(super) fn check_store(store: &StoreChoice, allow: bool) -> Result<(), ServeError> {
    let StoreChoice::Sqlite(db, _) = store else {
        return Ok(());
    };
    let with_suffix = |suffix: &str| {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    let own = "make it the serving user's alone: chown it and run chmod 600";
    let paths = [
        (db.clone(), own),
        (with_suffix("-wal"), own),
        (with_suffix("-shm"), own),
    ];
    refuse_exposed(&paths, allow)
}

/// The files root: created 0700 when missing (with any missing parent,
/// each 0700); refused when it exists and others may reach it.
pub(super) fn files_root(path: &Path, allow: bool) -> Result<(), ServeError> {
    refuse_exposed(
        &[(
            path.to_path_buf(),
            "make it the serving user's alone: chown it and run chmod 700",
        )],
        allow,
    )?;
    if path.exists() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)))
        .map_err(|e| {
            ServeError::Setup(format!(
                "cannot create the files root {} (mode 0700): {e}",
                path.display()
            ))
        })
}
