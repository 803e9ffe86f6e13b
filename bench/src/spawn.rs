//! `sharedos-bench`: what the sandbox costs per launch.
//!
//! Each configuration launches `/bin/true` `iterations` times through
//! [`sharedos_sandbox::spawn`] and measures (a) the time until the report is in, which
//! is when the plugin's `execve` succeeded, and (b) the time until the
//! helper is reaped. The cost of a layer is the median with everything
//! minus the median with that layer switched off. A direct `fork+exec` of
//! `/bin/true` is the baseline of the same run. VM noise is large: compare
//! minimums and medians, not single runs.
//!
//! The full sandbox runs with `policy.timings`, so the report also breaks
//! one spawn down by stage (host and helper side, on one clock): where the
//! time goes, independently of the layer toggles.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use sharedos_sandbox::{SandboxError, SandboxLevel, SandboxPolicy, SpawnSpec, spawn};

/// An I/O failure of the bench, named by what it was doing.
fn io_error(op: &'static str) -> impl FnOnce(std::io::Error) -> SandboxError {
    move |source| SandboxError::Io { op, source }
}

/// Timings of one configuration, in microseconds.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct BenchFigure {
    pub name: String,
    /// The level this configuration reached.
    pub level: Option<SandboxLevel>,
    pub runs: usize,
    /// Spawn until exec succeeded.
    pub exec_min_us: u64,
    pub exec_median_us: u64,
    pub exec_mean_us: u64,
    pub exec_p90_us: u64,
    /// Spawn until the helper was reaped (includes namespace teardown).
    pub total_median_us: u64,
}

/// The cost attributed to one layer: full − (full without it), on the
/// medians and on the minimums (the minimum is the steadier figure on a
/// noisy machine; either can come out negative within the noise).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct LayerCost {
    pub layer: String,
    pub exec_median_delta_us: i64,
    pub exec_min_delta_us: i64,
}

/// One stage of the full sandbox's spawn: when it was reached (µs since
/// the host called `spawn`) and how long it took after the previous stage,
/// as medians and minimums over the runs.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct StageFigure {
    /// `host`, `helper` (the supervisor), `pid1` or `plugin`.
    pub process: String,
    pub stage: String,
    pub at_median_us: u64,
    pub at_min_us: u64,
    /// Median of (this stage − the previous one) within each run.
    pub step_median_us: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct BenchReport {
    pub kernel: String,
    pub iterations: usize,
    /// `fork+exec+wait` of `/bin/true` with no helper at all.
    pub baseline: BenchFigure,
    pub configurations: Vec<BenchFigure>,
    /// The full sandbox prepared ahead ([`sharedos_sandbox::prepare`], untimed): from
    /// the start order until the plugin's `execve` (what a turn that takes
    /// a prepared sandbox waits for), and until it was reaped.
    pub prepared: BenchFigure,
    pub layer_costs: Vec<LayerCost>,
    /// The full sandbox's spawn, stage by stage, in order.
    pub stages: Vec<StageFigure>,
}

