//! `sharedos-bench`: figures measured in one run, each against a baseline
//! measured in the same run, so the ratios hold on a noisy machine.

#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::Serialize;

pub mod affinity;
pub mod calls;
pub mod durable;
pub mod engines;
pub mod envelope;
pub mod fixture;
pub mod harness;
pub mod kernel;
pub mod parsers;
pub mod placement;
pub mod process;
pub mod serve;
pub mod served;
pub mod serveturn;
pub mod soak;
pub mod spawn;
pub mod turn;
pub mod wholeturn;

/// One measured figure.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub name: String,
    pub iterations: usize,
    pub median_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub min_us: f64,
}

impl Figure {
    /// Summarizes samples (each one operation).
    pub fn from_samples(name: &str, mut samples: Vec<Duration>) -> Self {
        samples.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let n = samples.len().max(1);
        let at = |q: f64| {
            samples
                .get(((n as f64 - 1.0) * q).round() as usize)
                .copied()
                .unwrap_or_default()
        };
        Self {
            name: name.to_owned(),
            iterations: samples.len(),
            median_us: us(at(0.5)),
            p90_us: us(at(0.9)),
            p99_us: us(at(0.99)),
            min_us: us(samples.first().copied().unwrap_or_default()),
        }
    }

    pub fn line(&self) -> String {
        format!(
            "{:<58} median {:>10.1} µs   p99 {:>10.1} µs   min {:>9.1} µs   (n={})",
            self.name, self.median_us, self.p99_us, self.min_us, self.iterations
        )
    }
}

/// The child side of the floor: echoes each NDJSON request as a response,
/// with plain blocking std I/O. Entered as `sharedos-bench __bench-echo`.
pub fn echo_child() -> i32 {
    use std::os::fd::AsFd;
    // Our own buffer over fd 0, so that "nothing more read yet" is visible.
    let Ok(fd) = std::io::stdin().as_fd().try_clone_to_owned() else {
        return 1;
    };
    let mut input = BufReader::new(std::fs::File::from(fd));
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut line = String::new();
    loop {
        line.clear();
        match input.read_line(&mut line) {
            Ok(0) => return 0,
            Ok(_) => {}
            Err(_) => return 1,
        }
        let Ok(req) = serde_json::from_str::<FloorRequest<'_>>(&line) else {
            return 1;
        };
        let resp = FloorResponse {
            jsonrpc: "2.0",
            id: req.id,
            result: req.params,
        };
        if serde_json::to_writer(&mut out, &resp).is_err() || out.write_all(b"\n").is_err() {
            return 1;
        }
        // Answers to requests already read are written in one go: a floor
        // with as few syscalls as the host side may use.
        if input.buffer().is_empty() && out.flush().is_err() {
            return 1;
        }
    }
}

/// A request of the floor, typed: its params are passed through unparsed.
#[derive(serde::Serialize, serde::Deserialize)]
struct FloorRequest<'a> {
    jsonrpc: &'a str,
    id: u64,
    method: &'a str,
    #[serde(borrow)]
    params: &'a serde_json::value::RawValue,
}

/// The floor's answer: the request's params as its result.
#[derive(serde::Serialize, serde::Deserialize)]
struct FloorResponse<'a> {
    jsonrpc: &'a str,
    id: u64,
    #[serde(borrow)]
    result: &'a serde_json::value::RawValue,
}

/// (a) The floor: a raw NDJSON request/response round trip between two
/// processes over pipes, typed serde_json on both sides, one buffered line
/// and one `write` per message, blocking I/O.
pub fn ndjson_floor(exe: &std::path::Path, iterations: usize) -> std::io::Result<Figure> {
    let mut child = placement::command(exe, &["__bench-echo"])
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| std::io::Error::other("no stdin"))?;
    let mut stdout = BufReader::new(
        child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?,
    );
    let mut samples = Vec::with_capacity(iterations);
    let mut line = String::new();
    let mut request = Vec::with_capacity(256);
    let params = serde_json::value::RawValue::from_string(
        r#"{"turnId":"t-1","call":{"id":"c","tool":"bench.noop","arguments":{}}}"#.to_owned(),
    )
    .map_err(std::io::Error::other)?;
    let warmup = iterations / 10 + 10;
    for i in 0..(iterations + warmup) {
        let t = Instant::now();
        // One buffered line, one write: the best simple client.
        request.clear();
        let req = FloorRequest {
            jsonrpc: "2.0",
            id: i as u64,
            method: "host/invokeTool",
            params: &params,
        };
        serde_json::to_writer(&mut request, &req).map_err(std::io::Error::other)?;
        request.push(b'\n');
        stdin.write_all(&request)?;
        line.clear();
        stdout.read_line(&mut line)?;
        let answer: FloorResponse<'_> =
            serde_json::from_str(&line).map_err(std::io::Error::other)?;
        if answer.id != i as u64 {
            return Err(std::io::Error::other(format!(
                "answer {} to request {i}",
                answer.id
            )));
        }
        if i >= warmup {
            samples.push(t.elapsed());
        }
    }
    drop(stdin);
    let _ = child.wait();
    Ok(Figure::from_samples(
        "(a) raw NDJSON round trip, two processes (floor)",
        samples,
    ))
}

