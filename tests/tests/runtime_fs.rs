//! The runtime filesystem policy from the outside, through the `sharedos`
//! binary and the real sandbox: a Python venv and a Node package with a
//! `node_modules` dependency are seated by naming their directory; the
//! host's configuration, homes and secrets stay out of sight; a path or an
//! environment key the sandbox could not honour is a load error naming the
//! entry; `sandbox check --runtime` shows exactly what a runtime sees.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};
use sharedos_sandbox::{SandboxPolicy, SpawnSpec};
use sharedos_tests::plugin_bin;
use sharedos_tests::turns::{request, seat_toml};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn sharedos(args: &[&str]) -> Output {
    Command::new(plugin_bin("sharedos"))
        .args(args)
        .env_remove("SHAREDOS_LOG")
        .output()
        .expect("run sharedos")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// One turn through `sharedos run` in `dir`: (exit code, result, stderr).
fn run_turn(dir: &Path, toml: &str) -> (Option<i32>, Value, String) {
    let config = dir.join("host.toml");
    std::fs::write(&config, toml).unwrap();
    let req = dir.join("turn.json");
    let mut r = request("exec-runtime-fs", json!(null), &[], 30_000);
    r["message"]["payload"] = json!({});
    std::fs::write(&req, r.to_string()).unwrap();
    let out = sharedos(&[
        "run",
        "--config",
        config.to_str().unwrap(),
        "--request",
        req.to_str().unwrap(),
    ]);
    let result = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code(), result, text(&out.stderr))
}

