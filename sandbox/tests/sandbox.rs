//! Real processes: the real helper against the hostile probe binary. Every
//! attack is also checked on the host side (the file is absent, the listener
//! saw nothing, the pid is gone), never only through the probe's word.
//! The sandbox's lifecycle (kill, reap, prepared sandboxes) is in
//! `sandbox_lifecycle.rs`, its policy and levels in `sandbox_policy.rs`.

// Tests tweak one field of the default policy at a time, which reads best
// as an assignment.
#![allow(clippy::field_reassign_with_default)]

mod common;

use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;

use common::*;
use sharedos_sandbox::{LayerStatus, SandboxLevel, SandboxPolicy, spawn};

#[test]
fn probe_sees_a_strong_sandbox() {
    let (report, out, _err) = run(
        SandboxPolicy::default(),
        &["status", "fds", "uid", "hostname", "cwd", "procs"],
    );
    assert_eq!(report.level, full_level(), "{:?}", report.missing);
    let memory = (!sharedos_sandbox::cgroup::memory_delegated()).then_some("memory");
    let missing: Vec<&str> = report.missing.iter().map(|m| m.layer.as_str()).collect();
    assert_eq!(missing, Vec::from_iter(memory));
    assert_eq!(ok(&out, "fds"), "0,1,2");
    assert_ne!(ok(&out, "uid"), "0");
    let status = ok(&out, "status");
    assert!(status.contains("CapEff: 0000000000000000"), "{status}");
    assert!(status.contains("CapPrm: 0000000000000000"), "{status}");
    assert!(status.contains("CapBnd: 0000000000000000"), "{status}");
    assert!(status.contains("NoNewPrivs: 1"), "{status}");
    assert!(status.contains("Seccomp: 2"), "{status}");
    assert_eq!(ok(&out, "hostname"), "sandbox");
    assert_eq!(ok(&out, "cwd"), "/workspace");
    // Only the reaper and the probe exist in its pid namespace.
    assert_eq!(ok(&out, "procs"), "2");
    // The report's own self-check agrees.
    let sc = &report.self_check;
    assert_eq!(sc.cap_eff, Some(0));
    assert_eq!(sc.no_new_privs, Some(true));
    assert_eq!(sc.seccomp, Some(2));
    assert_eq!(report.fds, vec![0, 1, 2]);
    assert!(report.seccomp.x32_guard || !cfg!(target_arch = "x86_64"));
    assert_eq!(report.landlock.status, LayerStatus::Applied);
}

#[test]
fn leaked_host_fd_is_not_inherited() {
    // A host fd without CLOEXEC (a secret file) must not reach the plugin.
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "s3cret").unwrap();
    let f = std::fs::File::open(&secret).unwrap();
    // SAFETY: clearing FD_CLOEXEC on an fd this test owns.
    unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFD, 0) };
    let (report, out, _) = run(SandboxPolicy::default(), &["fds"]);
    assert_eq!(ok(&out, "fds"), "0,1,2");
    assert_eq!(report.fds, vec![0, 1, 2]);
    drop(f);
}

#[test]
fn secret_outside_the_workspace_is_unreadable() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "s3cret").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let read_secret = format!("read:{}", secret.display());
    let (_, out, _) = run(
        SandboxPolicy::default(),
        &[
            &read_secret,
            "read:/etc/shadow",
            "read:/root/.bashrc",
            "read:/proc/1/environ",
        ],
    );
    assert!(ok(&out, &read_secret).starts_with("err:"), "{out}");
    assert!(ok(&out, "read:/etc/shadow").starts_with("err:"), "{out}");
    assert!(ok(&out, "read:/root/.bashrc").starts_with("err:"), "{out}");
}

