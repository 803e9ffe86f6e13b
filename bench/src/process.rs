//! Across the process boundary: tool calls and emits through the whole
//! envelope with the plugin in a child process, spawn until `initialize`
//! is answered (no sandbox, the full sandbox, bubblewrap), and the time
//! from the deadline to the result for a plugin that ignores the abort.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sharedos_protocol::{ConnectionLimits, EventKind, RuntimeManifest};
use tokio::net::unix::pipe;

use super::Figure;
use super::envelope::call_samples;
use super::fixture;
use sharedos_host::executor::{ExecuteOptions, Executor};
use sharedos_host::process::driver::{Peer, PeerConfig, handshake, host_peer_config};
use sharedos_host::process::{
    DirectLauncher, LaunchError, LaunchSpec, LaunchedChild, Launcher, ProcessRuntime,
    ProcessRuntimeConfig,
};
use sharedos_host::sandboxed::SandboxLauncher;
use sharedos_host::seat::process_seat;

/// The hidden subcommand that serves the bench plugin (`fixture::plugin`).
pub const BENCH_PLUGIN_SUBCOMMAND: &str = "__bench-plugin";

/// Serves the bench plugin over stdio (`sharedos-bench __bench-plugin`).
pub fn serve_bench_plugin() -> std::process::ExitCode {
    sharedos_plugin_sdk::serve(fixture::plugin())
}

fn sibling(exe: &Path, name: &str) -> PathBuf {
    exe.parent()
        .map(|d| d.join(name))
        .unwrap_or_else(|| PathBuf::from(name))
}

pub(super) fn timing_executor(exe: &Path, launcher: Arc<dyn Launcher>) -> Result<Executor, String> {
    let manifest = fixture::manifest();
    // On the placement's cpu for peers (`--only calls`), if any.
    let (program, args) = super::placement::peer(exe, &[BENCH_PLUGIN_SUBCOMMAND]);
    let mut config = ProcessRuntimeConfig::new(program, manifest);
    config.args = args;
    let runtime = ProcessRuntime::new(config, launcher).map_err(|e| e.to_string())?;
    Executor::new(
        Arc::new(fixture::kernel()),
        process_seat(Arc::new(runtime)),
        fixture::options(),
    )
    .map_err(|e| e.to_string())
}

/// (c) A tool call through the whole envelope, plugin out of process.
pub async fn process_calls(
    exe: &Path,
    launcher: Arc<dyn Launcher>,
    name: &str,
    n: usize,
) -> Result<Figure, String> {
    let executor = timing_executor(exe, launcher)?;
    let result = executor
        .execute(
            fixture::request("bench-process", fixture::calls(n + 50)),
            ExecuteOptions::default(),
        )
        .await
        .map_err(|e| e.to_string())?;
    let mut samples = call_samples(&result)?;
    samples.drain(..50.min(samples.len()));
    Ok(Figure::from_samples(name, samples))
}

/// The first and last emit the envelope recorded, and how many.
type EmitSpan = (Option<Instant>, Option<Instant>, usize);

/// (e) Emits per second through the envelope, plugin out of process,
/// measured on the host: from the first `runtime.event` the envelope
/// records to the last. The host's per-turn token bucket allows a burst of
/// 10 000 notifications; the measurement stays inside it.
pub async fn process_emits(exe: &Path, n: usize) -> Result<f64, String> {
    let executor = timing_executor(exe, Arc::new(DirectLauncher))?;
    let seen: Arc<std::sync::Mutex<EmitSpan>> = Arc::default();
    let probe = seen.clone();
    let on_event: sharedos_host::executor::OnEvent = Arc::new(move |e| {
        if e.kind == EventKind::RuntimeEvent {
            let now = Instant::now();
            let mut s = probe.lock().unwrap_or_else(|p| p.into_inner());
            s.0.get_or_insert(now);
            s.1 = Some(now);
            s.2 += 1;
        }
    });
    let result = executor
        .execute(
            fixture::request("bench-process-emits", fixture::emits(n)),
            ExecuteOptions {
                cancel: None,
                on_event: Some(on_event),
            },
        )
        .await
        .map_err(|e| e.to_string())?;
    if result.status != sharedos_protocol::ExecutionStatus::Succeeded {
        return Err(format!(
            "the emit turn ended {} {:?}",
            result.status.as_str(),
            result.code()
        ));
    }
    let (first, last, count) = *seen.lock().unwrap_or_else(|p| p.into_inner());
    match (first, last) {
        (Some(f), Some(l)) if count > 1 => Ok((count - 1) as f64 / (l - f).as_secs_f64().max(1e-9)),
        _ => Err(format!("only {count} emits were recorded")),
    }
}

