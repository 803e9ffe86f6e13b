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

mod traps;
mod turn;
mod verdicts;

pub use traps::*;
pub use turn::*;
pub use verdicts::*;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

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
    let _ = std::fs::remove_dir_all(runtime_dir());
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
            // A host that is not root keeps its state directory (staged
            // plugins) in $XDG_RUNTIME_DIR, else in TMPDIR: one of its own,
            // so TMPDIR holds only the turns' workspaces.
            std::env::set_var("XDG_RUNTIME_DIR", runtime_dir());
        }
    });
}

/// This test process's `XDG_RUNTIME_DIR` (private, removed at exit).
fn runtime_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = PathBuf::from(format!("/tmp/sharedos-bait-rt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).expect("create the runtime dir");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    })
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
