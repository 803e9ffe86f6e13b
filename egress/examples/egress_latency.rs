//! Added latency of the egress gateway: the same request sent directly to
//! a mock upstream on loopback and through the gateway (kernel
//! authorization, each audit record serialized as the JSONL sink would
//! write it, key injection, metered streaming, the events taken by a task
//! as the envelope takes them).
//!
//! The three parties run apart, as they do in production: the client (the
//! plugin) on this thread, the gateway in a runtime of its own (1 worker,
//! as in the `sharedos` binary; `GATEWAY_WORKERS=2` for two), the mock
//! upstream in another (1 worker). The client is the same on both paths:
//! one hyper HTTP/1.1 client, the two paths interleaved request by
//! request, after a warm-up that is not counted, first with a fresh client
//! connection per request on both paths, then with one kept-alive client
//! connection per path (its own warm-up). The gateway keeps its own
//! upstream connection alive between requests (its pool).
//!
//! Printed in one run: both paths' median and p99 and the added latency
//! in each mode, the gateway's CPU time per request (its runtime's threads
//! only, from /proc/self/task/<tid>/schedstat: less noisy than the wall
//! clock on a shared machine) and how often its threads waited per
//! request (voluntary context switches: each is a wake-up later), the time
//! to the first streamed byte, and requests/s through the gateway with 16
//! concurrent clients.
//!
//! cargo run --release -p sharedos-host --example egress_latency [N]

#[path = "../tests/egress_support/mod.rs"]
mod egress_support;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use egress_support::*;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::json;
use sharedos_egress::{Gateway, GatewayLimits, NetworkRoutes, ServeHandle, TurnBinding};
use sharedos_kernel::{AuditError, AuditRecord, AuditSink, ConfigGrantSource, Kernel, TurnKernel};
use tokio::runtime::{Handle, Runtime};
use tokio::sync::Notify;

/// A runtime of its own, and the ids of its threads.
struct Side {
    runtime: Runtime,
    threads: Arc<Mutex<Vec<u32>>>,
}

impl Side {
    fn new(name: &str, workers: usize) -> Side {
        let threads = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&threads);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .thread_name(name)
            .on_thread_start(move || {
                if let Some(tid) = thread_id() {
                    seen.lock().unwrap().push(tid);
                }
            })
            .enable_all()
            .build()
            .unwrap();
        Side { runtime, threads }
    }

    fn handle(&self) -> Handle {
        self.runtime.handle().clone()
    }

    /// CPU time and context switches of this side's threads so far.
    fn usage(&self) -> Usage {
        let mut total = Usage::default();
        for tid in self.threads.lock().unwrap().iter() {
            let task = format!("/proc/self/task/{tid}");
            let stat = std::fs::read_to_string(format!("{task}/schedstat")).unwrap_or_default();
            let ns = stat.split_whitespace().next().and_then(|n| n.parse().ok());
            total.cpu += Duration::from_nanos(ns.unwrap_or(0));
            let status = std::fs::read_to_string(format!("{task}/status")).unwrap_or_default();
            for line in status.lines() {
                if let Some(n) = line.strip_prefix("voluntary_ctxt_switches:") {
                    total.switches += n.trim().parse::<u64>().unwrap_or(0);
                }
            }
        }
        total
    }
}

/// What a side's threads used: CPU time, and how often they gave up the
/// CPU to wait (each one a wake-up later).
#[derive(Default, Clone, Copy)]
struct Usage {
    cpu: Duration,
    switches: u64,
}

impl Usage {
    fn since(self, before: Usage) -> Usage {
        Usage {
            cpu: self.cpu.saturating_sub(before.cpu),
            switches: self.switches.saturating_sub(before.switches),
        }
    }

    fn add(&mut self, other: Usage) {
        self.cpu += other.cpu;
        self.switches += other.switches;
    }
}

fn thread_id() -> Option<u32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// Runs `fut` on `handle`'s runtime and waits for it here.
async fn on<F>(handle: &Handle, fut: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    handle.spawn(fut).await.unwrap()
}

fn stats(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (v[v.len() / 2], v[(v.len() * 99 / 100).min(v.len() - 1)])
}