/// bubblewrap with every namespace unshared, around a direct launch.
pub struct BwrapLauncher {
    pub bwrap: PathBuf,
}

impl Launcher for BwrapLauncher {
    fn launch(&self, spec: &LaunchSpec) -> Result<LaunchedChild, LaunchError> {
        let mut args: Vec<String> = [
            "--unshare-all",
            "--die-with-parent",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--",
        ]
        .map(String::from)
        .to_vec();
        args.push(spec.program.display().to_string());
        args.extend(spec.args.iter().cloned());
        let wrapped = LaunchSpec {
            program: self.bwrap.clone(),
            args,
            ..spec.clone()
        };
        DirectLauncher.launch(&wrapped)
    }
}

/// Finds `bwrap` on the PATH.
pub fn find_bwrap() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("bwrap"))
        .find(|p| p.is_file())
}

/// One spawn until `initialize` is answered, then the tree is killed
/// (outside the timed part).
async fn spawn_once(
    launcher: &Arc<dyn Launcher>,
    echo: &Path,
    manifest: &RuntimeManifest,
) -> Result<Duration, String> {
    let spec = LaunchSpec {
        program: echo.to_path_buf(),
        args: vec![],
        env: vec![("SHAREDOS_PLUGIN".into(), "1".into())],
        program_sha256: None,
        runtime_id: manifest.id.to_string(),
        execution_id: "bench-spawn".into(),
        turn_id: "t-bench".into(),
    };
    let start = Instant::now();
    let l = launcher.clone();
    let launched = tokio::task::spawn_blocking(move || l.launch(&spec))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let LaunchedChild {
        stdin,
        stdout,
        stderr,
        mut tree,
        ..
    } = launched;
    let stdin = pipe::Sender::from_owned_fd(stdin).map_err(|e| e.to_string())?;
    let stdout = pipe::Receiver::from_owned_fd(stdout).map_err(|e| e.to_string())?;
    let (peer, mut inbound) = Peer::spawn(stdout, stdin, host_peer_config(PeerConfig::default()));
    let limits = ConnectionLimits {
        max_message_bytes: 8 << 20,
        max_inflight_tool_calls: 8,
        max_concurrent_turns: 1,
    };
    let answered = handshake(
        &peer,
        &mut inbound,
        manifest,
        limits,
        Duration::from_secs(10),
    )
    .await;
    let elapsed = start.elapsed();
    drop(stderr);
    tree.start_kill();
    let _ = tokio::task::spawn_blocking(move || tree.kill_tree()).await;
    answered.map_err(|e| e.to_string())?;
    Ok(elapsed)
}

/// (d) Spawn until `initialize` is answered for `sharedos-echo`.
pub async fn spawn_to_initialize(
    launcher: Arc<dyn Launcher>,
    exe: &Path,
    name: &str,
    n: usize,
) -> Result<Figure, String> {
    let echo = sibling(exe, "sharedos-echo");
    let manifest = RuntimeManifest::new("sharedos-echo", env!("CARGO_PKG_VERSION"))
        .map_err(|e| e.to_string())?;
    for _ in 0..3 {
        spawn_once(&launcher, &echo, &manifest).await?;
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        samples.push(spawn_once(&launcher, &echo, &manifest).await?);
    }
    Ok(Figure::from_samples(name, samples))
}

