//! Load-time checks of a sandboxed runtime's environment and filesystem
//! policy: everything that would otherwise be dropped or skipped when the
//! plugin starts (an `env` key outside the allowlist, an `extraRoPaths`
//! entry that is missing, unreadable by the sandbox uid or unbindable, a
//! program whose interpreter the sandbox does not see) is refused here,
//! naming the entry and what to fix.

use std::collections::BTreeMap;
use std::path::Path;

use sharedos_sandbox::SandboxPolicy;
use sharedos_sandbox::fsview;

/// Checks runtime `i` (launched in the sandbox): its `env`, and its
/// filesystem policy against this host. `program` is the host path the
/// host will launch. The error lists every problem, one a line.
pub(crate) fn check_sandboxed(
    i: usize,
    env: &BTreeMap<String, String>,
    policy: &SandboxPolicy,
    program: &Path,
) -> Result<(), String> {
    let mut problems = Vec::new();
    for k in env.keys() {
        if k == "HOME" || k == "TMPDIR" {
            let inside = if k == "HOME" {
                fsview::HOME
            } else {
                fsview::TMP
            };
            problems.push(format!(
                "runtimes[{i}].env.{k}: the sandbox sets {k} to its own per-turn {inside}; \
                 remove the key"
            ));
        } else if !policy.env_allowed(k) {
            problems.push(format!(
                "runtimes[{i}].env.{k}: not admitted by runtimes[{i}].sandbox.envAllowlist \
                 ({}), so the plugin would never get it; add \"{k}\" to the allowlist or remove \
                 the key (credentials never belong in env: docs/PLUGINS.md, section 5)",
                policy.env_allowlist.join(", ")
            ));
        }
    }
    for p in fsview::check_runtime(policy, program) {
        problems.push(format!("runtimes[{i}].{}: {}", p.field, p.message));
    }
    if policy.cgroup.enabled
        && let Err(e) = sharedos_sandbox::cgroup::check_parent(&policy.cgroup)
    {
        problems.push(format!(
            "runtimes[{i}].sandbox.{e}; name a delegated cgroup v2 subtree (docs/SECURITY.md, \
             \"Getting a memory controller\") or remove the key"
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    use super::*;

    fn env(keys: &[&str]) -> BTreeMap<String, String> {
        keys.iter().map(|k| (k.to_string(), "v".into())).collect()
    }

    fn with_extras(extras: &[&Path]) -> SandboxPolicy {
        SandboxPolicy {
            extra_ro_paths: extras.iter().map(|p| p.display().to_string()).collect(),
            ..SandboxPolicy::default()
        }
    }

    /// A directory outside /tmp the sandbox uid may read (the checks for
    /// /tmp depend on the host being root).
    fn readable_dir() -> tempfile::TempDir {
        let d = tempfile::Builder::new()
            .prefix("sharedos-policy-")
            .tempdir_in("/var/tmp")
            .unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    #[test]
    fn a_cgroup_parent_that_is_not_a_cgroup_is_a_load_error_naming_it() {
        let d = readable_dir();
        let mut policy = SandboxPolicy::default();
        policy.cgroup.parent = Some(d.path().display().to_string());
        let e = check_sandboxed(1, &env(&[]), &policy, Path::new("/bin/true")).unwrap_err();
        assert!(
            e.starts_with(&format!(
                "runtimes[1].sandbox.cgroup.parent {:?} is not a cgroup v2 directory",
                d.path().display().to_string()
            )),
            "{e}"
        );
        assert!(e.contains("Getting a memory controller"), "{e}");
    }

    #[test]
    fn an_env_key_outside_the_allowlist_is_a_load_error_naming_it() {
        let e = check_sandboxed(
            2,
            &env(&["NOTES_MODE", "LANG"]),
            &SandboxPolicy::default(),
            Path::new("/bin/true"),
        )
        .unwrap_err();
        assert!(
            e.starts_with("runtimes[2].env.NOTES_MODE: not admitted"),
            "{e}"
        );
        assert!(e.contains("add \"NOTES_MODE\" to the allowlist"), "{e}");
        assert!(!e.contains("env.LANG"), "LANG is allowed: {e}");
        let allowed = SandboxPolicy {
            env_allowlist: vec!["NOTES_*".into()],
            ..SandboxPolicy::default()
        };
        check_sandboxed(0, &env(&["NOTES_MODE"]), &allowed, Path::new("/bin/true")).unwrap();
    }

    #[test]
    fn a_custom_allowlist_keeps_the_hosts_own_variables() {
        let custom = SandboxPolicy {
            env_allowlist: vec!["PYTHONPATH".into()],
            ..SandboxPolicy::default()
        };
        assert!(custom.env_allowed("SHAREDOS_PLUGIN"));
        assert!(custom.env_allowed("SHAREDOS_MODEL_KEY"));
        assert!(!custom.env_allowed("LANG"));
        check_sandboxed(
            0,
            &env(&["PYTHONPATH", "SHAREDOS_MODE"]),
            &custom,
            Path::new("/bin/true"),
        )
        .unwrap();
    }

    #[test]
    fn home_and_tmpdir_in_env_are_refused() {
        let e = check_sandboxed(
            0,
            &env(&["HOME"]),
            &SandboxPolicy::default(),
            Path::new("/bin/true"),
        )
        .unwrap_err();
        assert!(
            e.contains(
                "runtimes[0].env.HOME: the sandbox sets HOME to its own per-turn /sandbox/home"
            ),
            "{e}"
        );
    }

    #[test]
    fn a_missing_extra_path_is_a_load_error_naming_the_index() {
        let d = readable_dir();
        let missing = d.path().join("not-there");
        let e = check_sandboxed(
            0,
            &env(&[]),
            &with_extras(&[d.path(), &missing]),
            Path::new("/bin/true"),
        )
        .unwrap_err();
        assert_eq!(
            e,
            format!(
                "runtimes[0].sandbox.extraRoPaths[1]: {} does not exist; create it or remove the entry",
                missing.display()
            )
        );
    }

    #[test]
    fn an_extra_path_unreadable_by_the_sandbox_uid_says_so_not_missing() {
        let d = readable_dir();
        let private = d.path().join("private");
        std::fs::create_dir(&private).unwrap();
        // A root host runs each sandbox as a uid of its own, which reads
        // only what others may; a host that is not root runs it as
        // itself, which reads what the host's user may (not a 0000 dir).
        let root = rustix::process::geteuid().is_root();
        let mode = if root { 0o700 } else { 0o000 };
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(mode)).unwrap();
        let e = check_sandboxed(
            0,
            &env(&[]),
            &with_extras(&[&private]),
            Path::new("/bin/true"),
        )
        .unwrap_err();
        assert!(
            e.starts_with("runtimes[0].sandbox.extraRoPaths[0]: "),
            "{e}"
        );
        if root {
            assert!(
                e.contains("is not readable by the sandbox uid (it needs o+rx, a directory"),
                "{e}"
            );
            assert!(e.contains("mode 0700"), "{e}");
            assert!(e.contains("chmod o+rX"), "{e}");
        } else {
            assert!(
                e.contains("is not readable by the sandbox uid (the host's own uid here)"),
                "{e}"
            );
        }
        assert!(!e.contains("does not exist"), "{e}");
        // Readable by others: accepted, even below a private parent when
        // the host is root (the helper clones it as root).
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o755)).unwrap();
        check_sandboxed(
            0,
            &env(&[]),
            &with_extras(&[&private]),
            Path::new("/bin/true"),
        )
        .unwrap();
    }

    #[test]
    fn unbindable_extra_paths_are_load_errors() {
        for (entry, says) in [
            ("relative/dir", "must be an absolute path"),
            ("/opt/../etc", "must be an absolute path"),
            ("/", "would expose the whole host"),
            ("/proc/1", "is under /proc, which the sandbox mounts itself"),
            ("/sandbox/home", "is under /sandbox"),
            ("/dev/null", "is under /dev"),
        ] {
            let policy = SandboxPolicy {
                extra_ro_paths: vec![entry.into()],
                ..SandboxPolicy::default()
            };
            let e = check_sandboxed(0, &env(&[]), &policy, Path::new("/bin/true")).unwrap_err();
            assert!(
                e.starts_with("runtimes[0].sandbox.extraRoPaths[0]: ") && e.contains(says),
                "{entry}: {e}"
            );
        }
        // A socket is neither a file nor a directory.
        let d = readable_dir();
        let sock = d.path().join("s.sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let e = check_sandboxed(0, &env(&[]), &with_extras(&[&sock]), Path::new("/bin/true"))
            .unwrap_err();
        assert!(e.contains("neither a file nor a directory"), "{e}");
    }

    #[test]
    fn a_program_whose_symlink_leaves_the_visible_paths_is_refused() {
        // A venv whose interpreter lives where the sandbox sees nothing
        // (pyenv under a home): the link is followed hop by hop.
        let d = readable_dir();
        let venv = d.path().join("venv");
        let elsewhere = d.path().join("pyenv/bin");
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::copy("/bin/true", elsewhere.join("python3")).unwrap();
        std::os::unix::fs::symlink(elsewhere.join("python3"), venv.join("bin/python")).unwrap();
        let program: PathBuf = venv.join("bin/python");
        let e = check_sandboxed(0, &env(&[]), &with_extras(&[&venv]), &program).unwrap_err();
        assert!(e.starts_with("runtimes[0].program: "), "{e}");
        assert!(e.contains("which the sandbox does not see"), "{e}");
        assert!(e.contains(&elsewhere.display().to_string()), "{e}");
        // Naming the interpreter's directory too makes it visible.
        check_sandboxed(0, &env(&[]), &with_extras(&[&venv, &elsewhere]), &program).unwrap();
    }

    #[test]
    fn a_script_whose_interpreter_the_sandbox_does_not_see_is_refused() {
        let d = readable_dir();
        let script = d.path().join("main.sh");
        std::fs::write(&script, "#!/usr/local/bin/mysh\necho hi\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = check_sandboxed(0, &env(&[]), &with_extras(&[d.path()]), &script).unwrap_err();
        assert!(
            e.contains("starts with #!/usr/local/bin/mysh, which the sandbox does not see"),
            "{e}"
        );
        std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
        check_sandboxed(0, &env(&[]), &with_extras(&[d.path()]), &script).unwrap();
    }
}
