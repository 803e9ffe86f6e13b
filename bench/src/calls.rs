//! Concurrent tool calls from one plugin (issue 15): calls per second with
//! `inflight` calls outstanding, through the whole envelope with the plugin
//! out of process, against a raw NDJSON pipe pair with the same
//! concurrency, interleaved in one run; and the host's CPU per call.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};

use super::fixture;
use super::process::timing_executor;
use sharedos_host::executor::ExecuteOptions;
use sharedos_host::process::DirectLauncher;

/// The calls of one envelope turn: under the fixture's tool call budget.
const CALLS_PER_TURN: u64 = 9_000;

/// CPU time in microseconds: this process's (every thread, from
/// `CLOCK_PROCESS_CPUTIME_ID`, which counts in nanoseconds where
/// `getrusage` and `/proc/self/stat` count 10 ms ticks on this kernel),
/// and that of its children once reaped (the plugins: `getrusage`, in
/// ticks, over many calls).
fn cpu_us() -> Option<(f64, f64)> {
    use nix::sys::resource::{UsageWho, getrusage};
    use nix::time::{ClockId, clock_gettime};
    let own = clock_gettime(ClockId::CLOCK_PROCESS_CPUTIME_ID).ok()?;
    let own = own.tv_sec() as f64 * 1e6 + own.tv_nsec() as f64 / 1e3;
    let u = getrusage(UsageWho::RUSAGE_CHILDREN).ok()?;
    let (a, b) = (u.user_time(), u.system_time());
    let children = (a.tv_sec() + b.tv_sec()) as f64 * 1e6 + (a.tv_usec() + b.tv_usec()) as f64;
    Some((own, children))
}

/// What one measured round of [`envelope_parallel`] gives: calls per
/// second, and the host's and the plugin's CPU µs per call.
#[derive(Debug, Clone, Copy)]
pub struct ParallelFigure {
    pub rate: f64,
    pub host_cpu_us: f64,
    pub plugin_cpu_us: f64,
}

/// Calls per second and host and plugin CPU µs per call, `rounds` turns of
/// `CALLS_PER_TURN` calls with `inflight` outstanding, the plugin a direct
/// child (the SDK's `serve`, the host's peer and `ProcessRuntime`). The
/// plugin's CPU is counted once its process is reaped.
pub async fn envelope_parallel(
    exe: &Path,
    inflight: usize,
    rounds: usize,
) -> Result<ParallelFigure, String> {
    let executor = timing_executor(exe, Arc::new(DirectLauncher))?;
    let (mut calls, mut secs, mut cpu, mut plugin_cpu) = (0u64, 0f64, 0f64, 0f64);
    for round in 0..rounds + 1 {
        settle().await;
        let before = cpu_us();
        let result = executor
            .execute(
                fixture::request(
                    &format!("bench-parallel-{round}"),
                    fixture::parallel(CALLS_PER_TURN, inflight as u64),
                ),
                ExecuteOptions::default(),
            )
            .await
            .map_err(|e| e.to_string())?;
        let host_after = cpu_us();
        settle().await;
        let after = cpu_us();
        if result.status != sharedos_protocol::ExecutionStatus::Succeeded {
            return Err(format!(
                "the parallel turn ended {} {:?}",
                result.status.as_str(),
                result.code()
            ));
        }
        let ns = result
            .output
            .as_ref()
            .and_then(|o| o.get("parallelNs"))
            .and_then(Value::as_u64)
            .ok_or("the bench plugin returned no parallelNs")?;
        // The first turn warms up and is not kept.
        if round > 0 {
            calls += CALLS_PER_TURN;
            secs += ns as f64 / 1e9;
            cpu += host_after
                .zip(before)
                .map(|(a, b)| a.0 - b.0)
                .unwrap_or(f64::NAN);
            plugin_cpu += after
                .zip(before)
                .map(|(a, b)| a.1 - b.1)
                .unwrap_or(f64::NAN);
        }
    }
    let per_call = |us: f64| us / calls.max(1) as f64;
    Ok(ParallelFigure {
        rate: calls as f64 / secs.max(1e-9),
        host_cpu_us: per_call(cpu),
        plugin_cpu_us: per_call(plugin_cpu),
    })
}

