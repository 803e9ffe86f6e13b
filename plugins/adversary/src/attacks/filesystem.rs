//! Files of the host: secrets to read, paths to write, links out of the
//! workspace (sandbox.md C01–C08).

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::bait::Bait;
use crate::receipt::{Receipt, describe_errno, describe_io};
use crate::sys;

/// Reads a file through `path`, at most 64 KiB; never echoes its content.
fn read_attempt(attack: &str, path: &Path) -> Receipt {
    match sys::read_prefix(path, 64 * 1024) {
        Ok(bytes) => Receipt::succeeded(
            attack,
            format!(
                "succeeded: read {} bytes of {}",
                bytes.len(),
                path.display()
            ),
        ),
        Err(e) => Receipt::blocked(
            attack,
            format!("blocked: {} on {}", describe_io(&e), path.display()),
        ),
    }
}

pub fn c01_read_host_secret(bait: &Bait) -> Receipt {
    const A: &str = "C01-read-host-secret";
    match &bait.secret_path {
        Some(p) => read_attempt(A, p),
        None => Receipt::not_attempted(A, "no secret_path in the bait"),
    }
}

const CREDENTIALS: &[&str] = &[
    ".ssh/id_rsa",
    ".ssh/id_ed25519",
    ".ssh/id_ecdsa",
    ".aws/credentials",
    ".codex/auth.json",
    ".claude/.credentials.json",
    ".config/gh/hosts.yml",
    ".docker/config.json",
    ".git-credentials",
    ".netrc",
];

pub fn c02_read_home_credentials(bait: &Bait) -> Receipt {
    const A: &str = "C02-read-home-credentials";
    let mut seen = Vec::new();
    let mut leaked = false;
    for home in bait.homes() {
        match std::fs::read_dir(&home) {
            Ok(d) => {
                leaked = true;
                seen.push(format!("listed {} ({} entries)", home.display(), d.count()));
            }
            Err(e) => seen.push(format!("list {}: {}", home.display(), describe_io(&e))),
        }
        for rel in CREDENTIALS {
            let p = home.join(rel);
            if let Ok(b) = sys::read_prefix(&p, 64 * 1024) {
                leaked = true;
                seen.push(format!("read {} ({} bytes)", p.display(), b.len()));
            }
        }
    }
    let verdict = if leaked { "succeeded" } else { "blocked" };
    Receipt::judged(A, !leaked, format!("{verdict}: {}", seen.join("; ")))
}

pub fn c03_read_etc_shadow(_: &Bait) -> Receipt {
    read_attempt("C03-read-etc-shadow", Path::new("/etc/shadow"))
}

/// Creates `path` exclusively and writes a marker line into it.
fn create_marker(path: &Path, attack: &str) -> Result<usize, std::io::Error> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)?;
    let line = format!("written by sharedos-adversary {attack}\n");
    f.write_all(line.as_bytes())?;
    Ok(line.len())
}

pub fn c04_write_outside_workspace(bait: &Bait) -> Receipt {
    const A: &str = "C04-write-outside-workspace";
    let targets: Vec<PathBuf> = if bait.host_write_paths.is_empty() {
        ["/var/tmp", "/etc"]
            .iter()
            .map(|d| Path::new(d).join(sys::unique("pwned")))
            .collect()
    } else {
        bait.host_write_paths.clone()
    };
    let mut seen = Vec::new();
    let mut wrote = false;
    for t in &targets {
        match create_marker(t, A) {
            Ok(n) => {
                wrote = true;
                seen.push(format!("wrote {n} bytes to {}", t.display()));
                bait.tidy(t);
            }
            Err(e) => seen.push(format!("{}: {}", t.display(), describe_io(&e))),
        }
    }
    let verdict = if wrote { "succeeded" } else { "blocked" };
    Receipt::judged(A, !wrote, format!("{verdict}: {}", seen.join("; ")))
}

