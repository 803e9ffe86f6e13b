//! The sandbox's filesystem against issue 14, judged from the host side:
//! a plugin-built directory chain cannot take a host down (nor a later
//! one), any TMPDIR works, nothing a plugin plants is reachable by another
//! host user, and no host fact is visible inside.

use std::io::BufRead;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use sharedos_sandbox::{SandboxPolicy, SpawnSpec};
use sharedos_tests::bait::*;

/// Another host user: runs `argv` as uid/gid 12345 without groups.
const OTHER_USER: [&str; 4] = [
    "setpriv",
    "--reuid=12345",
    "--regid=12345",
    "--clear-groups",
];

fn as_other_user(argv: &[&str]) -> std::process::Output {
    Command::new(OTHER_USER[0])
        .args(&OTHER_USER[1..])
        .arg("--")
        .args(argv)
        .output()
        .expect("run setpriv")
}

/// `sharedos demo` with `TMPDIR` set: (success, stderr). A host that is not
/// root keeps its state directory in `$XDG_RUNTIME_DIR` (else in TMPDIR):
/// one of its own here, so TMPDIR shows only what the turn leaves.
fn demo(tmpdir: &Path) -> (bool, String) {
    let runtime_dir = tempfile::tempdir().unwrap();
    let out = Command::new(helper_exe())
        .arg("demo")
        .env("TMPDIR", tmpdir)
        .env("XDG_RUNTIME_DIR", runtime_dir.path())
        .output()
        .expect("run sharedos demo");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A chain `depth` directories deep below `top`, one level at a time.
fn chain(top: &Path, depth: usize) {
    use rustix::fs::{Mode, OFlags};
    std::fs::create_dir(top).unwrap();
    let mut cur = rustix::fs::open(top, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
    for _ in 0..depth {
        rustix::fs::mkdirat(&cur, "d", Mode::RWXU).unwrap();
        cur = rustix::fs::openat(&cur, "d", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
            .unwrap();
    }
}

/// A pid no process has now (a child that has exited and been reaped).
fn dead_pid() -> u32 {
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

#[test]
fn a_deep_directory_chain_leaves_the_host_and_a_later_host_standing() {
    let _serial = serial();
    let bait = json!({ "chain_depth": 20_000 });
    // Building the chain takes tens of seconds of the plugin's own work on
    // a loaded two-core machine (50 s seen): the deadline leaves room for
    // it, since a turn ended by its deadline proves nothing here.
    let spec = TurnSpec::new(SandboxPolicy::default(), bait)
        .only(&["C34b"])
        .timeout_ms(180_000);
    let run = run_turn(spec);
    // The host survived the end of the turn and returned a result.
    assert_eq!(run.status(), "succeeded", "errors: {}", run.error_text());
    let receipts = run.receipts();
    let observed = attempted(&receipts, "C34b", "workspace tmpfs")["observed"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // The plugin built deeper than the 13,000 levels that aborted hosts
    // before; the workspace's inode cap is what stopped it.
    let made: u64 = observed
        .split_whitespace()
        .nth(4)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(made >= 13_000, "{observed}");
    assert!(observed.contains("ENOSPC"), "{observed}");
    assert!(run.survivors.is_empty(), "{:?}", run.survivors);
    assert!(
        run.leftover_workspaces.is_empty(),
        "{:?}",
        run.leftover_workspaces
    );
    // A later host in the same TMPDIR starts and runs a turn.
    let (ok, err) = demo(workspaces_parent());
    assert!(ok, "a later host failed: {err}");
}

#[test]
fn a_stale_deep_workspace_of_an_older_host_is_swept_without_harm() {
    // On tmpfs: on a disk mounted with `discard` every rmdir waits for the
    // device, which would make this test slow, not the sweep.
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    let stale = tmp.path().join(format!("sharedos-ws-{}-older", dead_pid()));
    chain(&stale, 20_000);
    // A host starting over it runs its turn (the sweep is off its path).
    let (ok, err) = demo(tmp.path());
    assert!(ok, "a host over a stale deep workspace failed: {err}");
    // The sweep itself, on a small stack: iterative, and it finishes.
    let dir = tmp.path().to_path_buf();
    let sweep = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || sharedos_host::sandboxed::sweep_stale_workspaces(&dir))
        .unwrap()
        .join()
        .expect("the sweep never panics");
    assert!(sweep.failed.is_empty(), "{:?}", sweep.failed);
    assert!(!stale.exists(), "the stale workspace is still there");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().collect();
    assert!(left.is_empty(), "left: {left:?}");
}

#[test]
fn demo_works_with_tmpdir_under_a_private_directory() {
    let base = tempfile::tempdir().unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let tmpdir = base.path().join("x");
    std::fs::create_dir(&tmpdir).unwrap();
    std::fs::set_permissions(&tmpdir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let (ok, err) = demo(&tmpdir);
    assert!(ok, "sharedos demo failed with a private TMPDIR: {err}");
    assert!(
        err.contains(&format!("level {}", sharedos_tests::full_level())),
        "{err}"
    );
    assert!(err.contains("succeeded"), "{err}");
}

/// Every process of the tree below `pid` (children by /proc).
fn tree(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        let p = all[i];
        let kids =
            std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
        all.extend(
            kids.split_whitespace()
                .filter_map(|k| k.parse::<u32>().ok()),
        );
        i += 1;
    }
    all
}

#[test]
fn nothing_a_plugin_plants_is_reachable_by_another_host_user() {
    if !sharedos_tests::needs_root(
        "sandbox_fs::nothing_a_plugin_plants_is_reachable_by_another_host_user",
        "looking as another host user needs root (setpriv)",
    ) {
        return;
    }
    let _serial = serial();
    let mut child = sharedos_sandbox::spawn(&SpawnSpec {
        helper_exe: helper_exe(),
        program: adversary_exe(),
        args: ["--standalone", "--only", "C49b"].map(Into::into).to_vec(),
        env: vec![],
        policy: SandboxPolicy::default(),
        workspace: None,
    })
    .expect("spawn the adversary");
    let stdout = std::fs::File::from(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap();
    let receipt: Value = serde_json::from_str(&line).expect("the C49b receipt");
    let observed = receipt["observed"].as_str().unwrap_or_default().to_string();
    let marker = observed
        .strip_prefix("marker ")
        .and_then(|r| r.split(';').next())
        .expect("a marker")
        .to_string();
    // Inside, every file was planted, the workspace's setuid one with its bit.
    assert_eq!(observed.matches("planted ").count(), 6, "{observed}");
    assert!(
        observed.contains(&format!("/workspace/{marker}-setuid mode 4755")),
        "{observed}"
    );
    let pids = tree(child.pid as u32);
    assert!(pids.len() >= 3, "helper, pid 1 and the plugin: {pids:?}");
    let plugin = *pids.last().unwrap();
    // The host (root) sees it through the plugin's root: the path is right.
    let seen_by_root = format!("/proc/{plugin}/root/workspace/{marker}-setuid");
    assert!(
        std::fs::metadata(&seen_by_root).is_ok(),
        "{seen_by_root} is not there for root"
    );
    // Another user finds nothing in the host's shared places...
    let tmp = std::env::temp_dir();
    let places = [
        "/tmp",
        "/var/tmp",
        "/dev/shm",
        "/run",
        tmp.to_str().unwrap(),
    ];
    let pattern = format!("{marker}*");
    let mut find = vec!["find"];
    find.extend(places);
    find.extend(["-name", pattern.as_str()]);
    let out = as_other_user(&find);
    let found = String::from_utf8_lossy(&out.stdout);
    assert!(found.trim().is_empty(), "another user found: {found}");
    // ...and can neither read nor run anything through a sandbox process.
    for pid in &pids {
        for path in [
            format!("/proc/{pid}/root/workspace/{marker}-setuid"),
            format!("/proc/{pid}/root/workspace/{marker}-exec"),
            format!("/proc/{pid}/root/tmp/{marker}-exec"),
            format!("/proc/{pid}/cwd/{marker}-exec"),
        ] {
            let read = as_other_user(&["cat", &path]);
            assert!(!read.status.success(), "another user read {path}");
            let run = as_other_user(&[&path]);
            assert!(!run.status.success(), "another user ran {path}");
        }
    }
    child.kill_tree();
    let _ = child.wait();
    // Held by nothing now: the files are gone with the sandbox.
    assert!(std::fs::metadata(&seen_by_root).is_err());
}

/// What the host knows and the plugin must not: host paths and the host's
/// boot id and kernel command line.
fn host_facts() -> Vec<String> {
    let plugin = plugin_copy().path.clone();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let mut facts: Vec<String> = [
        plugin.clone(),
        plugin.parent().unwrap().to_path_buf(),
        helper_exe(),
        workspaces_parent().to_path_buf(),
        repo,
    ]
    .iter()
    .map(|p: &PathBuf| p.display().to_string())
    .collect();
    // `/proc/version` carries the kernel builder's user, host and compiler
    // beyond what uname(2) says.
    for f in [
        "/proc/sys/kernel/random/boot_id",
        "/proc/cmdline",
        "/proc/version",
    ] {
        let v = std::fs::read_to_string(f).unwrap().trim().to_string();
        assert!(v.len() >= 8, "{f} is too short to look for: {v:?}");
        facts.push(v);
    }
    // The host's name, where it is long enough to look for (the plugin's
    // hostname is checked exactly below).
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    if name.trim().len() >= 4 {
        facts.push(name.trim().to_string());
    }
    facts
}

#[test]
fn no_host_fact_is_visible_inside() {
    let _serial = serial();
    let facts = host_facts();
    let bait = json!({ "host_facts": facts });
    let run = run_turn(TurnSpec::new(SandboxPolicy::default(), bait).only(&["C53b"]));
    assert_eq!(run.status(), "succeeded", "errors: {}", run.error_text());
    let receipts = run.receipts();
    let r = attempted(&receipts, "C53b", "minimal root and masked /proc");
    let observed = r["observed"].as_str().unwrap_or_default();
    // It did read its view: the mount table, pid 1, its environment.
    assert!(observed.contains("/workspace"), "{observed}");
    assert!(
        observed.contains("[/proc/1/cmdline] sandbox-init"),
        "{observed}"
    );
    assert!(
        observed.contains("[/proc/1/comm] sandbox-init"),
        "{observed}"
    );
    assert!(observed.contains("[env PATH]"), "{observed}");
    // The hostname is the sandbox's; uptime starts with the sandbox;
    // `version` says only what uname(2) does.
    assert!(
        observed.contains("[/proc/sys/kernel/hostname] sandbox"),
        "{observed}"
    );
    assert!(observed.contains("[/proc/uptime] 0.00 0.00"), "{observed}");
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let version = std::fs::read_to_string("/proc/sys/kernel/version").unwrap();
    assert!(
        observed.contains(&format!(
            "[/proc/version] Linux version {} {}",
            release.trim(),
            version.trim()
        )),
        "{observed}"
    );
    // The host's own check of what was read verbatim...
    for fact in &facts {
        assert!(
            !observed.contains(fact.as_str()),
            "{fact:?} visible inside: {observed}"
        );
    }
    // ...and the plugin's, over its whole /proc view.
    assert_eq!(r["blocked"], true, "{observed}");
}

/// Run `program args` in the default sandbox (tmpfs workspace); its stdout.
fn run_in_sandbox(program: &str, args: &[&str]) -> String {
    use std::io::Read;
    let mut child = sharedos_sandbox::spawn(&SpawnSpec {
        helper_exe: helper_exe(),
        program: program.into(),
        args: args.iter().map(Into::into).collect(),
        env: vec![],
        policy: SandboxPolicy::default(),
        workspace: None,
    })
    .unwrap_or_else(|e| panic!("spawn {program}: {e}"));
    let mut out = String::new();
    std::fs::File::from(child.stdout.take().unwrap())
        .read_to_string(&mut out)
        .unwrap();
    let mut err = String::new();
    std::fs::File::from(child.stderr.take().unwrap())
        .read_to_string(&mut err)
        .unwrap();
    let st = child.wait().unwrap();
    assert!(st.success(), "{program}: {st}; stderr: {err}");
    out
}

#[test]
fn python_and_node_run_with_the_default_binds_and_host_config_stays_out() {
    // The host has the configuration the default binds leave out.
    assert!(Path::new("/usr/local/etc").is_dir());
    let py = run_in_sandbox(
        "/usr/bin/python3",
        &[
            "-c",
            "import json, os, threading, subprocess, tempfile\n\
             t = threading.Thread(target=lambda: None); t.start(); t.join()\n\
             open('/workspace/f', 'w').write('x')\n\
             r = subprocess.run(['/bin/sh', '-c', 'echo sub'], capture_output=True, text=True)\n\
             print(json.dumps({'sub': r.stdout.strip(), 'ws': os.listdir('/workspace'),\n\
               'usr_local_etc': os.path.exists('/usr/local/etc'), 'tmp': tempfile.gettempdir()}))",
        ],
    );
    let v: Value = serde_json::from_str(py.trim()).unwrap_or_else(|e| panic!("{e}: {py}"));
    assert_eq!(v["sub"], "sub", "{py}");
    assert_eq!(v["ws"], json!(["f"]), "{py}");
    assert_eq!(v["usr_local_etc"], false, "{py}");
    assert_eq!(v["tmp"], "/tmp", "{py}");
    let node = run_in_sandbox(
        "/usr/bin/node",
        &[
            "-e",
            "const fs = require('fs'); const cp = require('child_process');\n\
             fs.writeFileSync('/workspace/n', 'y');\n\
             setTimeout(() => console.log(JSON.stringify({sub: cp.execFileSync('/bin/sh', ['-c', 'echo sub']).toString().trim(),\n\
               ws: fs.readdirSync('/workspace'), usrLocalEtc: fs.existsSync('/usr/local/etc')})), 10);",
        ],
    );
    let v: Value = serde_json::from_str(node.trim()).unwrap_or_else(|e| panic!("{e}: {node}"));
    assert_eq!(v["sub"], "sub", "{node}");
    assert_eq!(v["ws"], json!(["n"]), "{node}");
    assert_eq!(v["usrLocalEtc"], false, "{node}");
}