#[test]
fn writes_outside_the_workspace_and_tmp_fail() {
    let ws = workspace();
    let host_dir = tempfile::tempdir().unwrap();
    let token = format!("pwned-{}", std::process::id());
    let host_target = host_dir.path().join(&token);
    let targets = [
        format!("write:/etc/{token}"),
        format!("write:/usr/{token}"),
        format!("write:/var/tmp/{token}"),
        format!("write:/{token}"),
        format!("write:{}", host_target.display()),
        format!("write:/dev/{token}"),
    ];
    let mut ops: Vec<&str> = targets.iter().map(String::as_str).collect();
    ops.extend(["write:/workspace/ok", "write:/tmp/ok", "write:/dev/shm/ok"]);
    let (_, out, _) = run_in(&ws, SandboxPolicy::default(), &ops);
    for t in &targets {
        assert!(ok(&out, t).starts_with("err:"), "{t}: {out}");
    }
    // Host side: nothing appeared anywhere.
    for p in [
        format!("/etc/{token}"),
        format!("/usr/{token}"),
        format!("/var/tmp/{token}"),
        format!("/{token}"),
    ] {
        assert!(!std::path::Path::new(&p).exists(), "{p} was created");
    }
    assert!(!host_target.exists());
    // The workspace and the private tmp are writable; only the workspace
    // write is visible on the host.
    assert_eq!(ok(&out, "write:/workspace/ok"), "ok");
    assert_eq!(ok(&out, "write:/tmp/ok"), "ok");
    assert_eq!(ok(&out, "write:/dev/shm/ok"), "ok");
    assert_eq!(std::fs::read(ws.path().join("ok")).unwrap(), b"pwned");
}

#[test]
fn network_sockets_are_denied() {
    let (_, out, _) = run(
        SandboxPolicy::default(),
        &[
            "socket:inet",
            "socket:inet6",
            "socket:udp",
            "socket:vsock",
            "socket:netlink",
            "socket:packet",
            "socket:unix",
        ],
    );
    let eperm = format!("err:{}", libc::EPERM);
    for fam in ["inet", "inet6", "udp", "vsock", "netlink", "packet"] {
        assert_eq!(ok(&out, &format!("socket:{fam}")), eperm, "{fam}: {out}");
    }
    // AF_UNIX stays (socketpair-style IPC, Python forkserver, ...).
    assert_eq!(ok(&out, "socket:unix"), "ok");
}

#[test]
fn tcp_listener_on_host_loopback_sees_no_connection() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let op = format!("connect:{port}");
    let (_, out, _) = run(SandboxPolicy::default(), &[&op]);
    assert!(ok(&out, &op).starts_with("err:"), "{out}");
    let accepted = listener.accept();
    assert!(
        matches!(&accepted, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the host listener saw a connection: {accepted:?}"
    );
}

#[test]
fn nested_namespaces_and_ptrace_are_denied() {
    let (_, out, _) = run(SandboxPolicy::default(), &["unshare", "ptrace"]);
    let eperm = format!("err:{}", libc::EPERM);
    assert_eq!(ok(&out, "unshare"), eperm);
    assert_eq!(ok(&out, "ptrace"), eperm);
}

#[test]
fn env_holds_only_the_allowlist() {
    let ws = workspace();
    let mut spec = spec(ws.path(), SandboxPolicy::default(), &["env".to_string()]);
    spec.env = vec![
        ("SECRET_TOKEN".into(), "t0ken".into()),
        ("AWS_SECRET_ACCESS_KEY".into(), "k3y".into()),
        ("SSH_AUTH_SOCK".into(), "/tmp/agent".into()),
        ("RUST_LOG".into(), "debug".into()),
    ];
    let mut child = spawn(&spec).unwrap();
    let out = read_all(child.stdout.take().unwrap());
    assert!(child.wait().unwrap().success());
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(ok(&v, "env"), "HOME,LANG,PATH,RUST_LOG,TMPDIR");
    let mut keys = child.report.env_keys.clone();
    keys.sort();
    assert_eq!(keys, ["HOME", "LANG", "PATH", "RUST_LOG", "TMPDIR"]);
    for k in ["SECRET_TOKEN", "AWS_SECRET_ACCESS_KEY", "SSH_AUTH_SOCK"] {
        assert!(
            child.report.warnings.iter().any(|w| w.contains(k)),
            "dropped {k} not reported"
        );
    }
}