/// Prints a figure, or the reason it could not be measured.
fn show(result: Result<Figure, String>, failed: &mut bool) -> Option<Figure> {
    match result {
        Ok(f) => {
            println!("{}", f.line());
            Some(f)
        }
        Err(e) => {
            println!("    (not measured: {e})");
            *failed = true;
            None
        }
    }
}

/// One part of `sharedos-bench` (`--only`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Only {
    /// A zero-call turn, stage by stage, in every mode.
    Turns,
    /// Sequential and concurrent tool calls against their floors.
    Calls,
    /// The envelope's concurrent tool calls alone (64 in flight, no
    /// floor): for counting the host's own work per call, e.g. `perf stat
    /// -i -e instructions:u`, which counts the host's main thread (where
    /// the single-threaded runtime serves the calls) and not the plugin.
    Inflight,
    /// Spawn until `initialize` in every sandbox mode against bwrap, the
    /// layer costs and the stage timings.
    Spawn,
    /// The MCP harness: execute() to the first tools/list, and an MCP tool
    /// call against an in-process plugin's.
    Harness,
    /// A session's next turn on its parked process (session affinity)
    /// against a fresh prepared sandbox and the in-process floor.
    Affinity,
    /// A whole zero-call `sharedos run`, direct and sandboxed, against the
    /// plugin binary alone and bwrap launching it, with its stages.
    WholeTurn,
    /// Runs admitted at speed through real `sharedos serve` hosts, and
    /// their events' latency to SSE observers on the same and another host
    /// (`--runs`, `--store`).
    Serve,
    /// The durable path through a real `sharedos run` (fsync'd JSONL
    /// audit, `files.read`), sequential and 64 in flight, direct and
    /// sandboxed, against a bare append + fsync on the same disk.
    Durable,
    /// A zero-call run through a real `sharedos serve` on a prepared
    /// sandbox, end to end over its API, against an in-process turn plus
    /// one raw round trip.
    ServeTurn,
    /// Every engine in one run: bwrap (the floor), the namespace sandbox
    /// cold and prepared, gVisor cold and prepared, the microVM cold and
    /// warm: launch to `initialize` answered and to a zero-call turn's
    /// end, the idle plugin tree's memory, and issue 30's goals.
    Engines,
}