/// Waits until every finished turn's plugin is reaped (its CPU time is
/// then in this process's children's).
async fn settle() {
    let _ = tokio::task::spawn_blocking(sharedos_host::process::settle_kills).await;
}

/// The floor: the raw NDJSON pipe pair of (a) (`sharedos-bench __bench-echo`,
/// serde_json, blocking I/O on both ends) with `inflight` requests
/// outstanding. Returns calls per second.
pub fn ndjson_parallel(exe: &Path, n: usize, inflight: usize) -> std::io::Result<f64> {
    let mut child = super::placement::command(exe, &["__bench-echo"]);
    child.env_clear();
    pipe_parallel(child, &[], n, inflight, |i, out| {
        writeln!(
            out,
            r#"{{"jsonrpc":"2.0","id":{i},"method":"host/invokeTool","params":{{"turnId":"t-1","call":{{"id":"c","tool":"bench.noop","arguments":{{}}}}}}}}"#
        )
    })
}

/// The environment variable naming the rmcp echo server
/// (`bench/rmcp-echo`, built on demand: docs/BENCHMARKS.md).
pub const RMCP_ECHO_ENV: &str = "SHAREDOS_BENCH_RMCP_ECHO";

/// The rmcp (official Rust MCP SDK) stdio server of `bench/rmcp-echo`,
/// driven like the floor: an MCP `initialize` and `notifications/initialized`,
/// then `n` `tools/call` of its `echo` tool, `inflight` outstanding, from
/// the same blocking client. `flavor` is its arguments (runtime and
/// transport). Returns calls per second.
pub fn rmcp_parallel(
    server: &Path,
    flavor: &[&str],
    n: usize,
    inflight: usize,
) -> std::io::Result<f64> {
    let mut child = super::placement::command(server, flavor);
    child.env_clear();
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "sharedos-bench", "version": "1"}}})
    .to_string();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string();
    let preamble = [(initialize.as_str(), true), (initialized.as_str(), false)];
    pipe_parallel(child, &preamble, n, inflight, |i, out| {
        writeln!(
            out,
            r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"c"}}}}}}"#,
            i + 1
        )
    })
}

/// An answer as the client checks it: a result is there. Its contents are
/// not parsed into a tree (the envelope's SDK does not build one for an
/// answer it only hands on either), so the client side costs each server
/// the same little.
#[derive(serde::Deserialize)]
struct Answer {
    /// Whether the answer has a `result` (`null` included).
    #[serde(default, deserialize_with = "present")]
    result: bool,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    <serde::de::IgnoredAny as serde::Deserialize>::deserialize(d).map(|_| true)
}