#[test]
fn a_request_larger_than_the_socket_buffer_still_arrives() {
    // The request is queued before the helper starts, as far as the socket
    // buffer takes it; the rest follows once the helper runs.
    let ws = workspace();
    let mut spec = spec(ws.path(), SandboxPolicy::default(), &["env".to_string()]);
    let big = "x".repeat(100 << 10);
    spec.env = (0..6)
        .map(|i| (format!("SHAREDOS_BIG_{i}"), big.clone()))
        .collect();
    let mut child = spawn(&spec).unwrap();
    let out = read_all(child.stdout.take().unwrap());
    assert!(child.wait().unwrap().success());
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(ok(&v, "env").contains("SHAREDOS_BIG_5"), "{v}");
}

#[test]
fn resource_limits_bound_forks_files_and_tmp() {
    let mut policy = SandboxPolicy::default();
    policy.rlimits.nproc = Some(64);
    policy.rlimits.fsize = Some(8 << 20);
    policy.tmp_size_bytes = 4 << 20;
    policy.cgroup.pids_max = Some(100);
    policy.rlimits.data = Some(256 << 20);
    policy.rlimits.nofile = Some(64);
    let (report, out, _) = run(
        policy,
        &[
            "fork:300",
            "fill:/workspace/big:32",
            "fill:/tmp/big:16",
            "mmap:1024",
            "mmap:16",
            "fdmax",
        ],
    );
    // RLIMIT_DATA refuses a 1 GiB writable mapping, not a small one.
    assert_eq!(ok(&out, "mmap:1024"), format!("err:{}", libc::ENOMEM));
    assert_eq!(ok(&out, "mmap:16"), "ok");
    // RLIMIT_NOFILE: EMFILE before 64 fds.
    let fdmax = ok(&out, "fdmax");
    assert!(fdmax.ends_with(&format!("err:{}", libc::EMFILE)), "{fdmax}");
    let opened: usize = fdmax.split_whitespace().next().unwrap().parse().unwrap();
    assert!(opened < 64, "{fdmax}");
    assert_eq!(report.rlimits.get("nproc"), Some(&64));
    assert_eq!(report.rlimits.get("core"), Some(&0));
    let forks: usize = ok(&out, "fork:300")
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(forks < 100, "fork bomb reached {forks} children");
    // RLIMIT_FSIZE stops the workspace file at 8 MiB with EFBIG.
    assert_eq!(
        ok(&out, "fill:/workspace/big:32"),
        format!("8 err:{}", libc::EFBIG)
    );
    // The private /tmp is a 4 MiB tmpfs: ENOSPC.
    let tmp = ok(&out, "fill:/tmp/big:16");
    assert!(tmp.ends_with(&format!("err:{}", libc::ENOSPC)), "{tmp}");
}

#[test]
fn kernel_attack_surface_is_filtered() {
    let mut ops = vec![
        "sys:bpf",
        "sys:perf_event_open",
        "sys:userfaultfd",
        "sys:keyctl",
        "sys:io_uring_setup",
        "sys:mount",
        "sys:setns",
        "sys:pidfd_getfd",
        "sys:tiocsti",
        "sys:clone3",
        "sys:sethostname",
    ];
    // The allowlist's newer refusals.
    ops.extend([
        "sys:open_tree_attr",
        "sys:listmount",
        "sys:statmount",
        "sys:quotactl_fd",
        "sys:memfd_secret",
        "sys:setxattrat",
        "sys:lsm_list_modules",
        "sys:personality_rie",
        "sys:prlimit_pid1",
    ]);
    if cfg!(target_arch = "x86_64") {
        ops.extend(["sys:x32", "sys:modify_ldt"]);
    }
    // Unlisted: ENOSYS, as from a kernel without them.
    let unlisted = [
        "sys:clone3",
        "sys:sethostname",
        "sys:unknown470",
        "sys:fanotify_init",
        "sys:memfd_create",
    ];
    ops.extend(&unlisted[2..]);
    let (_, out, _) = run(SandboxPolicy::default(), &ops);
    let eperm = format!("err:{}", libc::EPERM);
    for op in &ops {
        // clone3 for the libc fallback; the others because the allowlist
        // does not list them (memfd_create by the default policy).
        let want = if unlisted.contains(op) {
            format!("err:{}", libc::ENOSYS)
        } else {
            eperm.clone()
        };
        assert_eq!(ok(&out, op), want, "{op}: {out}");
    }
    // The host's hostname is untouched.
    assert_ne!(
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap()
            .trim(),
        "pwned"
    );
}

