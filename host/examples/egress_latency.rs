//! Added latency of the egress gateway: the same request sent directly to
//! a mock upstream on loopback and through the gateway (kernel
//! authorization, audit to memory, key injection, streaming copy). The
//! client opens a fresh connection per request on both paths, the two
//! paths interleaved request by request; the gateway keeps its upstream
//! connection alive between requests (its pool). Printed in one run: both
//! paths' median and p99, the added latency, the time to the first
//! streamed byte, and requests/s through the gateway with 16 clients.
//!
//! cargo run --release -p sharedos-host --example egress_latency [N]

#[path = "../tests/egress_support/mod.rs"]
mod egress_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use egress_support::*;
use http_body_util::BodyExt;
use serde_json::json;
use sharedos_host::egress::GatewayLimits;
use tokio::sync::Notify;

fn stats(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (v[v.len() / 2], v[(v.len() * 99 / 100).min(v.len() - 1)])
}

async fn run(addr: std::net::SocketAddr, path: &str, n: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let (status, _) = post(addr, path, "{\"model\":\"m\"}").await;
        assert_eq!(status, 200);
        out.push(t.elapsed());
    }
    out
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let dir = tempfile::tempdir().unwrap();
    let up = json_upstream(None).await;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "load average at start: {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let policy = json!({"routes": [{"name": "m", "upstream": format!("http://127.0.0.1:{}/v1", up.port),
        "secret": key_file(dir.path()), "api": "openai", "allow": ["loopback"]}]});
    let s = serve(
        policy,
        vec![egress_grant("alice", "m", "request", None)],
        "alice",
        GatewayLimits::default(),
    )
    .await;
    let direct_addr: std::net::SocketAddr = format!("127.0.0.1:{}", up.port).parse().unwrap();
    // Warm up both paths.
    run(direct_addr, "/v1/chat/completions", 200).await;
    run(s.addr, "/m/chat/completions", 200).await;
    // Interleaved, one direct then one through the gateway, so a load
    // change on the machine falls on both paths alike.
    let (mut direct, mut gateway) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        direct.extend(run(direct_addr, "/v1/chat/completions", 1).await);
        gateway.extend(run(s.addr, "/m/chat/completions", 1).await);
    }
    let (d_med, d_p99) = stats(direct);
    let (g_med, g_p99) = stats(gateway);
    println!("requests: {n} per path, interleaved, sequential, fresh client connection each");
    println!("direct : median {d_med:?}  p99 {d_p99:?}");
    println!("gateway: median {g_med:?}  p99 {g_p99:?}");
    // Signed: under load the direct path's tail can be the slower one.
    let added = |g: Duration, d: Duration| g.as_secs_f64() * 1e6 - d.as_secs_f64() * 1e6;
    println!(
        "added  : median {:+.0} µs  p99 {:+.0} µs",
        added(g_med, d_med),
        added(g_p99, d_p99)
    );

    // Requests per second through the gateway, 16 clients.
    let t = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let addr = s.addr;
        tasks.push(tokio::spawn(async move {
            run(addr, "/m/chat/completions", n / 16).await
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let done = (n / 16) * 16;
    println!(
        "gateway: {:.0} requests/s with 16 concurrent clients",
        done as f64 / t.elapsed().as_secs_f64()
    );

    let (direct_ttfb, gw_ttfb) = first_bytes(dir.path()).await;
    let (dt, dt99) = stats(direct_ttfb);
    let (gt, gt99) = stats(gw_ttfb);
    println!(
        "first streamed byte: direct median {dt:?} p99 {dt99:?}; gateway median {gt:?} p99 {gt99:?}; added median {:+.0} µs",
        added(gt, dt)
    );
}

/// Time to the first streamed byte, direct and through the gateway.
async fn first_bytes(dir: &std::path::Path) -> (Vec<Duration>, Vec<Duration>) {
    // Time to the first streamed byte: one upstream streams its first
    // event at once and holds the rest until the client has it. Direct and
    // through the gateway interleaved, on the same upstream; the gateway's
    // upstream connection is kept between samples (its pool).
    let samples = 200;
    let gates: Vec<Arc<Notify>> = (0..2 * samples).map(|_| Arc::new(Notify::new())).collect();
    let first = "data: {\"choices\":[{\"delta\":{\"content\":\"he\"}}]}\n\n".to_owned();
    let last = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n".to_owned();
    let script = gates
        .iter()
        .map(|gate| Reply::Gated {
            before: vec![first.clone()],
            gate: gate.clone(),
            after: vec![last.clone()],
        })
        .collect();
    let sse = MockModel::start(script).await.unwrap();
    let policy = json!({"routes": [{"name": "m", "upstream": sse.base_url(),
        "secret": key_file(dir), "api": "openai", "allow": ["loopback"]}]});
    let g = serve(
        policy,
        vec![egress_grant("alice", "m", "request", None)],
        "alice",
        GatewayLimits::default(),
    )
    .await;
    let sse_direct: std::net::SocketAddr = format!("127.0.0.1:{}", sse.port).parse().unwrap();
    let (mut direct_ttfb, mut gw_ttfb) = (Vec::new(), Vec::new());
    let mut gate = gates.iter();
    for _ in 0..samples {
        for (target, path, out) in [
            (sse_direct, "/v1/chat/completions", &mut direct_ttfb),
            (g.addr, "/m/chat/completions", &mut gw_ttfb),
        ] {
            let t = Instant::now();
            let (_, mut body) = open(target, path, "{}".into()).await;
            let _ = body.frame().await;
            out.push(t.elapsed());
            if let Some(gate) = gate.next() {
                gate.notify_one();
            }
            let _ = body.collect().await;
        }
    }
    (direct_ttfb, gw_ttfb)
}