/// Drives one NDJSON server over its stdio with blocking I/O: writes the
/// `preamble` (waiting for an answer to each line marked `true`), then `n`
/// requests with `inflight` outstanding (one thread writes each request
/// straight into its buffer, flushed when no more may go out, while
/// another reads the answers). Every answer must be a result. Returns
/// calls per second.
fn pipe_parallel(
    mut command: Command,
    preamble: &[(&str, bool)],
    n: usize,
    inflight: usize,
    request: impl Fn(usize, &mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<f64> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let no = |what: &str| std::io::Error::other(format!("no {what}"));
    let mut stdin = std::io::BufWriter::new(child.stdin.take().ok_or_else(|| no("stdin"))?);
    let mut stdout = BufReader::new(child.stdout.take().ok_or_else(|| no("stdout"))?);
    let answered = |line: &str| -> std::io::Result<()> {
        let answer: Answer = serde_json::from_str(line).map_err(std::io::Error::other)?;
        if answer.result {
            Ok(())
        } else {
            Err(std::io::Error::other(format!(
                "the server answered without a result: {}",
                line.trim_end()
            )))
        }
    };
    let mut line = String::new();
    for (sent, wait) in preamble {
        writeln!(stdin, "{sent}")?;
        stdin.flush()?;
        if *wait {
            line.clear();
            stdout.read_line(&mut line)?;
            answered(&line)?;
        }
    }
    let (tokens, permits) = std::sync::mpsc::sync_channel::<()>(inflight);
    for _ in 0..inflight {
        let _ = tokens.send(());
    }
    let start = Instant::now();
    let reader = std::thread::spawn(move || -> std::io::Result<()> {
        let mut line = String::new();
        for _ in 0..n {
            line.clear();
            if stdout.read_line(&mut line)? == 0 {
                return Err(std::io::Error::other("the server closed its stdout"));
            }
            answered(&line)?;
            let _ = tokens.send(());
        }
        Ok(())
    });
    for i in 0..n {
        if permits.try_recv().is_err() {
            stdin.flush()?;
            if permits.recv().is_err() {
                // The reader stopped early: its error is the one to report.
                break;
            }
        }
        request(i, &mut stdin)?;
    }
    stdin.flush()?;
    reader
        .join()
        .map_err(|_| std::io::Error::other("the reader panicked"))??;
    let rate = n as f64 / start.elapsed().as_secs_f64().max(1e-9);
    drop(stdin);
    let _ = child.wait();
    Ok(rate)
}

/// rmcp's server flavors the bench tries (runtime, transport); its best
/// is the one compared.
const RMCP_FLAVORS: &[&[&str]] = &[
    &["current", "pipes"],
    &["multi", "pipes"],
    &["multi", "stdio"],
];

/// Runs a blocking measurement off the async runtime.
async fn blocking(
    f: impl FnOnce() -> std::io::Result<f64> + Send + 'static,
) -> Result<f64, String> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Prints the envelope's rate and CPU per call alone, the median of
/// `rounds` rounds.
pub async fn print_envelope(exe: &Path, inflight: usize, rounds: usize) -> bool {
    match envelope_parallel(exe, inflight, rounds).await {
        Ok(r) => {
            println!(
                "{:<58} {:>12.0} calls/s   host CPU {:.1} µs, plugin CPU {:.1} µs a call",
                format!("{inflight} in flight, through the envelope ({rounds} rounds)"),
                r.rate,
                r.host_cpu_us,
                r.plugin_cpu_us
            );
            println!("    calls measured: {}", CALLS_PER_TURN * rounds as u64);
            true
        }
        Err(e) => {
            println!("    (envelope calls in flight not measured: {e})");
            false
        }
    }
}

/// Prints the envelope's rate, the raw pair's and (when [`RMCP_ECHO_ENV`]
/// names the server) each rmcp flavor's, interleaved over `rounds`, and
/// their ratios.
pub async fn print(exe: &Path, inflight: usize, rounds: usize) -> bool {
    let rmcp = std::env::var_os(RMCP_ECHO_ENV).map(std::path::PathBuf::from);
    let (mut env, mut raw) = (Vec::new(), Vec::new());
    let mut flavors: Vec<Vec<f64>> = vec![Vec::new(); RMCP_FLAVORS.len()];
    let n = CALLS_PER_TURN as usize;
    for _ in 0..rounds {
        match envelope_parallel(exe, inflight, 1).await {
            Ok(r) => env.push(r),
            Err(e) => {
                println!("    (envelope calls in flight not measured: {e})");
                return false;
            }
        }
        let e2 = exe.to_path_buf();
        match blocking(move || ndjson_parallel(&e2, n, inflight)).await {
            Ok(r) => raw.push(r),
            Err(e) => {
                println!("    (raw pipe pair not measured: {e})");
                return false;
            }
        }
        let Some(server) = &rmcp else { continue };
        for (flavor, rates) in RMCP_FLAVORS.iter().zip(flavors.iter_mut()) {
            let server = server.clone();
            match blocking(move || rmcp_parallel(&server, flavor, n, inflight)).await {
                Ok(r) => rates.push(r),
                Err(e) => {
                    println!("    (rmcp {} not measured: {e})", flavor.join(" "));
                    return false;
                }
            }
        }
    }
    let cpu = median(env.iter().map(|r| r.host_cpu_us).collect());
    let plugin_cpu = median(env.iter().map(|r| r.plugin_cpu_us).collect());
    let env = median(env.into_iter().map(|r| r.rate).collect());
    let raw = median(raw);
    println!(
        "{:<58} {:>12.0} calls/s   host CPU {:.1} µs, plugin CPU {:.1} µs a call",
        format!("{inflight} in flight, through the envelope, plugin out of process"),
        env,
        cpu,
        plugin_cpu
    );
    println!(
        "{:<58} {:>12.0} calls/s",
        format!("{inflight} in flight, raw NDJSON pipe pair (floor)"),
        raw
    );
    println!(
        "    {:<54} {:>6.2}×   (medians of {rounds} interleaved rounds of {CALLS_PER_TURN} calls)",
        "envelope / raw pipe pair",
        env / raw.max(1e-9)
    );
    if rmcp.is_none() {
        println!("    (rmcp not measured: set {RMCP_ECHO_ENV} to bench/rmcp-echo's binary)");
        return true;
    }
    let mut best = 0f64;
    for (flavor, rates) in RMCP_FLAVORS.iter().zip(flavors) {
        let rate = median(rates);
        best = best.max(rate);
        println!(
            "{:<58} {:>12.0} calls/s",
            format!(
                "{inflight} in flight, rmcp stdio server ({})",
                flavor.join(", ")
            ),
            rate
        );
    }
    println!(
        "    {:<54} {:>6.2}×   (target ≥ 2×)",
        "envelope / rmcp's best",
        env / best.max(1e-9)
    );
    true
}

/// The raw pair batched (the floor of many requests per write): `batch`
/// requests written with one `write`, then their `batch` answers read,
/// and again, `n` calls in all. Returns calls per second.
pub fn ndjson_batched(exe: &Path, n: usize, batch: usize) -> std::io::Result<f64> {
    let mut child = super::placement::command(exe, &["__bench-echo"])
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let no = |what: &str| std::io::Error::other(format!("no {what}"));
    let mut stdin = child.stdin.take().ok_or_else(|| no("stdin"))?;
    let mut stdout = BufReader::new(child.stdout.take().ok_or_else(|| no("stdout"))?);
    let batch = batch.max(1);
    let mut buffer = Vec::with_capacity(batch * 160);
    let mut line = String::new();
    let rounds = n.div_ceil(batch);
    let start = Instant::now();
    for round in 0..rounds {
        buffer.clear();
        for i in 0..batch {
            let id = round * batch + i;
            writeln!(
                buffer,
                r#"{{"jsonrpc":"2.0","id":{id},"method":"host/invokeTool","params":{{"turnId":"t-1","call":{{"id":"c","tool":"bench.noop","arguments":{{}}}}}}}}"#
            )?;
        }
        stdin.write_all(&buffer)?;
        for _ in 0..batch {
            line.clear();
            if stdout.read_line(&mut line)? == 0 {
                return Err(std::io::Error::other("the echo closed its stdout"));
            }
            let answer: Answer = serde_json::from_str(&line).map_err(std::io::Error::other)?;
            if !answer.result {
                return Err(std::io::Error::other("an answer without a result"));
            }
        }
    }
    let rate = (rounds * batch) as f64 / start.elapsed().as_secs_f64().max(1e-9);
    drop(stdin);
    let _ = child.wait();
    Ok(rate)
}

/// rmcp's own client driving its own server (`rmcp-echo client`, started
/// by this process, the server through [`super::placement::peer`]): its
/// sequential median and minimum (µs) over `sequential` calls and its rate
/// with `inflight` outstanding over `n` calls.
pub fn rmcp_own_client(
    echo: &Path,
    flavor: &[&str],
    sequential: usize,
    n: usize,
    inflight: usize,
) -> std::io::Result<(f64, f64, f64)> {
    let (server, server_args) = super::placement::peer(echo, flavor);
    let out = Command::new(echo)
        .arg("client")
        .args([sequential, n, inflight].map(|v| v.to_string()))
        .arg(server)
        .args(server_args)
        .env_clear()
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!(
            "rmcp-echo client exited {}",
            out.status
        )));
    }
    let v: Value = serde_json::from_slice(&out.stdout).map_err(std::io::Error::other)?;
    let get = |k: &str| {
        v.get(k)
            .and_then(Value::as_f64)
            .ok_or_else(|| std::io::Error::other(format!("rmcp-echo client printed no {k}")))
    };
    Ok((
        get("sequentialMedianUs")?,
        get("sequentialMinUs")?,
        get("rate")?,
    ))
}

