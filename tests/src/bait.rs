//! Bait for the sandbox tests: host-side traps laid before a turn of the
//! adversary runtime, the turn itself through the real host path, and the
//! host-side checks afterwards.
//!
//! The turn goes through everything a configured runtime goes through:
//! `HostConfig` → `seat::process_runtime` → `ProcessRuntime` →
//! `SandboxLauncher` (the real `sharedos __sandbox-exec` helper) →
//! `Executor` with the real kernel built from the configuration's grants.
//! Only the launcher's `helper_exe` is set explicitly, because the test
//! binary is not the `sharedos` binary.
//!
//! Every verdict is taken on the host side: the listeners saw nothing, the
//! victim is alive, the files are byte-for-byte and timestamp-for-timestamp
//! what they were (a read is detected through `atime`, which `relatime`
//! updates when it is older than `mtime`), no process of the turn survived,
//! no workspace or cgroup is left. The receipts are only the plugin's view.
//!
//! Tests that use this module take [`serial`] first: turns are heavy and
//! the host-side checks (process scans, temp dirs) assume one turn at a time
//! per test binary.

use crate::leftovers::own_cgroups as leftover_cgroups;
use std::collections::BTreeMap;
use std::fs::File;
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_host::config::HostConfig;
use sharedos_host::executor::{ExecuteOptions, Executor, ExecutorOptions, OnTurnError, TurnError};
use sharedos_host::process::Launcher;
use sharedos_host::sandboxed::SandboxLauncher;
use sharedos_host::seat::{process_runtime, process_seat};
use sharedos_kernel::{Kernel, MemoryAuditSink};
use sharedos_protocol::ExecutionResult;
use sharedos_sandbox::SandboxPolicy;

// ------------------------------------------------------------------ setup

/// Env vars set on the test process before any host code runs. The host
/// must not hand them to the plugin (sandbox.md C28).
pub const SECRET_ENV: &[(&str, &str)] = &[
    ("SECRET_TOKEN", "sdos-bait-env-token-5f2c"),
    ("AWS_SECRET_ACCESS_KEY", "sdos-bait-env-aws-91d0"),
    ("GITHUB_TOKEN", "sdos-bait-env-gh-77ab"),
];

/// A credential the *configuration* tries to pass to the plugin; the
/// sandbox's env allowlist must drop it (and say so in its warnings).
pub const CONFIG_SECRET_ENV: (&str, &str) = ("OPENAI_API_KEY", "sdos-bait-config-key-3e8f");

/// The uid the sandbox runs the adversary as when the test is root: every
/// sandbox has a uid of its own, so [`run_turn`] pins the runtime's uid
/// range to this one uid (one sandbox at a time), and the victim runs as
/// the same uid.
pub const SANDBOX_UID: u32 = 0x6fff_0000;

/// The agent the adversary serves.
pub const AGENT: &str = "adversary";

static SERIAL: Mutex<()> = Mutex::new(());

/// One turn at a time per test binary; also prepares the process once.
pub fn serial() -> MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    prepare_process();
    guard
}

/// The private parent of every per-turn workspace (`TMPDIR`), so that "no
/// temp dir left" is exact even when other suites share `/tmp`.
pub fn workspaces_parent() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = PathBuf::from(format!("/tmp/sharedos-bait-ws-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).expect("create the workspaces parent");
        // The sandbox uid must traverse it to reach its workspace.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    })
}

/// Removes what this test process made for all its turns (the private
/// `TMPDIR`, the plugin copy): statics are never dropped, so this runs at
/// exit.
extern "C" fn remove_process_dirs() {
    let _ = std::fs::remove_dir_all(workspaces_parent());
    if let Some(copy) = PLUGIN_COPY.get() {
        let _ = std::fs::remove_dir_all(copy._dir.path());
    }
}

/// Removes the `sharedos-bait-*` entries of test processes that are gone
/// (a crashed or killed run cannot clean up after itself).
fn sweep_stale() {
    for parent in ["/tmp", "/var/tmp", "/dev/shm"] {
        let Ok(dir) = std::fs::read_dir(parent) else {
            continue;
        };
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix("sharedos-bait-") else {
                continue;
            };
            // `<stem>-<pid>[-<n>]`: the first all-digit field is the pid.
            let Some(pid) = rest.split('-').find_map(|f| f.parse::<u32>().ok()) else {
                continue;
            };
            if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                let p = e.path();
                let _ = std::fs::remove_dir_all(&p).or_else(|_| std::fs::remove_file(&p));
            }
        }
    }
}

fn prepare_process() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        sweep_stale();
        // SAFETY: registering a plain extern "C" function to run at exit.
        unsafe { libc::atexit(remove_process_dirs) };
        let tmp = workspaces_parent().to_path_buf();
        // SAFETY: done once, under the serial lock, before this binary's
        // first turn and before any thread of ours reads the environment.
        unsafe {
            for (k, v) in SECRET_ENV {
                std::env::set_var(k, v);
            }
            std::env::set_var("TMPDIR", &tmp);
        }
    });
}

/// The `sharedos` binary, which serves `__sandbox-exec`.
pub fn helper_exe() -> PathBuf {
    crate::binaries::workspace_bin("sharedos")
}

pub fn adversary_exe() -> PathBuf {
    crate::binaries::workspace_bin("sharedos-adversary")
}