/// A venv made with the system's Python, holding the Python SDK and a
/// module that exists nowhere else, and the plugin in `plugin/`.
fn make_venv(base: &Path) -> PathBuf {
    let venv = base.join("venv");
    let made = Command::new("/usr/bin/python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(made.success());
    let version = Command::new(venv.join("bin/python"))
        .args([
            "-c",
            "import sys; print(f'python{sys.version_info[0]}.{sys.version_info[1]}')",
        ])
        .output()
        .unwrap();
    let site = venv
        .join("lib")
        .join(String::from_utf8_lossy(&version.stdout).trim())
        .join("site-packages");
    assert!(site.is_dir(), "{site:?}");
    let copied = Command::new("cp")
        .arg("-r")
        .arg(repo().join("sdk/python/sharedos_plugin"))
        .arg(&site)
        .status()
        .unwrap();
    assert!(copied.success());
    std::fs::create_dir(site.join("venvonly")).unwrap();
    std::fs::write(
        site.join("venvonly/__init__.py"),
        "MARK = 'only-in-the-venv'\n",
    )
    .unwrap();
    let plugin = venv.join("plugin");
    std::fs::create_dir(&plugin).unwrap();
    std::fs::copy(
        repo().join("sdk/python/examples/echo.py"),
        plugin.join("echo.py"),
    )
    .unwrap();
    std::fs::write(
        plugin.join("main.py"),
        "import os, sys\n\
         sys.path.insert(0, os.path.dirname(__file__))\n\
         import venvonly\n\
         from echo import Echo\n\
         from sharedos_plugin import serve\n\
         \n\
         class VenvEcho(Echo):\n\
         \x20   async def run(self, request, host, abort):\n\
         \x20       host.annotate('venv.prefix', sys.prefix)\n\
         \x20       host.annotate('venv.module', venvonly.MARK)\n\
         \x20       host.annotate('venv.home', os.environ.get('HOME'))\n\
         \x20       return await super().run(request, host, abort)\n\
         \n\
         if __name__ == '__main__':\n\
         \x20   sys.exit(serve(VenvEcho()))\n",
    )
    .unwrap();
    venv
}

/// A directory for a plugin's files below a `0700` directory. As root,
/// under `/tmp`: the helper clones what a runtime names there before the
/// sandbox's own `/tmp` hides it and the uid drops. A host that is not root
/// cannot (its spawn says so), and its sandbox runs as its own uid: the
/// files go under the build's temp dir instead.
fn private_base() -> tempfile::TempDir {
    let base = sharedos_tests::plugin_tempdir();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    base
}

#[test]
fn a_python_venv_plugin_is_seated_by_naming_the_venv_and_conforms() {
    // Under /tmp, below a 0700 directory: the host is root, so the helper
    // clones the venv before the uid drop and only the venv itself must be
    // readable by others.
    let base = private_base();
    let venv = make_venv(base.path());
    let python = venv.join("bin/python");
    let main = venv.join("plugin/main.py");
    let body = format!(
        "program = {python:?}\nargs = [{main:?}]\nsandbox = {{ extraRoPaths = [{venv:?}] }}"
    );
    let (code, result, err) = run_turn(base.path(), &seat_toml("sharedos-echo-python", &body));
    assert_eq!(code, Some(0), "{result:#}\n{err}");
    let meta = &result["metadata"];
    // sys.prefix is the venv: the interpreter ran by the venv's own path
    // and found its pyvenv.cfg (a staged /plugin/python would give /usr).
    assert_eq!(
        meta["venv.prefix"],
        venv.display().to_string(),
        "{result:#}"
    );
    // A module that exists only in the venv's site-packages was imported.
    assert_eq!(meta["venv.module"], "only-in-the-venv", "{result:#}");
    assert_eq!(meta["venv.home"], "/sandbox/home", "{result:#}");
    assert_eq!(
        meta["runtime"]["sandbox"]["level"],
        sharedos_tests::full_level(),
        "{result:#}"
    );
    // The same plugin passes the conformance battery in the full sandbox.
    let out = Command::new(plugin_bin("sharedos"))
        .args(["conformance", "--json", "--ro"])
        .arg(&venv)
        .arg("--")
        .arg(&python)
        .arg(&main)
        .env_remove("SHAREDOS_LOG")
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stderr)));
    let failed: Vec<&Value> = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["status"] != "pass")
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");
    assert_eq!(report["launcher"], "sandbox");
    assert_eq!(report["passed"], true);
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn a_node_plugin_with_a_node_modules_dependency_runs_from_its_directory() {
    let base = private_base();
    let pkg = base.path().join("notes-plugin");
    sharedos_tests::install_typescript_sdk(&pkg);
    let dep = pkg.join("node_modules/fixture-dep");
    std::fs::create_dir_all(&dep).unwrap();
    std::fs::write(
        dep.join("package.json"),
        r#"{"name": "fixture-dep", "version": "1.0.0", "main": "index.js"}"#,
    )
    .unwrap();
    std::fs::write(
        dep.join("index.js"),
        "module.exports = { mark: 'from-node-modules' };\n",
    )
    .unwrap();
    std::fs::write(
        pkg.join("package.json"),
        r#"{"name": "notes-plugin", "version": "0.1.0", "type": "module"}"#,
    )
    .unwrap();
    std::fs::write(
        pkg.join("main.mjs"),
        "import { complete, serve } from '@sharedos/plugin';\n\
         import dep from 'fixture-dep';\n\
         serve({\n\
         \x20 manifest: () => ({ id: 'fixture-node', version: '0.1.0', protocolVersion: '1' }),\n\
         \x20 async run(request, host) {\n\
         \x20   host.annotate('node.dep', dep.mark);\n\
         \x20   return complete({ mark: dep.mark });\n\
         \x20 },\n\
         });\n",
    )
    .unwrap();
    let main = pkg.join("main.mjs");
    let body = format!(
        "program = \"/usr/bin/node\"\nargs = [{main:?}]\nsandbox = {{ extraRoPaths = [{pkg:?}] }}"
    );
    let (code, result, err) = run_turn(base.path(), &seat_toml("fixture-node", &body));
    assert_eq!(code, Some(0), "{result:#}\n{err}");
    assert_eq!(
        result["metadata"]["node.dep"], "from-node-modules",
        "{result:#}"
    );
    assert_eq!(result["output"]["mark"], "from-node-modules", "{result:#}");
}

/// Removes a planted host file or directory on every way out.
struct Planted(PathBuf);