/// One round of [`print_placed`]'s calls in flight.
struct Round {
    envelope: ParallelFigure,
    raw: f64,
    batched: f64,
    /// rmcp's server driven by the raw client, each of [`RMCP_FLAVORS`].
    rmcp_raw: Vec<f64>,
    /// rmcp's own client and server, each of [`RMCP_FLAVORS`].
    rmcp_own: Vec<f64>,
}

async fn one_round(exe: &Path, rmcp: Option<&Path>, inflight: usize) -> Result<Round, String> {
    let n = CALLS_PER_TURN as usize;
    let envelope = envelope_parallel(exe, inflight, 1).await?;
    let e2 = exe.to_path_buf();
    let raw = blocking(move || ndjson_parallel(&e2, n, inflight)).await?;
    let e2 = exe.to_path_buf();
    let batched = blocking(move || ndjson_batched(&e2, n, inflight)).await?;
    let (mut rmcp_raw, mut rmcp_own) = (Vec::new(), Vec::new());
    if let Some(server) = rmcp {
        for flavor in RMCP_FLAVORS {
            let s = server.to_path_buf();
            let r = blocking(move || rmcp_parallel(&s, flavor, n, inflight))
                .await
                .map_err(|e| format!("rmcp {} (raw client): {e}", flavor.join(" ")))?;
            rmcp_raw.push(r);
            let s = server.to_path_buf();
            let r = blocking(move || rmcp_own_client(&s, flavor, 0, n, inflight).map(|r| r.2))
                .await
                .map_err(|e| format!("rmcp {} (own client): {e}", flavor.join(" ")))?;
            rmcp_own.push(r);
        }
    }
    Ok(Round {
        envelope,
        raw,
        batched,
        rmcp_raw,
        rmcp_own,
    })
}