#[test]
fn prlimit64_cannot_change_pid_1s_limits() {
    // The probe tries to lower pid 1's RLIMIT_NOFILE to 17, then waits; the
    // host reads pid 1's limits while it is alive.
    let ws = workspace();
    let ops = ["sys:prlimit_pid1".to_string(), "daemon:x".to_string()];
    let mut child = spawn(&spec(ws.path(), SandboxPolicy::default(), &ops)).unwrap();
    let mut lines = BufReader::new(std::fs::File::from(child.stdout.take().unwrap())).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.contains("started"), "{first}");
    let pid1 = sandbox_pid1(child.pid).expect("the sandbox's pid 1 on the host");
    let limits = std::fs::read_to_string(format!("/proc/{pid1}/limits")).unwrap();
    let nofile = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .nth(3)
        .unwrap()
        .to_string();
    kill_child(child);
    assert_ne!(nofile, "17", "pid 1's limits were changed: {limits}");
}

#[test]
fn host_processes_and_devices_are_out_of_reach() {
    // A victim the test owns; the plugin tries to kill it by its host pid.
    let mut victim = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .unwrap();
    let kill = format!("kill:{}", victim.id());
    let (_, out, _) = run(
        SandboxPolicy::default(),
        &[
            &kill,
            "kill:-1",
            "read:/dev/kmsg",
            "read:/dev/vda",
            "read:/dev/vsock",
            "read:/dev/console",
            "read:/sys/fs/cgroup/cgroup.procs",
            "write:/proc/sysrq-trigger",
        ],
    );
    for op in [
        "read:/dev/kmsg",
        "read:/dev/vda",
        "read:/dev/vsock",
        "read:/dev/console",
        "read:/sys/fs/cgroup/cgroup.procs",
        "write:/proc/sysrq-trigger",
    ] {
        assert!(ok(&out, op).starts_with("err:"), "{op}: {out}");
    }
    // Judge from the host side: the victim is alive.
    assert!(
        victim.try_wait().unwrap().is_none(),
        "the victim was killed"
    );
    victim.kill().unwrap();
    victim.wait().unwrap();
}

#[test]
fn a_shell_and_its_tools_work_inside() {
    // The minimal root must still run ordinary dynamically linked tools.
    let ws = workspace();
    let mut s = spec(ws.path(), SandboxPolicy::default(), &[]);
    s.program = "/bin/sh".into();
    s.args = vec![
        "-c".into(),
        "set -e; echo hello > /workspace/out; cat /workspace/out; ls /usr/bin >/dev/null; \
         id -u; hostname 2>/dev/null || cat /proc/sys/kernel/hostname; \
         echo tmp > /tmp/t && cat /tmp/t; echo $HOME $TMPDIR; pwd"
            .into(),
    ];
    let mut child = spawn(&s).unwrap();
    drop(child.stdin.take());
    let err = child.stderr.take().unwrap();
    let err = std::thread::spawn(move || read_all(err));
    let out = read_all(child.stdout.take().unwrap());
    let status = child.wait().unwrap();
    let err = err.join().unwrap();
    assert!(status.success(), "{status}: {out} {err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "hello");
    assert!(is_sandbox_uid(lines[1]), "{lines:?}");
    assert_eq!(lines[2], "sandbox");
    assert_eq!(lines[3], "tmp");
    assert_eq!(lines[4], "/sandbox/home /tmp");
    assert_eq!(lines[5], "/workspace");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("out")).unwrap(),
        "hello\n"
    );
}

