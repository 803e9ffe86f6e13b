//! The store's figures (docs/BENCHMARKS.md, "Store"), in one run:
//!
//! - one audited tool call (`files.list` through the real kernel) with the
//!   JSONL sink, the SQLite store and the PostgreSQL store;
//! - runs admitted per second and events journaled per second, SQLite and
//!   PostgreSQL (one caller, each write committed before the next);
//! - a turn's grant load (the kernel's `GrantSource::load`, 8 grants of
//!   the actor): the configuration's in-memory source against the store's
//!   (`StoreGrants`), SQLite and PostgreSQL;
//! - observation latency on PostgreSQL: from the start of one host's
//!   journal write to another host (another connection) holding the event
//!   (woken by `NOTIFY`, then reading the journal);
//! - the cost of the host lease's fencing: the audited call, admissions
//!   and journal writes again through a store holding a lease (each write
//!   checks its epoch, as under `sharedos serve`), `…_leased`, on the same
//!   databases in the same rounds.
//!
//! The sinks, then the stores, take turns in 20 rounds of N/20 (each
//! figure's samples come from every round), so a shared machine's load
//! falls on all alike.
//!
//! `cargo run --release -p sharedos-store --example store_bench [N]`; the
//! PostgreSQL server is `SHAREDOS_TEST_POSTGRES`'s or a private cluster
//! (`sharedos_store::cluster`). Prints one JSON object per figure.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_kernel::{
    AuditSink, ConfigGrantSource, Grant, GrantSource, JsonlAuditSink, Kernel, KernelConfig,
    TurnKernel,
};
use sharedos_protocol::{AccessContext, ExecutionEvent, ToolCall};
use sharedos_store::cluster::TestDatabase;
use sharedos_store::{
    GrantOrigin, NewRun, PostgresStore, SessionRecord, SqliteOptions, SqliteStore, Store,
    StoreGrants,
};
use tokio_util::sync::CancellationToken;