/// Issue 15's figures alone.
async fn run_only(exe: &std::path::Path, iterations: usize, only: Only) -> i32 {
    let mut failed = false;
    match only {
        Only::Turns => {
            match turn::zero_call_turns(exe, (iterations / 20).clamp(20, 200)).await {
                Ok(figures) => turn::print(&figures),
                Err(e) => {
                    println!("    (zero-call turns not measured: {e})");
                    failed = true;
                }
            }
            match turn::kill_many_direct(exe, 500) {
                Ok(d) => println!(
                    "    killing and reaping 500 unsandboxed plugins: {:.1} ms",
                    d.as_secs_f64() * 1e3
                ),
                Err(e) => {
                    println!("    (killing 500 plugins not measured: {e})");
                    failed = true;
                }
            }
        }
        Only::Calls => {
            failed |= !calls::print_placed(exe, iterations, (iterations / 600).clamp(1, 5)).await;
        }
        Only::Inflight => {
            failed |= !calls::print_envelope(exe, 64, (iterations / 40).clamp(1, 50)).await;
        }
        Only::Spawn => {
            let spawns = (iterations / 20).clamp(20, 200);
            failed |= spawn_figures(exe, spawns).await;
        }
        Only::WholeTurn => {
            failed |= !wholeturn::print((iterations / 20).clamp(1, 200)).await;
        }
        Only::Affinity => {
            failed |= !affinity::print(exe, (iterations / 20).clamp(20, 200)).await;
        }
        Only::Serve => {
            let stores = [served::Store::Sqlite, served::Store::Postgres];
            failed |= !serve::run(exe, 200, &stores).await;
        }
        Only::Durable => {
            let sequential = iterations.clamp(20, 3000) as u64;
            let in_flight = (iterations as u64 * 2).clamp(200, 4_000);
            let exe = exe.to_path_buf();
            failed |=
                !tokio::task::spawn_blocking(move || durable::print(&exe, sequential, in_flight))
                    .await
                    .unwrap_or(false);
        }
        Only::Engines => {
            let n = (iterations / 20).clamp(3, 200);
            let vm_cold = (n / 4).clamp(3, 10);
            println!(
                "== The engines in one run ({n} interleaved rounds, the microVM cold {vm_cold}; 2 rounds discarded first, the microVM cold 1)"
            );
            let exe = exe.to_path_buf();
            failed |= !tokio::task::spawn_blocking(move || engines::run(&exe, n, vm_cold))
                .await
                .unwrap_or(false);
        }
        Only::ServeTurn => {
            failed |= !serveturn::print(exe, (iterations / 20).clamp(5, 200)).await;
        }
        Only::Harness => {
            failed |= !harness::print(
                exe,
                (iterations / 100).clamp(5, 50),
                iterations.clamp(100, 2000),
            )
            .await;
        }
    }
    i32::from(failed)
}

/// `sharedos-bench`: every figure, printed with its ratio to the baseline
/// measured in the same run.
pub async fn run(iterations: usize, only: Option<Only>) -> i32 {
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("sharedos-bench: cannot find its own binary: {e}");
            return 2;
        }
    };
    if let Some(only) = only {
        return run_only(&exe, iterations, only).await;
    }
    let mut failed = false;
    let spawns = (iterations / 20).clamp(20, 200);
    println!("sharedos-bench: {iterations} iterations per round trip, {spawns} per spawn\n");
    let inproc = protocol_and_envelope(&exe, iterations, &mut failed).await;
    println!("\n== Concurrent tool calls from one plugin (issue 15)");
    failed |= !calls::print(&exe, 64, 5).await;
    emit_rates(&exe, iterations).await;

    println!("\n== Per-turn fixed cost, stage by stage (issue 15), interleaved");
    match turn::zero_call_turns(&exe, spawns).await {
        Ok(figures) => turn::print(&figures),
        Err(e) => {
            println!("    (zero-call turns not measured: {e})");
            failed = true;
        }
    }
    envelope_and_deadline(&exe, iterations, inproc.as_ref(), &mut failed).await;
    kernel_figures(iterations).await;
    failed |= spawn_figures(&exe, spawns).await;
    if failed { 1 } else { 0 }
}

