//! `sharedos-bench soak`: many turns of hostile plugins through long-lived
//! executors in the full sandbox, watching the host for what a turn could
//! leave behind. Every `every` turns it prints the host's resident memory,
//! open descriptors, live descendant processes, leftover workspaces and
//! cgroups; it exits 1 on any leftover at a report or on growth of memory
//! or descriptors between the first report and the last, and when no turn
//! succeeded at all (the plugins never ran).
//!
//! The mix: the testplugin's hostile scripts (setsid escapees, floods,
//! crashes, framing violations, stderr floods, a stall to the deadline,
//! tool calls) on one executor, and every tenth turn the adversary (a few
//! quick sandbox attacks) on a second executor over the same kernel.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};
use sharedos_kernel::{JsonlAuditSink, Kernel};
use sharedos_protocol::{ExecutionRequest, ExecutionStatus};

use sharedos_host::config::HostConfig;
use sharedos_host::executor::{DEFAULT_MAX_TURN_BYTES, ExecuteOptions, Executor, ExecutorOptions};
use sharedos_host::seat::registry_from_config;

use sharedos_host::seat::configured_launcher;

const AGENT: &str = "soak-agent";
const ADVERSARY_AGENT: &str = "soak-adversary";
const NAMESPACE: &str = "soak";

/// What a soak runs and how often it reports.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    pub turns: u32,
    pub every: u32,
    /// The testplugin and adversary binaries (default: next to this one).
    pub testplugin: PathBuf,
    pub adversary: PathBuf,
}

/// One look at the host between turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    pub rss_kib: u64,
    pub fds: u64,
    pub descendants: u64,
    pub workspaces: u64,
    pub cgroups: u64,
}

impl Snapshot {
    /// The report line's figures.
    fn line(&self) -> String {
        format!(
            "rss {:>7} KiB  fds {:>4}  descendants {}  workspaces {}  cgroups {}",
            self.rss_kib, self.fds, self.descendants, self.workspaces, self.cgroups
        )
    }

