//! What a runtime sees of the host's filesystem, decided before any
//! sandbox is built: which paths are read-only inside (at the same path
//! as outside), where the program is executed from, and whether every
//! path a runtime names can really be bound and read by the sandbox uid.
//!
//! The host checks a runtime's policy with [`check_runtime`] when it loads
//! its configuration, so a missing, unreadable or unbindable path is a
//! load error naming the entry, never a plugin that fails later with
//! "EOF on stdout". The helper builds the root from the same rules
//! ([`crate::mounts`]) and, with `policy.describe`, reports what it built
//! as a [`RootView`].

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::policy::SandboxPolicy;

pub use super::inside::{HOME, PLUGIN_DIR, TMP, WORKSPACE, clean};
pub use crate::report::{RootView, ViewMount};

/// Directories the sandbox mounts itself: no host path can be bound there.
/// `/tmp` is special: a path strictly below it is cloned by a root host
/// and attached on top of the private `/tmp`.
const MANAGED: [&str; 6] = ["/dev", "/proc", WORKSPACE, PLUGIN_DIR, "/sandbox", "/tmp"];

/// A path a runtime names that cannot be used, with what to fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FsProblem {
    /// The field of the runtime entry: `program`, `sandbox.extraRoPaths[2]`.
    pub field: String,
    pub message: String,
}

/// Whether `p` is under (or is) a directory the sandbox mounts itself.
fn managed(p: &Path) -> Option<&'static str> {
    MANAGED.iter().copied().find(|m| p.starts_with(m))
}

/// Every read-only path of the policy, clean (system paths first).
fn visible_roots(policy: &SandboxPolicy) -> Vec<PathBuf> {
    policy
        .ro_paths
        .iter()
        .chain(&policy.extra_ro_paths)
        .filter_map(|p| clean(p))
        .filter(|p| p != Path::new("/"))
        .collect()
}

/// Whether the sandbox sees host path `p` (lexically: `p` is at or below
/// one of the policy's read-only paths).
pub fn visible(policy: &SandboxPolicy, p: &Path) -> bool {
    visible_roots(policy).iter().any(|r| p.starts_with(r))
}

/// Whether the program is executed from its own path: it lies inside one
/// of the runtime's read-only paths, so its directory (a venv's
/// `pyvenv.cfg`, `node_modules` next to a script, files next to a binary)
/// is there too. Otherwise it is staged and bound at `/plugin/<name>`.
pub fn program_in_place(policy: &SandboxPolicy, program: &Path) -> bool {
    policy.layers.mountns && program.is_absolute() && visible(policy, program)
}

/// How the sandbox uid reaches host files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reach {
    /// A root host clones each extra path before the uid drop: only the
    /// path itself (and what is in it) must be readable by others.
    ClonedAsRoot,
    /// The sandbox runs as a uid of its own range but opens paths itself:
    /// every directory above must be searchable by others too.
    OtherUid,
    /// The sandbox runs as the host's own uid: what it can access.
    HostUid,
    /// The sandbox keeps uid 0 (`dropUid = false`): no check.
    Root,
}

fn reach(policy: &SandboxPolicy) -> Reach {
    let root = rustix::process::geteuid().is_root();
    match (root, policy.layers.drop_uid, policy.layers.mountns) {
        (true, true, true) => Reach::ClonedAsRoot,
        (true, true, false) => Reach::OtherUid,
        (true, false, _) => Reach::Root,
        (false, _, _) => Reach::HostUid,
    }
}

