//! The fixed cost of one turn, stage by stage (issue 15): a zero-call turn
//! through `Executor::execute`, in process (the floor), and out of process
//! with no sandbox, the full sandbox built in the turn's path, and one
//! prepared ahead (`warm = 1`). Measured interleaved: each round runs one
//! turn of every mode in turn, so a change of load weighs on all alike.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Figure;
use super::fixture;
use super::process::BENCH_PLUGIN_SUBCOMMAND;
use sharedos_host::executor::{ExecuteOptions, Executor};
use sharedos_host::process::{
    DirectLauncher, Launcher, ProcessRuntime, ProcessRuntimeConfig, StageLog, settle_teardown,
};
use sharedos_host::sandboxed::SandboxLauncher;
use sharedos_host::seat::process_seat;

/// The stages reported, in order: each from the previous stamp to its own.
/// `envelope` is from `execute` to the runtime's `run`; `launch` to the
/// child's pipes; `handshake` to `initialize` answered; `turn` to the
/// outcome known; `signal` to the tree killed; `outcome` to `execute`'s
/// return (the recording of the result); `teardown` (off the caller's path)
/// until the tree is reaped and its workspace and cgroup removed.
pub const STAGES: [&str; 7] = [
    "envelope",
    "launch",
    "handshake",
    "turn",
    "signal",
    "outcome",
    "teardown",
];

/// One mode's figures: the total, then each of [`STAGES`] (medians of
/// their own samples), then launch + handshake (spawn until initialize).
pub struct TurnFigures {
    pub name: String,
    /// Per turn: its total over its own spawn until `initialize` plus the
    /// in-process turn of the same round (a ratio per round holds better
    /// than a ratio of medians when the load drifts); as µs×1000 samples.
    pub ratio: Figure,
    pub total: Figure,
    pub stages: Vec<Figure>,
    pub spawn_to_initialize: Figure,
}

struct Mode {
    name: &'static str,
    executor: Executor,
    log: Option<StageLog>,
    warm: Option<Arc<SandboxLauncher>>,
    samples: Vec<Vec<Duration>>,
}

fn process_mode(
    name: &'static str,
    exe: &Path,
    launcher: Arc<dyn Launcher>,
    warm: Option<Arc<SandboxLauncher>>,
) -> Result<Mode, String> {
    let manifest = fixture::manifest();
    let mut config = ProcessRuntimeConfig::new(exe, manifest);
    config.args = vec![BENCH_PLUGIN_SUBCOMMAND.to_owned()];
    let log: StageLog = Arc::new(Mutex::new(Vec::new()));
    config.stages = Some(log.clone());
    let runtime = ProcessRuntime::new(config, launcher).map_err(|e| e.to_string())?;
    let executor = Executor::new(
        Arc::new(fixture::kernel()),
        process_seat(Arc::new(runtime)),
        fixture::options(),
    )
    .map_err(|e| e.to_string())?;
    Ok(Mode {
        name,
        executor,
        log: Some(log),
        warm,
        samples: vec![Vec::new(); STAGES.len() + 2],
    })
}

fn modes(exe: &Path) -> Result<Vec<Mode>, String> {
    let inprocess = fixture::in_process_executor()?;
    let warm = super::process::warm_launcher(exe);
    Ok(vec![
        Mode {
            name: "in process (floor)",
            executor: inprocess,
            log: None,
            warm: None,
            samples: vec![Vec::new(); STAGES.len() + 2],
        },
        process_mode("direct child", exe, Arc::new(DirectLauncher), None)?,
        process_mode(
            "full sandbox, cold",
            exe,
            super::process::sandbox_launcher(exe),
            None,
        )?,
        process_mode(
            "full sandbox, prepared (warm = 1)",
            exe,
            warm.clone(),
            Some(warm),
        )?,
    ])
}

