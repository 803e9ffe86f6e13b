//! The SDKs as their users install them: the Python SDK's wheel and sdist
//! (`python -m build`), installed into a fresh virtual environment, and the
//! TypeScript SDK's `npm pack` tarball and `npm install --install-links`
//! copy, each running the README's plugin in the full sandbox (`sharedos
//! conformance`, whose launcher is the real one), and nothing written into
//! the checkout. A package linked out of what the sandbox sees (`npm
//! install ./sdk/typescript` makes a symlink) is refused at load, naming
//! the link and the fix.
//!
//! The tools come from `scripts/test`'s environment (its venv's `python3`
//! with `build` and `flit_core`, `node` and `npm`); run outside it, a
//! missing tool fails the test naming `scripts/test`.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sharedos_tests::plugin_bin;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

fn run(cmd: &mut Command) -> Output {
    let shown = format!("{cmd:?}");
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{shown}: {e} (run the tests with scripts/test)"));
    assert!(
        out.status.success(),
        "{shown} failed (run the tests with scripts/test, which provisions it):\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A directory the sandbox uid may read (outside /tmp, o+rx).
fn readable_dir(prefix: &str) -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/var/tmp")
        .expect("a directory under /var/tmp");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// Every file under `dir`, but the caches interpreters write while tests
/// import (`__pycache__`, `.pytest_cache`).
fn files_under(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let name = e.file_name();
            if name == "__pycache__" || name == ".pytest_cache" {
                continue;
            }
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                stack.push(p);
            } else {
                out.insert(p);
            }
        }
    }
    out
}