/// `--only calls`: in each placement of [`super::placement`], in one run,
/// the sequential floor (a) and the envelope (c) over `iterations` calls,
/// rmcp's own client sequentially, then `rounds` interleaved rounds of 64
/// calls in flight (the envelope, the raw pair, the raw pair batched,
/// rmcp's server driven by the raw client and by its own client), with
/// the ratios per round. `false` when something could not be measured.
pub async fn print_placed(exe: &Path, iterations: usize, rounds: usize) -> bool {
    use super::placement::{Placement, apply};
    let rmcp = std::env::var_os(RMCP_ECHO_ENV).map(std::path::PathBuf::from);
    if rmcp.is_none() {
        println!("    (rmcp not measured: set {RMCP_ECHO_ENV} to bench/rmcp-echo's binary)");
    }
    let mut ok = true;
    for placement in [Placement::Unpinned, Placement::OneVcpu, Placement::Split] {
        println!("\n== Tool calls, {}", placement.label());
        if let Err(e) = apply(placement) {
            println!("    (not measured: {e})");
            ok = false;
            continue;
        }
        ok &= placed(exe, rmcp.as_deref(), iterations, rounds).await;
    }
    let _ = apply(Placement::Unpinned);
    ok
}

async fn placed(exe: &Path, rmcp: Option<&Path>, iterations: usize, rounds: usize) -> bool {
    if !placed_sequential(exe, rmcp, iterations).await {
        return false;
    }
    let inflight = 64;
    let Some(all) = placed_rounds(exe, rmcp, inflight, rounds).await else {
        return false;
    };
    print_inflight(&all, rmcp.is_some(), inflight, rounds);
    true
}

/// The sequential figures of one placement: the raw pair, the envelope and
/// rmcp's own client. False when one could not be measured.
async fn placed_sequential(exe: &Path, rmcp: Option<&Path>, iterations: usize) -> bool {
    let e2 = exe.to_path_buf();
    let floor = match blocking_figure(move || super::ndjson_floor(&e2, iterations)).await {
        Ok(f) => f,
        Err(e) => {
            println!("    (raw pair not measured: {e})");
            return false;
        }
    };
    println!("{}", floor.line());
    let direct = super::process::process_calls(
        exe,
        Arc::new(DirectLauncher),
        "(c) tool call through the envelope, plugin out of process",
        iterations,
    )
    .await;
    match direct {
        Ok(c) => {
            println!("{}", c.line());
            println!(
                "{}",
                super::process::ratio_line(
                    "(c) / (a), goal ≤ 1.3× across vCPUs, ≤ 2× on one",
                    &c,
                    &floor
                )
            );
        }
        Err(e) => {
            println!("    (envelope calls not measured: {e})");
            return false;
        }
    }
    if let Some(server) = rmcp {
        let s = server.to_path_buf();
        let n = iterations;
        match tokio::task::spawn_blocking(move || rmcp_own_client(&s, RMCP_FLAVORS[0], n, 0, 1))
            .await
        {
            Ok(Ok((median, min, _))) => println!(
                "{:<58} median {:>10.1} µs   min {:>9.1} µs   (n={n})",
                "rmcp's own client and server (current, pipes)", median, min
            ),
            Ok(Err(e)) => println!("    (rmcp's own client not measured: {e})"),
            Err(e) => println!("    (rmcp's own client not measured: {e})"),
        }
    }
    true
}

