//! `SHAREDOS_TIMINGS=1`: `sharedos run` and `sharedos demo` print where
//! their time went, stage by stage, as one line on stderr when they exit
//! (docs/BENCHMARKS.md, "A whole turn"):
//!
//! ```text
//! sharedos timings: {"mainUnixNs":1764967000123456789,"stagesUs":[["runtime",120],["config",80],...]}
//! ```
//!
//! `mainUnixNs` is `CLOCK_REALTIME` when `main` was entered (a caller that
//! noted the time before it spawned `sharedos` gets the process start);
//! each stage is the µs from the stamp before it to its own, in order.
//! The host's stamps (`config`, `seated`, `kernel`, `executor`, `printed`,
//! `kills`, `reaped`) and each turn's (`run`: the envelope before the
//! runtime, `launched`, `initialized`, `settled`, `signalled`, then
//! `executed`: the recording of the result) share one clock.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The environment variable that turns the timings on (any value but `0`).
pub const TIMINGS_ENV: &str = "SHAREDOS_TIMINGS";

struct Start {
    at: Instant,
    unix_ns: u128,
    log: sharedos_host::process::StageLog,
}

static START: OnceLock<Start> = OnceLock::new();

/// Starts the timings when [`TIMINGS_ENV`] asks for them; call first in
/// `main`.
pub fn start() {
    let on = std::env::var_os(TIMINGS_ENV).is_some_and(|v| !v.is_empty() && v != "0");
    if !on {
        return;
    }
    let unix_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let at = Instant::now();
    let log: sharedos_host::process::StageLog = Arc::new(Mutex::new(Vec::new()));
    if sharedos_host::process::record_stages(log.clone()) {
        let _ = START.set(Start { at, unix_ns, log });
    }
}

/// Stamps the end of `stage` (nothing when the timings are off).
pub fn mark(stage: &'static str) {
    if START.get().is_some() {
        sharedos_host::process::stamp_stage(stage);
    }
}

/// The line [`start`] promised, from the stamps so far; `None` when the
/// timings are off.
pub fn line() -> Option<String> {
    let start = START.get()?;
    let stamps = start.log.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut prev = start.at;
    let stages: Vec<(&str, u64)> = stamps
        .iter()
        .map(|(stage, at)| {
            let us = at.saturating_duration_since(prev).as_micros() as u64;
            prev = *at;
            (*stage, us)
        })
        .collect();
    let json = serde_json::json!({"mainUnixNs": start.unix_ns as u64, "stagesUs": stages});
    Some(format!("sharedos timings: {json}"))
}

/// Prints [`line`] to stderr.
pub fn print() {
    if let Some(l) = line() {
        eprintln!("{l}");
    }
}