/// Checks everything of a runtime's filesystem policy that can be checked
/// before a sandbox exists: each `extraRoPaths` entry (present, a file or
/// directory, bindable, readable by the sandbox uid), each `roPaths`
/// entry's form, and the program (its symlinks and `#!` interpreter must
/// resolve to paths the sandbox sees, and it must be executable there).
/// `program` is the host path the host will launch. Returns every problem.
pub fn check_runtime(policy: &SandboxPolicy, program: &Path) -> Vec<FsProblem> {
    let mut problems = Vec::new();
    for (j, entry) in policy.ro_paths.iter().enumerate() {
        if let Err(message) = check_form(entry, false) {
            problems.push(FsProblem {
                field: format!("sandbox.roPaths[{j}]"),
                message,
            });
        }
    }
    let how = reach(policy);
    for (j, entry) in policy.extra_ro_paths.iter().enumerate() {
        let checked = check_form(entry, true).and_then(|p| {
            check_readable(&p, how, entry)?;
            check_package_links(policy, &p)
        });
        if let Err(message) = checked {
            problems.push(FsProblem {
                field: format!("sandbox.extraRoPaths[{j}]"),
                message,
            });
        }
    }
    if policy.layers.mountns
        && let Err(message) = check_program(policy, program, how)
    {
        problems.push(FsProblem {
            field: "program".into(),
            message,
        });
    }
    problems
}

/// The packages a runtime's read-only path installs (`node_modules/<name>`
/// and `node_modules/@scope/<name>`, as `npm install ./dir` links them)
/// that are symbolic links out of everything the sandbox sees. Inside the
/// sandbox such a link dangles, and the plugin fails to load far from the
/// cause: refuse it at load, naming the link and the fix. A link that
/// resolves inside a visible path is followed as it is (nothing to do).
fn check_package_links(policy: &SandboxPolicy, root: &Path) -> Result<(), String> {
    let modules = root.join("node_modules");
    let Ok(entries) = std::fs::read_dir(&modules) else {
        return Ok(());
    };
    let mut links = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let scoped = entry.file_name().to_string_lossy().starts_with('@');
        if scoped && !path.is_symlink() {
            links.extend(
                std::fs::read_dir(&path)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path()),
            );
        } else {
            links.push(path);
        }
    }
    links.sort();
    for link in links.into_iter().filter(|l| l.is_symlink()) {
        let target = std::fs::canonicalize(&link).unwrap_or_else(|_| link.clone());
        if !visible(policy, &target) {
            return Err(format!(
                "{} is a symbolic link to {}, which the sandbox does not see (read-only paths \
                 are bound at their own path, and no link out of them is followed): install \
                 the package as a copy (`npm install --install-links <dir>`, or from its `npm \
                 pack` tarball), or add {} to extraRoPaths",
                link.display(),
                target.display(),
                target.display()
            ));
        }
    }
    Ok(())
}

/// The form of a read-only path: absolute, clean, not a directory the
/// sandbox mounts itself; under `/tmp` only where a root host clones it.
fn check_form(entry: &str, extra: bool) -> Result<PathBuf, String> {
    let Some(p) = clean(entry) else {
        return Err(format!(
            "{entry:?} must be an absolute path without `..` (it is bound at the same path inside)"
        ));
    };
    if p == Path::new("/") {
        return Err(
            "\"/\" would expose the whole host; name the directories the runtime needs".into(),
        );
    }
    if super::users::would_show_host_users(entry) {
        return Err(format!(
            "{entry} would show the host's users and groups; name the entries of it the runtime \
             needs (/etc/passwd and /etc/group inside are the sandbox's own)"
        ));
    }
    if let Some(m) = managed(&p) {
        let root = rustix::process::geteuid().is_root();
        let tmp_ok = extra && m == "/tmp" && p != Path::new("/tmp") && root;
        if !tmp_ok {
            let why = if m == "/tmp" && p != Path::new("/tmp") {
                "is under /tmp, which the sandbox replaces with its own; only a host running \
                 as root can clone it before /tmp is hidden: move it out of /tmp (e.g. to /opt \
                 or /var/lib) or run the host as root"
                    .to_string()
            } else {
                format!(
                    "is under {m}, which the sandbox mounts itself; bind the files from another \
                     directory"
                )
            };
            return Err(format!("{entry} {why}"));
        }
    }
    Ok(p)
}