pub fn c05_write_host_tmp(bait: &Bait) -> Receipt {
    const A: &str = "C05-write-host-tmp";
    let (probe, target) = match &bait.host_tmp_path {
        Some(p) => (
            Some(p.clone()),
            PathBuf::from(format!("{}.pwned", p.display())),
        ),
        None => (None, Path::new("/tmp").join(sys::unique("pwned"))),
    };
    let read = probe.as_ref().map(|p| sys::read_prefix(p, 64 * 1024));
    let write = create_marker(&target, A);
    let mut obs = Vec::new();
    if let (Some(p), Some(r)) = (&probe, &read) {
        obs.push(match r {
            Ok(b) => format!("read host file {} ({} bytes)", p.display(), b.len()),
            Err(e) => format!("host file {}: {}", p.display(), describe_io(e)),
        });
    }
    obs.push(match &write {
        Ok(n) => format!("wrote {n} bytes to {}", target.display()),
        Err(e) => format!("write {}: {}", target.display(), describe_io(e)),
    });
    if write.is_ok() {
        bait.tidy(&target);
    }
    let obs = obs.join("; ");
    match (read, write) {
        (Some(Ok(_)), _) => {
            Receipt::succeeded(A, format!("succeeded: the host's /tmp is visible: {obs}"))
        }
        // The write may have landed in a private tmpfs: only the host can tell.
        (_, Ok(_)) => Receipt::unjudged(A, format!("wrote somewhere: {obs}")),
        (_, Err(_)) => Receipt::blocked(A, format!("blocked: {obs}")),
    }
}

pub fn c06_symlink_to_secret(bait: &Bait) -> Receipt {
    const A: &str = "C06-symlink-to-host-secret";
    let target = bait
        .secret_path
        .clone()
        .unwrap_or_else(|| "/etc/shadow".into());
    let link = bait.workspace().join(sys::unique("symlink"));
    if let Err(e) = std::os::unix::fs::symlink(&target, &link) {
        return Receipt::blocked(
            A,
            format!("blocked: symlink in the workspace: {}", describe_io(&e)),
        );
    }
    let r = read_attempt(A, &link);
    let _ = std::fs::remove_file(&link);
    Receipt {
        observed: format!("{} -> {}: {}", link.display(), target.display(), r.observed),
        ..r
    }
}

pub fn c07_hard_link_host_file(bait: &Bait) -> Receipt {
    const A: &str = "C07-hard-link-host-file";
    let target = bait
        .secret_path
        .clone()
        .unwrap_or_else(|| "/etc/shadow".into());
    let link = bait.workspace().join(sys::unique("hardlink"));
    match std::fs::hard_link(&target, &link) {
        Ok(()) => {
            let n = sys::read_prefix(&link, 64 * 1024)
                .map(|b| b.len())
                .unwrap_or(0);
            let _ = std::fs::remove_file(&link);
            Receipt::succeeded(
                A,
                format!(
                    "succeeded: linked {} as {} and read {n} bytes",
                    target.display(),
                    link.display()
                ),
            )
        }
        Err(e) => Receipt::blocked(
            A,
            format!("blocked: link({}): {}", target.display(), describe_io(&e)),
        ),
    }
}

pub fn c08_protected_metadata(bait: &Bait) -> Receipt {
    const A: &str = "C08-replace-protected-metadata";
    let git = bait.workspace().join(".git");
    if !git.exists() {
        return Receipt::not_attempted(
            A,
            format!("no {} in the workspace to attack", git.display()),
        );
    }
    let hook = git.join("hooks").join(sys::unique("hook"));
    let c = sys::cstring(&git.join("config"));
    let mut obs = Vec::new();
    // SAFETY: `c` is NUL-terminated and outlives the call; the fd is closed
    // right away and nothing is written to the config.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_WRONLY | libc::O_APPEND | libc::O_CLOEXEC,
        )
    };
    let config_ok = fd >= 0;
    if config_ok {
        // SAFETY: closing the fd we just opened.
        unsafe { libc::close(fd) };
        obs.push("opened .git/config for writing".to_owned());
    } else {
        obs.push(format!(".git/config: {}", describe_errno(sys::errno())));
    }
    let hook_ok = match create_marker(&hook, A) {
        Ok(n) => {
            obs.push(format!("wrote {n} bytes to {}", hook.display()));
            bait.tidy(&hook);
            true
        }
        Err(e) => {
            obs.push(format!("{}: {}", hook.display(), describe_io(&e)));
            false
        }
    };
    let worked = config_ok || hook_ok;
    let verdict = if worked { "succeeded" } else { "blocked" };
    Receipt::judged(A, !worked, format!("{verdict}: {}", obs.join("; ")))
}