impl Drop for Planted {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs `script` with `/bin/sh` in the full sandbox under `policy`:
/// (stdout, stderr).
fn sh_in_sandbox(policy: SandboxPolicy, script: &str) -> (String, String) {
    let mut child = sharedos_sandbox::spawn(&SpawnSpec {
        helper_exe: plugin_bin("sharedos"),
        program: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()],
        env: vec![],
        policy,
        workspace: None,
    })
    .expect("spawn the sandbox");
    assert_eq!(child.report.level.to_string(), sharedos_tests::full_level());
    drop(child.stdin.take());
    let err = std::fs::File::from(child.stderr.take().unwrap());
    let err = std::thread::spawn(move || std::io::read_to_string(err).unwrap_or_default());
    let out = std::io::read_to_string(std::fs::File::from(child.stdout.take().unwrap())).unwrap();
    child.wait().unwrap();
    (out, err.join().unwrap())
}

#[test]
fn host_configuration_homes_and_unnamed_neighbours_stay_out_of_sight() {
    if !sharedos_tests::needs_root(
        "runtime_fs::host_configuration_homes_and_unnamed_neighbours_stay_out_of_sight",
        "planting bait in /root and /home needs root",
    ) {
        return;
    }
    let id = std::process::id();
    // Bait the plugin must not see: a file in root's home, a user's home,
    // host configuration, and a secret next to the directory it is given.
    let root_bait = Planted(PathBuf::from(format!("/root/.sharedos-bait-{id}")));
    std::fs::write(&root_bait.0, "root-home-secret-7c1").unwrap();
    let user_home = Planted(PathBuf::from(format!("/home/sharedos-bait-{id}")));
    std::fs::create_dir(&user_home.0).unwrap();
    std::fs::write(user_home.0.join("secret"), "user-home-secret-7c1").unwrap();
    std::fs::set_permissions(&user_home.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(Path::new("/usr/local/etc").is_dir() && Path::new("/etc/shadow").exists());
    let base = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let named = base.path().join("install");
    std::fs::create_dir(&named).unwrap();
    std::fs::write(named.join("ok.txt"), "named-and-visible").unwrap();
    std::fs::write(base.path().join("neighbour.txt"), "neighbour-secret-7c1").unwrap();
    let policy = SandboxPolicy {
        extra_ro_paths: vec![named.display().to_string()],
        ..SandboxPolicy::default()
    };
    let script = format!(
        "for p in /usr/local/etc /usr/local/etc/npmrc /root /root/.sharedos-bait-{id} /home \
         {home} {home}/secret /etc/shadow {base}/neighbour.txt; do \
         if [ -e \"$p\" ]; then echo \"SEEN $p\"; cat \"$p\" 2>/dev/null; ls -A \"$p\" 2>/dev/null; \
         else echo \"absent $p\"; fi; done; \
         cat {named}/ok.txt; echo; echo \"HOME=$HOME\"; ls -A \"$HOME\"; \
         echo mine > \"$HOME/.rc\" && cat \"$HOME/.rc\"",
        home = user_home.0.display(),
        base = base.path().display(),
        named = named.display(),
    );
    let (out, err) = sh_in_sandbox(policy.clone(), &script);
    assert!(!out.contains("SEEN"), "{out}\n{err}");
    for secret in [
        "root-home-secret",
        "user-home-secret",
        "neighbour-secret",
        "root:",
    ] {
        assert!(!out.contains(secret), "{secret} leaked: {out}");
    }
    assert_eq!(out.matches("absent ").count(), 9, "{out}");
    // What was named is there; the home is the sandbox's own, writable
    // and empty at the start.
    assert!(
        out.ends_with("named-and-visible\nHOME=/sandbox/home\nmine\n"),
        "{out}\n{err}"
    );
    // The next sandbox's home starts empty again: nothing outlives a turn.
    let (out, _) = sh_in_sandbox(policy, "ls -A \"$HOME\"; echo end");
    assert_eq!(out, "end\n");
}

fn write_config(dir: &Path, runtime_body: &str) -> PathBuf {
    let config = dir.join("host.toml");
    std::fs::write(&config, seat_toml("fixture", runtime_body)).unwrap();
    config
}

#[test]
fn paths_and_keys_the_sandbox_cannot_honour_are_load_errors_naming_the_entry() {
    let base = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let private = base.path().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let missing = base.path().join("missing");
    let cases: [(String, &str); 6] = [
        (
            "env = { NOTES_TOKEN = \"x\" }".into(),
            "runtimes[0].env.NOTES_TOKEN: not admitted by runtimes[0].sandbox.envAllowlist",
        ),
        (
            format!("sandbox = {{ extraRoPaths = [\"/opt\", {missing:?}] }}"),
            "runtimes[0].sandbox.extraRoPaths[1]: ",
        ),
        (
            format!("sandbox = {{ extraRoPaths = [{private:?}] }}"),
            "runtimes[0].sandbox.extraRoPaths[0]: ",
        ),
        (
            "sandbox = { extraRoPaths = [\"/proc/self\"] }".into(),
            "runtimes[0].sandbox.extraRoPaths[0]: /proc/self is under /proc",
        ),
        (
            "sandbox = { extraRoPaths = [\"/etc\"] }".into(),
            "runtimes[0].sandbox.extraRoPaths[0]: /etc would show the host's users and groups",
        ),
        (
            "env = { HOME = \"/root\" }".into(),
            "runtimes[0].env.HOME: the sandbox sets HOME to its own per-turn /sandbox/home",
        ),
    ];
    for (i, (keys, says)) in cases.iter().enumerate() {
        if i == 2 && !sharedos_tests::is_root() {
            // A sandbox of a host that is not root runs as the host's own
            // uid, which reads the host's 0700 directory: nothing to refuse.
            continue;
        }
        let body = format!("program = \"/bin/true\"\n{keys}");
        let config = write_config(base.path(), &body);
        // The same error from every command that loads the configuration.
        for args in [
            vec![
                "run",
                "--config",
                config.to_str().unwrap(),
                "--request",
                "/dev/null",
            ],
            vec![
                "sandbox",
                "check",
                "--runtime",
                "fixture",
                "--config",
                config.to_str().unwrap(),
            ],
        ] {
            let out = sharedos(&args);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "case {i} {args:?}: {err}");
            assert!(err.contains(says), "case {i} {args:?}: {err}");
            match i {
                1 => assert!(
                    err.contains(&format!("{} does not exist", missing.display())),
                    "{err}"
                ),
                2 => {
                    assert!(
                        err.contains(
                            "is not readable by the sandbox uid (it needs o+rx, a directory"
                        ),
                        "{err}"
                    );
                    assert!(!err.contains("does not exist"), "{err}");
                }
                _ => {}
            }
        }
    }
    // Fixed, the same configuration loads and its runtime runs.
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = write_config(
        base.path(),
        &format!("program = \"/bin/true\"\nsandbox = {{ extraRoPaths = [{private:?}] }}"),
    );
    let out = sharedos(&[
        "sandbox",
        "check",
        "--runtime",
        "fixture",
        "--config",
        config.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn sandbox_check_runtime_shows_every_mount_the_program_and_the_env_keys() {
    let base = private_base();
    let venv = make_venv(base.path());
    let python = venv.join("bin/python");
    let main = venv.join("plugin/main.py");
    let body = format!(
        "program = {python:?}\nargs = [{main:?}]\nenv = {{ LANG = \"C.UTF-8\" }}\n\
         sandbox = {{ extraRoPaths = [{venv:?}] }}"
    );
    let config = write_config(base.path(), &body);
    let out = sharedos(&[
        "sandbox",
        "check",
        "--runtime",
        "fixture",
        "--config",
        config.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    let has = |line: &str| {
        assert!(
            stdout.lines().any(|l| l
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .starts_with(line)),
            "no line {line:?} in\n{stdout}"
        )
    };
    has(&format!(
        "program: {} (executed from its own path: it lies inside a read-only path)",
        python.display()
    ));
    has("working directory: /workspace");
    has(
        "environment keys: HOME, LANG, PATH, SHAREDOS_PLUGIN, TMPDIR (HOME=/sandbox/home, TMPDIR=/tmp)",
    );
    has(&format!(
        "ro {} extraRoPaths{}",
        venv.display(),
        if sharedos_tests::is_root() {
            " (on top of the private /tmp)"
        } else {
            ""
        }
    ));
    has("ro /usr/bin roPaths");
    has("rw /workspace tmpfs 256 MiB");
    has("rw /sandbox/home tmpfs 128 MiB, HOME");
    has("rw /tmp tmpfs 128 MiB, TMPDIR");
    has("seccomp ok");
    has(&format!("level: {}", sharedos_tests::full_level()));
    // Nothing of /usr/local, no home, no staged copy: the list is the root.
    assert!(!stdout.contains("/usr/local"), "{stdout}");
    assert!(
        !stdout
            .lines()
            .any(|l| l.trim_start().starts_with("ro  /plugin")),
        "{stdout}"
    );
    assert!(!stdout.contains("/root"), "{stdout}");
    // A program outside every read-only path is staged, and says so.
    let plugin = plugin_bin("sharedos-echo");
    let config = write_config(base.path(), &format!("program = {plugin:?}"));
    let out = sharedos(&[
        "sandbox",
        "check",
        "--runtime",
        "fixture",
        "--config",
        config.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(
            "program: /plugin/sharedos-echo (a staged copy of the configured file, bound read-only)"
        ),
        "{stdout}"
    );
    // An unknown runtime is a usage error naming the ones defined.
    let out = sharedos(&[
        "sandbox",
        "check",
        "--runtime",
        "nope",
        "--config",
        config.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("no runtime \"nope\" (defined: fixture)"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn what_only_the_sandbox_can_tell_is_logged_where_the_operator_sees_it() {
    // A degraded sandbox (user namespaces refused, as under Docker's
    // profile) reports warnings no load-time check can foresee: the CLI
    // shows them at its default log level, not only in the result.
    let base = tempfile::tempdir().unwrap();
    let body = "program = \"/bin/true\"\n\
                sandbox = { emulateNoUserns = true, minLevel = \"reduced\" }";
    let (code, result, err) = run_turn(base.path(), &seat_toml("fixture", body));
    assert_ne!(code, Some(0), "/bin/true is no plugin: {result:#}");
    let warned = err
        .lines()
        .find(|l| l.contains("WARN") && l.contains("sandbox: test mode: user namespaces refused"));
    assert!(warned.is_some(), "{err}");
    let warnings = result["metadata"]["runtime"]["sandbox"]["warnings"].to_string();
    assert!(warnings.contains("test mode"), "{result:#}");
}

#[test]
fn an_installation_under_a_private_parent_runs_in_place_when_named() {
    // Like an interpreter under /root/.pyenv: the parent is 0700, the
    // installation itself readable by others. A root host clones it before
    // the uid drop, and the program runs from its own path inside it.
    let private = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let install = private.path().join("versions/1.0");
    std::fs::create_dir_all(install.join("bin")).unwrap();
    std::fs::create_dir_all(install.join("share")).unwrap();
    for d in [private.path().join("versions"), install.clone()] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::copy("/bin/cat", install.join("bin/tool")).unwrap();
    std::fs::write(install.join("share/data.txt"), "from-the-installation\n").unwrap();
    let policy = SandboxPolicy {
        extra_ro_paths: vec![install.display().to_string()],
        ..SandboxPolicy::default()
    };
    let program = install.join("bin/tool");
    assert!(sharedos_sandbox::fsview::check_runtime(&policy, &program).is_empty());
    let mut child = sharedos_sandbox::spawn(&SpawnSpec {
        helper_exe: plugin_bin("sharedos"),
        program: program.clone(),
        args: vec![install.join("share/data.txt").into()],
        env: vec![],
        policy,
        workspace: None,
    })
    .expect("spawn");
    drop(child.stdin.take());
    let out = std::io::read_to_string(std::fs::File::from(child.stdout.take().unwrap())).unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(out, "from-the-installation\n");
}
