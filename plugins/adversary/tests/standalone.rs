//! The attacks are real: run unsandboxed against real bait, they work.
//!
//! A sandboxed test that sees an attack "blocked" means something only if
//! the same attempt succeeds without the sandbox. These tests lay bait on
//! this machine (a secret file, loopback listeners, a victim process of
//! their own, an inherited fd, a /dev/shm file), run the binary in
//! standalone mode, and check both the receipts and the host-side effects.
//! Resource attacks run only with tight bounds.

use std::collections::HashMap;
use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_sharedos-adversary");

/// Counts what reaches a listener, from a thread that lives as long as the test.
fn count_accepts<S: Send + 'static>(listener: S, accept: fn(&S) -> bool) -> Arc<AtomicUsize> {
    let n = Arc::new(AtomicUsize::new(0));
    let seen = n.clone();
    std::thread::spawn(move || {
        while accept(&listener) {
            seen.fetch_add(1, Ordering::SeqCst);
        }
    });
    n
}

fn run(
    bait: &Value,
    args: &[&str],
    cwd: &Path,
    env: &[(&str, &str)],
) -> (HashMap<String, Value>, Vec<u8>) {
    let bait_path = cwd.join("bait.json");
    std::fs::write(&bait_path, bait.to_string()).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg("--standalone")
        .arg("--bait")
        .arg(&bait_path)
        .args(args)
        .current_dir(cwd)
        .envs(env.iter().copied());
    cmd.stdin(Stdio::null());
    // A new session without a controlling terminal, so that C54 cannot type
    // into the terminal of whoever runs the tests.
    // SAFETY: setsid is async-signal-safe and touches no shared state.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::setsid();
            Ok(())
        })
    };
    let out = cmd.output().expect("the adversary runs");
    assert!(
        out.status.success(),
        "exit {:?}, stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let receipts = String::from_utf8(out.stdout)
        .expect("receipts are UTF-8")
        .lines()
        .map(|l| {
            let r: Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("receipt line {l:?}: {e}"));
            let id = r["attack"]
                .as_str()
                .unwrap()
                .split('-')
                .next()
                .unwrap()
                .to_owned();
            (id, r)
        })
        .collect();
    (receipts, out.stderr)
}

fn assert_succeeded(receipts: &HashMap<String, Value>, ids: &[&str]) {
    for id in ids {
        let r = receipts
            .get(*id)
            .unwrap_or_else(|| panic!("no receipt for {id}"));
        assert_eq!(r["attempted"], true, "{r}");
        assert_eq!(r["blocked"], false, "{id} should work unsandboxed: {r}");
    }
}

#[test]
fn the_default_sequence_works_unsandboxed() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "host secret\n").unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
    std::fs::write(ws.join(".git/config"), "[core]\n").unwrap();
    let devshm =
        Path::new("/dev/shm").join(format!("sharedos-adversary-test-{}", std::process::id()));
    std::fs::write(&devshm, "shm secret").unwrap();

    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp_port = tcp.local_addr().unwrap().port();
    let tcp_hits = count_accepts(tcp, |l| l.accept().is_ok());
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    let udp_hits = count_accepts(udp, |s| s.recv(&mut [0u8; 64]).is_ok());
    let unix_path = dir.path().join("host.sock");
    let unix_hits = count_accepts(UnixListener::bind(&unix_path).unwrap(), |l| {
        l.accept().is_ok()
    });
    let abstract_name = format!("sharedos-adversary-test-{}", std::process::id());
    let abstract_addr = {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap()
    };
    let abstract_hits = count_accepts(UnixListener::bind_addr(&abstract_addr).unwrap(), |l| {
        l.accept().is_ok()
    });

    // An fd the child inherits: a dup without CLOEXEC.
    let held = std::fs::File::open(&secret).unwrap();
    // SAFETY: dup of a live fd; the copy is closed below.
    let inherited = unsafe { libc::dup(std::os::fd::AsRawFd::as_raw_fd(&held)) };
    assert!(inherited > 2);

    // A SysV segment of the host's, removed at the end.
    let shm_key = 0x5d05_0000 | (std::process::id() as i32 & 0xffff);
    // SAFETY: shmget with integer arguments.
    let shm_id = unsafe { libc::shmget(shm_key, 4096, libc::IPC_CREAT | libc::IPC_EXCL | 0o600) };
    assert!(shm_id >= 0, "shmget: {}", std::io::Error::last_os_error());

    let mut victim = Command::new("sleep").arg("30").spawn().expect("a victim");
    let bait = json!({
        "secret_path": secret, "workspace": ws, "cleanup": true,
        "host_tmp_path": secret, "devshm_path": devshm,
        "tcp_port": tcp_port, "udp_port": udp_port,
        "unix_path": unix_path, "abstract_name": abstract_name,
        "victim_pid": victim.id(), "inherited_fd": inherited, "inherited_fd_target": secret,
        "secret_env_names": ["SHAREDOS_ADVERSARY_TEST_TOKEN"], "shm_key": shm_key,
    });
    let (receipts, _) = run(&bait, &[], &ws, &[("SHAREDOS_ADVERSARY_TEST_TOKEN", "x")]);
    // SAFETY: closing our own dup.
    unsafe { libc::close(inherited) };
    std::fs::remove_file(&devshm).ok();
    // SAFETY: removing the segment made above.
    unsafe { libc::shmctl(shm_id, libc::IPC_RMID, std::ptr::null_mut()) };

    let listed = Command::new(BIN).arg("--list").output().unwrap();
    let defaults = String::from_utf8(listed.stdout)
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"selectableOnly\":false"))
        .count();
    assert_eq!(
        receipts.len(),
        defaults,
        "one receipt per attack of the default sequence"
    );
    let attempted = receipts.values().filter(|r| r["attempted"] == true).count();
    assert!(attempted >= 40, "only {attempted} attempted");

    assert_succeeded(
        &receipts,
        &[
            "C01", "C02", "C05", "C06", "C07", "C08", "C09", "C10", "C12", "C13", "C14", "C19",
            "C20", "C21", "C22", "C23", "C24", "C26", "C27", "C28", "C56", "C57",
        ],
    );
    // Confirmed from the host side, as the sandboxed tests will.
    assert!(
        tcp_hits.load(Ordering::SeqCst) >= 1,
        "the TCP listener saw no connection"
    );
    assert!(
        unix_hits.load(Ordering::SeqCst) >= 1,
        "the unix listener saw no connection"
    );
    assert!(
        abstract_hits.load(Ordering::SeqCst) >= 1,
        "the abstract listener saw no connection"
    );
    for _ in 0..100 {
        if udp_hits.load(Ordering::SeqCst) > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(udp_hits.load(Ordering::SeqCst) >= 1, "no datagram arrived");
    let status = victim.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "the victim was killed by the attack"
    );
    // cleanup: the attacks left nothing behind in the workspace.
    let left: Vec<_> = std::fs::read_dir(&ws)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n != ".git" && n != "bait.json")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(!Path::new(&format!("{}.pwned", secret.display())).exists());

    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        // Root of the machine: the privileged surface is open too.
        assert_succeeded(
            &receipts,
            &[
                "C03", "C04", "C46", "C47", "C48", "C52", "C58", "C58a", "C58b", "C58c", "C58d",
                "C58e", "C60",
            ],
        );
    }
}

