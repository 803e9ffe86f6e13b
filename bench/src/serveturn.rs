//! `--only serve-turn`: a zero-call run through a real `sharedos serve`
//! whose runtime keeps prepared sandboxes (`warm = 8`, the full sandbox,
//! the SQLite store), end to end over its API: the run asked for in a
//! session (`POST /v1/sessions/{id}/runs`) until `event: end` on its
//! stream. Against, in the same run: a zero-call turn of the envelope in
//! process (`Executor::execute` with the plugin seated in the host, the
//! floor of `--only turns`) plus one round trip of the raw NDJSON pair
//! (the floor of `--only calls`). Issue 31's goal: the served run within
//! 1.2× of that sum.
//!
//! Rounds alternate a served run and an in-process turn, after a pause
//! that lets the runtime prepare the sandbox the last run took; a run is
//! counted only when its result says it ran in a prepared sandbox
//! (`metadata.runtime.sandbox.prepared`), and those that did not are
//! counted apart.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Figure;
use super::fixture;
use crate::serve::{host_means, run_to_end};
use crate::served::{self, Host, call, open_session, write_config};
use sharedos_host::executor::ExecuteOptions;

/// The pause before each round: the runtime prepares the sandbox the last
/// run took in the background.
const REFILL: Duration = Duration::from_millis(100);
/// Rounds run and discarded first.
const WARMUP: usize = 3;

/// What one run of the mode measured.
pub struct ServeTurn {
    /// A zero-call run through `sharedos serve` on a prepared sandbox:
    /// request sent until `event: end`.
    pub served: Figure,
    /// Runs that found no prepared sandbox (not in `served`).
    pub unprepared: usize,
    /// A zero-call turn of the envelope with the plugin in process.
    pub in_process: Figure,
    /// One round trip of the raw NDJSON pair.
    pub raw: Figure,
    /// The host's own account (`GET /metrics`, means in ms over every run
    /// it served).
    pub host_means_ms: Vec<(&'static str, Option<f64>)>,
}

impl ServeTurn {
    /// Served run over in-process turn plus one raw round trip (medians).
    pub fn ratio(&self) -> f64 {
        self.served.median_us / (self.in_process.median_us + self.raw.median_us)
    }
}

/// Whether the run's result says it ran in a prepared sandbox.
async fn prepared(socket: &Path, run: &str) -> Result<bool, String> {
    let (status, body) = call(socket, "GET", &format!("/v1/runs/{run}"), &Value::Null).await?;
    if status != 200 {
        return Err(format!("run {run}: {status} {body}"));
    }
    Ok(body["run"]["result"]["metadata"]["runtime"]["sandbox"]["prepared"] == true)
}

/// One zero-call turn of the envelope in process.
async fn in_process_turn(
    executor: &sharedos_host::executor::Executor,
    round: usize,
) -> Result<Duration, String> {
    let request = fixture::request(&format!("bench-serve-turn-{round}"), fixture::idle());
    let start = Instant::now();
    let result = executor
        .execute(request, ExecuteOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let took = start.elapsed();
    if result.status != sharedos_protocol::ExecutionStatus::Succeeded {
        return Err(format!(
            "an in-process zero-call turn ended {}",
            result.status.as_str()
        ));
    }
    Ok(took)
}

/// `n` rounds (after [`WARMUP`]) and `raw` raw round trips.
pub async fn measure(exe: &Path, n: usize, raw: usize) -> Result<ServeTurn, String> {
    let (sharedos, testplugin) = served::binaries(exe)?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    write_config(dir.path(), &testplugin, 1).map_err(|e| e.to_string())?;
    let database = dir.path().join("sharedos.db").display().to_string();
    let host = Host::start(&sharedos, dir.path(), "a", &["--database".into(), database]).await?;
    let session = open_session(&host.socket).await?;
    let executor = fixture::in_process_executor()?;
    let (mut served, mut in_process, mut unprepared) = (Vec::new(), Vec::new(), 0);
    for round in 0..n + WARMUP {
        tokio::time::sleep(REFILL).await;
        let ended = run_to_end(&host.socket, &session, &format!("turn-{round}"), json!([])).await?;
        let was_prepared = prepared(&host.socket, &ended.run).await?;
        let floor = in_process_turn(&executor, round).await?;
        if round < WARMUP {
            continue;
        }
        if was_prepared {
            served.push(ended.ended);
        } else {
            unprepared += 1;
        }
        in_process.push(floor);
    }
    if served.is_empty() {
        return Err(format!(
            "none of {n} runs found a prepared sandbox: no figure"
        ));
    }
    let e2 = exe.to_path_buf();
    let raw = tokio::task::spawn_blocking(move || super::ndjson_floor(&e2, raw))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("the raw pair: {e}"))?;
    let host_means_ms = host_means(&host.socket).await?;
    Ok(ServeTurn {
        served: Figure::from_samples(
            "served run, prepared sandbox: POST until event: end",
            served,
        ),
        unprepared,
        in_process: Figure::from_samples("in-process zero-call turn (envelope)", in_process),
        raw: Figure {
            name: "one raw NDJSON round trip".into(),
            ..raw
        },
        host_means_ms,
    })
}

/// Measures and prints; false when it could not be measured.
pub async fn print(exe: &Path, n: usize) -> bool {
    let figures = match measure(exe, n, (n * 20).clamp(200, 3000)).await {
        Ok(f) => f,
        Err(e) => {
            println!("serve-turn not measured: {e}");
            return false;
        }
    };
    let f = &figures;
    println!("\n== serve-turn: a zero-call run through `sharedos serve` on a prepared sandbox");
    for figure in [&f.served, &f.in_process, &f.raw] {
        println!("{}", figure.line());
    }
    if f.unprepared > 0 {
        println!(
            "    ({} runs found no prepared sandbox and are not counted)",
            f.unprepared
        );
    }
    let goal = f.ratio() <= 1.2;
    println!(
        "    served / (in-process turn + one raw round trip): {:.2}× (goal ≤ 1.2×: {})",
        f.ratio(),
        if goal { "met" } else { "NOT met" }
    );
    let means: Vec<String> = f
        .host_means_ms
        .iter()
        .map(|(name, v)| match v {
            Some(ms) => format!("{name} {ms:.2} ms"),
            None => format!("{name} -"),
        })
        .collect();
    println!("    the host's own means: {}", means.join(", "));
    true
}
