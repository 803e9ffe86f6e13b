//! Shared support for the workspace integration tests: locating the built
//! plugin binaries, a recording `RuntimeHost` test double, a valid
//! `RuntimeTurnRequest` builder, and leak checks (child processes, fds).

/// The sandbox suites' bait, turn runner and host-side checks.
pub mod bait;
/// The workspace's binaries, built on first use.
pub mod binaries;
/// Turns of runtimes with a network policy, and what the host sees.
pub mod egress;
/// The engines (namespace sandbox, gVisor) the shared cases run in.
pub mod engines;
/// Harness turns: a vendor CLI (or the Python MCP client) seated by
/// `sharedos-harness` in the full sandbox.
pub mod harness;
/// What a turn may leave on the host: cgroups, workspaces.
pub mod leftovers;
/// Memory as the host reads it from `/proc`.
pub mod meminfo;
/// A crate's module import graph and its cycles (the architecture test's).
pub mod modgraph;
/// `sharedos serve` and an HTTP client over its socket.
pub mod served;
/// `sharedos serve` on TCP with tenants' tokens.
pub mod tenants;
/// Turns through the whole host, and the invariants every turn keeps.
pub mod turns;
/// The real Codex CLI and Claude Code seated by their shipped specs.
pub mod vendors;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_protocol::RuntimeTurnRequest;

/// A binary of the workspace (`target/<profile>/<name>`), built on first
/// use ([`binaries::workspace_bin`]).
pub fn plugin_bin(name: &str) -> PathBuf {
    binaries::workspace_bin(name)
}

/// Grants of the demo agent `alice`: admission, and read/write/list over
/// her own file memory (namespace `demo`).
pub const DEMO_KERNEL: &str = r#"
[[grants]]
id = "admission"
subject = { kind = "agent", agentId = "alice" }
issuer = { kind = "service", serviceId = "demo-host" }
namespaceId = "demo"
capabilities = [{ namespace = "sharedos.execution", path = ["agent", "alice"], scope = "exact", actions = ["invoke"] }]

[[grants]]
id = "memory"
subject = { kind = "agent", agentId = "alice" }
issuer = { kind = "service", serviceId = "demo-host" }
namespaceId = "demo"
capabilities = [{ namespace = "files", path = ["alice"], scope = "descendants", actions = ["read", "write", "list"] }]
"#;

/// The real kernel with [`DEMO_KERNEL`]'s grants, its file tools over
/// `files_root`, and an in-memory audit sink.
pub fn demo_kernel(files_root: &std::path::Path) -> sharedos_kernel::Kernel {
    let config: sharedos_kernel::KernelConfig =
        toml::from_str(DEMO_KERNEL).expect("DEMO_KERNEL parses");
    sharedos_kernel::Kernel::from_config(
        &config,
        files_root,
        Arc::new(sharedos_kernel::MemoryAuditSink::new()),
    )
    .expect("DEMO_KERNEL builds")
}

/// Serializes the tests of one binary, so fd counts and process checks of
/// one test are not disturbed by another.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// A two-worker tokio runtime, for tests that block on their turns.
pub fn blocking_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// The recording `RuntimeHost` double, from the test kit.
pub use sharedos_testkit::{Record, RecordingHost};

/// A valid sanitized turn request whose message payload is `payload`.
pub fn turn_request(execution_id: &str, payload: Value) -> RuntimeTurnRequest {
    let agent = json!({"kind":"agent","agentId":"agent-1"});
    let v = json!({
        "version": "1",
        "executionId": execution_id,
        "agent": agent,
        "context": {
            "actor": {"kind":"human","userId":"u1"},
            "owner": {"kind":"human","userId":"u1"},
            "namespaceId": "ns",
            "purpose": "testing the wire",
            "traceId": "trace-1",
            "now": "2026-01-01T00:00:00Z",
            "reach": {"status":"unavailable","reasonCode":"not_computed"}
        },
        "message": {
            "version": "1", "id": "m1",
            "sender": {"kind":"human","userId":"u1"}, "receiver": agent,
            "purpose": "testing the wire", "payload": payload,
            "traceId": "trace-1", "createdAt": "2026-01-01T00:00:00Z"
        },
        "tools": []
    });
    match serde_json::from_value(v) {
        Ok(r) => r,
        Err(e) => panic!("test request does not parse: {e}"),
    }
}