fn summary(name: &str, mut samples: Vec<Duration>) -> Value {
    samples.sort_unstable();
    let n = samples.len().max(1);
    let total: Duration = samples.iter().sum();
    let pick = |q: f64| {
        samples
            .get(((n as f64 - 1.0) * q) as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    json!({"name": name, "iterations": samples.len(), "p50Us": pick(0.5), "p99Us": pick(0.99),
           "perSecond": n as f64 / total.as_secs_f64()})
}

fn context() -> AccessContext {
    serde_json::from_value(json!({
        "namespaceId": "bench", "actor": {"kind": "agent", "agentId": "bench"},
        "authority": {"kind": "service", "serviceId": "host"},
        "owner": {"kind": "service", "serviceId": "host"}, "purpose": "benchmark",
        "traceId": "bench-trace", "enabledToolNamespaces": ["files"], "now": "2026-12-01T00:00:00Z"
    }))
    .expect("context")
}

/// One audit sink behind a real kernel, timed a block of calls at a time
/// so the sinks can take turns on a shared machine.
struct CallBench {
    name: &'static str,
    /// Owns the audit sink and the tools the turn calls into.
    _kernel: Kernel,
    turn: Arc<dyn sharedos_kernel::KernelTurn>,
    ctx: AccessContext,
    samples: Vec<Duration>,
    next: usize,
}

impl CallBench {
    async fn new(name: &'static str, audit: Arc<dyn AuditSink>, dir: &std::path::Path) -> Self {
        let config: KernelConfig = serde_json::from_value(json!({"grants": [{
            "id": "bench", "subject": {"kind": "agent", "agentId": "bench"},
            "issuer": {"kind": "service", "serviceId": "host"}, "namespaceId": "bench",
            "capabilities": [{"namespace": "files", "path": ["bench"], "scope": "descendants", "actions": ["list"]}]
        }]}))
        .expect("config");
        let kernel = Kernel::from_config(&config, dir, audit).expect("kernel");
        let ctx = context();
        let turn = kernel.open_turn(&ctx).await.expect("turn");
        Self {
            name,
            _kernel: kernel,
            turn,
            ctx,
            samples: Vec::new(),
            next: 0,
        }
    }

    async fn block(&mut self, count: usize) {
        for _ in 0..count {
            let i = self.next;
            self.next += 1;
            let call: ToolCall = serde_json::from_value(json!({"id": format!("c{i}"), "tool": "files.list",
                "arguments": {"path": ""}, "traceId": "bench-trace", "requestedAt": "2026-12-01T00:00:00Z"}))
            .expect("call");
            let t = Instant::now();
            self.turn
                .invoke_tool(&self.ctx, &call, CancellationToken::new())
                .await
                .expect("invoke");
            self.samples.push(t.elapsed());
        }
    }

    fn summary(self) -> Value {
        summary(self.name, self.samples)
    }
}

fn event(run: &str, sequence: u64) -> ExecutionEvent {
    serde_json::from_value(json!({"version": "1", "eventId": format!("e{sequence}"),
        "executionId": run, "traceId": run, "sequence": sequence, "type": "bench.step",
        "data": {"n": sequence}, "occurredAt": "2026-12-01T00:00:00Z"}))
    .expect("event")
}

/// Admissions and journal writes on one store, a block at a time.
struct JournalBench<'a> {
    label: &'static str,
    store: &'a dyn Store,
    admits: Vec<Duration>,
    appends: Vec<Duration>,
}

impl<'a> JournalBench<'a> {
    async fn new(label: &'static str, store: &'a dyn Store) -> Self {
        let session = SessionRecord {
            id: format!("s-{label}"),
            agent_id: "bench".into(),
            runtime_id: "bench".into(),
            scope: json!({}),
            binding: json!({}),
            open: true,
            created_at: "2026-12-01T00:00:00Z".into(),
            closed_at: None,
        };
        store.open_session(&session).await.expect("session");
        Self {
            label,
            store,
            admits: Vec::new(),
            appends: Vec::new(),
        }
    }

    /// `count` admissions, then `count` events journaled to the first run.
    async fn block(&mut self, count: usize) {
        let label = self.label;
        for _ in 0..count {
            let i = self.admits.len();
            let run = NewRun {
                id: format!("r-{label}-{i}"),
                session_id: format!("s-{label}"),
                request_id: format!("q{i}"),
                payload_digest: "d".into(),
                input: json!({"payload": {"i": i}}),
                host_id: "bench".into(),
                admitted_at: "2026-12-01T00:00:00Z".into(),
            };
            let t = Instant::now();
            self.store.admit_run(&run).await.expect("admit");
            self.admits.push(t.elapsed());
        }
        let run = format!("r-{label}-0");
        for _ in 0..count {
            let e = event(&run, self.appends.len() as u64);
            let t = Instant::now();
            self.store.append_event(&run, &e).await.expect("append");
            self.appends.push(t.elapsed());
        }
    }

    fn summaries(self) -> Vec<Value> {
        vec![
            summary(&format!("store.admit_run.{}", self.label), self.admits),
            summary(&format!("store.append_event.{}", self.label), self.appends),
        ]
    }
}

fn bench_grants() -> Vec<Grant> {
    (0..8)
        .map(|i| {
            serde_json::from_value(json!({
                "id": format!("g{i}"), "subject": {"kind": "agent", "agentId": "bench"},
                "issuer": {"kind": "service", "serviceId": "host"}, "namespaceId": "bench",
                "capabilities": [{"namespace": "files", "path": ["bench", format!("d{i}")],
                                  "scope": "descendants", "actions": ["read", "list"]}]
            }))
            .expect("grant")
        })
        .collect()
}

/// What a turn's start pays to load its actor's grants.
async fn grant_load(name: &str, source: &dyn GrantSource, n: usize) -> Value {
    let ctx = context();
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let loaded = source.load(&ctx).await.expect("load");
        samples.push(t.elapsed());
        assert_eq!(loaded.len(), 8);
    }
    summary(name, samples)
}

async fn stored_grant_load(label: &str, store: Arc<dyn Store>, n: usize) -> Value {
    for g in bench_grants() {
        store
            .add_grant(&g, GrantOrigin::Operator, "2026-12-01T00:00:00Z")
            .await
            .expect("add");
    }
    let source = StoreGrants::new(store);
    grant_load(&format!("kernel.grant_load.store_{label}"), &source, n).await
}