#[test]
fn host_ipc_and_unix_sockets_are_unreachable() {
    use std::os::linux::net::SocketAddrExt;
    let pid = std::process::id();
    // Bait: a pathname socket (0777), an abstract socket, a SysV shm
    // segment and a /dev/shm file, all of the host.
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("host.sock");
    let path_listener = std::os::unix::net::UnixListener::bind(&sock_path).unwrap();
    std::fs::set_permissions(
        &sock_path,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    path_listener.set_nonblocking(true).unwrap();
    let abstract_name = format!("sharedos-test-{pid}");
    let addr =
        std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap();
    let abs_listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    abs_listener.set_nonblocking(true).unwrap();
    let key = 0x5d00_0000 + (pid as i32 & 0xffff);
    // SAFETY: creating a 4 KiB shm segment the test removes below.
    let shm = unsafe { libc::shmget(key, 4096, libc::IPC_CREAT | 0o666) };
    assert!(shm >= 0);
    let shm_file = format!("/dev/shm/sharedos-test-{pid}");
    std::fs::write(&shm_file, "s3cret").unwrap();
    // Removed even when an assertion fails.
    struct Bait(i32, String);
    impl Drop for Bait {
        fn drop(&mut self) {
            // SAFETY: removing the segment this test created.
            unsafe { libc::shmctl(self.0, libc::IPC_RMID, std::ptr::null_mut()) };
            let _ = std::fs::remove_file(&self.1);
        }
    }
    let _bait = Bait(shm, shm_file.clone());

    let uconnect = format!("uconnect:{}", sock_path.display());
    let aconnect = format!("aconnect:{abstract_name}");
    let shmget = format!("shmget:{key}");
    let read_shm = format!("read:{shm_file}");
    let ops = [uconnect.as_str(), &aconnect, &shmget, &read_shm];

    for (mode, policy) in [
        ("strong", SandboxPolicy::default()),
        (
            "reduced",
            SandboxPolicy {
                emulate_no_userns: true,
                min_level: SandboxLevel::Reduced,
                ..SandboxPolicy::default()
            },
        ),
    ] {
        let (_, out, _) = run(policy, &ops);
        for op in ops {
            assert!(ok(&out, op).starts_with("err:"), "{mode} {op}: {out}");
        }
        // Host side: no connection arrived on either socket.
        assert!(
            path_listener.accept().is_err(),
            "{mode}: pathname socket reached"
        );
        assert!(
            abs_listener.accept().is_err(),
            "{mode}: abstract socket reached"
        );
    }
}

#[test]
fn a_setuid_root_binary_does_not_escalate() {
    if !needs_root(
        "sandbox::a_setuid_root_binary_does_not_escalate",
        "making a setuid-root file needs root",
    ) {
        return;
    }
    let ws = workspace();
    let id = ["/usr/bin/id", "/bin/id"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("id(1) is installed");
    let suid = ws.path().join("id-suid");
    std::fs::copy(id, &suid).unwrap();
    std::os::unix::fs::chown(&suid, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&suid, std::os::unix::fs::PermissionsExt::from_mode(0o4755)).unwrap();
    for (mode, policy) in [
        ("strong", SandboxPolicy::default()),
        (
            "reduced",
            SandboxPolicy {
                emulate_no_userns: true,
                min_level: SandboxLevel::Reduced,
                ..SandboxPolicy::default()
            },
        ),
    ] {
        let path = if mode == "strong" {
            "/workspace/id-suid".to_string()
        } else {
            suid.display().to_string()
        };
        let op = format!("exec:{path}");
        let (_, out, _) = run_in(&ws, policy, &[&op]);
        let res = ok(&out, &op);
        // `uid=N(sandbox) gid=...`: the sandbox has a passwd entry of its
        // own for its uid, so id(1) names it.
        let uid = res
            .strip_prefix("ok:uid=")
            .and_then(|r| r.split(|c: char| c == '(' || c.is_whitespace()).next())
            .unwrap_or_default();
        assert!(is_sandbox_uid(uid), "{mode}: {res}");
        assert!(!res.contains("euid=0"), "{mode}: setuid took effect: {res}");
    }
}

#[test]
fn extra_read_only_paths_are_bound_read_only() {
    // A host directory outside the system dirs, made visible on purpose.
    let extra = tempfile::Builder::new()
        .prefix("sharedos-extra-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::write(extra.path().join("data"), "shared").unwrap();
    let mut policy = SandboxPolicy::default();
    policy.extra_ro_paths = vec![extra.path().display().to_string()];
    let read = format!("read:{}/data", extra.path().display());
    let write = format!("write:{}/data", extra.path().display());
    let (_, out, _) = run(policy.clone(), &[&read, &write]);
    assert_eq!(ok(&out, &read), "ok");
    assert!(ok(&out, &write).starts_with("err:"));
    assert_eq!(
        std::fs::read_to_string(extra.path().join("data")).unwrap(),
        "shared"
    );
    // A named path that is gone fails the spawn, naming it: the plugin
    // never runs without what its runtime said it needs.
    for gone in ["/tmp/not-allowed", "/var/tmp/sharedos-gone-extra"] {
        let mut p = policy.clone();
        p.extra_ro_paths.push(gone.into());
        let ws = workspace();
        let e = spawn(&spec(ws.path(), p, std::slice::from_ref(&read)))
            .expect_err("a missing extra path");
        assert!(e.to_string().contains(gone), "{e}");
    }
}

/// A prepared sandbox (`prepare`): every layer and the report exist before
/// the plugin does; nothing of it runs until `start`, and then it runs with
/// the same report, marked as prepared.

#[test]
fn an_extra_read_only_path_under_tmp_is_visible_read_only() {
    // A checkout in a temp dir (an interpreted plugin's script, its SDK):
    // the sandbox's own /tmp must not hide it, and it stays read-only.
    let src = tempfile::Builder::new()
        .prefix("sharedos-extra-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::create_dir(src.path().join("pkg")).unwrap();
    std::fs::write(src.path().join("pkg/script.txt"), "from the host\n").unwrap();
    // The sandbox uid must be able to traverse and read it.
    for p in [src.path(), &src.path().join("pkg")] {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let dir = src.path().join("pkg");
    let mut policy = SandboxPolicy::default();
    policy.extra_ro_paths = vec![dir.display().to_string()];
    let ws = workspace();
    let mut s = spec(ws.path(), policy, &[]);
    s.program = "/bin/sh".into();
    s.args = vec![
        "-c".into(),
        format!(
            "cat {d}/script.txt; echo x > {d}/new 2>/dev/null && echo writable || echo read-only; \
             echo private > /tmp/mine && cat /tmp/mine",
            d = dir.display()
        )
        .into(),
    ];
    if !rustix::process::geteuid().is_root() {
        // A host that is not root cannot clone a path under /tmp before
        // the sandbox's own /tmp hides it: the spawn is refused, naming
        // the path and the fix, instead of running without it.
        let Err(e) = spawn(&s) else {
            panic!("an extra path under /tmp was accepted by a host that is not root");
        };
        let e = e.to_string();
        assert!(
            e.contains("is under /tmp") && e.contains(&dir.display().to_string()),
            "{e}"
        );
        return;
    }
    let mut child = spawn(&s).unwrap();
    drop(child.stdin.take());
    let err = child.stderr.take().unwrap();
    let err = std::thread::spawn(move || read_all(err));
    let out = read_all(child.stdout.take().unwrap());
    let status = child.wait().unwrap();
    let err = err.join().unwrap();
    assert!(status.success(), "{status}: {out} {err}");
    assert_eq!(out, "from the host\nread-only\nprivate\n", "{err}");
    assert!(!dir.join("new").exists(), "nothing was written to the host");
    assert!(
        !std::path::Path::new("/tmp/mine").exists(),
        "the sandbox's /tmp is its own"
    );
}
