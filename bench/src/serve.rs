//! `--only serve`: admission at speed through real `sharedos serve` hosts
//! (docs/BENCHMARKS.md, "Admission at speed"). For each store, two hosts
//! share it; `runs` runs of the echo runtime are asked for at once across
//! `sessions` sessions on the first host, each on a connection of its own,
//! and each followed to its end over SSE. Then one run emits events while
//! an observer on each host follows it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use sharedos_protocol::Timestamp;

use crate::served::{self, Events, Host, Store, WARM, call, open_session, run_body, write_config};

/// Events the observed run emits, one every [`EVENT_GAP_MS`].
const EVENTS: usize = 300;
const EVENT_GAP_MS: u64 = 3;

/// What one store measured.
pub struct ServeFigures {
    pub store: Store,
    /// Request sent → 201 with the run id, each admitted run, sorted (µs).
    pub admission_us: Vec<u64>,
    /// Request sent → `event: end` on the run's stream, sorted (µs).
    pub run_us: Vec<u64>,
    /// Admitted runs over the time from the first request to the last 201.
    pub runs_per_s: f64,
    /// Event stamp → arrival at an observer on the run's host, sorted (µs).
    pub same_host_us: Vec<u64>,
    /// The same, for an observer on the other host.
    pub cross_host_us: Vec<u64>,
    /// The first host's own account (`GET /metrics`), means in ms over
    /// every run it served (the warm-up and the observed run included):
    /// admission, the store's `admit_run`, `append_event`, `end_run`, and a
    /// run from stored to ended.
    pub host_means_ms: Vec<(&'static str, Option<f64>)>,
}

/// The first host's own account of where a run's time went.
pub(crate) async fn host_means(socket: &Path) -> Result<Vec<(&'static str, Option<f64>)>, String> {
    let text = served::metrics(socket).await?;
    let store =
        |op: &str| served::mean_ms(&text, "store_seconds", &format!("{{operation=\"{op}\"}}"));
    Ok(vec![
        ("admission", served::mean_ms(&text, "admission_seconds", "")),
        ("store admit_run", store("admit_run")),
        ("store append_event", store("append_event")),
        ("store end_run", store("end_run")),
        (
            "run stored → ended",
            served::mean_ms(&text, "run_seconds", ""),
        ),
    ])
}

/// The `p`-th percentile (nearest rank) of sorted `v`.
pub fn percentile(v: &[u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// Measures `store`: two hosts, the batch, the observed run.
pub async fn measure(
    exe: &Path,
    store: Store,
    runs: usize,
    sessions: usize,
) -> Result<ServeFigures, String> {
    let (sharedos, testplugin) = served::binaries(exe)?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    write_config(dir.path(), &testplugin, runs).map_err(|e| e.to_string())?;
    // Declared before the hosts so the cluster stops after them.
    let database = match store {
        Store::Postgres => Some(sharedos_store::cluster::TestDatabase::new().await?),
        Store::Sqlite => None,
    };
    let store_args: Vec<String> = match &database {
        Some(db) => vec!["--postgres".into(), db.conninfo.clone()],
        None => vec![
            "--database".into(),
            dir.path().join("sharedos.db").display().to_string(),
        ],
    };
    let a = Host::start(&sharedos, dir.path(), "a", &store_args).await?;
    let b = Host::start(&sharedos, dir.path(), "b", &store_args).await?;
    let mut ids = Vec::new();
    for _ in 0..sessions {
        ids.push(open_session(&a.socket).await?);
    }
    // One run first, so the runtime's warm sandboxes are up.
    one_run(
        a.socket.clone(),
        ids[0].clone(),
        "warmup".into(),
        Instant::now(),
    )
    .await?;
    let (admission_us, run_us, runs_per_s) = batch(&a.socket, &ids, runs).await?;
    let (same_host_us, cross_host_us) = observe(&a.socket, &b.socket, &ids[0]).await?;
    let host_means_ms = host_means(&a.socket).await?;
    Ok(ServeFigures {
        store,
        admission_us,
        run_us,
        runs_per_s,
        same_host_us,
        cross_host_us,
        host_means_ms,
    })
}

/// One run of an echo turn: asked for, then followed to its end on its
/// stream. Its admission and whole latency, and the time from `batch` to
/// its admission (µs).
async fn one_run(
    socket: PathBuf,
    session: String,
    request: String,
    batch: Instant,
) -> Result<(u64, u64, u64), String> {
    let script = json!([{"op": "emit", "type": "echo", "data": {"request": request}}]);
    let ended = run_to_end(&socket, &session, &request, script).await?;
    let us = |d: Duration| d.as_micros() as u64;
    let admitted_at = ended.sent.saturating_duration_since(batch) + ended.admitted;
    Ok((us(ended.admitted), us(ended.ended), us(admitted_at)))
}

/// A run followed to its end ([`run_to_end`]).
pub struct RunEnded {
    pub run: String,
    /// When the request was sent.
    pub sent: Instant,
    /// Request sent → 201/202 with the run id.
    pub admitted: Duration,
    /// Request sent → `event: end` on the run's stream.
    pub ended: Duration,
}

/// Asks for a run of `script` in `session` and follows its stream to
/// `event: end`; an error unless the turn completed.
pub async fn run_to_end(
    socket: &Path,
    session: &str,
    request: &str,
    script: Value,
) -> Result<RunEnded, String> {
    let sent = Instant::now();
    let (status, body) = call(
        socket,
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        &run_body(request, script),
    )
    .await?;
    let admitted = sent.elapsed();
    let Some(run) = body["run"]["id"]
        .as_str()
        .filter(|_| status == 201 || status == 202)
    else {
        return Err(format!("run {request}: {status} {body}"));
    };
    let mut events = Events::open(socket, run).await?;
    let completed = events.to_end().await;
    let ended = sent.elapsed();
    match completed {
        Some(true) => Ok(RunEnded {
            run: run.to_owned(),
            sent,
            admitted,
            ended,
        }),
        Some(false) => {
            let (_, body) = call(socket, "GET", &format!("/v1/runs/{run}"), &Value::Null).await?;
            Err(format!(
                "run {request} did not complete: {}",
                body["run"]["result"]
            ))
        }
        None => Err(format!("run {request}: its stream closed before its end")),
    }
}

/// `runs` runs asked for at once, across `sessions`; admission and run
/// latencies, sorted, and admitted runs/s.
async fn batch(
    socket: &Path,
    sessions: &[String],
    runs: usize,
) -> Result<(Vec<u64>, Vec<u64>, f64), String> {
    let mut set = tokio::task::JoinSet::new();
    let start = Instant::now();
    for i in 0..runs {
        let (socket, session) = (socket.to_path_buf(), sessions[i % sessions.len()].clone());
        set.spawn(async move { one_run(socket, session, format!("run-{i}"), start).await });
    }
    let (mut admission, mut whole) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    let mut last_admitted = 1;
    while let Some(joined) = set.join_next().await {
        let (a, w, at) = joined.map_err(|e| e.to_string())??;
        admission.push(a);
        whole.push(w);
        last_admitted = last_admitted.max(at);
    }
    admission.sort_unstable();
    whole.sort_unstable();
    // From the first request's task spawned to the last 201.
    let window = last_admitted as f64 / 1e6;
    Ok((admission, whole, runs as f64 / window))
}

/// A run on `a` that emits [`EVENTS`] events; an observer on `a` and one on
/// `b` follow it. Each event's latency: its arrival at the observer less
/// its `occurredAt` (the host's stamp when it recorded the event).
async fn observe(a: &Path, b: &Path, session: &str) -> Result<(Vec<u64>, Vec<u64>), String> {
    let mut script = vec![json!({"op": "sleep", "ms": 500})];
    for i in 0..EVENTS {
        script.push(json!({"op": "emit", "type": "tick", "data": {"i": i}}));
        script.push(json!({"op": "sleep", "ms": EVENT_GAP_MS}));
    }
    let (status, body) = call(
        a,
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        &run_body("observed", Value::Array(script)),
    )
    .await?;
    let Some(run) = body["run"]["id"].as_str() else {
        return Err(format!("the observed run: {status} {body}"));
    };
    let subscribed = SystemTime::now();
    let (same, cross) = tokio::join!(follow(a, run, subscribed), follow(b, run, subscribed));
    let (same, cross) = (same?, cross?);
    if same.is_empty() || cross.is_empty() {
        return Err(format!(
            "no live event observed ({} same host, {} cross host)",
            same.len(),
            cross.len()
        ));
    }
    Ok((same, cross))
}

/// Follows `run`'s events on `socket` to its end: the latency of each
/// `tick` stamped after `subscribed` (a replayed one measures the journal,
/// not the live path), sorted (µs).
async fn follow(socket: &Path, run: &str, subscribed: SystemTime) -> Result<Vec<u64>, String> {
    let mut events = Events::open(socket, run).await?;
    let mut latencies = Vec::with_capacity(EVENTS);
    let within = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some((event, data, arrived)) = events.next().await {
            if event == "end" {
                return true;
            }
            if data["data"]["type"] != "tick" {
                continue;
            }
            let Some(at) = data["occurredAt"]
                .as_str()
                .and_then(|t| Timestamp::parse(t).ok())
            else {
                continue;
            };
            let stamped = SystemTime::UNIX_EPOCH
                + Duration::from_nanos(at.to_offset().unix_timestamp_nanos().max(0) as u64);
            if stamped < subscribed {
                continue;
            }
            let latency = arrived.duration_since(stamped).unwrap_or_default();
            latencies.push(latency.as_micros() as u64);
        }
        false
    })
    .await;
    if within != Ok(true) {
        return Err(format!(
            "the observed run's stream on {} did not end",
            socket.display()
        ));
    }
    latencies.sort_unstable();
    Ok(latencies)
}

fn ms(us: u64) -> String {
    format!("{:.1} ms", us as f64 / 1000.0)
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "NOT met" }
}

