//! Records the commit the binary is built from, for `sharedos --version`:
//! `git rev-parse` of the checkout when there is one (with `-dirty` when
//! tracked files differ from it), else `SHAREDOS_COMMIT` from the
//! environment (a build from a source archive), else `unknown`.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=SHAREDOS_COMMIT");
    let commit = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(head) => {
            // Rebuild when HEAD moves or the index changes (a commit, a
            // checkout, a staged edit).
            for file in ["HEAD", "index"] {
                if let Some(path) = git(&["rev-parse", "--git-path", file]) {
                    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
                    println!("cargo:rerun-if-changed={}", path.display());
                }
            }
            if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"])
                && let Some(path) = git(&["rev-parse", "--git-path", &reference])
            {
                let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
                println!("cargo:rerun-if-changed={}", path.display());
            }
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty { format!("{head}-dirty") } else { head }
        }
        None => std::env::var("SHAREDOS_COMMIT").unwrap_or_else(|_| "unknown".into()),
    };
    println!("cargo:rustc-env=SHAREDOS_COMMIT={commit}");
}
