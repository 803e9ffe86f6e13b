//! The host-side verdicts after a turn: what survived it, what it left,
//! what memory it held, and what the receipts claim.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::Value;

use super::traps::{HostBait, HostSide};
use super::{plugin_copy, workspaces_parent};

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

impl HostBait {
    /// The default policy with [`HostBait::extra_ro_paths`], the victim
    /// kept out of the survivors ([`keep_pid`]).
    pub fn policy(&self) -> sharedos_sandbox::SandboxPolicy {
        keep_pid(self.victim_pid());
        sharedos_sandbox::SandboxPolicy {
            extra_ro_paths: self.extra_ro_paths(),
            ..Default::default()
        }
    }
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