/// (d) The full sandbox with one sandbox kept prepared (`warm = 1`), spawns
/// back to back: a spawn may find the replacement of the previous one still
/// being prepared, and wait for it.
pub async fn spawn_to_initialize_warm_back_to_back(
    exe: &Path,
    name: &str,
    n: usize,
) -> Result<Figure, String> {
    let launcher = warm_launcher(exe);
    spawn_to_initialize(launcher, exe, name, n).await
}

/// One launcher of an interleaved (d) measurement.
pub struct SpawnConfig {
    pub name: String,
    pub launcher: Arc<dyn Launcher>,
    /// Run after each of this launcher's spawns (outside the timing), so
    /// that no background work of it runs into the next launcher's spawn:
    /// a warm launcher waits until its replacement is prepared.
    pub settle: Box<dyn Fn()>,
}

impl SpawnConfig {
    pub fn new(name: &str, launcher: Arc<dyn Launcher>) -> Self {
        Self {
            name: name.to_owned(),
            launcher,
            settle: Box::new(|| {}),
        }
    }

    /// The full sandbox with one sandbox kept prepared (`warm = 1`); each
    /// timed spawn finds the replacement of the previous one ready (turns
    /// further apart than one preparation, ~3–6 ms of CPU here).
    pub fn warm(name: &str, exe: &Path) -> Self {
        let launcher = warm_launcher(exe);
        let waiter = launcher.clone();
        Self {
            name: name.to_owned(),
            launcher,
            settle: Box::new(move || {
                waiter.wait_warm(Duration::from_secs(30));
            }),
        }
    }
}

/// (d) for several launchers at once, interleaved: round `i` spawns once
/// with each launcher in turn, so a change of load on the shared machine
/// weighs on every figure alike and the ratios between them hold.
pub async fn spawn_to_initialize_interleaved(
    exe: &Path,
    configs: &[SpawnConfig],
    n: usize,
) -> Vec<Result<Figure, String>> {
    let echo = sibling(exe, "sharedos-echo");
    let manifest = match RuntimeManifest::new("sharedos-echo", env!("CARGO_PKG_VERSION")) {
        Ok(m) => m,
        Err(e) => return configs.iter().map(|_| Err(e.to_string())).collect(),
    };
    let mut samples: Vec<Result<Vec<Duration>, String>> =
        configs.iter().map(|_| Ok(Vec::with_capacity(n))).collect();
    for round in 0..n + 3 {
        for (c, out) in configs.iter().zip(samples.iter_mut()) {
            let Ok(v) = out else { continue };
            let once = spawn_once(&c.launcher, &echo, &manifest).await;
            (c.settle)();
            match once {
                // The first three rounds warm caches up and are not kept.
                Ok(d) if round >= 3 => v.push(d),
                Ok(_) => {}
                Err(e) => *out = Err(e),
            }
        }
    }
    configs
        .iter()
        .zip(samples)
        .map(|(c, s)| s.map(|s| Figure::from_samples(&c.name, s)))
        .collect()
}

/// Holds about 1 GiB resident, touched page by page, for as long as it
/// lives.
pub fn hold_resident(bytes: usize) -> Vec<u8> {
    let mut v = vec![0u8; bytes];
    for i in (0..bytes).step_by(4096) {
        v[i] = 1;
    }
    std::hint::black_box(&v);
    v
}