/// The path exists, is a file or directory, and the sandbox uid can read
/// it (and list it, for a directory).
fn check_readable(p: &Path, how: Reach, entry: &str) -> Result<(), String> {
    let md = match std::fs::metadata(p) {
        Ok(md) => md,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "{entry} does not exist; create it or remove the entry"
            ));
        }
        Err(e) => return Err(format!("{entry} cannot be examined by the host: {e}")),
    };
    if !md.is_dir() && !md.is_file() {
        return Err(format!(
            "{entry} is neither a file nor a directory (a socket, device or fifo is never bound)"
        ));
    }
    let need = if md.is_dir() { 0o005 } else { 0o004 };
    match how {
        Reach::Root => Ok(()),
        Reach::ClonedAsRoot => others_may(p, &md, need),
        Reach::OtherUid => {
            let mut dir = p.parent();
            while let Some(d) = dir {
                let dmd = std::fs::metadata(d).map_err(|e| format!("{}: {e}", d.display()))?;
                others_may(d, &dmd, 0o001)?;
                dir = d.parent();
            }
            others_may(p, &md, need)
        }
        Reach::HostUid => {
            let mut access = rustix::fs::Access::READ_OK;
            if md.is_dir() {
                access |= rustix::fs::Access::EXEC_OK;
            }
            rustix::fs::access(p, access).map_err(|e| {
                format!(
                    "{entry} is not readable by the sandbox uid (the host's own uid here): {e}; \
                     make it readable by the host's user"
                )
            })
        }
    }
}

/// Whether "others" have the `need` bits (a sandbox uid owns no host file
/// and is in no group), as an error naming the fix.
fn others_may(p: &Path, md: &std::fs::Metadata, need: u32) -> Result<(), String> {
    let mode = md.permissions().mode() & 0o7777;
    if mode & need == need {
        return Ok(());
    }
    let (what, bits) = match need {
        0o001 => ("searchable", "o+x"),
        0o004 => ("readable", "o+r"),
        _ => ("readable", "o+rx, a directory"),
    };
    Err(format!(
        "{} is not {what} by the sandbox uid (it needs {bits}; mode {mode:04o}, owner uid {}, \
         group {}; a sandbox runs as a uid of its own, in no group, so only the \"other\" bits \
         count): make it so with chmod o+rX {}, or name a copy that is",
        p.display(),
        md.uid(),
        md.gid(),
        p.display()
    ))
}

/// The program as the sandbox will execute it: every symlink hop, the
/// file itself and a `#!` interpreter must be visible inside; a program
/// executed in place must be executable by the sandbox uid.
fn check_program(policy: &SandboxPolicy, program: &Path, how: Reach) -> Result<(), String> {
    if std::fs::metadata(program).is_err() {
        // Reported by the runtime's loader (it does not exist).
        return Ok(());
    }
    let in_place = program_in_place(policy, program);
    let real = if in_place {
        let real = resolve_visibly(policy, program)?;
        let md = std::fs::metadata(&real).map_err(|e| format!("{}: {e}", real.display()))?;
        if matches!(how, Reach::ClonedAsRoot | Reach::OtherUid) && md.mode() & 0o001 == 0 {
            return Err(format!(
                "{} is not executable by the sandbox uid (mode {:04o}; only the \"other\" bits \
                 count): chmod o+rx it",
                real.display(),
                md.mode() & 0o7777
            ));
        }
        real
    } else {
        // Staged: the real file is copied, so only its interpreter matters.
        std::fs::canonicalize(program).map_err(|e| format!("{}: {e}", program.display()))?
    };
    if let Some(interp) = shebang(&real)
        && !visible(policy, &interp)
    {
        return Err(format!(
            "{} starts with #!{}, which the sandbox does not see; add its directory to \
             sandbox.extraRoPaths or give the interpreter as the program",
            program.display(),
            interp.display()
        ));
    }
    Ok(())
}