/// (a) the NDJSON floor, (b) a tool call in process, (c) and (c') out of
/// process, direct and sandboxed, and their ratios; returns (b).
async fn protocol_and_envelope(
    exe: &std::path::Path,
    iterations: usize,
    failed: &mut bool,
) -> Option<Figure> {
    println!("== Protocol and envelope (issue: foundation)");
    let floor = tokio::task::spawn_blocking({
        let exe = exe.to_path_buf();
        move || ndjson_floor(&exe, iterations).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r);
    let floor = show(floor, failed);
    let inproc = show(envelope::inprocess_calls(iterations).await, failed);
    let direct = process::process_calls(
        exe,
        std::sync::Arc::new(sharedos_host::process::DirectLauncher),
        "(c) tool call through the envelope, plugin out of process",
        iterations,
    )
    .await;
    let outproc = show(direct, failed);
    let sandboxed = process::process_calls(
        exe,
        process::sandbox_launcher(exe),
        "(c') the same, plugin in the full sandbox",
        iterations,
    )
    .await;
    let outsand = show(sandboxed, failed);
    if let (Some(c), Some(a)) = (&outproc, &floor) {
        println!("{}", process::ratio_line("(c) / (a), target ≤ 2.5×", c, a));
    }
    if let (Some(c), Some(a)) = (&outsand, &floor) {
        println!("{}", process::ratio_line("(c') / (a)", c, a));
    }
    if let (Some(c), Some(b)) = (&outproc, &inproc) {
        println!("{}", process::ratio_line("(c) / (b)", c, b));
    }
    inproc
}

/// (e) and (e'): emits through the envelope, in and out of process.
async fn emit_rates(exe: &std::path::Path, iterations: usize) {
    match envelope::inprocess_emits(iterations * 50).await {
        Ok(rate) => println!(
            "{:<58} {:>12.0} emits/s",
            "(e) emits through the envelope, plugin in process", rate
        ),
        Err(e) => println!("    (emits in process not measured: {e})"),
    }
    match process::process_emits(exe, 9_000).await {
        Ok(rate) => println!(
            "{:<58} {:>12.0} emits/s",
            "(e') the same, plugin out of process (9 000 emits, host side)", rate
        ),
        Err(e) => println!("    (emits out of process not measured: {e})"),
    }
}

/// The envelope's overhead over a direct kernel call (against (b)), and
/// the time from the deadline to the result, direct and sandboxed.
async fn envelope_and_deadline(
    exe: &std::path::Path,
    iterations: usize,
    inproc: Option<&Figure>,
    failed: &mut bool,
) {
    println!("\n== Envelope overhead and the deadline (issue: envelope)");
    let kernel = show(envelope::kernel_direct(iterations).await, failed);
    if let (Some(b), Some(k)) = (inproc, &kernel) {
        println!(
            "    envelope overhead per call: {:.1} µs median ({:.2}× the direct kernel call)",
            b.median_us - k.median_us,
            b.median_us / k.median_us.max(1e-9)
        );
    }
    let runs = 30;
    match process::deadline_to_result(
        exe,
        std::sync::Arc::new(sharedos_host::process::DirectLauncher),
        50,
        runs,
        true,
    )
    .await
    {
        Ok((r, g)) => {
            println!("{}  [direct launch]", r.line());
            if let Some(g) = g {
                println!("{}", g.line());
            }
        }
        Err(e) => {
            println!("    (deadline, direct launch, not measured: {e})");
            *failed = true;
        }
    }
    match process::deadline_to_result(exe, process::sandbox_launcher(exe), 50, runs, false).await {
        Ok((r, _)) => println!("{}  [full sandbox]", r.line()),
        Err(e) => {
            println!("    (deadline, sandboxed, not measured: {e})");
            *failed = true;
        }
    }
}

/// The kernel's own figures (bench::kernel).
async fn kernel_figures(iterations: usize) {
    println!("\n== Kernel (issue: kernel)");
    println!(
        "authorization decision: {}",
        kernel::authorization_decision(iterations * 10).await
    );
    let dir = tempfile::tempdir();
    match dir {
        Ok(dir) => {
            println!(
                "audited tool call (JSONL + fsync): {}",
                kernel::audited_tool_call(dir.path(), 200).await
            );
            println!(
                "100 file tool calls: {}",
                kernel::file_tool_calls(dir.path()).await
            );
        }
        Err(e) => println!("    (kernel file benches not measured: {e})"),
    }
}

/// Section (d): spawn until `initialize` in every sandbox mode, interleaved
/// with bwrap in the same rounds, then the sandbox crate's layer costs and
/// stage timings (`--only spawn` runs this alone).
/// True when a figure could not be measured.
async fn spawn_figures(exe: &std::path::Path, spawns: usize) -> bool {
    let exe = exe.to_path_buf();
    let mut failed = false;
    println!("\n== Sandbox (issue: sandbox)");
    println!("    (d) interleaved: each round spawns once with every launcher in turn");
    let configs = spawn_configs(&exe);
    let figures: Vec<Option<Figure>> =
        process::spawn_to_initialize_interleaved(&exe, &configs, spawns)
            .await
            .into_iter()
            .map(|f| show(f, &mut failed))
            .collect();
    drop(configs);
    let fig = |i: usize| figures.get(i).and_then(|f| f.as_ref());
    let (bare, echo_warm, echo_sandbox, echo_forked, bw) = (fig(0), fig(1), fig(2), fig(3), fig(4));
    let echo_warm_b2b = show(
        process::spawn_to_initialize_warm_back_to_back(
            &exe,
            "(d) prepared ahead, spawns back to back (may wait for the replacement)",
            spawns,
        )
        .await,
        &mut failed,
    );
    let spawned = Spawned {
        bare,
        echo_warm,
        echo_sandbox,
        echo_forked,
        echo_warm_b2b: echo_warm_b2b.as_ref(),
    };
    print_spawn_ratios(&spawned, bw);
    let echo_sandbox = echo_sandbox.cloned();
    resident_and_layers(&exe, spawns, echo_sandbox, &mut failed).await;
    failed
}

/// The launchers (d) interleaves: none, prepared ahead, built in the
/// turn's path, forked by the fork server, and bwrap where installed.
fn spawn_configs(exe: &std::path::Path) -> Vec<process::SpawnConfig> {
    let mut configs = vec![
        process::SpawnConfig::new(
            "(d) spawn until initialize, echo, no sandbox (interleaved)",
            std::sync::Arc::new(sharedos_host::process::DirectLauncher),
        ),
        process::SpawnConfig::warm("(d) full sandbox prepared ahead (warm = 1)", exe),
        process::SpawnConfig::new(
            "(d) full sandbox built in the turn's path",
            process::sandbox_launcher(exe),
        ),
        process::SpawnConfig::new(
            "(d) the same, helper forked by the fork server",
            process::sandbox_launcher_fork_server(exe),
        ),
    ];
    if let Some(bwrap) = process::find_bwrap() {
        configs.push(process::SpawnConfig::new(
            "(d) bwrap --unshare-all",
            std::sync::Arc::new(process::BwrapLauncher { bwrap }),
        ));
    }
    configs
}

/// (d)'s figures the ratios compare.
struct Spawned<'a> {
    bare: Option<&'a Figure>,
    echo_warm: Option<&'a Figure>,
    echo_sandbox: Option<&'a Figure>,
    echo_forked: Option<&'a Figure>,
    echo_warm_b2b: Option<&'a Figure>,
}

