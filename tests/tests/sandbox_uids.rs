//! Issue 14, items 1 and 2, asserted from the host: each live sandbox runs
//! as a uid of its own (read from `/proc/<pid>/status` of each plugin), two
//! host processes never hand out the same uid, and the supervisor can be
//! neither read nor entered by the sandbox uid or any other non-root user.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use sharedos_sandbox::{SandboxPolicy, SandboxedChild, SpawnSpec, UidPolicy, spawn, uid};
use sharedos_tests::{plugin_bin, serial};

/// A sandbox whose plugin is `sleep`: alive until killed.
fn sleeper(policy: SandboxPolicy) -> (SandboxedChild, tempfile::TempDir) {
    let ws = tempfile::Builder::new()
        .prefix("sharedos-uids-")
        .tempdir()
        .unwrap();
    let child = spawn(&SpawnSpec {
        helper_exe: plugin_bin("sharedos"),
        program: "/usr/bin/sleep".into(),
        args: vec!["600".into()],
        env: vec![],
        policy,
        workspace: Some(ws.path().to_path_buf()),
    })
    .expect("spawn a sleeping plugin");
    (child, ws)
}

/// The supervisor, pid 1 and the plugin, by host pid.
fn tree(pid: i32) -> Vec<i32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        let kids = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", all[i]))
            .unwrap_or_default();
        all.extend(
            kids.split_whitespace()
                .filter_map(|k| k.parse::<i32>().ok()),
        );
        i += 1;
    }
    all
}

/// The four ids of a `Uid:`/`Gid:` line of `/proc/<pid>/status`.
fn ids(pid: i32, field: &str) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap()
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect()
}

#[test]
fn concurrent_sandboxes_run_as_distinct_uids_of_the_range() {
    if !sharedos_tests::needs_root(
        "sandbox_uids::concurrent_sandboxes_run_as_distinct_uids_of_the_range",
        "a uid of its own for each sandbox needs a root host (one that is not root runs every sandbox as its own uid, and says so)",
    ) {
        return;
    }
    let _serial = serial();
    let range = UidPolicy::default();
    let kids: Vec<_> = (0..4).map(|_| sleeper(SandboxPolicy::default())).collect();
    let mut seen = Vec::new();
    for (child, _) in &kids {
        let procs = tree(child.pid);
        assert_eq!(procs.len(), 3, "supervisor, pid 1, plugin: {procs:?}");
        let uid = ids(procs[2], "Uid:")[0];
        for p in &procs {
            assert_eq!(
                ids(*p, "Uid:"),
                [uid; 4],
                "pid {p} of the sandbox of uid {uid}"
            );
            assert_eq!(
                ids(*p, "Gid:"),
                [uid; 4],
                "pid {p} of the sandbox of uid {uid}"
            );
        }
        assert!(
            (range.first..range.first + range.count).contains(&uid),
            "uid {uid} outside the range"
        );
        assert_ne!(uid, 65534);
        assert_eq!(child.own_uid(), Some(uid));
        assert_eq!(child.report.host_uid, uid);
        assert_eq!(child.report.own_uid, sharedos_sandbox::LayerStatus::Applied);
        seen.push(uid);
    }
    let mut distinct = seen.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), seen.len(), "uids shared: {seen:?}");
    for (mut child, _ws) in kids {
        child.kill_tree();
        child.wait().unwrap();
    }
}

/// Child mode of the next test: hold `n` uids of the range, print them,
/// keep them until stdin closes.
#[test]
fn uid_allocation_child() {
    let Ok(n) = std::env::var("SHAREDOS_UID_CHILD") else {
        return;
    };
    let p = child_range();
    let leases: Vec<_> = (0..n.parse::<u32>().unwrap())
        .map(|_| uid::allocate(&p).unwrap())
        .collect();
    let list: Vec<String> = leases.iter().map(|l| l.uid().to_string()).collect();
    println!("UIDS {}", list.join(","));
    std::io::stdout().flush().unwrap();
    let mut rest = String::new();
    let _ = std::io::stdin().read_line(&mut rest);
}

fn child_range() -> UidPolicy {
    UidPolicy {
        first: 0x6100_0000,
        count: 24,
        required: true,
    }
}

#[test]
fn two_host_processes_never_hand_out_the_same_uid() {
    let spawn_child = || {
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "uid_allocation_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("SHAREDOS_UID_CHILD", "12")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut kids = [spawn_child(), spawn_child()];
    let mut all = Vec::new();
    let mut outs = Vec::new();
    for k in &mut kids {
        let mut out = BufReader::new(k.stdout.take().unwrap());
        let mut line = String::new();
        // libtest prints the test's name on the same line, first.
        let list = loop {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "child ended early");
            if let Some((_, l)) = line.split_once("UIDS ") {
                break l.trim().to_string();
            }
        };
        all.extend(list.split(',').map(|u| u.parse::<u32>().unwrap()));
        outs.push(out); // read to the end below, so the children never see EPIPE
    }
    // Both hold their 12 at once: the 24 uids of the range, each once.
    all.sort();
    let want: Vec<u32> = (0..24).map(|i| 0x6100_0000 + i).collect();
    assert_eq!(all, want);
    // A third taker finds none free while they hold them.
    let dir = uid::state_dir().unwrap();
    assert!(dir.join("uids").is_dir());
    assert!(matches!(
        uid::allocate(&child_range()),
        Err(uid::UidError::Exhausted { .. })
    ));
    for (mut k, mut out) in kids.into_iter().zip(outs) {
        drop(k.stdin.take());
        let _ = std::io::Read::read_to_end(&mut out, &mut Vec::new());
        k.wait().unwrap();
    }
    // Released with their holders.
    assert!(uid::allocate(&child_range()).is_ok());
}

