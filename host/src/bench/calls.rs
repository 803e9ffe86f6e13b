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
use crate::executor::ExecuteOptions;
use crate::process::DirectLauncher;

/// The calls of one envelope turn: under the fixture's tool call budget.
const CALLS_PER_TURN: u64 = 9_000;

/// This process's CPU time (user + system, every thread) in microseconds,
/// from `/proc/self/stat` (clock ticks, 100 per second).
fn cpu_us() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let mut f = rest.split_whitespace().skip(11);
    let utime: f64 = f.next()?.parse().ok()?;
    let stime: f64 = f.next()?.parse().ok()?;
    Some((utime + stime) * 10_000.0)
}

/// Calls per second and host CPU µs per call, `rounds` turns of
/// `CALLS_PER_TURN` calls with `inflight` outstanding, the plugin a direct
/// child (the SDK's `serve`, the host's peer and `ProcessRuntime`).
pub async fn envelope_parallel(
    exe: &Path,
    inflight: usize,
    rounds: usize,
) -> Result<(f64, f64), String> {
    let executor = timing_executor(exe, Arc::new(DirectLauncher))?;
    let (mut calls, mut secs, mut cpu) = (0u64, 0f64, 0f64);
    for round in 0..rounds + 1 {
        let before = cpu_us();
        let result = executor
            .execute(
                fixture::request(
                    &format!("bench-parallel-{round}"),
                    json!({"parallel": CALLS_PER_TURN, "inflight": inflight}),
                ),
                ExecuteOptions::default(),
            )
            .await
            .map_err(|e| e.to_string())?;
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
            cpu += after.zip(before).map(|(a, b)| a - b).unwrap_or(f64::NAN);
        }
    }
    Ok((calls as f64 / secs.max(1e-9), cpu / calls.max(1) as f64))
}

/// The floor: the raw NDJSON pipe pair of (a) (`sharedos __bench-echo`,
/// serde_json, blocking I/O on both ends) with `inflight` requests
/// outstanding: one thread writes while another reads the answers.
/// Returns calls per second.
pub fn ndjson_parallel(exe: &Path, n: usize, inflight: usize) -> std::io::Result<f64> {
    let mut child = Command::new(exe)
        .arg("__bench-echo")
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let no = |what: &str| std::io::Error::other(format!("no {what}"));
    let mut stdin = std::io::BufWriter::new(child.stdin.take().ok_or_else(|| no("stdin"))?);
    let mut stdout = BufReader::new(child.stdout.take().ok_or_else(|| no("stdout"))?);
    let (tokens, permits) = std::sync::mpsc::sync_channel::<()>(inflight);
    for _ in 0..inflight {
        let _ = tokens.send(());
    }
    let start = Instant::now();
    let reader = std::thread::spawn(move || -> std::io::Result<()> {
        let mut line = String::new();
        for _ in 0..n {
            line.clear();
            stdout.read_line(&mut line)?;
            let _: Value = serde_json::from_str(&line).map_err(std::io::Error::other)?;
            let _ = tokens.send(());
        }
        Ok(())
    });
    for i in 0..n {
        // Requests are written in batches: flushed when no more may go out.
        if permits.try_recv().is_err() {
            stdin.flush()?;
            permits.recv().map_err(std::io::Error::other)?;
        }
        let req = json!({"jsonrpc": "2.0", "id": i, "method": "host/invokeTool",
            "params": {"turnId": "t-1", "call": {"id": "c", "tool": "bench.noop", "arguments": {}}}});
        writeln!(stdin, "{req}")?;
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

/// Prints both rates, interleaved over `rounds`, and their ratio.
pub async fn print(exe: &Path, inflight: usize, rounds: usize) -> bool {
    let (mut env, mut raw) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        match envelope_parallel(exe, inflight, 1).await {
            Ok(r) => env.push(r),
            Err(e) => {
                println!("    (envelope calls in flight not measured: {e})");
                return false;
            }
        }
        let e2 = exe.to_path_buf();
        let floor = tokio::task::spawn_blocking(move || {
            ndjson_parallel(&e2, CALLS_PER_TURN as usize, inflight)
        })
        .await;
        match floor {
            Ok(Ok(r)) => raw.push(r),
            Ok(Err(e)) => {
                println!("    (raw pipe pair not measured: {e})");
                return false;
            }
            Err(e) => {
                println!("    (raw pipe pair not measured: {e})");
                return false;
            }
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let cpu = median(env.iter().map(|r| r.1).collect());
    let env = median(env.into_iter().map(|r| r.0).collect());
    let raw = median(raw);
    println!(
        "{:<58} {:>12.0} calls/s   host CPU {:.1} µs a call",
        format!("{inflight} in flight, through the envelope, plugin out of process"),
        env,
        cpu
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
    true
}
