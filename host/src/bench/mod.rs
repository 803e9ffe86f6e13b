//! `sharedos bench`: figures measured in one run, each against a baseline
//! measured in the same run, so the ratios hold on a noisy machine.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

pub mod envelope;
pub mod fixture;

/// One measured figure.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub name: String,
    pub iterations: usize,
    pub median_us: f64,
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
/// with plain blocking std I/O. Entered as `sharedos __bench-echo`.
pub fn echo_child() -> i32 {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { return 1 };
        let Ok(req) = serde_json::from_str::<serde_json::Value>(&line) else {
            return 1;
        };
        let resp = serde_json::json!({"jsonrpc": "2.0", "id": req["id"], "result": req["params"]});
        if writeln!(out, "{resp}").and_then(|_| out.flush()).is_err() {
            return 1;
        }
    }
    0
}

/// (a) The floor: a raw NDJSON request/response round trip between two
/// processes over pipes, serde_json on both sides, blocking I/O.
pub fn ndjson_floor(exe: &std::path::Path, iterations: usize) -> std::io::Result<Figure> {
    let mut child = Command::new(exe)
        .arg("__bench-echo")
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
    let warmup = iterations / 10 + 10;
    for i in 0..(iterations + warmup) {
        let req = serde_json::json!({"jsonrpc": "2.0", "id": i, "method": "host/invokeTool",
            "params": {"turnId": "t-1", "call": {"id": "c", "tool": "bench.noop", "arguments": {}}}});
        let t = Instant::now();
        writeln!(stdin, "{req}")?;
        stdin.flush()?;
        line.clear();
        stdout.read_line(&mut line)?;
        let _: serde_json::Value = serde_json::from_str(&line).map_err(std::io::Error::other)?;
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

/// `sharedos bench`: every figure, printed with its ratio to the baseline
/// measured in the same run.
pub async fn run(iterations: usize) -> i32 {
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("sharedos bench: cannot find its own binary: {e}");
            return 2;
        }
    };
    println!("sharedos bench — {iterations} iterations per round-trip figure");
    let floor = tokio::task::spawn_blocking({
        let exe = exe.clone();
        move || ndjson_floor(&exe, iterations)
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r.map_err(|e| e.to_string()));
    let floor = match floor {
        Ok(f) => f,
        Err(e) => {
            eprintln!("sharedos bench: the floor measurement failed: {e}");
            return 1;
        }
    };
    println!("{}", floor.line());
    let mut failed = false;
    match (
        envelope::inprocess_calls(iterations).await,
        envelope::kernel_direct(iterations).await,
    ) {
        (Ok(b), Ok(k)) => {
            println!("{}", b.line());
            println!("{}", k.line());
            println!(
                "    envelope overhead per call: {:.1} µs (median {:.2}× the direct kernel call)",
                b.median_us - k.median_us,
                b.median_us / k.median_us.max(1e-9)
            );
        }
        (b, k) => {
            eprintln!(
                "sharedos bench: in-process envelope: {:?} / {:?}",
                b.err(),
                k.err()
            );
            failed = true;
        }
    }
    match envelope::inprocess_emits(iterations * 50).await {
        Ok(rate) => println!(
            "{:<58} {:>10.0} emits/s",
            "(e) emits through the envelope, plugin in process", rate
        ),
        Err(e) => {
            eprintln!("sharedos bench: emits: {e}");
            failed = true;
        }
    }
    if failed { 1 } else { 0 }
}