/// Runs `cmd` as `uid`:`uid` with no groups; true when it succeeded.
fn as_user(uid: u32, cmd: &[&str]) -> (bool, String) {
    let u = uid.to_string();
    let out = Command::new("/usr/bin/setpriv")
        .args(["--reuid", &u, "--regid", &u, "--clear-groups", "--"])
        .args(cmd)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_supervisor_is_neither_readable_nor_enterable_by_the_sandbox_uid_or_another() {
    if !sharedos_tests::needs_root(
        "sandbox_uids::the_supervisor_is_neither_readable_nor_enterable_by_the_sandbox_uid_or_another",
        "acting as the sandbox uid and as another uid needs root (setpriv)",
    ) {
        return;
    }
    let _serial = serial();
    let (mut child, _ws) = sleeper(SandboxPolicy::default());
    let sup = child.pid;
    let uid = child.own_uid().unwrap();
    assert!(child.report.supervisor_non_dumpable);
    let s = sup.to_string();
    let other = 0x5fff_ff00;
    for who in [uid, other] {
        for file in ["environ", "mem", "maps", "auxv"] {
            let path = format!("/proc/{s}/{file}");
            let (ok, err) = as_user(who, &["/usr/bin/head", "-c1", &path]);
            assert!(!ok, "uid {who} read {path}");
            assert!(
                err.contains("Permission denied"),
                "uid {who}, {path}: {err}"
            );
        }
        let (ok, err) = as_user(who, &["/usr/bin/ls", &format!("/proc/{s}/fd")]);
        assert!(!ok, "uid {who} listed the supervisor's fds");
        assert!(err.contains("Permission denied"), "{err}");
        for ns in ["--user", "--mount", "--ipc", "--net", "--pid"] {
            let (ok, err) = as_user(
                who,
                &[
                    "/usr/bin/nsenter",
                    "--target",
                    &s,
                    ns,
                    "--preserve-credentials",
                    "/bin/true",
                ],
            );
            assert!(!ok, "uid {who} entered the supervisor's namespace {ns}");
            assert!(err.contains("Permission denied"), "{ns}: {err}");
        }
    }
    // The limits the supervisor set on itself, inherited by the tree as
    // hard limits: the plugin can lower them, never raise them.
    let limits = std::fs::read_to_string(format!("/proc/{s}/limits")).unwrap();
    // RLIMIT_DATA bounds a process's private mappings (RLIMIT_AS is not
    // set by default: it counts reservations, and broke Node's WebAssembly).
    let as_line = limits
        .lines()
        .find(|l| l.starts_with("Max data size"))
        .unwrap();
    let want = (4u64 << 30).to_string();
    assert_eq!(
        as_line.split_whitespace().filter(|w| *w == want).count(),
        2,
        "{as_line}"
    );
    let plugin = *tree(sup).last().unwrap();
    let plugin_limits = std::fs::read_to_string(format!("/proc/{plugin}/limits")).unwrap();
    assert!(plugin_limits.contains(as_line), "{plugin_limits}");
    child.kill_tree();
    child.wait().unwrap();
}

#[test]
fn a_policy_requiring_its_own_uid_is_refused_when_none_can_be_given() {
    let mut policy = SandboxPolicy::default();
    policy.layers.drop_uid = false;
    policy.uids.required = true;
    let ws = tempfile::tempdir().unwrap();
    let err = spawn(&SpawnSpec {
        helper_exe: plugin_bin("sharedos"),
        program: "/usr/bin/true".into(),
        args: vec![],
        env: vec![],
        policy,
        workspace: Some(ws.path().to_path_buf()),
    })
    .expect_err("no uid of its own, and the policy requires one");
    let text = err.to_string();
    assert!(text.contains("sandbox.uids.required"), "{text}");
}

#[test]
fn sandbox_check_states_the_uid_the_ceilings_and_what_bounds_memory() {
    let _serial = serial();
    let out = Command::new(plugin_bin("sharedos"))
        .args(["sandbox", "check"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    // A host that is not root gives no sandbox a uid of its own and cannot
    // write its ipc namespace's limits: the check says so on those lines.
    let (own_uid, ipc_limits, shmall) = if sharedos_tests::is_root() {
        ("own_uid        ok", "ipc_limits     ok (", "shmall=8192")
    } else {
        (
            "own_uid        MISSING (no other live sandbox has it): the host is not root",
            "ipc_limits     MISSING: the host is not root",
            "none: no private ipc namespace limit",
        )
    };
    for needle in [
        own_uid,
        "supervisor     ok (non-dumpable)",
        "ceilings       ok (",
        "max_inotify_instances=64",
        ipc_limits,
        shmall,
        "memory:",
        "RLIMIT_DATA 4294967296 a process x RLIMIT_NPROC",
        "memfd_create refused by the seccomp filter",
        "bound: ",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    // The whole tree is bounded only by a delegated memory controller,
    // and the check says which it is.
    let unbounded = text.contains("none: no delegated cgroup v2 memory controller")
        && text.contains("unbounded the whole tree");
    assert_eq!(
        unbounded,
        !sharedos_sandbox::cgroup::memory_delegated(),
        "{text}"
    );
}
