//! The traps laid on the host before a turn: watched files, a shared
//! memory segment, listeners, a victim process, an inherited fd.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

use super::{CONFIG_SECRET_ENV, Dir, SANDBOX_UID, SECRET_ENV, adversary_exe, unique};

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
        if crate::is_root() {
            assert!(
                set_file_caps(&filecap_binary),
                "setxattr security.capability: {}",
                std::io::Error::last_os_error()
            );
        } else {
            // Without root the binary carries no file capability, so its
            // exec escalates nothing whatever the sandbox does.
            crate::record_skip(
                "bait: the file-capability binary's escalation",
                "setting security.capability needs root",
            );
        }

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