/// Signed: under load the direct path's tail can be the slower one.
fn added(g: Duration, d: Duration) -> f64 {
    g.as_secs_f64() * 1e6 - d.as_secs_f64() * 1e6
}

const BODY: &str = "{\"model\":\"m\"}";

/// One request on a fresh client connection.
async fn fresh(addr: SocketAddr, path: &str) -> Duration {
    let t = Instant::now();
    let (status, _) = post(addr, path, BODY).await;
    assert_eq!(status, 200);
    t.elapsed()
}

/// A kept-alive client connection.
async fn keep(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

/// One request on a kept-alive client connection.
async fn kept(sender: &mut SendRequest<Full<Bytes>>, path: &str) -> Duration {
    let t = Instant::now();
    sender.ready().await.unwrap();
    let req = hyper::Request::post(path)
        .header("host", "127.0.0.1")
        .header("authorization", format!("Bearer {PLACEHOLDER}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(BODY.as_bytes())))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();
    t.elapsed()
}

struct Paths {
    direct: SocketAddr,
    gateway: SocketAddr,
}

const DIRECT: &str = "/v1/chat/completions";
const GATEWAY: &str = "/m/chat/completions";

fn report(mode: &str, n: usize, direct: Vec<Duration>, gateway: Vec<Duration>, used: Usage) {
    let (d_med, d_p99) = stats(direct);
    let (g_med, g_p99) = stats(gateway);
    println!("{mode}: {n} requests per path, interleaved, sequential");
    println!("  direct : median {d_med:?}  p99 {d_p99:?}");
    println!("  gateway: median {g_med:?}  p99 {g_p99:?}");
    println!(
        "  added  : median {:+.0} µs  p99 {:+.0} µs;  gateway CPU {:.1} µs and {:.2} waits per request",
        added(g_med, d_med),
        added(g_p99, d_p99),
        used.cpu.as_secs_f64() * 1e6 / n as f64,
        used.switches as f64 / n as f64,
    );
}

async fn fresh_connections(p: &Paths, gw: &Side, n: usize) {
    let (mut direct, mut gateway) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut used = Usage::default();
    for _ in 0..n {
        direct.push(fresh(p.direct, DIRECT).await);
        let before = gw.usage();
        gateway.push(fresh(p.gateway, GATEWAY).await);
        used.add(gw.usage().since(before));
    }
    report(
        "fresh client connection per request",
        n,
        direct,
        gateway,
        used,
    );
}

async fn kept_connections(p: &Paths, gw: &Side, n: usize) {
    let (mut to_direct, mut to_gateway) = (keep(p.direct).await, keep(p.gateway).await);
    // Warm-up of the kept connections, not counted.
    for _ in 0..200 {
        kept(&mut to_direct, DIRECT).await;
        kept(&mut to_gateway, GATEWAY).await;
    }
    let (mut direct, mut gateway) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut used = Usage::default();
    for _ in 0..n {
        direct.push(kept(&mut to_direct, DIRECT).await);
        let before = gw.usage();
        gateway.push(kept(&mut to_gateway, GATEWAY).await);
        used.add(gw.usage().since(before));
    }
    report(
        "one kept-alive client connection per path",
        n,
        direct,
        gateway,
        used,
    );
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "load average at start: {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    // The gateway runs on one worker by default, as in the `sharedos`
    // binary, whose runtime is one thread unless `SHAREDOS_RUNTIME=multi`;
    // `GATEWAY_WORKERS=2` measures a host on a multi-threaded runtime.
    let workers = std::env::var("GATEWAY_WORKERS")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(1);
    println!("gateway workers: {workers}");
    let (gw, upstream) = (Side::new("gateway", workers), Side::new("upstream", 1));
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    client.block_on(measure(n, &gw, &upstream));
}

async fn measure(n: usize, gw: &Side, upstream: &Side) {
    let dir = tempfile::tempdir().unwrap();
    let up = on(&upstream.handle(), json_upstream(None)).await;
    let policy = json!({"routes": [{"name": "m", "upstream": format!("http://127.0.0.1:{}/v1", up.port),
        "secret": key_file(dir.path()), "api": "openai", "allow": ["loopback"]}]});
    let grants = vec![egress_grant("alice", "m", "request", None)];
    let (gateway_addr, serving) = on(&gw.handle(), gateway(policy, grants)).await;
    let p = Paths {
        direct: format!("127.0.0.1:{}", up.port).parse().unwrap(),
        gateway: gateway_addr,
    };
    // Warm-up, not counted.
    for _ in 0..200 {
        fresh(p.direct, DIRECT).await;
        fresh(p.gateway, GATEWAY).await;
    }
    // For `strace -c -p <tid>...` of the gateway side alone.
    println!("gateway threads: {:?}", gw.threads.lock().unwrap());
    fresh_connections(&p, gw, n).await;
    kept_connections(&p, gw, n).await;

    // Requests per second through the gateway, 16 clients, each with a
    // fresh connection per request.
    let t = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let addr = p.gateway;
        tasks.push(tokio::spawn(async move {
            for _ in 0..n / 16 {
                fresh(addr, GATEWAY).await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    println!(
        "gateway: {:.0} requests/s with 16 concurrent clients",
        ((n / 16) * 16) as f64 / t.elapsed().as_secs_f64()
    );

    let (direct_ttfb, gw_ttfb) = first_bytes(dir.path(), gw, upstream).await;
    let (dt, dt99) = stats(direct_ttfb);
    let (gt, gt99) = stats(gw_ttfb);
    println!(
        "first streamed byte: direct median {dt:?} p99 {dt99:?}; gateway median {gt:?} p99 {gt99:?}; added median {:+.0} µs",
        added(gt, dt)
    );
    drop(serving);
}

/// The audit sink here: each record serialized as the JSONL sink writes
/// it, then dropped (the gateway is measured, not the disk; as the
/// envelope's benchmark does).
struct SerializingSink;

#[async_trait::async_trait]
impl AuditSink for SerializingSink {
    async fn append(&self, record: &AuditRecord) -> Result<(), AuditError> {
        let line = serde_json::to_vec(record).map_err(|e| AuditError::Sink(e.to_string()))?;
        std::hint::black_box(line);
        Ok(())
    }
}

/// A gateway serving a loopback listener for one turn of `alice`, its
/// events taken as they come (as the envelope takes them).
async fn gateway(
    policy: serde_json::Value,
    grants: Vec<sharedos_kernel::Grant>,
) -> (SocketAddr, ServeHandle) {
    let policy: NetworkRoutes = serde_json::from_value(policy).unwrap();
    let gateway = Arc::new(Gateway::from_policy(&policy, GatewayLimits::default()).unwrap());
    let grants = Arc::new(ConfigGrantSource::new(grants));
    let kernel = Arc::new(Kernel::builder(grants, Arc::new(SerializingSink)).build());
    let ctx = context("alice");
    let turn = kernel.open_turn(&ctx).await.unwrap();
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move { while events.recv().await.is_some() {} });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let binding = Arc::new(TurnBinding::new(turn, ctx, tx));
    (addr, gateway.serve(listener, binding))
}

/// Time to the first streamed byte, direct and through the gateway.
async fn first_bytes(
    dir: &std::path::Path,
    gw: &Side,
    upstream: &Side,
) -> (Vec<Duration>, Vec<Duration>) {
    // One upstream streams its first event at once and holds the rest
    // until the client has it. Direct and through the gateway interleaved,
    // on the same upstream, a fresh client connection each; the gateway's
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
    let sse = on(&upstream.handle(), async move {
        MockModel::start(script).await.unwrap()
    })
    .await;
    let policy = json!({"routes": [{"name": "m", "upstream": sse.base_url(),
        "secret": key_file(dir), "api": "openai", "allow": ["loopback"]}]});
    let grants = vec![egress_grant("alice", "m", "request", None)];
    let (g_addr, g) = on(&gw.handle(), gateway(policy, grants)).await;
    let sse_direct: SocketAddr = format!("127.0.0.1:{}", sse.port).parse().unwrap();
    let (mut direct_ttfb, mut gw_ttfb) = (Vec::new(), Vec::new());
    let mut gate = gates.iter();
    for _ in 0..samples {
        for (target, path, out) in [
            (sse_direct, DIRECT, &mut direct_ttfb),
            (g_addr, GATEWAY, &mut gw_ttfb),
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
    drop(g);
    (direct_ttfb, gw_ttfb)
}
