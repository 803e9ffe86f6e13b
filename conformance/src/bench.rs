//! `sharedos conformance --bench N -- A ::: B ::: C`: the tool-call round
//! trip of each plugin, measured in one run. Each plugin gets one turn of
//! `N` sequential echo calls, answered at once; a sample is the time from
//! the host writing one answer to reading the next call (the plugin's SDK
//! parsing the result, emitting progress, and sending the next call). The
//! plugins take turns, round after round, so a machine's drift spreads
//! over all of them.

use std::io::Write;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use super::checks::{Battery, DEFAULT_MAX};
use super::session::Recv;
use super::turn;

/// Rounds per plugin; each round is one launch and one turn.
const ROUNDS: usize = 3;

#[derive(Debug, Serialize)]
pub struct BenchRow {
    pub command: String,
    pub calls: usize,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub mean_us: u64,
}

/// One turn of `calls` sequential calls; the per-call samples.
pub fn one_round(battery: &Battery<'_>, calls: usize) -> Result<Vec<Duration>, String> {
    let mut s = battery.ready(DEFAULT_MAX, 8)?;
    s.send(&turn::turn_run(turn::calls(calls, false)))?;
    let mut samples = Vec::with_capacity(calls);
    let mut answered: Option<Instant> = None;
    loop {
        let msg = match s.recv(battery.step) {
            Recv::Message(v) => v,
            Recv::Invalid(why) => return Err(format!("wrote {why}")),
            Recv::Eof => return Err(format!("closed stdout (stderr: {})", s.stderr_tail())),
            Recv::Timeout => return Err("stopped answering".into()),
        };
        if msg["method"] == "host/invokeTool" {
            if let Some(t) = answered.take() {
                samples.push(t.elapsed());
            }
            s.send(&turn::succeeded(&msg, Value::Null))?;
            answered = Some(Instant::now());
        } else if msg.get("method").is_none() {
            break;
        }
    }
    if samples.len() + 1 < calls {
        return Err(format!(
            "made {} calls of the {calls} asked",
            samples.len() + 1
        ));
    }
    Ok(samples)
}

fn percentile(sorted: &[Duration], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_micros() as u64
}

pub fn row(command: String, mut samples: Vec<Duration>) -> BenchRow {
    samples.sort();
    let total: Duration = samples.iter().sum();
    BenchRow {
        command,
        calls: samples.len(),
        p50_us: percentile(&samples, 0.5),
        p90_us: percentile(&samples, 0.9),
        p99_us: percentile(&samples, 0.99),
        mean_us: (total.as_micros() / samples.len().max(1) as u128) as u64,
    }
}

pub const ROUND_COUNT: usize = ROUNDS;

pub fn print_table(rows: &[BenchRow], launcher: &str, out: &mut dyn Write) {
    let _ = writeln!(
        out,
        "tool-call round trip ({launcher} launcher), µs per call: p50 / p90 / p99 / mean (samples)"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "  {:>6} / {:>6} / {:>6} / {:>6}  ({:>5})  {}",
            r.p50_us, r.p90_us, r.p99_us, r.mean_us, r.calls, r.command
        );
    }
}