    fn take() -> Self {
        let pid = std::process::id();
        Self {
            rss_kib: rss_kib(),
            fds: count_dir("/proc/self/fd", |_| true),
            descendants: descendants(pid),
            workspaces: count_dir(std::env::temp_dir(), |n| {
                n.starts_with(&format!("sharedos-ws-{pid}-"))
            }),
            cgroups: cgroups(pid),
        }
    }
    fn leftovers(&self) -> bool {
        self.descendants + self.workspaces + self.cgroups > 0
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn count_dir(dir: impl AsRef<Path>, keep: impl Fn(&str) -> bool) -> u64 {
    std::fs::read_dir(dir).map_or(0, |rd| {
        rd.flatten()
            .filter(|e| keep(&e.file_name().to_string_lossy()))
            .count() as u64
    })
}

/// Live processes below `root` (ppid links from `/proc/*/stat`).
fn descendants(root: u32) -> u64 {
    let mut links: Vec<(u32, u32)> = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // The fields after the command (which may hold spaces) start after
        // the last ')': state, ppid, ...
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let mut f = after.split_whitespace();
        let state = f.next().unwrap_or("");
        if state == "Z" || state == "X" {
            continue;
        }
        if let Some(ppid) = f.next().and_then(|p| p.parse().ok()) {
            links.push((pid, ppid));
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            links
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    (found.len() - 1) as u64
}

/// Cgroups the sandbox named after this host (`sharedos-<pid>-<n>`).
fn cgroups(pid: u32) -> u64 {
    let prefix = format!("sharedos-{pid}-");
    let mut dirs = vec![PathBuf::from("/sys/fs/cgroup")];
    if let Ok(own) = std::fs::read_to_string("/proc/self/cgroup")
        && let Some(path) = own.lines().find_map(|l| l.strip_prefix("0::"))
    {
        let own = PathBuf::from("/sys/fs/cgroup").join(path.trim_start_matches('/'));
        dirs.push(own.clone());
        if let Some(parent) = own.parent() {
            dirs.push(parent.to_path_buf());
        }
    }
    dirs.sort();
    dirs.dedup();
    dirs.iter()
        .map(|d| count_dir(d, |n| n.starts_with(&prefix)))
        .sum()
}

fn host_toml(o: &SoakOptions) -> String {
    let grant = |id: &str, agent: &str, extra: &str| {
        format!(
            r#"
[[kernel.grants]]
id = "{id}"
subject = {{ kind = "agent", agentId = "{agent}" }}
issuer = {{ kind = "service", serviceId = "soak" }}
namespaceId = "{NAMESPACE}"
[[kernel.grants.capabilities]]
namespace = "sharedos.execution"
path = ["agent", "{agent}"]
scope = "exact"
actions = ["invoke"]
{extra}"#
        )
    };
    let files = format!(
        "[[kernel.grants.capabilities]]\nnamespace = \"files\"\npath = [\"{AGENT}\"]\nscope = \"descendants\"\nactions = [\"read\", \"write\", \"list\"]\n"
    );
    format!(
        r#"[host]
defaultTimeoutMs = 20000
drainGraceMs = 200
auditPath = "audit.jsonl"
filesRoot = "files"

[[runtimes]]
id = "sharedos-testplugin"
version = "0.1.0"
program = {tp:?}
args = ["normal"]

[[runtimes]]
id = "sharedos-adversary"
version = "{version}"
program = {adv:?}
env = {{ RUST_BACKTRACE = "0" }}

[[agents]]
agentId = "{AGENT}"
runtime = "sharedos-testplugin"

[[agents]]
agentId = "{ADVERSARY_AGENT}"
runtime = "sharedos-adversary"
{g1}{g2}"#,
        tp = o.testplugin.display().to_string(),
        adv = o.adversary.display().to_string(),
        version = env!("CARGO_PKG_VERSION"),
        g1 = grant("soak-admission", AGENT, &files),
        g2 = grant("adversary-admission", ADVERSARY_AGENT, ""),
    )
}

/// The hostile scripts, in rotation; each with its deadline in ms.
fn testplugin_script(n: u32) -> (Value, u64) {
    let write = json!({"op": "call", "tool": "files.write",
        "arguments": {"path": format!("soak/f{}.txt", n % 50), "content": "soak"}});
    let read = json!({"op": "call", "tool": "files.read",
        "arguments": {"path": format!("soak/f{}.txt", n % 50)}});
    let scripts = [
        (
            json!([{"op": "fork", "n": 2, "setsid": true}, write]),
            10_000,
        ),
        (json!([{"op": "flood", "n": 3_000}]), 20_000),
        (json!([write, {"op": "crash"}]), 10_000),
        (json!([{"op": "invalid_utf8"}]), 10_000),
        (
            json!([{"op": "raw", "line": "not json \u{1b}[31m"}]),
            10_000,
        ),
        (
            json!([{"op": "stderr_flood", "bytes": 64 << 10}, read]),
            10_000,
        ),
        (json!([{"op": "exit", "code": 3}]), 10_000),
        (
            json!([{"op": "fork", "n": 1, "double": true}, {"op": "stall"}]),
            300,
        ),
        (json!([{"op": "close_stdout"}]), 10_000),
        (
            json!([{"op": "burst_calls", "n": 12, "tool": "files.list"}]),
            10_000,
        ),
        (
            json!([{"op": "invoke_as_notification", "tool": "files.write", "n": 3}, write]),
            10_000,
        ),
    ];
    scripts[n as usize % scripts.len()].clone()
}

fn request(n: u32, agent: &str, payload: Value, timeout_ms: u64, tools: &[&str]) -> Value {
    let who = json!({"kind": "agent", "agentId": agent});
    let tools: Vec<Value> = tools
        .iter()
        .map(|t| {
            let action = t.trim_start_matches("files.");
            let rw = if action == "write" { "write" } else { "read" };
            json!({"name": t, "description": "soak", "namespace": "files", "source": "request",
                   "readWrite": rw, "inputSchema": {},
                   "requiredCapability": {"resource": {"namespace": "files", "path": []}, "action": action}})
        })
        .collect();
    json!({
        "version": "1",
        "executionId": format!("soak-{}-{n}", std::process::id()),
        "agent": who,
        "context": {
            "namespaceId": NAMESPACE, "actor": who,
            "authority": {"kind": "service", "serviceId": "soak"},
            "owner": {"kind": "human", "userId": "operator"},
            "purpose": "soak", "traceId": format!("soak-trace-{n}"),
            "enabledToolNamespaces": ["files"], "now": "2026-11-30T12:00:00Z"
        },
        "message": {
            "version": "1", "id": format!("soak-msg-{n}"),
            "sender": {"kind": "human", "userId": "operator"}, "receiver": who,
            "purpose": "soak", "payload": payload,
            "traceId": format!("soak-trace-{n}"), "createdAt": "2026-11-30T12:00:00Z"
        },
        "tools": tools,
        "options": {"timeoutMs": timeout_ms, "maxSteps": 64, "maxToolCalls": 1000}
    })
}

/// Waits (bounded) for the trees of the last turns to be reaped, then looks.
async fn settled_snapshot() -> Snapshot {
    tokio::task::spawn_blocking(sharedos_host::process::settle_kills)
        .await
        .ok();
    let mut snap = Snapshot::take();
    for _ in 0..40 {
        if !snap.leftovers() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        snap = Snapshot::take();
    }
    snap
}

/// Why the soak could not start or could not run a turn (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum SoakError {
    #[error("{0}")]
    Config(#[from] sharedos_host::config::ConfigError),
    #[error("{0}")]
    Seat(#[from] sharedos_host::seat::SeatError),
    #[error("{0}")]
    Setup(String),
}

/// Runs the soak; returns the exit code (0 clean, 1 leftovers or growth).
pub async fn soak(o: &SoakOptions) -> Result<i32, SoakError> {
    for p in [&o.testplugin, &o.adversary] {
        if !p.is_file() {
            return Err(SoakError::Setup(format!(
                "{} not found: build the workspace (cargo build --workspace) or pass its path",
                p.display()
            )));
        }
    }
    let dir = tempfile::tempdir().map_err(|e| SoakError::Setup(format!("temp dir: {e}")))?;
    let (plugins, adversary) = executors(o, dir.path())?;
    let every = o.every.max(1);
    let mut first: Option<Snapshot> = None;
    let mut last = Snapshot::take();
    let mut ended = Endings::default();
    let mut failed = false;
    for n in 1..=o.turns {
        let (executor, req) = if n % 10 == 0 {
            let payload =
                json!({"bait": {"cleanup": true}, "only": ["C10", "c12-bind-tcp-listener", "C62"]});
            (
                &adversary,
                request(n, ADVERSARY_AGENT, payload, 20_000, &[]),
            )
        } else {
            let (script, timeout) = testplugin_script(n);
            let tools = ["files.write", "files.read", "files.list"];
            let payload = json!({ "script": script });
            (&plugins, request(n, AGENT, payload, timeout, &tools))
        };
        let req: ExecutionRequest = serde_json::from_value(req)
            .map_err(|e| SoakError::Setup(format!("soak request: {e}")))?;
        let result = executor
            .execute(req, ExecuteOptions::default())
            .await
            .map_err(|e| SoakError::Setup(format!("turn {n}: {e}")))?;
        ended.count(result.status);
        if n % every == 0 || n == o.turns {
            last = settled_snapshot().await;
            println!("turn {n:>6}/{}  {}  ({ended})", o.turns, last.line());
            if last.leftovers() {
                eprintln!("sharedos-bench soak: leftovers after turn {n}: {last:?}");
                failed = true;
            }
            first.get_or_insert(last);
        }
    }
    // A soak whose plugins never ran proves nothing (a TMPDIR the sandbox
    // uid cannot enter fails every launch, for one).
    if ended.succeeded == 0 && o.turns >= 10 {
        eprintln!(
            "sharedos-bench soak: no turn succeeded; the plugins did not run (see the log with SHAREDOS_LOG=warn)"
        );
        failed = true;
    }
    if let Some(first) = first
        && let Some(why) = growth(&first, &last)
    {
        eprintln!("sharedos-bench soak: {why} (first report {first:?}, last {last:?})");
        failed = true;
    }
    Ok(i32::from(failed))
}

/// How the soak's turns ended so far.
#[derive(Default)]
struct Endings {
    succeeded: u32,
    failed: u32,
    cancelled: u32,
    other: u32,
}

impl Endings {
    fn count(&mut self, status: ExecutionStatus) {
        match status {
            ExecutionStatus::Succeeded => self.succeeded += 1,
            ExecutionStatus::Failed => self.failed += 1,
            ExecutionStatus::Cancelled => self.cancelled += 1,
            _ => self.other += 1,
        }
    }
}

impl std::fmt::Display for Endings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "succeeded {}, failed {}, cancelled {}, other {}",
            self.succeeded, self.failed, self.cancelled, self.other
        )
    }
}

/// The two executors of the soak (the testplugin's and the adversary's)
/// over one kernel, its files and audit trail under `dir`.
fn executors(o: &SoakOptions, dir: &Path) -> Result<(Executor, Executor), SoakError> {
    let config = HostConfig::parse(&host_toml(o), "soak.toml", dir)?;
    let registry = registry_from_config(&config, configured_launcher)?;
    let files_root = dir.join("files");
    std::fs::create_dir_all(&files_root)
        .map_err(|e| SoakError::Setup(format!("files root: {e}")))?;
    let audit = JsonlAuditSink::open(dir.join("audit.jsonl"))
        .map_err(|e| SoakError::Setup(format!("audit: {e}")))?;
    let kernel = Arc::new(
        Kernel::from_config(&config.kernel, &files_root, Arc::new(audit))
            .map_err(|e| SoakError::Setup(format!("kernel: {e}")))?,
    );
    let executor = |id: &str| -> Result<Executor, SoakError> {
        let seat = registry
            .resolve(id)
            .map_err(sharedos_host::seat::SeatError::from)?
            .clone();
        let options = ExecutorOptions {
            drain_grace_ms: config.host.drain_grace_ms,
            max_turn_bytes: config.host.max_turn_bytes.unwrap_or(DEFAULT_MAX_TURN_BYTES),
            ..ExecutorOptions::default()
        };
        Executor::new(kernel.clone(), seat, options)
            .map_err(|e| SoakError::Setup(format!("executor: {e}")))
    };
    Ok((
        executor("sharedos-testplugin")?,
        executor("sharedos-adversary")?,
    ))
}

/// Growth between the first report and the last beyond the slack of an
/// allocator and a runtime's lazily created threads and descriptors.
pub fn growth(first: &Snapshot, last: &Snapshot) -> Option<String> {
    if last.fds > first.fds + 4 {
        return Some(format!(
            "open descriptors grew from {} to {}",
            first.fds, last.fds
        ));
    }
    if last.rss_kib > first.rss_kib + first.rss_kib / 2 + 32 * 1024 {
        return Some(format!(
            "resident memory grew from {} KiB to {} KiB",
            first.rss_kib, last.rss_kib
        ));
    }
    None
}

/// The binary `name` next to this executable.
pub fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_is_judged_against_the_first_report() {
        let first = Snapshot {
            rss_kib: 40_000,
            fds: 20,
            descendants: 0,
            workspaces: 0,
            cgroups: 0,
        };
        assert_eq!(growth(&first, &first), None);
        let more_fds = Snapshot { fds: 25, ..first };
        assert!(growth(&first, &more_fds).unwrap().contains("descriptors"));
        let fat = Snapshot {
            rss_kib: 100_000,
            ..first
        };
        assert!(growth(&first, &fat).unwrap().contains("memory"));
        assert!(
            Snapshot {
                cgroups: 1,
                ..first
            }
            .leftovers()
        );
    }

    #[test]
    fn this_process_has_no_descendants_and_counts_its_fds() {
        let s = Snapshot::take();
        assert!(s.fds >= 3 && s.rss_kib > 0, "{s:?}");
        let child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert!(descendants(std::process::id()) >= 1);
        let mut child = child;
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