/// Per-stage figures from the `timings_us` of many runs (stages keyed by
/// process and name, in the order of the first run).
fn stage_figures(runs: &[Vec<sharedos_sandbox::StageTiming>]) -> Vec<StageFigure> {
    let mut keys: Vec<(String, String)> = Vec::new();
    let mut at: Vec<Vec<u64>> = Vec::new();
    let mut step: Vec<Vec<u64>> = Vec::new();
    for run in runs {
        let mut prev = 0;
        for t in run {
            let key = (t.process.clone(), t.stage.clone());
            let i = match keys.iter().position(|k| *k == key) {
                Some(i) => i,
                None => {
                    keys.push(key);
                    at.push(Vec::new());
                    step.push(Vec::new());
                    keys.len() - 1
                }
            };
            at[i].push(t.us);
            step[i].push(t.us.saturating_sub(prev));
            prev = t.us;
        }
    }
    let median = |v: &mut Vec<u64>| {
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    keys.into_iter()
        .zip(at.iter_mut().zip(step.iter_mut()))
        .map(|((process, stage), (a, st))| StageFigure {
            process,
            stage,
            at_median_us: median(a),
            at_min_us: a.first().copied().unwrap_or(0),
            step_median_us: median(st),
        })
        .collect()
}

fn stats(
    name: &str,
    level: Option<SandboxLevel>,
    mut exec: Vec<Duration>,
    mut total: Vec<Duration>,
) -> BenchFigure {
    exec.sort();
    total.sort();
    let us = |d: Duration| d.as_micros() as u64;
    let n = exec.len().max(1);
    let pick = |v: &[Duration], q: f64| {
        v.get(((v.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or_default()
    };
    BenchFigure {
        name: name.to_string(),
        level,
        runs: exec.len(),
        exec_min_us: exec.first().copied().map(us).unwrap_or(0),
        exec_median_us: us(pick(&exec, 0.5)),
        exec_mean_us: exec.iter().map(|d| us(*d)).sum::<u64>() / n as u64,
        exec_p90_us: us(pick(&exec, 0.9)),
        total_median_us: us(pick(&total, 0.5)),
    }
}

fn true_binary() -> PathBuf {
    ["/bin/true", "/usr/bin/true"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("/bin/true"))
}

/// `/bin/true` under `policy`, with `ws` as its workspace only where the
/// policy cannot have a tmpfs one (as the host launches it).
fn true_spec(helper_exe: &Path, policy: &SandboxPolicy, ws: &Path) -> SpawnSpec {
    SpawnSpec {
        helper_exe: helper_exe.to_path_buf(),
        program: true_binary(),
        args: vec![],
        env: vec![],
        policy: policy.clone(),
        workspace: sharedos_sandbox::needs_host_workspace(policy).then(|| ws.to_path_buf()),
    }
}

/// One launch of `/bin/true`: (time to exec, time to reaped, report).
fn launch_once(
    helper_exe: &Path,
    policy: &SandboxPolicy,
    ws: &Path,
) -> Result<(Duration, Duration, sharedos_sandbox::SandboxReport), SandboxError> {
    let t0 = Instant::now();
    let mut child = spawn(&true_spec(helper_exe, policy, ws))?;
    let exec = t0.elapsed();
    child
        .wait()
        .map_err(io_error("wait for the benchmark child"))?;
    let total = t0.elapsed();
    Ok((exec, total, std::mem::take(&mut child.report)))
}

/// One prepared launch of `/bin/true`: (start to exec, start to reaped).
fn start_prepared_once(
    helper_exe: &Path,
    policy: &SandboxPolicy,
    ws: &Path,
) -> Result<(Duration, Duration, SandboxLevel), SandboxError> {
    let prepared = sharedos_sandbox::prepare(&true_spec(helper_exe, policy, ws))?;
    let t0 = Instant::now();
    let mut child = prepared.start()?;
    let exec = t0.elapsed();
    child
        .wait()
        .map_err(io_error("wait for the benchmark child"))?;
    Ok((exec, t0.elapsed(), child.report.level))
}

/// Fork and exec of `/bin/true` without any helper: the floor.
fn baseline(iterations: usize) -> Result<BenchFigure, SandboxError> {
    let mut base = Vec::new();
    for _ in 0..iterations {
        let t0 = Instant::now();
        std::process::Command::new(true_binary())
            .status()
            .map_err(io_error("run /bin/true"))?;
        base.push(t0.elapsed());
    }
    Ok(stats(
        "fork+exec /bin/true (no helper)",
        None,
        base.clone(),
        base,
    ))
}

/// The configurations measured: the helper with no layers, the full
/// sandbox (its stages recorded), and the full sandbox without one layer
/// at a time.
fn configurations(full: &SandboxPolicy) -> Vec<(String, SandboxPolicy)> {
    // Only the full sandbox records its stages (a few clock reads).
    let full_timed = SandboxPolicy {
        timings: true,
        ..full.clone()
    };
    let mut configs: Vec<(String, SandboxPolicy)> = vec![
        ("helper, no layers".into(), SandboxPolicy::unconfined()),
        ("full sandbox".into(), full_timed),
    ];
    let without = |name: &str, f: &dyn Fn(&mut SandboxPolicy)| {
        let mut p = full.clone();
        f(&mut p);
        (format!("full without {name}"), p)
    };
    configs.push(without("netns", &|p| p.layers.netns = false));
    configs.push(without("mountns+root", &|p| p.layers.mountns = false));
    configs.push(without("pidns+mountns", &|p| {
        p.layers.pidns = false;
        p.layers.mountns = false
    }));
    configs.push(without("landlock", &|p| p.layers.landlock = false));
    configs.push(without("seccomp", &|p| p.layers.seccomp = false));
    configs.push(without("cgroup", &|p| p.cgroup.enabled = false));
    configs.push(without("rlimits", &|p| p.layers.rlimits = false));
    configs.push(without("all namespaces", &|p| {
        p.layers.userns = false;
        p.layers.mountns = false;
        p.layers.pidns = false;
        p.layers.netns = false;
        p.layers.ipcns = false;
        p.layers.utsns = false;
        p.layers.cgroupns = false;
    }));
    configs
}

/// Run the benchmark with `helper_exe` as the helper binary.
pub fn bench(helper_exe: &Path, iterations: usize) -> Result<BenchReport, SandboxError> {
    let iterations = iterations.max(1);
    let baseline = baseline(iterations)?;
    let full = SandboxPolicy {
        min_level: SandboxLevel::Minimal,
        ..SandboxPolicy::default()
    };
    let configs = configurations(&full);

    // Round-robin over the configurations, so that the machine's noise
    // (other builds, the VM's neighbours) spreads evenly over all of them.
    let ws = tempfile::Builder::new()
        .prefix("sharedos-bench-")
        .tempdir()
        .map_err(io_error("create the bench workspace"))?;
    let mut samples: Vec<(Vec<Duration>, Vec<Duration>, Option<SandboxLevel>)> =
        vec![(Vec::new(), Vec::new(), None); configs.len()];
    let mut timings = Vec::new();
    let (mut prepared_exec, mut prepared_total) = (Vec::new(), Vec::new());
    let mut prepared_level = None;
    for _ in 0..iterations {
        let (e, t, level) = start_prepared_once(helper_exe, &full, ws.path())?;
        prepared_exec.push(e);
        prepared_total.push(t);
        prepared_level = Some(level);
        for (i, (_, policy)) in configs.iter().enumerate() {
            let (e, t, report) = launch_once(helper_exe, policy, ws.path())?;
            samples[i].0.push(e);
            samples[i].1.push(t);
            samples[i].2 = Some(report.level);
            if !report.timings_us.is_empty() {
                timings.push(report.timings_us);
            }
        }
    }
    let figures: Vec<BenchFigure> = configs
        .iter()
        .zip(samples)
        .map(|((name, _), (e, t, l))| stats(name, l, e, t))
        .collect();
    let full_median = figures[1].exec_median_us as i64;
    let full_min = figures[1].exec_min_us as i64;
    let layer_costs = figures
        .iter()
        .skip(2)
        .map(|f| LayerCost {
            layer: f.name.trim_start_matches("full without ").to_string(),
            exec_median_delta_us: full_median - f.exec_median_us as i64,
            exec_min_delta_us: full_min - f.exec_min_us as i64,
        })
        .collect();
    Ok(BenchReport {
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        iterations,
        baseline,
        configurations: figures,
        prepared: stats(
            "full sandbox prepared ahead: start order until execve",
            prepared_level,
            prepared_exec,
            prepared_total,
        ),
        layer_costs,
        stages: stage_figures(&timings),
    })
}

/// [`bench`] with the running binary (the `sharedos` binary) as the helper.
pub fn bench_current_exe(iterations: usize) -> Result<BenchReport, SandboxError> {
    let exe = std::env::current_exe().map_err(io_error("locate the running binary"))?;
    bench(&exe, iterations)
}