/// One zero-call turn of `mode`; returns the total and, for a process
/// mode, each stage. The teardown is waited for (and timed) after the
/// result, and a warm launcher's replacement is prepared, outside the timing.
async fn one_turn(mode: &Mode, round: usize) -> Result<Vec<Duration>, String> {
    if let Some(log) = &mode.log {
        log.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
    let request = fixture::request(&format!("bench-turn-{round}"), fixture::idle());
    let start = Instant::now();
    let result = mode
        .executor
        .execute(request, ExecuteOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let returned = Instant::now();
    tokio::task::spawn_blocking(settle_teardown)
        .await
        .map_err(|e| e.to_string())?;
    let reaped = Instant::now();
    if result.status != sharedos_protocol::ExecutionStatus::Succeeded {
        return Err(format!("a zero-call turn ended {}", result.status.as_str()));
    }
    if let Some(w) = &mode.warm {
        let w = w.clone();
        let _ = tokio::task::spawn_blocking(move || w.wait_warm(Duration::from_secs(30))).await;
    }
    let mut out = vec![returned - start];
    let Some(log) = &mode.log else { return Ok(out) };
    let stamps = log.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let at = |stage: &str| {
        stamps
            .iter()
            .find(|(s, _)| *s == stage)
            .map(|(_, t)| *t)
            .ok_or_else(|| format!("the turn stamped no {stage:?}"))
    };
    let points = [
        start,
        at("run")?,
        at("launched")?,
        at("initialized")?,
        at("settled")?,
        at("signalled")?,
        returned,
        reaped,
    ];
    out.extend(
        points
            .windows(2)
            .map(|w| w[1].saturating_duration_since(w[0])),
    );
    out.push(points[3] - points[1]);
    Ok(out)
}

/// Every mode's figures, `n` interleaved rounds after 3 discarded ones.
pub async fn zero_call_turns(exe: &Path, n: usize) -> Result<Vec<TurnFigures>, String> {
    let mut modes = modes(exe)?;
    for round in 0..n + 3 {
        for mode in modes.iter_mut() {
            let got = one_turn(mode, round).await?;
            if round >= 3 {
                for (v, d) in mode.samples.iter_mut().zip(got) {
                    v.push(d);
                }
            }
        }
    }
    let floor: Vec<Duration> = modes
        .first()
        .map(|m| m.samples[0].clone())
        .unwrap_or_default();
    let figures = modes
        .into_iter()
        .map(|m| {
            let spawn_i = STAGES.len() + 1;
            let ratio = m.samples[0]
                .iter()
                .zip(m.samples.get(spawn_i).map(Vec::as_slice).unwrap_or(&[]))
                .zip(&floor)
                .map(|((t, s), f)| {
                    let r = t.as_secs_f64() / (*s + *f).as_secs_f64().max(1e-9);
                    Duration::from_nanos((r * 1e6) as u64)
                })
                .collect();
            let ratio = Figure::from_samples(&format!("{}: ratio", m.name), ratio);
            let mut figs = m
                .samples
                .into_iter()
                .enumerate()
                .map(|(i, s)| {
                    let stage = match i {
                        0 => "total",
                        i if i <= STAGES.len() => STAGES[i - 1],
                        _ => "spawn until initialize",
                    };
                    Figure::from_samples(&format!("{}: {stage}", m.name), s)
                })
                .collect::<Vec<_>>();
            let spawn = figs
                .pop()
                .unwrap_or_else(|| Figure::from_samples("", vec![]));
            let total = figs.remove(0);
            TurnFigures {
                name: m.name.to_owned(),
                ratio,
                total,
                stages: figs,
                spawn_to_initialize: spawn,
            }
        })
        .collect();
    Ok(figures)
}

/// Prints the table and the ratios: a zero-call turn against its
/// spawn until `initialize` plus the in-process turn.
pub fn print(figures: &[TurnFigures]) {
    let ms = |f: &Figure| format!("{:.2}", f.median_us / 1000.0);
    println!(
        "    {:<36} {:>7} {}  (medians, ms)",
        "zero-call turn",
        "total",
        STAGES.map(|s| format!("{s:>10}")).join("")
    );
    for f in figures {
        let stages = if f.stages.iter().all(|s| s.iterations == 0) {
            String::new()
        } else {
            f.stages.iter().map(|s| format!("{:>10}", ms(s))).collect()
        };
        println!("    {:<36} {:>7} {stages}", f.name, ms(&f.total));
    }
    let Some(floor) = figures.first() else { return };
    for f in figures.iter().skip(1) {
        let base = f.spawn_to_initialize.median_us + floor.total.median_us;
        println!(
            "    {}: total / (spawn until initialize + in-process turn): {:.2}× per-round median, {:.2}× of medians \
             (total {:.2} ms, spawn until initialize {:.2} ms; minimums {:.2} / {:.2} ms)",
            f.name,
            f.ratio.median_us / 1000.0,
            f.total.median_us / base.max(1e-9),
            f.total.median_us / 1000.0,
            f.spawn_to_initialize.median_us / 1000.0,
            f.total.min_us / 1000.0,
            f.spawn_to_initialize.min_us / 1000.0,
        );
    }
}

/// Starts `n` unsandboxed children (`sharedos-bench __bench-echo`, waiting on
/// their stdin), then kills and reaps every tree; returns the time the
/// kills and reaps took in all. The direct launcher's kill is one
/// process-group kill, whatever else runs on the machine.
pub fn kill_many_direct(exe: &Path, n: usize) -> Result<Duration, String> {
    let spec = sharedos_host::process::LaunchSpec {
        program: exe.to_path_buf(),
        args: vec!["__bench-echo".into()],
        env: Vec::new(),
        program_sha256: None,
        runtime_id: "bench".into(),
        execution_id: "bench-kill".into(),
        turn_id: "t-bench".into(),
    };
    let mut children = Vec::with_capacity(n);
    for _ in 0..n {
        children.push(DirectLauncher.launch(&spec).map_err(|e| e.to_string())?);
    }
    let start = Instant::now();
    for c in children.iter_mut() {
        c.tree.start_kill();
    }
    for c in children.iter_mut() {
        c.tree.kill_tree().map_err(|e| e.to_string())?;
    }
    Ok(start.elapsed())
}