/// The family's table for `figures`.
pub fn print(figures: &ServeFigures) {
    let f = figures;
    let (adm50, adm99) = (
        percentile(&f.admission_us, 50.0),
        percentile(&f.admission_us, 99.0),
    );
    let (run50, run99) = (percentile(&f.run_us, 50.0), percentile(&f.run_us, 99.0));
    let (same50, same99) = (
        percentile(&f.same_host_us, 50.0),
        percentile(&f.same_host_us, 99.0),
    );
    let (cross50, cross99) = (
        percentile(&f.cross_host_us, 50.0),
        percentile(&f.cross_host_us, 99.0),
    );
    println!(
        "\n== serve, {}: {} runs admitted, {} / {} events observed same / cross host",
        f.store.name(),
        f.admission_us.len(),
        f.same_host_us.len(),
        f.cross_host_us.len()
    );
    println!("    | figure | p50 | p99 | goal | |");
    println!("    |---|---|---|---|---|");
    println!(
        "    | admission | {} | {} | p99 ≤ 50 ms | {} |",
        ms(adm50),
        ms(adm99),
        verdict(adm99 <= 50_000)
    );
    println!(
        "    | admitted runs/s | {:.0} | | ≥ 100/s | {} |",
        f.runs_per_s,
        verdict(f.runs_per_s >= 100.0)
    );
    println!(
        "    | run (to its end) | {} | {} | | |",
        ms(run50),
        ms(run99)
    );
    println!(
        "    | event → SSE, same host | {} | {} | p99 ≤ 5 ms | {} |",
        ms(same50),
        ms(same99),
        verdict(same99 <= 5_000)
    );
    println!(
        "    | event → SSE, cross host | {} | {} | p99 ≤ 50 ms | {} |",
        ms(cross50),
        ms(cross99),
        verdict(cross99 <= 50_000)
    );
    let means: Vec<String> = f
        .host_means_ms
        .iter()
        .map(|(what, mean)| match mean {
            Some(ms) => format!("{what} {ms:.2} ms"),
            None => format!("{what} (none)"),
        })
        .collect();
    println!("    host a's account, means: {}", means.join(", "));
}

/// Measures and prints each of `stores`; false if any measurement failed.
pub async fn run(exe: &Path, runs: usize, stores: &[Store]) -> bool {
    println!(
        "sharedos-bench --only serve: {runs} runs at once across {} sessions, two hosts a store, \
         the echo runtime sandboxed with {WARM} warm sandboxes; latencies from the host's \
         occurredAt (ms precision, truncated: up to 1 ms too high)",
        sessions_for(runs)
    );
    let mut ok = true;
    for &store in stores {
        match measure(exe, store, runs, sessions_for(runs)).await {
            Ok(f) => print(&f),
            Err(e) => {
                println!("\n    ({} not measured: {e})", store.name());
                ok = false;
            }
        }
    }
    ok
}

/// 20 sessions for 200 runs: one session for every ten runs, at least one.
pub fn sessions_for(runs: usize) -> usize {
    (runs / 10).clamp(1, 20)
}