/// Whether a pid is a live (non-zombie) process.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Polls until none of `pids` is alive, up to `bound`; returns survivors.
pub fn survivors(pids: &[u32], bound: Duration) -> Vec<u32> {
    let until = Instant::now() + bound;
    loop {
        let left: Vec<u32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() || Instant::now() >= until {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills leftover pids (cleanup after a test that expects survivors).
pub fn kill_all(pids: &[u32]) {
    for p in pids {
        if let Some(pid) = i32::try_from(*p)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}

/// Open fds of this process.
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Polls until the fd count is back to at most `before + slack`.
pub fn fds_settle(before: usize, slack: usize, bound: Duration) -> usize {
    let until = Instant::now() + bound;
    loop {
        let now = fd_count();
        if now <= before + slack || Instant::now() >= until {
            return now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Children of this process still alive (from `/proc/*/stat` ppid).
pub fn live_children() -> Vec<u32> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .is_some_and(|s| {
                    s.rsplit_once(')').is_some_and(|(_, rest)| {
                        let mut f = rest.split_whitespace();
                        let state = f.next().unwrap_or("Z");
                        let ppid = f.next().and_then(|p| p.parse::<u32>().ok());
                        ppid == Some(me) && state != "Z" && state != "X"
                    })
                })
        })
        .collect()
}

/// A `ProcessRuntime` over a workspace plugin binary, direct launch.
pub fn runtime(
    bin: &str,
    args: &[&str],
    manifest: (&str, &str),
    tweak: impl FnOnce(&mut sharedos_host::process::ProcessRuntimeConfig),
) -> sharedos_host::process::ProcessRuntime {
    use sharedos_host::process::{DirectLauncher, ProcessRuntime, ProcessRuntimeConfig};
    let manifest = match sharedos_protocol::RuntimeManifest::new(manifest.0, manifest.1) {
        Ok(m) => m,
        Err(e) => panic!("manifest: {e}"),
    };
    let mut config = ProcessRuntimeConfig::new(plugin_bin(bin), manifest);
    config.args = args.iter().map(|a| (*a).to_owned()).collect();
    tweak(&mut config);
    match ProcessRuntime::new(config, Arc::new(DirectLauncher)) {
        Ok(rt) => rt,
        Err(e) => panic!("runtime: {e}"),
    }
}

/// The testplugin's runtime with its mode argument.
pub fn testplugin(mode: &str) -> sharedos_host::process::ProcessRuntime {
    runtime(
        "sharedos-testplugin",
        &[mode],
        ("sharedos-testplugin", "0.1.0"),
        |_| {},
    )
}

/// Runs one test body on its own current-thread runtime, serialized with
/// the other tests of the binary, and checks that it left no fd behind:
/// the count is taken before the runtime exists and after it is dropped,
/// so the runtime's own fds do not blur it.
pub fn isolated<T>(body: impl std::future::Future<Output = T>) -> T {
    let _guard = serial();
    // tokio keeps a process-wide socket pair for its signal driver once a
    // runtime with signals was built; create it before the first count.
    static WARM: std::sync::Once = std::sync::Once::new();
    WARM.call_once(|| {
        drop(
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build(),
        )
    });
    let before = fd_count();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("tokio runtime: {e}"),
    };
    let out = rt.block_on(body);
    drop(rt);
    let after = fds_settle(before, 0, Duration::from_secs(5));
    if after > before {
        let fds: Vec<String> = std::fs::read_dir("/proc/self/fd")
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
            .map(|e| format!("{:?}", std::fs::read_link(e.path()).unwrap_or_default()))
            .collect();
        panic!("fds leaked: {before} before the test, {after} after: {fds:?}");
    }
    out
}

/// The level a full sandbox reaches on this host, as the report spells
/// it: `strong` where the memory controller is delegated (the tree's
/// memory bounded), else `isolated`.
pub fn full_level() -> &'static str {
    if sharedos_sandbox::cgroup::memory_delegated() {
        "strong"
    } else {
        "isolated"
    }
}

/// The layers a full sandbox's report lists as missing on this host:
/// none, or `memory` alone where no memory controller is delegated.
pub fn full_missing(report: &serde_json::Value) -> Vec<String> {
    report["missing"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["layer"].as_str())
        .filter(|l| *l != "memory" || sharedos_sandbox::cgroup::memory_delegated())
        .map(str::to_owned)
        .collect()
}

/// Whether the tests run as root (the CI host) or as a user (a developer's
/// machine): a few host facts differ, each said where it is used.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Asserts a direct launch's `containment` is what this host can do: a
/// cgroup of its own as root; for a user without a delegated cgroup, the
/// subreaper, with why no cgroup was made.
pub fn assert_direct_containment(containment: &serde_json::Value) {
    let c = containment.as_str().unwrap_or_default();
    if is_root() {
        assert_eq!(c, "cgroup", "containment: {containment}");
    } else {
        assert!(
            c.starts_with("subreaper (no cgroup: "),
            "containment: {containment}"
        );
    }
}

/// Whether a check that only a root host can make runs here. On a host
/// that is not root it is skipped, never silently: `test` and `why` go to
/// stderr and, when `SHAREDOS_TEST_SKIPS` names a file, into it, and
/// `scripts/test` lists that file when the run ends. CI runs as root, so
/// every such check runs there.
pub fn needs_root(test: &str, why: &str) -> bool {
    if is_root() {
        return true;
    }
    record_skip(test, why);
    false
}

/// Records a check skipped on this host (see [`needs_root`]).
pub fn record_skip(test: &str, why: &str) {
    let line = format!("{test}: {why}\n");
    eprint!("skipped {line}");
    if let Some(path) = std::env::var_os("SHAREDOS_TEST_SKIPS") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// A temp directory for files a sandboxed plugin is given by path (its
/// script, a venv, a package). As root, under the system temp dir: the
/// sandbox's helper clones what a runtime names there before its own
/// `/tmp` hides it. A host that is not root cannot, and refuses such a
/// path, so there it goes under the build's `tmp` directory (beside
/// `target/<profile>`).
pub fn plugin_tempdir() -> tempfile::TempDir {
    if is_root() {
        return tempfile::tempdir().expect("a temp dir");
    }
    let base = binaries::profile_dir()
        .parent()
        .map(|t| t.join("tmp"))
        .unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base).expect("the build's tmp directory");
    tempfile::tempdir_in(&base).expect("a temp dir under the build's tmp directory")
}

/// Installs the TypeScript SDK into `pkg/node_modules/@sharedos/plugin` as
/// a copy (the way `npm install --install-links` does, never a link the
/// sandbox could not follow), for a Node plugin package under test.
pub fn install_typescript_sdk(pkg: &std::path::Path) {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository");
    let sdk = pkg.join("node_modules/@sharedos/plugin");
    std::fs::create_dir_all(&sdk).expect("the SDK's directory");
    let copied = std::process::Command::new("cp")
        .arg("-r")
        .arg(repo.join("sdk/typescript/src"))
        .arg(repo.join("sdk/typescript/package.json"))
        .arg(&sdk)
        .status()
        .expect("run cp");
    assert!(copied.success(), "copying the TypeScript SDK failed");
}