/// Follow `program`'s symlinks the way the sandbox will, each hop by its
/// own path: every one must be visible inside. Returns the file reached.
fn resolve_visibly(policy: &SandboxPolicy, program: &Path) -> Result<PathBuf, String> {
    let mut p = program.to_path_buf();
    for _ in 0..40 {
        if !visible(policy, &p) {
            // An interpreter's bin/ directory: name its installation, which
            // holds its libraries too.
            let dir = p.parent().unwrap_or(&p);
            let install = match dir.file_name() {
                Some(n) if n == "bin" => dir.parent().unwrap_or(dir),
                _ => dir,
            };
            return Err(format!(
                "{} leads to {}, which the sandbox does not see; add {} (where it is \
                 installed, with its libraries) to sandbox.extraRoPaths",
                program.display(),
                p.display(),
                install.display()
            ));
        }
        let md = std::fs::symlink_metadata(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        if !md.file_type().is_symlink() {
            return Ok(p);
        }
        let target = std::fs::read_link(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        let joined = p.parent().unwrap_or(Path::new("/")).join(target);
        p = normalize(&joined);
    }
    Err(format!("{}: too many symlinks", program.display()))
}

/// `p` with `.` and `..` resolved lexically.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The interpreter of a `#!` script, if `file` is one.
fn shebang(file: &Path) -> Option<PathBuf> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(file).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|b| *b == b'\n').next()?;
    let text = std::str::from_utf8(line).ok()?;
    text.split_whitespace().next().map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_paths_are_absolute_and_without_parent_components() {
        assert_eq!(clean("/opt/x/"), Some(PathBuf::from("/opt/x")));
        assert_eq!(clean("/opt/./x"), Some(PathBuf::from("/opt/x")));
        assert_eq!(clean("opt/x"), None);
        assert_eq!(clean("/opt/../etc"), None);
    }

    #[test]
    fn visibility_is_by_path_prefix_not_by_string_prefix() {
        let policy = SandboxPolicy {
            extra_ro_paths: vec!["/opt/venv".into()],
            ..SandboxPolicy::default()
        };
        assert!(visible(&policy, Path::new("/opt/venv/bin/python")));
        assert!(!visible(&policy, Path::new("/opt/venv2/bin/python")));
        assert!(visible(&policy, Path::new("/usr/bin/python3")));
        assert!(!visible(&policy, Path::new("/usr/local/bin/python3")));
        assert!(program_in_place(&policy, Path::new("/opt/venv/bin/python")));
        assert!(!program_in_place(&policy, Path::new("/srv/plugin")));
    }

    #[test]
    fn a_directory_the_sandbox_mounts_itself_is_refused() {
        for p in [
            "/proc/self",
            "/dev/null",
            "/workspace/x",
            "/sandbox/home",
            "/",
        ] {
            assert!(check_form(p, true).is_err(), "{p}");
        }
        assert!(check_form("/tmp", true).is_err());
        assert!(check_form("/opt/x", true).is_ok());
    }

    #[test]
    fn normalize_resolves_parent_components() {
        assert_eq!(
            normalize(Path::new("/opt/venv/bin/../lib/./x")),
            PathBuf::from("/opt/venv/lib/x")
        );
    }

    #[test]
    fn a_package_linked_out_of_the_visible_paths_is_named_with_its_fix() {
        let project = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let scope = project.path().join("node_modules/@scope");
        std::fs::create_dir_all(&scope).unwrap();
        std::os::unix::fs::symlink(outside.path(), scope.join("pkg")).unwrap();
        let policy = SandboxPolicy {
            extra_ro_paths: vec![project.path().display().to_string()],
            ..SandboxPolicy::default()
        };
        let e = check_package_links(&policy, project.path()).unwrap_err();
        assert!(e.contains(&scope.join("pkg").display().to_string()), "{e}");
        assert!(e.contains("--install-links"), "{e}");
        // The same link is followed once its target is visible too.
        let both = SandboxPolicy {
            extra_ro_paths: vec![
                project.path().display().to_string(),
                std::fs::canonicalize(outside.path())
                    .unwrap()
                    .display()
                    .to_string(),
            ],
            ..SandboxPolicy::default()
        };
        assert_eq!(check_package_links(&both, project.path()), Ok(()));
        // A link inside the path itself is fine.
        std::fs::remove_file(scope.join("pkg")).unwrap();
        std::fs::create_dir(project.path().join("real")).unwrap();
        std::os::unix::fs::symlink(project.path().join("real"), scope.join("pkg")).unwrap();
        let canonical = SandboxPolicy {
            extra_ro_paths: vec![
                std::fs::canonicalize(project.path())
                    .unwrap()
                    .display()
                    .to_string(),
            ],
            ..SandboxPolicy::default()
        };
        let root = std::fs::canonicalize(project.path()).unwrap();
        assert_eq!(check_package_links(&canonical, &root), Ok(()));
    }
}