#[test]
fn bounded_resource_and_stdio_attacks_work_unsandboxed() {
    let dir = tempfile::tempdir().unwrap();
    let bait = json!({
        "workspace": dir.path(), "fork_count": 40, "alloc_mib": 128, "fill_mib": 4,
        "inode_count": 500, "fd_count": 500, "flood_mib": 1,
    });
    let (receipts, stderr) = run(
        &bait,
        &["--only", "C30,C31,C32,C34,C35,C43"],
        dir.path(),
        &[],
    );
    assert_succeeded(&receipts, &["C30", "C31", "C32", "C34", "C35"]);
    assert_eq!(receipts["C43"]["attempted"], true);
    assert!(
        stderr.len() >= 1 << 20,
        "the stderr flood wrote {} bytes",
        stderr.len()
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n != "bait.json")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn a_malformed_frame_goes_out_after_its_receipt() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args(["--standalone", "--only", "C44b"])
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(child.wait().unwrap().success());
    let mut lines = out.lines();
    let receipt: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(receipt["attack"], "C44b-invalid-json-frame");
    let frame = lines.next().unwrap();
    assert!(
        serde_json::from_str::<Value>(frame).is_err(),
        "{frame:?} should not parse"
    );
}

#[test]
fn kill_minus_one_refuses_as_machine_root() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (receipts, _) = run(
        &json!({ "allow_kill_all": true }),
        &["--only", "C25"],
        dir.path(),
        &[],
    );
    assert_eq!(receipts["C25"]["attempted"], false, "{}", receipts["C25"]);
}

/// A copy of the adversary binary in `dir`, world-readable.
fn copy_of_self(dir: &Path, name: &str, mode: u32) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::copy(BIN, &path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

#[test]
fn setuid_and_file_capability_binaries_escalate_unsandboxed() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return; // only root can make a root-owned 4755 file and set file caps
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let probe = sharedos_adversary::sys::cstring(dir.path());
    // SAFETY: statvfs into a zeroed struct we own.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `probe` is NUL-terminated.
    if unsafe { libc::statvfs(probe.as_ptr(), &mut st) } == 0 && st.f_flag & libc::ST_NOSUID != 0 {
        return; // a nosuid /tmp ignores both by design
    }
    let adversary = copy_of_self(dir.path(), "adversary", 0o755);
    let suid = copy_of_self(dir.path(), "suid", 0o4755);
    let fcap = copy_of_self(dir.path(), "fcap", 0o755);
    // security.capability, VFS_CAP_REVISION_2 with the effective flag:
    // permitted = CAP_NET_RAW (13).
    let mut xattr = Vec::new();
    for word in [0x0200_0000u32 | 1, 1 << 13, 0, 0, 0] {
        xattr.extend_from_slice(&word.to_le_bytes());
    }
    let fcap_c = sharedos_adversary::sys::cstring(&fcap);
    // SAFETY: setxattr with NUL-terminated names and a live value buffer.
    let r = unsafe {
        libc::setxattr(
            fcap_c.as_ptr(),
            c"security.capability".as_ptr(),
            xattr.as_ptr().cast(),
            xattr.len(),
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "setxattr security.capability: {}",
        std::io::Error::last_os_error()
    );
    let bait = json!({
        "setuid_binary": suid, "setuid_args": ["--report-ids"],
        "filecap_binary": fcap, "filecap_args": ["--report-ids"],
    });
    std::fs::write(dir.path().join("bait.json"), bait.to_string()).unwrap();
    // A fork in a parallel test may briefly hold the fresh copies open for
    // writing (ETXTBSY): retry a few times.
    let out = (0..50)
        .find_map(|_| {
            let r = Command::new(&adversary)
                .args(["--standalone", "--bait", "bait.json", "--only", "C49,C50"])
                .current_dir(dir.path())
                .uid(65534)
                .gid(65534)
                .output();
            match r {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                    std::thread::sleep(Duration::from_millis(20));
                    None
                }
                r => Some(r.unwrap()),
            }
        })
        .expect("the copy stayed busy");
    let receipts: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        receipts.len(),
        2,
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for r in &receipts {
        assert_eq!(r["blocked"], false, "{r}");
    }
}
