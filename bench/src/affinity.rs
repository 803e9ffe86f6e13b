//! Session affinity's second turn (issue 15): a zero-call turn of a
//! session on the process its previous turn left parked, against a fresh
//! turn on a prepared sandbox (`warm = 1`, the fastest fresh launch) and
//! the in-process turn (the floor). Interleaved rounds, so a change of load
//! weighs on all three alike.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Figure;
use super::fixture;
use super::process::BENCH_PLUGIN_SUBCOMMAND;
use sharedos_host::executor::{ExecuteOptions, Executor};
use sharedos_host::process::{AffinityConfig, Launcher, ProcessRuntime, ProcessRuntimeConfig};
use sharedos_host::seat::process_seat;

fn sandboxed(exe: &Path, launcher: Arc<dyn Launcher>, affine: bool) -> Result<Executor, String> {
    let manifest = fixture::manifest();
    let mut config = ProcessRuntimeConfig::new(exe, manifest);
    config.args = vec![BENCH_PLUGIN_SUBCOMMAND.to_owned()];
    config.affinity = affine.then_some(AffinityConfig { ttl_ms: 60_000 });
    let runtime = ProcessRuntime::new(config, launcher).map_err(|e| e.to_string())?;
    Executor::new(
        Arc::new(fixture::kernel()),
        process_seat(Arc::new(runtime)),
        fixture::options(),
    )
    .map_err(|e| e.to_string())
}

/// One zero-call turn; `session` makes it a session turn.
async fn timed(exec: &Executor, id: &str, session: Option<&str>) -> Result<Duration, String> {
    let request = fixture::request(id, fixture::idle());
    let start = Instant::now();
    let result = match session {
        Some(s) => {
            exec.execute_in_session(request, ExecuteOptions::default(), None, s)
                .await
        }
        None => exec.execute(request, ExecuteOptions::default()).await,
    }
    .map_err(|e| e.to_string())?;
    let took = start.elapsed();
    if result.status != sharedos_protocol::ExecutionStatus::Succeeded {
        return Err(format!("a zero-call turn ended {}", result.status.as_str()));
    }
    if session.is_some() && result.metadata["runtime"]["affinity"]["reused"] != true {
        return Err("the session turn did not reuse the parked process".into());
    }
    Ok(took)
}

/// `[floor, prepared, reused]` over `n` rounds after 3 discarded ones.
async fn rounds(exe: &Path, n: usize) -> Result<[Figure; 3], String> {
    let floor = fixture::in_process_executor()?;
    let warm = super::process::warm_launcher(exe);
    let prepared = sandboxed(exe, warm.clone(), false)?;
    let affine = sandboxed(exe, super::process::sandbox_launcher(exe), true)?;
    // The session's first turn launches the process the others reuse.
    let first = fixture::request("bench-affinity-0", fixture::idle());
    affine
        .execute_in_session(first, ExecuteOptions::default(), None, "bench")
        .await
        .map_err(|e| e.to_string())?;
    let mut samples: [Vec<Duration>; 3] = Default::default();
    for round in 0..n + 3 {
        let f = timed(&floor, &format!("bench-floor-{round}"), None).await?;
        let p = timed(&prepared, &format!("bench-prepared-{round}"), None).await?;
        // Outside the timing: the prepared turn's teardown and its
        // replacement sandbox.
        tokio::task::spawn_blocking(sharedos_host::process::settle_teardown)
            .await
            .map_err(|e| e.to_string())?;
        let w = warm.clone();
        let _ = tokio::task::spawn_blocking(move || w.wait_warm(Duration::from_secs(30))).await;
        let r = timed(&affine, &format!("bench-reused-{round}"), Some("bench")).await?;
        if round >= 3 {
            for (v, d) in samples.iter_mut().zip([f, p, r]) {
                v.push(d);
            }
        }
    }
    affine.release_parked();
    let [f, p, r] = samples;
    Ok([
        Figure::from_samples("(f) zero-call turn in process (floor)", f),
        Figure::from_samples("(p) fresh turn, full sandbox prepared (warm = 1)", p),
        Figure::from_samples("(r) session turn on its parked process (affinity)", r),
    ])
}

/// Prints the round; `false` when it could not be measured.
pub async fn print(exe: &Path, n: usize) -> bool {
    println!("session affinity: a session's next turn on its parked process ({n} rounds)");
    let measured = rounds(exe, n).await;
    let _ = tokio::task::spawn_blocking(sharedos_host::process::settle_kills).await;
    match measured {
        Ok([f, p, r]) => {
            for fig in [&f, &p, &r] {
                println!("    {}", fig.line());
            }
            println!(
                "    (r) / (p): {:.2}×   (r) / (f): {:.2}×",
                r.median_us / p.median_us.max(f64::MIN_POSITIVE),
                r.median_us / f.median_us.max(f64::MIN_POSITIVE)
            );
            true
        }
        Err(e) => {
            println!("    (not measured: {e})");
            false
        }
    }
}