/// The deadline to the returned result, for a plugin that ignores
/// `turn/abort` after forking `children` children; and the time until
/// every child is gone.
/// The pids the testplugin's `fork` step reported in its events.
fn forked_pids(result: &sharedos_protocol::ExecutionResult) -> Vec<i32> {
    result
        .events
        .iter()
        .filter(|e| e.kind == EventKind::RuntimeEvent && e.data["type"] == "forked")
        .flat_map(|e| {
            e.data["data"]["pids"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|p| p.as_i64().map(|p| p as i32))
        .collect()
}

/// Waits until every one of `pids` is gone (10 s at most); how long it took.
async fn all_gone(pids: &[i32]) -> Result<Duration, String> {
    let waited = Instant::now();
    while !pids.iter().all(|&p| gone(p)) {
        if waited.elapsed() > Duration::from_secs(10) {
            return Err("children survived the turn by 10 s".into());
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    Ok(waited.elapsed())
}

pub async fn deadline_to_result(
    exe: &Path,
    launcher: Arc<dyn Launcher>,
    children: usize,
    runs: usize,
    host_pids: bool,
) -> Result<(Figure, Option<Figure>), String> {
    let plugin = sibling(exe, "sharedos-testplugin");
    let manifest =
        RuntimeManifest::new("sharedos-testplugin", "0.1.0").map_err(|e| e.to_string())?;
    let runtime = ProcessRuntime::new(ProcessRuntimeConfig::new(plugin, manifest), launcher)
        .map_err(|e| e.to_string())?;
    let executor = Executor::new(
        Arc::new(fixture::kernel()),
        process_seat(Arc::new(runtime)),
        fixture::options(),
    )
    .map_err(|e| e.to_string())?;
    let timeout_ms = 800u64;
    let mut to_result = Vec::with_capacity(runs);
    let mut to_gone = Vec::with_capacity(runs);
    for i in 0..runs {
        let script =
            json!([{"op": "ignore_abort"}, {"op": "fork", "n": children}, {"op": "stall"}]);
        let mut request =
            fixture::request(&format!("bench-deadline-{i}"), json!({"script": script}));
        request.options = Some(sharedos_protocol::ExecutionOptions {
            max_steps: Some(16),
            max_tool_calls: Some(16),
            timeout_ms: Some(timeout_ms),
        });
        let start = Instant::now();
        let result = executor
            .execute(request, ExecuteOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        let returned = start.elapsed();
        if result.code() != Some("turn_cancelled") {
            return Err(format!(
                "the deadline turn ended {} {:?}",
                result.status.as_str(),
                result.code()
            ));
        }
        let pids = forked_pids(&result);
        if host_pids && pids.len() != children {
            return Err(format!(
                "the plugin reported {} children before the deadline, not {children}",
                pids.len()
            ));
        }
        to_result.push(returned.saturating_sub(Duration::from_millis(timeout_ms)));
        if !host_pids {
            // Pids reported from inside a pid namespace name nothing here.
            continue;
        }
        let waited = all_gone(&pids).await?;
        to_gone.push(returned + waited - Duration::from_millis(timeout_ms));
    }
    Ok((
        Figure::from_samples(
            "deadline → result, abort ignored, children forked",
            to_result,
        ),
        host_pids.then(|| Figure::from_samples("deadline → every child gone (host pids)", to_gone)),
    ))
}

/// A pid no longer names a live process (a zombie counts as gone).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .map(|rest| rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
    }
}

/// The sandboxed launcher with the default (strong) policy.
pub fn sandbox_launcher(exe: &Path) -> Arc<dyn Launcher> {
    Arc::new(SandboxLauncher::new(
        exe.to_path_buf(),
        sharedos_sandbox::SandboxPolicy::default(),
    ))
}

/// The sandboxed launcher keeping one sandbox prepared (`warm = 1`).
pub fn warm_launcher(exe: &Path) -> Arc<SandboxLauncher> {
    Arc::new(SandboxLauncher::new(
        exe.to_path_buf(),
        sharedos_sandbox::SandboxPolicy {
            warm: 1,
            ..Default::default()
        },
    ))
}

/// The sandboxed launcher with the fork server on.
pub fn sandbox_launcher_fork_server(exe: &Path) -> Arc<dyn Launcher> {
    let policy = sharedos_sandbox::SandboxPolicy {
        fork_server: true,
        ..Default::default()
    };
    Arc::new(SandboxLauncher::new(exe.to_path_buf(), policy))
}

/// What each (d) figure is compared with.
pub fn ratio_line(name: &str, a: &Figure, b: &Figure) -> String {
    format!(
        "    {name}: {:.2}× (median {:.0} µs / {:.0} µs)",
        a.median_us / b.median_us.max(1e-9),
        a.median_us,
        b.median_us
    )
}
