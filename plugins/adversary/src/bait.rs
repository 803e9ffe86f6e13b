//! The bait a test lays on the host before the run.
//!
//! Every field is optional. An attack whose bait is missing runs its
//! generic form where one exists, and otherwise reports `attempted: false`.
//! Unknown fields are ignored, so a test may carry its own notes along.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Bait {
    // -- files of the host --------------------------------------------------
    /// A secret file outside the workspace (C01, C06, C07).
    pub secret_path: Option<PathBuf>,
    /// The real home of the host user (C02, C29); default `/root` and `/home/*`.
    pub real_home: Option<PathBuf>,
    /// A vendor CLI credential file on the host (C29); default
    /// `<real_home>/.codex/auth.json`.
    pub vendor_credential_path: Option<PathBuf>,
    /// Paths outside the workspace to create (C04); default
    /// `/var/tmp/sharedos-adversary-pwned-<pid>` and `/etc/sharedos-adversary-pwned-<pid>`.
    pub host_write_paths: Vec<PathBuf>,
    /// A file in the host's `/tmp` (C05): read it, then create `<path>.pwned`.
    pub host_tmp_path: Option<PathBuf>,
    /// A file in the host's `/dev/shm` (C57).
    pub devshm_path: Option<PathBuf>,
    /// The plugin's workspace (C06, C07, C08, C32, C34); default the cwd.
    pub workspace: Option<PathBuf>,
    /// A root-owned 4755 binary (C49), run with `setuid_args`. A copy of
    /// this binary answers `--report-ids` with its uid/euid/caps.
    pub setuid_binary: Option<PathBuf>,
    pub setuid_args: Vec<String>,
    /// A binary with file capabilities (C50), run with `filecap_args`.
    pub filecap_binary: Option<PathBuf>,
    pub filecap_args: Vec<String>,

    // -- network -------------------------------------------------------------
    /// A TCP listener on 127.0.0.1 (C09, C19).
    pub tcp_port: Option<u16>,
    /// A UDP socket bound on 127.0.0.1 (C11).
    pub udp_port: Option<u16>,
    /// A pathname unix socket (C13).
    pub unix_path: Option<PathBuf>,
    /// An abstract unix socket name, without the leading NUL (C14).
    pub abstract_name: Option<String>,

    // -- processes, ipc, env ---------------------------------------------------
    /// A process the test started and expects to stay alive (C20–C26).
    pub victim_pid: Option<i32>,
    /// The host's (or the test's) own pid, for read-only probes (C21, C22).
    pub host_pid: Option<i32>,
    /// An fd number the host had open when it spawned the plugin (C27).
    pub inherited_fd: Option<i32>,
    /// What that fd pointed to in the host (`/proc/self/fd/N`'s link: a
    /// path, `socket:[ino]`, `pipe:[ino]`); makes the C27 verdict exact.
    pub inherited_fd_target: Option<String>,
    /// Env var names set in the host that must not be visible (C28).
    pub secret_env_names: Vec<String>,
    /// A SysV shm key created by the host (C56).
    pub shm_key: Option<i32>,
    /// The host's hostname (C55): tells a private UTS namespace apart.
    pub hostname: Option<String>,

    // -- behaviour -------------------------------------------------------------
    /// Remove what the attacks created (files, links) once observed. Off by
    /// default so that the host can find the evidence.
    pub cleanup: bool,
    /// Keep what each attack obtained (sockets, a listener, io_uring and
    /// bpf fds, a mount, the C61 crash directory) and, standalone, print
    /// `{"holding":true}` after the last receipt and sleep `hang_secs`, so
    /// the host can look from `/proc` while the attack is held.
    pub hold: bool,
    /// Allow C25 `kill(-1, SIGKILL)`. It also refuses to run as root of the
    /// initial user namespace, whatever this says.
    pub allow_kill_all: bool,
    /// Children for the fork bomb (C30), at most 300.
    pub fork_count: Option<u32>,
    /// MiB to allocate and touch (C31), at most 6144.
    pub alloc_mib: Option<u64>,
    /// The kinds C31c takes, by the names of its receipt (`pipes`,
    /// `unix-sockets`, ...); every kind when empty.
    pub memory_kinds: Vec<String>,
    /// MiB to write per fill target (C32, C33), at most 200.
    pub fill_mib: Option<u64>,
    /// Empty files to create (C34), at most 1 000 000.
    pub inode_count: Option<u64>,
    /// Levels of the directory chain (C34b), at most 100 000.
    pub chain_depth: Option<u64>,
    /// Host facts that must not be visible inside (C53b): host paths (of
    /// the plugin, the workspace, the `sharedos` binary, TMPDIR, the
    /// repository), the host's boot id and kernel command line.
    pub host_facts: Vec<String>,
    /// fds to open (C35), at most 1 048 576.
    pub fd_count: Option<u64>,
    /// Seconds a hanging attack lasts if nobody kills it (C36–C41, C45), at most 3600.
    pub hang_secs: Option<u64>,
    /// MiB of the newline-free stdout line (C42), at most 2048.
    pub line_mib: Option<u64>,
    /// MiB written to stderr (C43), at most 1024.
    pub flood_mib: Option<u64>,
}

impl Bait {
    pub fn workspace(&self) -> PathBuf {
        crate::sys::workspace(self.workspace.as_deref())
    }
    pub fn fork_count(&self) -> u32 {
        self.fork_count.unwrap_or(300).min(300)
    }
    pub fn alloc_mib(&self) -> u64 {
        self.alloc_mib.unwrap_or(6144).min(6144)
    }
    pub fn fill_mib(&self) -> u64 {
        self.fill_mib.unwrap_or(200).min(200)
    }
    pub fn inode_count(&self) -> u64 {
        self.inode_count.unwrap_or(100_000).min(1_000_000)
    }
    pub fn chain_depth(&self) -> u64 {
        self.chain_depth.unwrap_or(20_000).min(100_000)
    }
    pub fn fd_count(&self) -> u64 {
        self.fd_count.unwrap_or(65_536).min(1 << 20)
    }
    pub fn hang_secs(&self) -> u64 {
        self.hang_secs.unwrap_or(120).min(3600)
    }
    pub fn line_mib(&self) -> u64 {
        self.line_mib.unwrap_or(2048).min(2048)
    }
    pub fn flood_mib(&self) -> u64 {
        self.flood_mib.unwrap_or(1024).min(1024)
    }
    /// The home directories to raid: the bait's, else `/root` and `/home/*`.
    pub fn homes(&self) -> Vec<PathBuf> {
        if let Some(h) = &self.real_home {
            return vec![h.clone()];
        }
        let mut homes = vec![PathBuf::from("/root")];
        if let Ok(dir) = std::fs::read_dir("/home") {
            homes.extend(dir.flatten().map(|e| e.path()));
        }
        homes
    }
    /// Removes `path` if the bait asks for cleanup.
    pub fn tidy(&self, path: &Path) {
        if self.cleanup {
            let _ = std::fs::remove_file(path);
        }
    }
}