/// `sharedos conformance` over `command`, in the full sandbox, with `ro`
/// bound read-only.
fn conformance(ro: &[PathBuf], command: &[&str]) -> Output {
    let mut cmd = Command::new(plugin_bin("sharedos"));
    cmd.arg("conformance");
    for p in ro {
        cmd.arg("--ro").arg(p);
    }
    cmd.arg("--").args(command);
    cmd.env_remove("SHAREDOS_LOG")
        .output()
        .expect("run sharedos conformance")
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The install prefix of an interpreter outside /usr (a pyenv or a venv's
/// base, Node.js from PyPI), which the sandbox must see; none under /usr.
fn prefix_outside_usr(prefix: PathBuf) -> Vec<PathBuf> {
    if prefix.starts_with("/usr") {
        Vec::new()
    } else {
        vec![prefix]
    }
}

/// The listing under "## A plugin" in an SDK's README (fenced as `lang`):
/// the plugin the test seats is the one the README shows, verbatim.
fn readme_plugin(sdk: &str, lang: &str) -> String {
    let readme = std::fs::read_to_string(repo().join(sdk).join("README.md")).unwrap();
    let section = &readme[readme.find("## A plugin").expect("a section ## A plugin")..];
    let fence = format!("```{lang}\n");
    let start = section.find(&fence).expect("a listing in ## A plugin") + fence.len();
    let body = &section[start..];
    let listing = &body[..body.find("```").expect("the listing's end")];
    assert!(
        listing.lines().count() <= 20,
        "the README's plugin is over 20 lines"
    );
    listing.to_owned()
}

#[test]
fn the_python_sdk_builds_installs_and_runs_sandboxed_leaving_the_tree_as_it_was() {
    let sdk = repo().join("sdk/python");
    let before = files_under(&sdk);
    let out_dir = tempfile::tempdir().unwrap();
    run(Command::new("python3")
        .args(["-m", "build", "--no-isolation", "--outdir"])
        .arg(out_dir.path())
        .arg(&sdk));
    let built: Vec<String> = std::fs::read_dir(out_dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let wheel = built
        .iter()
        .find(|n| n.starts_with("sharedos_plugin-0.1.0-") && n.ends_with(".whl"))
        .unwrap_or_else(|| panic!("no wheel among {built:?}"));
    assert!(
        built.iter().any(|n| n == "sharedos_plugin-0.1.0.tar.gz"),
        "no sdist among {built:?}"
    );

    // pip install of the directory itself.
    let target = tempfile::tempdir().unwrap();
    run(Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--no-build-isolation",
        ])
        .args(["--disable-pip-version-check", "--target"])
        .arg(target.path())
        .arg(&sdk));
    assert!(target.path().join("sharedos_plugin/__init__.py").is_file());
    assert_eq!(
        files_under(&sdk),
        before,
        "building and installing wrote into sdk/python"
    );

    // The wheel in a fresh virtual environment, the README's plugin seated
    // from it in the full sandbox.
    let home = readable_dir("sharedos-pywheel-");
    let venv = home.path().join("venv");
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv));
    run(Command::new(venv.join("bin/python"))
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--disable-pip-version-check",
        ])
        .arg(out_dir.path().join(wheel)));
    let base =
        run(Command::new(venv.join("bin/python"))
            .args(["-c", "import sys; print(sys.base_prefix)"]));
    let base = PathBuf::from(String::from_utf8_lossy(&base.stdout).trim());
    let plugin = home.path().join("hello.py");
    std::fs::write(&plugin, readme_plugin("sdk/python", "python")).unwrap();
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut ro = vec![venv.clone()];
    ro.extend(prefix_outside_usr(base));
    let python = venv.join("bin/python");
    let out = conformance(&ro, &[python.to_str().unwrap(), plugin.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
}

/// `node`'s install prefix when it is not under /usr.
fn node_ro() -> Vec<PathBuf> {
    let out = run(Command::new("node").args(["-p", "process.execPath"]));
    let exe = std::fs::canonicalize(String::from_utf8_lossy(&out.stdout).trim())
        .expect("node's real path");
    let prefix = exe
        .parent()
        .and_then(Path::parent)
        .expect("node's prefix")
        .to_path_buf();
    prefix_outside_usr(prefix)
}

/// A project under /var/tmp with `@sharedos/plugin` installed by `how`,
/// and the README's plugin in it.
fn ts_project(prefix: &str, install: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let dir = readable_dir(prefix);
    std::fs::write(dir.path().join("package.json"), r#"{"private": true}"#).unwrap();
    run(Command::new("npm")
        .args([
            "install",
            "--offline",
            "--no-audit",
            "--no-fund",
            "--no-save",
        ])
        .args(install)
        .current_dir(dir.path()));
    let plugin = dir.path().join("plugin.mjs");
    std::fs::write(&plugin, readme_plugin("sdk/typescript", "js")).unwrap();
    let walk = |p: &Path| {
        let _ = Command::new("chmod").arg("-R").arg("o+rX").arg(p).status();
    };
    walk(dir.path());
    (dir, plugin)
}

#[test]
fn the_typescript_sdk_packs_with_its_types_and_runs_sandboxed_from_a_copy() {
    let sdk = repo().join("sdk/typescript");
    let before = files_under(&sdk);
    let packed = readable_dir("sharedos-tspack-");
    run(Command::new("npm")
        .args(["pack", "--silent", "--pack-destination"])
        .arg(packed.path())
        .current_dir(&sdk));
    let tarball = packed.path().join("sharedos-plugin-0.1.0.tgz");
    let listing = run(Command::new("tar").arg("-tzf").arg(&tarball));
    let listing = String::from_utf8_lossy(&listing.stdout);
    for f in [
        "package/src/index.d.ts",
        "package/src/protocol.d.ts",
        "package/src/index.js",
    ] {
        assert!(
            listing.lines().any(|l| l == f),
            "{f} not in the tarball:\n{listing}"
        );
    }

    let sdk_arg = sdk.display().to_string();
    let tarball_arg = tarball.display().to_string();
    for install in [
        vec![tarball_arg.as_str()],
        vec!["--install-links", sdk_arg.as_str()],
    ] {
        let (_dir, plugin) = ts_project("sharedos-tsproj-", &install);
        let out = conformance(&node_ro(), &["node", plugin.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "installed by {install:?}: {}",
            text(&out)
        );
    }
    assert_eq!(
        files_under(&sdk),
        before,
        "packing and installing wrote into sdk/typescript"
    );
}

#[test]
fn a_package_linked_out_of_the_sandbox_is_refused_naming_the_link_and_the_fix() {
    let sdk = repo().join("sdk/typescript");
    let (dir, plugin) = ts_project("sharedos-tslink-", &[sdk.to_str().unwrap()]);
    let link = dir.path().join("node_modules/@sharedos/plugin");
    assert!(link.is_symlink(), "npm install of a directory links it");
    let out = conformance(&node_ro(), &["node", plugin.to_str().unwrap()]);
    assert!(!out.status.success(), "ran with a dangling package link");
    let said = text(&out);
    assert!(
        said.contains(&link.display().to_string()) && said.contains("--install-links"),
        "the error names the link and the fix: {said}"
    );
}