/// Each launcher against bwrap (`bw`) and against no sandbox.
fn print_spawn_ratios(d: &Spawned<'_>, bw: Option<&Figure>) {
    let Spawned {
        bare,
        echo_warm,
        echo_sandbox,
        echo_forked,
        echo_warm_b2b,
    } = *d;
    match bw {
        Some(b) => {
            for (name, f) in [
                (
                    "full sandbox prepared ahead (warm = 1) / bwrap, target ≤ 0.4×",
                    echo_warm,
                ),
                (
                    "full sandbox built in the turn's path / bwrap",
                    echo_sandbox,
                ),
                ("the same, fork server / bwrap", echo_forked),
                ("no sandbox / bwrap", bare),
                (
                    "prepared ahead, back to back / bwrap (not interleaved)",
                    echo_warm_b2b,
                ),
            ] {
                if let Some(f) = f {
                    println!("{}", process::ratio_line(name, f, b));
                }
            }
        }
        None => println!("    (bwrap not installed: `apt-get install bubblewrap` to compare)"),
    }
    for (name, f) in [
        ("full sandbox prepared ahead / no sandbox", echo_warm),
        (
            "full sandbox built in the turn's path / no sandbox",
            echo_sandbox,
        ),
    ] {
        if let (Some(f), Some(d)) = (f, bare) {
            println!("{}", process::ratio_line(name, f, d));
        }
    }
}

/// A spawn with the host holding 1 GiB resident against `echo_sandbox`,
/// then the sandbox's cost layer by layer.
async fn resident_and_layers(
    exe: &std::path::Path,
    spawns: usize,
    echo_sandbox: Option<Figure>,
    failed: &mut bool,
) {
    let resident = process::hold_resident(1 << 30);
    let big = show(
        process::spawn_to_initialize(
            process::sandbox_launcher(exe),
            exe,
            "(d) full sandbox, host holding 1 GiB resident",
            spawns,
        )
        .await,
        failed,
    );
    drop(resident);
    if let (Some(b), Some(s)) = (&big, &echo_sandbox) {
        println!(
            "{}",
            process::ratio_line("1 GiB host / small host, target ≤ 1.2×", b, s)
        );
    }
    match tokio::task::spawn_blocking(move || spawn::bench_current_exe(spawns)).await {
        Ok(Ok(report)) => println!(
            "sandbox cost by layer: {}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        ),
        Ok(Err(e)) => println!("    (sandbox layers not measured: {e})"),
        Err(e) => println!("    (sandbox layers not measured: {e})"),
    }
}