/// Issue 14, finding 1: a directory chain deep enough that a host removing
/// the workspace with a recursive walk overflows its stack, and one that
/// holds an fd per level runs out. Built with `mkdirat`/`openat` one level
/// at a time (no recursion, two fds). The verdict is the host's: it must
/// survive, return a result, and a later host must start cleanly.
pub fn c34b_deep_directory_chain(bait: &Bait) -> Receipt {
    const A: &str = "C34b-deep-directory-chain";
    let want = bait.chain_depth();
    let ws = bait.workspace();
    let top = ws.join(format!("sharedos-chain-{}", std::process::id()));
    let mut made = 0u64;
    let stop = (|| -> Result<(), i32> {
        let name = c"d";
        let first = sys::cstring(&top);
        // SAFETY: `first` is NUL-terminated.
        if unsafe { libc::mkdir(first.as_ptr(), 0o755) } != 0 {
            return Err(sys::errno());
        }
        let mut cur = sys::open(&top, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        while made < want {
            // SAFETY: `cur` is an open directory fd, `name` NUL-terminated.
            if unsafe { libc::mkdirat(cur.as_raw_fd(), name.as_ptr(), 0o755) } != 0 {
                return Err(sys::errno());
            }
            made += 1;
            // SAFETY: as above; the new fd is owned right away.
            let fd = unsafe {
                libc::openat(
                    cur.as_raw_fd(),
                    name.as_ptr(),
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                )
            };
            cur = sys::owned(fd.into())?;
        }
        Ok(())
    })();
    let how = match stop {
        Ok(()) => "built in full".to_string(),
        Err(e) => format!("stopped by {}", describe_errno(e)),
    };
    Receipt::unjudged(
        A,
        format!(
            "built a chain of {made} of {want} directories in {} ({how}); the host judges: \
             it must survive the end of the turn and leave nothing",
            ws.display()
        ),
    )
}

/// Issue 14, finding 2: files a later host user could run to become the
/// sandbox uid. Plants a setuid (4755) and a plain executable (0755) script
/// in every writable place (workspace, /tmp, /dev/shm), named with a marker
/// the host searches for, then holds (the `then` half) so the host can
/// look while the sandbox is alive. The verdict is the host's.
pub fn c49b_plant_setuid_and_executable(bait: &Bait) -> Receipt {
    const A: &str = "C49b-plant-setuid-and-executable";
    let marker = format!("sharedos-planted-{}", std::process::id());
    let mut notes = Vec::new();
    for dir in [
        bait.workspace(),
        PathBuf::from("/tmp"),
        PathBuf::from("/dev/shm"),
    ] {
        for (kind, mode) in [("setuid", 0o4755), ("exec", 0o755)] {
            let p = dir.join(format!("{marker}-{kind}"));
            let made = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o755)
                .open(&p)
                .and_then(|mut f| f.write_all(b"#!/bin/sh\nid\n"))
                .and_then(|()| {
                    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(mode))
                });
            let mode_now = std::fs::metadata(&p)
                .map(|m| {
                    format!(
                        "{:o}",
                        std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777
                    )
                })
                .unwrap_or_else(|e| describe_io(&e));
            notes.push(match made {
                Ok(()) => format!("planted {} mode {mode_now}", p.display()),
                Err(e) => format!("{}: {}", p.display(), describe_io(&e)),
            });
        }
    }
    Receipt::unjudged(
        A,
        format!("marker {marker}; {}; the host judges", notes.join("; ")),
    )
}

/// Hold the planted files in place while the host looks for them.
pub fn c49b_then(bait: &Bait) {
    std::thread::sleep(std::time::Duration::from_secs(bait.hang_secs()));
}