/// Host A writes, host B (its own connection and LISTEN) holds the event.
async fn observation_latency(db: &TestDatabase, n: usize) -> Value {
    let a = PostgresStore::connect(&db.conninfo, None).await.expect("a");
    let b = PostgresStore::connect(&db.conninfo, None).await.expect("b");
    let session = SessionRecord {
        id: "s-observe".into(),
        agent_id: "bench".into(),
        runtime_id: "bench".into(),
        scope: json!({}),
        binding: json!({}),
        open: true,
        created_at: "t".into(),
        closed_at: None,
    };
    a.open_session(&session).await.expect("session");
    let run = NewRun {
        id: "r-observe".into(),
        session_id: session.id.clone(),
        request_id: "q".into(),
        payload_digest: "d".into(),
        input: json!({}),
        host_id: "a".into(),
        admitted_at: "t".into(),
    };
    a.admit_run(&run).await.expect("admit");
    let mut changes = b.changes().expect("postgres notifies");
    let mut samples = Vec::with_capacity(n);
    for s in 0..n as u64 {
        let t = Instant::now();
        a.append_event(&run.id, &event(&run.id, s))
            .await
            .expect("append");
        loop {
            if changes.recv().await.expect("notification") == run.id {
                break;
            }
        }
        let after = s.checked_sub(1);
        let got = b.events_after(&run.id, after, 10).await.expect("read");
        assert_eq!(got.first().map(|e| e.sequence), Some(s));
        samples.push(t.elapsed());
    }
    summary("store.observation_latency.postgres_cross_host", samples)
}

/// How many turns each sink and store takes.
const ROUNDS: usize = 20;

/// `store` with a lease of host id `host` taken (an hour: no renewal in
/// the run), so its writes go through the fencing.
async fn leased(store: Arc<dyn Store>, host: &'static str) -> Arc<dyn Store> {
    store
        .acquire_lease(
            host,
            Duration::from_secs(3600),
            &sharedos_protocol::Timestamp::now(),
        )
        .await
        .expect("lease");
    store
}

/// Loading grants (from the configuration, from each store) and how soon
/// another host observes a change.
async fn grant_figures(
    db: &TestDatabase,
    sqlite: Arc<SqliteStore>,
    pg: Arc<PostgresStore>,
    n: usize,
) -> Vec<Value> {
    let config = ConfigGrantSource::new(bench_grants());
    vec![
        grant_load("kernel.grant_load.config", &config, n).await,
        stored_grant_load("sqlite", sqlite, n).await,
        stored_grant_load("postgres", pg, n).await,
        observation_latency(db, n.min(1000)).await,
    ]
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let dir = tempfile::tempdir().expect("tempdir");
    let db = TestDatabase::new().await.expect("postgres");
    let sqlite = Arc::new(
        SqliteStore::open(dir.path().join("bench.db"), SqliteOptions::default()).expect("sqlite"),
    );
    let pg = Arc::new(
        PostgresStore::connect(&db.conninfo, None)
            .await
            .expect("pg"),
    );
    let sqlite_leased = leased(
        Arc::new(
            SqliteStore::open(dir.path().join("bench.db"), SqliteOptions::default())
                .expect("sqlite"),
        ),
        "bench-sqlite",
    )
    .await;
    let pg_leased = leased(
        Arc::new(
            PostgresStore::connect(&db.conninfo, None)
                .await
                .expect("pg"),
        ),
        "bench-postgres",
    )
    .await;
    let jsonl = Arc::new(JsonlAuditSink::open(dir.path().join("audit.jsonl")).expect("jsonl"));
    let files = dir.path().join("files");
    std::fs::create_dir_all(&files).expect("files");
    // The machine is shared: the sinks and the stores take turns, a block
    // of ROUNDS at a time, so a burst of load elsewhere hits each alike.
    let block = n.div_ceil(ROUNDS);
    let mut calls = [
        CallBench::new("kernel.audited_tool_call.jsonl", jsonl, &files).await,
        CallBench::new("kernel.audited_tool_call.sqlite", sqlite.clone(), &files).await,
        CallBench::new("kernel.audited_tool_call.postgres", pg.clone(), &files).await,
        CallBench::new(
            "kernel.audited_tool_call.sqlite_leased",
            sqlite_leased.clone(),
            &files,
        )
        .await,
        CallBench::new(
            "kernel.audited_tool_call.postgres_leased",
            pg_leased.clone(),
            &files,
        )
        .await,
    ];
    let mut journals = [
        JournalBench::new("sqlite", sqlite.as_ref()).await,
        JournalBench::new("postgres", pg.as_ref()).await,
        JournalBench::new("sqlite_leased", sqlite_leased.as_ref()).await,
        JournalBench::new("postgres_leased", pg_leased.as_ref()).await,
    ];
    for _ in 0..ROUNDS {
        for c in &mut calls {
            c.block(block).await;
        }
        for j in &mut journals {
            j.block(block).await;
        }
    }
    let mut out: Vec<Value> = calls.into_iter().map(CallBench::summary).collect();
    for j in journals {
        out.extend(j.summaries());
    }
    out.extend(grant_figures(&db, sqlite.clone(), pg.clone(), n).await);
    for v in out {
        println!("{v}");
    }
}