/// `rounds` rounds of `inflight` calls in flight, each printed; `None` when
/// one could not be measured.
async fn placed_rounds(
    exe: &Path,
    rmcp: Option<&Path>,
    inflight: usize,
    rounds: usize,
) -> Option<Vec<Round>> {
    let mut all = Vec::new();
    for round in 0..rounds {
        match one_round(exe, rmcp, inflight).await {
            Ok(r) => {
                let best = |v: &[f64]| v.iter().copied().fold(0f64, f64::max);
                let rmcp_part = if r.rmcp_raw.is_empty() {
                    String::new()
                } else {
                    format!(
                        ", rmcp best {:.0}/s (raw client) {:.0}/s (own client): envelope/rmcp {:.2}×",
                        best(&r.rmcp_raw),
                        best(&r.rmcp_own),
                        r.envelope.rate / best(&r.rmcp_raw).max(1e-9)
                    )
                };
                println!(
                    "    round {}: envelope {:.0}/s, raw {:.0}/s, batched {:.0}/s: envelope/raw {:.2}×{rmcp_part}; host CPU {:.1} µs a call",
                    round + 1,
                    r.envelope.rate,
                    r.raw,
                    r.batched,
                    r.envelope.rate / r.raw.max(1e-9),
                    r.envelope.host_cpu_us
                );
                all.push(r);
            }
            Err(e) => {
                println!("    (calls in flight not measured: {e})");
                return None;
            }
        }
    }
    Some(all)
}

/// The medians of the rounds in flight and the goal's ratio.
fn print_inflight(all: &[Round], with_rmcp: bool, inflight: usize, rounds: usize) {
    let med = |f: &dyn Fn(&Round) -> f64| median(all.iter().map(f).collect());
    let env = med(&|r| r.envelope.rate);
    let raw = med(&|r| r.raw);
    println!(
        "{:<58} {:>12.0} calls/s   host CPU {:.1} µs, plugin CPU {:.1} µs a call",
        format!("{inflight} in flight, through the envelope (median of {rounds})"),
        env,
        med(&|r| r.envelope.host_cpu_us),
        med(&|r| r.envelope.plugin_cpu_us)
    );
    println!(
        "{:<58} {:>12.0} calls/s",
        format!("{inflight} in flight, raw pair"),
        raw
    );
    println!(
        "{:<58} {:>12.0} calls/s",
        format!("{inflight} a batch, raw pair batched (one write a batch)"),
        med(&|r| r.batched)
    );
    if with_rmcp {
        for (i, flavor) in RMCP_FLAVORS.iter().enumerate() {
            println!(
                "{:<58} {:>12.0} calls/s (raw client)   {:>10.0} calls/s (own client)",
                format!("{inflight} in flight, rmcp ({})", flavor.join(", ")),
                med(&|r| r.rmcp_raw.get(i).copied().unwrap_or(f64::NAN)),
                med(&|r| r.rmcp_own.get(i).copied().unwrap_or(f64::NAN)),
            );
        }
    }
    println!(
        "    envelope / raw pair: {:.2}× (medians; goal ≥ 0.5× in every round)",
        env / raw.max(1e-9)
    );
}

/// Runs a blocking measurement that gives a figure off the async runtime.
async fn blocking_figure(
    f: impl FnOnce() -> std::io::Result<super::Figure> + Send + 'static,
) -> Result<super::Figure, String> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}