fn unique(stem: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "sharedos-bait-{stem}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A directory removed on drop.
#[derive(Debug)]
pub struct Dir(pub PathBuf);

impl Dir {
    fn create(parent: &str, stem: &str, mode: u32) -> Dir {
        let p = Path::new(parent).join(unique(stem));
        std::fs::create_dir(&p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        Dir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The plugin binary for the turns: a copy of `sharedos-adversary` under a
/// name unique to this test process, so every process of a turn's tree
/// (forks keep argv[0]) can be found on the host by its command line
/// without ever touching another suite's processes.
pub struct PluginCopy {
    _dir: Dir,
    pub path: PathBuf,
    /// What every process of the plugin's tree has in its cmdline.
    pub marker: String,
}

static PLUGIN_COPY: OnceLock<PluginCopy> = OnceLock::new();

pub fn plugin_copy() -> &'static PluginCopy {
    PLUGIN_COPY.get_or_init(|| {
        let dir = Dir::create("/var/tmp", "plugin", 0o755);
        let marker = format!("sdos-adversary-bait-{}", std::process::id());
        let path = dir.path().join(&marker);
        std::fs::copy(adversary_exe(), &path).expect("copy the adversary");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        PluginCopy {
            _dir: dir,
            path,
            marker,
        }
    })
}

// ------------------------------------------------------------------- bait

/// A file whose content and timestamps are checked after the turn. Its
/// atime is set older than its mtime, so that any read (with `relatime`)
/// moves it.
#[derive(Debug)]
pub struct WatchedFile {
    pub path: PathBuf,
    pub content: Vec<u8>,
    atime: (i64, i64),
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl WatchedFile {
    pub fn create(path: PathBuf, content: &[u8], mode: u32) -> WatchedFile {
        std::fs::write(&path, content).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        set_old_atime(&path);
        let md = std::fs::metadata(&path).unwrap();
        WatchedFile {
            path,
            content: content.to_vec(),
            atime: (md.atime(), md.atime_nsec()),
            mtime: (md.mtime(), md.mtime_nsec()),
            ctime: (md.ctime(), md.ctime_nsec()),
        }
    }

    /// `None` when untouched; else what changed.
    pub fn tampering(&self) -> Option<String> {
        let md = match std::fs::metadata(&self.path) {
            Ok(m) => m,
            Err(e) => return Some(format!("{} is gone: {e}", self.path.display())),
        };
        let mut what = Vec::new();
        if (md.atime(), md.atime_nsec()) != self.atime {
            what.push("atime moved (it was read)");
        }
        if (md.mtime(), md.mtime_nsec()) != self.mtime {
            what.push("mtime moved (it was written)");
        }
        if (md.ctime(), md.ctime_nsec()) != self.ctime {
            what.push("ctime moved (linked, chmod'ed or written)");
        }
        if md.nlink() != 1 {
            what.push("link count changed");
        }
        // Read the content last: this read moves the atime.
        if std::fs::read(&self.path).ok().as_deref() != Some(&self.content[..]) {
            what.push("content changed");
        }
        (!what.is_empty()).then(|| format!("{}: {}", self.path.display(), what.join(", ")))
    }
}

fn set_old_atime(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let times = [
        libc::timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    ];
    // SAFETY: a NUL-terminated path and two live timespecs.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) };
    assert_eq!(r, 0, "utimensat {}", path.display());
}

/// A SysV shm segment of the host (sandbox.md C56).
pub struct ShmSegment {
    pub key: i32,
    pub id: i32,
    pattern: Vec<u8>,
}

impl ShmSegment {
    fn create() -> ShmSegment {
        let pattern: Vec<u8> = b"sdos-bait-shm-secret".to_vec();
        for i in 0..64 {
            let key = 0x5d0b_0000 | ((std::process::id() as i32 + i * 7919) & 0xffff);
            // SAFETY: shmget with integer arguments.
            let id = unsafe { libc::shmget(key, 4096, libc::IPC_CREAT | libc::IPC_EXCL | 0o666) };
            if id < 0 {
                continue;
            }
            // SAFETY: attach the segment we created, write our pattern, detach.
            unsafe {
                let p = libc::shmat(id, std::ptr::null(), 0);
                assert_ne!(p as isize, -1, "shmat");
                std::ptr::copy_nonoverlapping(pattern.as_ptr(), p as *mut u8, pattern.len());
                libc::shmdt(p);
            }
            return ShmSegment { key, id, pattern };
        }
        panic!("no free SysV shm key");
    }

    fn stat(&self) -> libc::shmid_ds {
        // SAFETY: zeroed plain-old-data, filled by IPC_STAT.
        let mut ds: libc::shmid_ds = unsafe { std::mem::zeroed() };
        // SAFETY: IPC_STAT into a live struct.
        let r = unsafe { libc::shmctl(self.id, libc::IPC_STAT, &mut ds) };
        assert_eq!(r, 0, "shmctl IPC_STAT");
        ds
    }

    /// `None` when nobody else attached it and the bytes are ours.
    pub fn tampering(&self, before: &libc::shmid_ds) -> Option<String> {
        let now = self.stat();
        let mut what = Vec::new();
        if now.shm_nattch != 0 {
            what.push(format!("{} attachments", now.shm_nattch));
        }
        if now.shm_lpid != before.shm_lpid {
            what.push(format!("last attach/detach by pid {}", now.shm_lpid));
        }
        if now.shm_atime != before.shm_atime {
            what.push("attach time moved".into());
        }
        // SAFETY: attach read-only to compare the bytes, then detach.
        let same = unsafe {
            let p = libc::shmat(self.id, std::ptr::null(), libc::SHM_RDONLY);
            assert_ne!(p as isize, -1, "shmat");
            let s = std::slice::from_raw_parts(p as *const u8, self.pattern.len()) == self.pattern;
            libc::shmdt(p);
            s
        };
        if !same {
            what.push("content changed".into());
        }
        (!what.is_empty()).then(|| format!("shm key {:#x}: {}", self.key, what.join(", ")))
    }
}

impl Drop for ShmSegment {
    fn drop(&mut self) {
        // SAFETY: removing the segment this test created.
        unsafe { libc::shmctl(self.id, libc::IPC_RMID, std::ptr::null_mut()) };
    }
}

/// Everything laid on the host before a turn.
pub struct HostBait {
    /// `/tmp/<unique>`: the secret, the host `/tmp` file, the unix socket.
    pub tmp_dir: Dir,
    /// `/var/tmp/<unique>`: the setuid and file-capability binaries, bound
    /// read-only into the sandbox (`extra_ro_paths`) so the plugin can run
    /// them.
    pub bin_dir: Dir,
    pub secret: WatchedFile,
    pub host_tmp: WatchedFile,
    pub devshm: WatchedFile,
    pub home_files: Vec<WatchedFile>,
    pub home: PathBuf,
    pub vendor_credential: PathBuf,
    pub host_write_paths: Vec<PathBuf>,
    pub setuid_binary: PathBuf,
    pub filecap_binary: PathBuf,
    pub tcp: TcpListener,
    pub udp: UdpSocket,
    pub unix: UnixListener,
    pub unix_path: PathBuf,
    pub abstract_listener: UnixListener,
    pub abstract_name: String,
    pub victim: Child,
    pub shm: ShmSegment,
    shm_before: libc::shmid_ds,
    /// An fd of the host without close-on-exec, on the secret file, at a
    /// number no runtime of the plugin would reuse by chance.
    pub inherited: std::os::fd::OwnedFd,
    pub hostname: String,
    /// The secret strings that must never show up in a result.
    pub secrets: Vec<String>,
    /// Stop the victim on drop (false once the test has reaped it).
    victim_reaped: bool,
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname into a live buffer of the given length.
    unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    String::from_utf8_lossy(&buf[..buf.iter().position(|&b| b == 0).unwrap_or(0)]).into_owned()
}

/// A `security.capability` xattr (VFS_CAP_REVISION_2, effective) granting
/// CAP_NET_RAW: what `setcap cap_net_raw+ep` writes.
fn set_file_caps(path: &Path) -> bool {
    const VFS_CAP_REVISION_2: u32 = 0x0200_0000;
    const VFS_CAP_FLAGS_EFFECTIVE: u32 = 0x1;
    const CAP_NET_RAW: u32 = 13;
    let words = [
        VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE,
        1 << CAP_NET_RAW,
        0,
        0,
        0,
    ];
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path, a NUL-terminated name and a live buffer.
    unsafe {
        libc::setxattr(
            c.as_ptr(),
            c"security.capability".as_ptr(),
            bytes.as_ptr().cast(),
            bytes.len(),
            0,
        ) == 0
    }
}

impl HostBait {
    pub fn lay() -> HostBait {
        let tmp_dir = Dir::create("/tmp", "host", 0o755);
        let bin_dir = Dir::create("/var/tmp", "bin", 0o755);
        let t = tmp_dir.path();
        let secret_text = format!("sdos-bait-secret-{}", unique("s"));
        let secret = WatchedFile::create(t.join("secret"), secret_text.as_bytes(), 0o644);
        let host_tmp = WatchedFile::create(t.join("host-file"), b"sdos-bait-host-tmp-file", 0o666);
        let devshm = WatchedFile::create(
            Path::new("/dev/shm").join(unique("shm")),
            b"sdos-bait-devshm-secret",
            0o644,
        );
        // A fake home with the credentials an agent CLI keeps.
        let home = t.join("home");
        let mut home_files = Vec::new();
        for (rel, text) in [
            (".ssh/id_ed25519", "sdos-bait-ssh-key"),
            (".aws/credentials", "sdos-bait-aws-credentials"),
            (".codex/auth.json", "{\"token\":\"sdos-bait-codex-token\"}"),
        ] {
            let p = home.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            home_files.push(WatchedFile::create(p, text.as_bytes(), 0o644));
        }
        for d in [".ssh", ".aws", ".codex", ""] {
            std::fs::set_permissions(home.join(d), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let vendor_credential = home.join(".codex/auth.json");
        let host_write_paths = vec![
            PathBuf::from("/var/tmp").join(unique("pwned")),
            PathBuf::from("/etc").join(unique("pwned")),
            t.join("pwned"),
        ];
        // Escalation binaries: copies of the adversary, which answers
        // `--report-ids`.
        let setuid_binary = bin_dir.path().join("suid-report-ids");
        std::fs::copy(adversary_exe(), &setuid_binary).unwrap();
        std::fs::set_permissions(&setuid_binary, std::fs::Permissions::from_mode(0o4755)).unwrap();
        let filecap_binary = bin_dir.path().join("fcap-report-ids");
        std::fs::copy(adversary_exe(), &filecap_binary).unwrap();
        std::fs::set_permissions(&filecap_binary, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(
            set_file_caps(&filecap_binary),
            "setxattr security.capability: {}",
            std::io::Error::last_os_error()
        );

        let tcp = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        tcp.set_nonblocking(true).unwrap();
        let udp = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        udp.set_nonblocking(true).unwrap();
        let unix_path = t.join("host.sock");
        let unix = UnixListener::bind(&unix_path).unwrap();
        unix.set_nonblocking(true).unwrap();
        std::fs::set_permissions(&unix_path, std::fs::Permissions::from_mode(0o777)).unwrap();
        let abstract_name = unique("abstract");
        let abstract_listener = {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes())
                .unwrap();
            UnixListener::bind_addr(&addr).unwrap()
        };
        abstract_listener.set_nonblocking(true).unwrap();

        // The victim runs as the sandbox's uid when the test is root, so
        // only the sandbox's layers (pid namespace, Landlock's signal
        // scope, seccomp), not plain uid permission checks, protect it.
        let mut victim = Command::new("sleep");
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            use std::os::unix::process::CommandExt;
            victim.uid(SANDBOX_UID).gid(SANDBOX_UID);
        }
        let victim = victim
            .arg("600")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the victim");
        let shm = ShmSegment::create();
        let shm_before = shm.stat();
        let file = File::open(&secret.path).unwrap();
        // SAFETY: F_DUPFD makes a new fd (>= 300) without FD_CLOEXEC, owned
        // here: every child the host spawns now could inherit it.
        let inherited = unsafe {
            let fd = libc::fcntl(file.as_raw_fd(), libc::F_DUPFD, 300);
            assert!(fd >= 300, "F_DUPFD");
            std::os::fd::FromRawFd::from_raw_fd(fd)
        };
        drop(file);
        let mut secrets = vec![secret_text];
        secrets.extend(SECRET_ENV.iter().map(|(_, v)| v.to_string()));
        secrets.push(CONFIG_SECRET_ENV.1.to_string());
        for f in [&host_tmp, &devshm].into_iter().chain(home_files.iter()) {
            secrets.push(String::from_utf8_lossy(&f.content).into_owned());
        }
        HostBait {
            tmp_dir,
            bin_dir,
            secret,
            host_tmp,
            devshm,
            home_files,
            home,
            vendor_credential,
            host_write_paths,
            setuid_binary,
            filecap_binary,
            tcp,
            udp,
            unix,
            unix_path,
            abstract_listener,
            abstract_name,
            victim,
            shm,
            shm_before,
            inherited,
            hostname: hostname(),
            secrets,
            victim_reaped: false,
        }
    }

    /// The bait JSON of the adversary (`message.payload.bait`).
    pub fn json(&self) -> Value {
        let fd = self.inherited.as_raw_fd();
        json!({
            "secret_path": self.secret.path,
            "real_home": self.home,
            "vendor_credential_path": self.vendor_credential,
            "host_write_paths": self.host_write_paths,
            "host_tmp_path": self.host_tmp.path,
            "devshm_path": self.devshm.path,
            "setuid_binary": self.setuid_binary,
            "setuid_args": ["--report-ids"],
            "filecap_binary": self.filecap_binary,
            "filecap_args": ["--report-ids"],
            "tcp_port": self.tcp.local_addr().unwrap().port(),
            "udp_port": self.udp.local_addr().unwrap().port(),
            "unix_path": self.unix_path,
            "abstract_name": self.abstract_name,
            "victim_pid": self.victim.id(),
            "host_pid": std::process::id(),
            "inherited_fd": fd,
            "inherited_fd_target": self.secret.path,
            "secret_env_names": SECRET_ENV.iter().map(|(k, _)| *k).chain([CONFIG_SECRET_ENV.0]).collect::<Vec<_>>(),
            "shm_key": self.shm.key,
            "hostname": self.hostname,
            "allow_kill_all": false,
            "cleanup": false,
        })
    }

    /// The read-only paths the policy must bind for C49/C50.
    pub fn extra_ro_paths(&self) -> Vec<String> {
        vec![self.bin_dir.path().display().to_string()]
    }

    /// The pids of processes that must stay alive.
    pub fn victim_pid(&self) -> u32 {
        self.victim.id()
    }

    /// Looks at everything on the host side.
    pub fn inspect(&mut self) -> HostSide {
        let mut tcp_accepts = 0;
        while self.tcp.accept().is_ok() {
            tcp_accepts += 1;
        }
        let mut udp_datagrams = 0;
        let mut buf = [0u8; 2048];
        while self.udp.recv_from(&mut buf).is_ok() {
            udp_datagrams += 1;
        }
        let mut unix_accepts = 0;
        while self.unix.accept().is_ok() {
            unix_accepts += 1;
        }
        let mut abstract_accepts = 0;
        while self.abstract_listener.accept().is_ok() {
            abstract_accepts += 1;
        }
        let victim_alive = matches!(self.victim.try_wait(), Ok(None));
        let victim_state = std::fs::read_to_string(format!("/proc/{}/stat", self.victim.id()))
            .ok()
            .and_then(|s| s.rsplit(')').next().map(|r| r.trim().chars().next()))
            .flatten();
        let victim_tracer = std::fs::read_to_string(format!("/proc/{}/status", self.victim.id()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("TracerPid:"))
                    .map(|v| v.trim().to_string())
            });
        let mut pwned: Vec<PathBuf> = self
            .host_write_paths
            .iter()
            .filter(|p| p.exists())
            .cloned()
            .collect();
        let dot_pwned = PathBuf::from(format!("{}.pwned", self.host_tmp.path.display()));
        if dot_pwned.exists() {
            pwned.push(dot_pwned);
        }
        // Nothing new may appear next to the bait either.
        let expected = ["secret", "host-file", "home", "host.sock", "pwned"];
        if let Ok(d) = std::fs::read_dir(self.tmp_dir.path()) {
            for e in d.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if !expected.contains(&n.as_str()) && !n.ends_with(".pwned") {
                    pwned.push(e.path());
                }
            }
        }
        let mut files = BTreeMap::new();
        files.insert("secret", self.secret.tampering());
        files.insert("host_tmp", self.host_tmp.tampering());
        files.insert("devshm", self.devshm.tampering());
        for (i, f) in self.home_files.iter().enumerate() {
            let name = ["ssh_key", "aws_credentials", "codex_auth"][i];
            files.insert(name, f.tampering());
        }
        HostSide {
            tcp_accepts,
            udp_datagrams,
            unix_accepts,
            abstract_accepts,
            victim_alive,
            victim_state,
            victim_tracer,
            pwned,
            files,
            shm: self.shm.tampering(&self.shm_before),
            hostname: hostname(),
        }
    }

    /// Stops and reaps the victim (by its pid, through its `Child`).
    pub fn reap_victim(&mut self) {
        if !self.victim_reaped {
            let _ = self.victim.kill();
            let _ = self.victim.wait();
            self.victim_reaped = true;
        }
    }
}

impl Drop for HostBait {
    fn drop(&mut self) {
        self.reap_victim();
        let _ = std::fs::remove_file(&self.devshm.path);
        for p in &self.host_write_paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// What the host saw after the turn.
#[derive(Debug)]
pub struct HostSide {
    pub tcp_accepts: usize,
    pub udp_datagrams: usize,
    pub unix_accepts: usize,
    pub abstract_accepts: usize,
    pub victim_alive: bool,
    /// `S` sleeping, `T`/`t` stopped or traced, ...
    pub victim_state: Option<char>,
    pub victim_tracer: Option<String>,
    /// Files that appeared where the plugin must not write.
    pub pwned: Vec<PathBuf>,
    /// Per watched file: `None` untouched, else what changed.
    pub files: BTreeMap<&'static str, Option<String>>,
    pub shm: Option<String>,
    pub hostname: String,
}

/// The adversary's catalogue (`--list`): `(id, selectable_only)`, in the
/// order of its default sequence.
pub fn catalogue() -> Vec<(String, bool)> {
    let out = Command::new(adversary_exe())
        .arg("--list")
        .output()
        .expect("sharedos-adversary --list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| {
            (
                v["id"].as_str().unwrap_or_default().to_string(),
                v["selectableOnly"] == true,
            )
        })
        .collect()
}

/// The ids of the default sequence.
pub fn default_ids() -> Vec<String> {
    catalogue()
        .into_iter()
        .filter(|(_, sel)| !sel)
        .map(|(id, _)| id)
        .collect()
}

// ------------------------------------------------------------------- turn

/// How to run one turn of the adversary.
pub struct TurnSpec {
    pub policy: SandboxPolicy,
    /// `payload.bait`.
    pub bait: Value,
    /// `payload.only`; `None` runs the default sequence.
    pub only: Option<Vec<String>>,
    pub timeout_ms: u64,
    pub drain_grace_ms: u64,
}

impl TurnSpec {
    pub fn new(policy: SandboxPolicy, bait: Value) -> TurnSpec {
        TurnSpec {
            policy,
            bait,
            only: None,
            timeout_ms: 60_000,
            drain_grace_ms: 0,
        }
    }
    pub fn only(mut self, ids: &[&str]) -> TurnSpec {
        self.only = Some(ids.iter().map(|s| s.to_string()).collect());
        self
    }
    pub fn timeout_ms(mut self, ms: u64) -> TurnSpec {
        self.timeout_ms = ms;
        self
    }
    /// `turn/draining` this long before the deadline.
    pub fn drain_grace_ms(mut self, ms: u64) -> TurnSpec {
        self.drain_grace_ms = ms;
        self
    }
}

/// What a turn left behind, host side.
#[derive(Debug)]
pub struct TurnRun {
    pub result: ExecutionResult,
    /// Every `on_turn_error` call, in order.
    pub turn_errors: Vec<TurnError>,
    pub elapsed: Duration,
    /// Processes of the turn still alive after it (pid and description).
    pub survivors: Vec<String>,
    /// Per-turn workspaces left in the private `TMPDIR`.
    pub leftover_workspaces: Vec<PathBuf>,
    /// Throwaway cgroups of this process left behind.
    pub leftover_cgroups: Vec<PathBuf>,
    /// Whether the launcher was ever asked to start a plugin, and how many
    /// plugin processes (the marker in the cmdline) were seen while it ran.
    pub launches: u32,
}

impl TurnRun {
    /// The result as JSON.
    pub fn json(&self) -> Value {
        serde_json::to_value(&self.result).expect("result json")
    }
    /// `metadata.runtime.sandbox`.
    pub fn sandbox_report(&self) -> Value {
        self.json()["metadata"]["runtime"]["sandbox"].clone()
    }
    pub fn level(&self) -> String {
        self.sandbox_report()["level"]
            .as_str()
            .unwrap_or("<no level>")
            .to_string()
    }
    pub fn status(&self) -> String {
        self.json()["status"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
    pub fn code(&self) -> Option<String> {
        self.result.code().map(str::to_owned)
    }
    /// The `sandbox.attack` receipts, by attack id (`C07`, `C44a`).
    pub fn receipts(&self) -> BTreeMap<String, Value> {
        self.result
            .events
            .iter()
            .filter(|e| e.kind.as_str() == "runtime.event")
            .filter_map(|e| {
                let v = serde_json::to_value(e).ok()?;
                let data = &v["data"];
                (data["type"] == "sandbox.attack").then(|| data["data"].clone())
            })
            .filter_map(|r| {
                let label = r["attack"].as_str()?.to_string();
                let id = label.split('-').next()?.to_string();
                Some((id, r))
            })
            .collect()
    }
    /// The turn errors, as text.
    pub fn error_text(&self) -> String {
        self.turn_errors
            .iter()
            .map(|e| format!("{e:?}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// A launcher that counts launches and otherwise is the sandbox launcher.
struct CountingLauncher {
    inner: SandboxLauncher,
    launches: Arc<AtomicU32>,
}

impl Launcher for CountingLauncher {
    fn launch(
        &self,
        spec: &sharedos_host::process::LaunchSpec,
    ) -> Result<sharedos_host::process::LaunchedChild, sharedos_host::process::LaunchError> {
        self.launches.fetch_add(1, Ordering::SeqCst);
        self.inner.launch(spec)
    }
}

/// The host configuration of the turns: the adversary seated for one
/// agent, admission granted, no tools.
pub fn host_config(base: &Path) -> HostConfig {
    HostConfig::parse(&host_config_text(), "sandbox-tests.toml", base)
        .expect("the test configuration")
}

/// The TOML of [`host_config`] (the default sandbox policy).
pub fn host_config_text() -> String {
    host_config_text_with("")
}

/// [`host_config_text`] with extra keys for the runtime entry, e.g.
/// `sandbox = { emulateNoUserns = true, minLevel = "reduced" }`.
pub fn host_config_text_with(runtime_keys: &str) -> String {
    format!(
        r#"
[host]
defaultTimeoutMs = 60000
auditPath = "audit.jsonl"
filesRoot = "files"

[[runtimes]]
id = "sharedos-adversary"
version = "{version}"
program = "{program}"
env = {{ RUST_BACKTRACE = "0" }}
{runtime_keys}

[[agents]]
agentId = "{AGENT}"
runtime = "sharedos-adversary"

[[kernel.grants]]
id = "adversary-admission"
subject = {{ kind = "agent", agentId = "{AGENT}" }}
issuer = {{ kind = "service", serviceId = "sandbox-tests" }}
namespaceId = "sandbox-tests"
[[kernel.grants.capabilities]]
namespace = "sharedos.execution"
path = ["agent", "{AGENT}"]
scope = "exact"
actions = ["invoke"]
"#,
        version = env!("CARGO_PKG_VERSION"),
        program = plugin_copy().path.display(),
    )
}

/// The `ExecutionRequest` of a turn (`n` makes its ids unique).
pub fn request(spec: &TurnSpec, n: u32) -> Value {
    let agent = json!({"kind": "agent", "agentId": AGENT});
    let mut payload = json!({ "bait": spec.bait });
    if let Some(only) = &spec.only {
        payload["only"] = json!(only);
    }
    let trace = format!("trace-bait-{}-{n}", std::process::id());
    json!({
        "version": "1",
        "executionId": format!("exec-bait-{}-{n}", std::process::id()),
        "agent": agent,
        "context": {
            "namespaceId": "sandbox-tests",
            "actor": agent,
            "authority": {"kind": "service", "serviceId": "sandbox-tests"},
            "owner": {"kind": "human", "userId": "operator"},
            "purpose": "Prove the sandbox",
            "traceId": trace,
            "enabledToolNamespaces": [],
            "now": "2026-11-30T12:00:00Z"
        },
        "message": {
            "version": "1",
            "id": format!("msg-bait-{n}"),
            "sender": {"kind": "human", "userId": "operator"},
            "receiver": agent,
            "purpose": "Prove the sandbox",
            "payload": payload,
            "traceId": trace,
            "createdAt": "2026-11-30T12:00:00Z"
        },
        "tools": [],
        "options": {"timeoutMs": spec.timeout_ms}
    })
}

/// Runs one turn of the adversary through the real host path and looks
/// for what it left behind.
pub fn run_turn(spec: TurnSpec) -> TurnRun {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let base = tempfile::tempdir().expect("config dir");
    let mut config = host_config(base.path());
    config.host.drain_grace_ms = spec.drain_grace_ms;
    let mut spec = spec;
    if spec.policy.warm == 0 && spec.policy.uids == sharedos_sandbox::UidPolicy::default() {
        spec.policy.uids = sharedos_sandbox::UidPolicy {
            first: SANDBOX_UID,
            count: 1,
            required: false,
        };
    }
    config.runtimes[0].sandbox = spec.policy.clone();
    // A configured credential is refused at load (`runtimes[0].env.*`);
    // one a host passes anyway, past the load check, must still be dropped
    // by the sandbox's allowlist (C28).
    config.runtimes[0].env.insert(
        CONFIG_SECRET_ENV.0.to_owned(),
        CONFIG_SECRET_ENV.1.to_owned(),
    );
    let entry = config.runtimes[0].clone();
    let launches = Arc::new(AtomicU32::new(0));
    let launcher = Arc::new(CountingLauncher {
        inner: SandboxLauncher::new(helper_exe(), spec.policy.clone()),
        launches: launches.clone(),
    });
    let runtime = process_runtime(&config, &entry, launcher).expect("seat the adversary");
    let seat = process_seat(runtime);
    let files_root = base.path().join("files");
    std::fs::create_dir_all(&files_root).unwrap();
    let kernel = Kernel::from_config(
        &config.kernel,
        &files_root,
        Arc::new(MemoryAuditSink::new()),
    )
    .expect("kernel");
    let errors: Arc<Mutex<Vec<TurnError>>> = Arc::default();
    let sink = errors.clone();
    let on_turn_error: OnTurnError = Arc::new(move |e: &TurnError, _| {
        sink.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(e.clone());
    });
    let options = ExecutorOptions {
        default_timeout_ms: spec.timeout_ms,
        drain_grace_ms: spec.drain_grace_ms,
        on_turn_error: Some(on_turn_error),
        ..ExecutorOptions::default()
    };
    let executor = Executor::new(Arc::new(kernel), seat, options).expect("executor");
    let req = request(&spec, n).to_string();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let result = rt
        .block_on(executor.execute_json(&req, ExecuteOptions::default()))
        .expect("a valid request");
    let elapsed = started.elapsed();
    drop(executor);
    rt.shutdown_timeout(Duration::from_secs(5));
    // The tree is reaped before `execute` returns; give the kernel a moment
    // to tear the namespaces down before calling anything a survivor.
    let survivors = settle(Duration::from_secs(3), survivors);
    let leftover_workspaces = settle(Duration::from_secs(3), leftover_workspaces);
    let leftover_cgroups = settle(Duration::from_secs(3), leftover_cgroups);
    let turn_errors = errors.lock().unwrap_or_else(|p| p.into_inner()).clone();
    TurnRun {
        result,
        turn_errors,
        elapsed,
        survivors,
        leftover_workspaces,
        leftover_cgroups,
        launches: launches.load(Ordering::SeqCst),
    }
}

/// Polls `probe` until it finds nothing or `limit` passes.
fn settle<T>(limit: Duration, probe: fn() -> Vec<T>) -> Vec<T> {
    let end = Instant::now() + limit;
    loop {
        let found = probe();
        if found.is_empty() || Instant::now() >= end {
            return found;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ------------------------------------------------------------- leftovers

fn proc_field(pid: u32, name: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/{name}")).ok()
}

fn ppid_of(pid: u32) -> Option<u32> {
    let stat = proc_field(pid, "stat")?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Pids the test itself keeps (victims): registered so that the scan does
/// not count them.
static KEEP: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Marks a pid the test spawned on purpose (a victim), not a survivor.
pub fn keep_pid(pid: u32) {
    KEEP.lock().unwrap_or_else(|p| p.into_inner()).push(pid);
}

/// Processes of a turn still alive: any descendant of this test process
/// other than its victims (the helper, the reaper, the plugin), and any
/// process whose cmdline carries this process's plugin marker wherever it
/// was reparented (a double-forked daemon, `sdos-adv-c38`/`c39`/`c40`/
/// `c41b`). Found by scanning `/proc`; never killed here.
pub fn survivors() -> Vec<String> {
    let me = std::process::id();
    let keep = KEEP.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let marker = &plugin_copy().marker;
    let mut found = Vec::new();
    for pid in all_pids() {
        if pid == me || keep.contains(&pid) {
            continue;
        }
        let cmdline = proc_field(pid, "cmdline")
            .unwrap_or_default()
            .replace('\0', " ");
        let comm = proc_field(pid, "comm")
            .unwrap_or_default()
            .trim()
            .to_string();
        let mut descends = false;
        let mut p = pid;
        for _ in 0..64 {
            match ppid_of(p) {
                Some(pp) if pp == me => {
                    descends = true;
                    break;
                }
                Some(pp) if pp > 1 => p = pp,
                _ => break,
            }
        }
        // A victim's own children are the victim's business.
        if descends && keep.iter().any(|k| ppid_of(pid) == Some(*k)) {
            continue;
        }
        if descends || cmdline.contains(marker.as_str()) {
            found.push(format!("pid {pid} comm {comm:?} cmdline {cmdline:?}"));
        }
    }
    found
}

/// Workspaces (`sharedos-ws-*`) left in this process's private `TMPDIR`.
pub fn leftover_workspaces() -> Vec<PathBuf> {
    std::fs::read_dir(workspaces_parent())
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("sharedos-ws-"))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

// ----------------------------------------------------------------- memory

/// `VmHWM` and `VmRSS` of this process, in KiB.
pub fn memory_kib() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |k: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

// -------------------------------------------------------------- assertions

/// Asserts a receipt exists and was attempted; returns it.
pub fn attempted<'a>(receipts: &'a BTreeMap<String, Value>, id: &str, layer: &str) -> &'a Value {
    let r = receipts.get(id).unwrap_or_else(|| {
        panic!(
            "{id}: no receipt (the layer under test is {layer}); receipts: {:?}",
            receipts.keys().collect::<Vec<_>>()
        )
    });
    assert_eq!(
        r["attempted"], true,
        "{id}: not attempted ({layer} untested): {}",
        r["observed"]
    );
    r
}

/// Asserts the plugin itself saw the attack refused (`blocked: true`).
pub fn blocked(receipts: &BTreeMap<String, Value>, id: &str, layer: &str) {
    let r = attempted(receipts, id, layer);
    assert_eq!(
        r["blocked"], true,
        "{id} must be stopped by {layer}, the plugin saw: {}",
        r["observed"]
    );
}

/// Asserts the plugin's receipt is `blocked: true` or unjudged (`null`):
/// for attacks only the host can judge.
pub fn not_succeeded(receipts: &BTreeMap<String, Value>, id: &str, layer: &str) {
    let r = attempted(receipts, id, layer);
    assert_ne!(
        r["blocked"], false,
        "{id} must be stopped by {layer}, the plugin saw: {}",
        r["observed"]
    );
}

/// Whether any of `secrets` appears anywhere in `text`.
pub fn leaked_secrets<'a>(text: &str, secrets: &'a [String]) -> Vec<&'a str> {
    secrets
        .iter()
        .filter(|s| text.contains(s.as_str()))
        .map(String::as_str)
        .collect()
}

impl HostSide {
    /// Asserts every host-side trap is untouched, naming the attack and the
    /// layer of sandbox.md C that must hold in `mode`.
    pub fn assert_untouched(&self, mode: &str) {
        for (name, what) in &self.files {
            let attack = match *name {
                "secret" => "C01/C06/C07 read, symlink or link the host secret (mountns; Landlock)",
                "ssh_key" | "aws_credentials" => "C02 read-home-credentials (mountns; Landlock)",
                "codex_auth" => "C29 vendor-cli-credentials (mountns; Landlock)",
                "host_tmp" => "C05 write-host-tmp (private tmp; Landlock)",
                "devshm" => "C57 host-dev-shm-file (private /dev/shm; Landlock)",
                _ => "a watched file",
            };
            assert_eq!(what, &None, "[{mode}] {attack}: {name} was touched");
        }
        assert!(
            self.pwned.is_empty(),
            "[{mode}] C04/C05 write outside the workspace (ro binds; Landlock): {:?}",
            self.pwned
        );
        assert_eq!(
            self.tcp_accepts, 0,
            "[{mode}] C09 tcp-connect-host-loopback (netns; seccomp; Landlock ConnectTcp)"
        );
        assert_eq!(
            self.udp_datagrams, 0,
            "[{mode}] C11 udp-to-host-port (netns; seccomp)"
        );
        assert_eq!(
            self.unix_accepts, 0,
            "[{mode}] C13 unix-connect-host-pathname (mountns; strict seccomp)"
        );
        assert_eq!(
            self.abstract_accepts, 0,
            "[{mode}] C14 unix-connect-host-abstract (netns; Landlock scope; strict seccomp)"
        );
        assert!(
            self.victim_alive,
            "[{mode}] C24/C26 the victim died (pidns; Landlock Scope::Signal; uid)"
        );
        assert_eq!(
            self.victim_tracer.as_deref(),
            Some("0"),
            "[{mode}] C20 ptrace-attach: the victim is traced (pidns; seccomp)"
        );
        assert_eq!(
            self.shm, None,
            "[{mode}] C56 host-sysv-shm (ipcns; strict seccomp)"
        );
    }
}

/// Processes whose cmdline carries this test process's plugin marker
/// (every process of its adversary turns): `(pid, comm)`.
pub fn marked_processes() -> Vec<(u32, String)> {
    let marker = &plugin_copy().marker;
    all_pids()
        .into_iter()
        .filter_map(|pid| {
            let cmdline = proc_field(pid, "cmdline")?;
            cmdline.contains(marker.as_str()).then(|| {
                // The process's comm, or a thread's `sdos-adv-*` name.
                let mut comm = proc_field(pid, "comm")
                    .unwrap_or_default()
                    .trim()
                    .to_string();
                if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
                    for t in tasks.flatten() {
                        let c = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
                        if c.trim().starts_with("sdos-adv-") {
                            comm = c.trim().to_string();
                        }
                    }
                }
                (pid, comm)
            })
        })
        .collect()
}

/// Whether reads of `path` move its atime (a `relatime`/`strictatime`
/// mount, not `noatime`): the read detector of [`WatchedFile`] depends on
/// it.
pub fn atime_is_tracked(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let best = mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 4 && path.starts_with(f[1])).then(|| (f[1].len(), f[3].to_string()))
        })
        .max_by_key(|(len, _)| *len);
    best.is_some_and(|(_, opts)| !opts.split(',').any(|o| o == "noatime"))
}
