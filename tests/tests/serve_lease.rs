//! Host leases between two `sharedos serve` processes on one PostgreSQL,
//! and on one SQLite file (docs/STORE.md, "Recovery across machines"),
//! each with a short lease:
//!
//! - a host SIGKILLed mid-run (after a tool call wrote a file) is taken
//!   over by the other once its lease expired: the run is `interrupted`
//!   with the account, the effect is not replayed (the file on disk), the
//!   audit trail has one decision and one invocation;
//! - a host SIGSTOPped past its lease is taken over, and once SIGCONTed it
//!   is fenced: the tool call its plugin makes then is refused (no
//!   decision stored, no `maxUses` use taken, no effect), nothing it
//!   journals lands after `run.interrupted`, it admits no new run and its
//!   `/v1/health` says the lease is lost;
//! - a live host's long run is never taken over (its renewals hold).
//!
//! The pause runs on PostgreSQL only: a process stopped while it holds
//! SQLite's write lock (a renewal is a write) stops every other process's
//! writes with it, so where the pause lands would decide the outcome.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use serde_json::{Value, json};
use sharedos_store::cluster::TestDatabase;
use sharedos_store::{PostgresStore, SqliteOptions, SqliteStore, Store};
use sharedos_tests::served::{
    Events, Server, agent_file, call, open_session, run_body, start_run, start_with, wait_state,
    write_config_with,
};

/// One use of `files.delete` under `once/`.
const ONE_DELETE: &str = r#"
[[kernel.grants]]
id = "notes-once"
subject = { kind = "agent", agentId = "alice" }
issuer = { kind = "service", serviceId = "test-host" }
namespaceId = "endings"
maxUses = 1
capabilities = [{ namespace = "files", path = ["alice", "once"], scope = "descendants", actions = ["delete"] }]
"#;

/// The database both hosts share.
enum Shared {
    Postgres(TestDatabase),
    Sqlite(PathBuf),
}

impl Shared {
    async fn postgres() -> Self {
        Shared::Postgres(TestDatabase::new().await.unwrap())
    }
    fn sqlite(dir: &Path) -> Self {
        Shared::Sqlite(dir.join("shared.db"))
    }
    fn args(&self) -> [String; 2] {
        match self {
            Shared::Postgres(db) => ["--postgres".into(), db.conninfo.clone()],
            Shared::Sqlite(path) => ["--database".into(), path.display().to_string()],
        }
    }
    /// A store of the test's own on the shared database (no lease).
    async fn store(&self) -> Arc<dyn Store> {
        match self {
            Shared::Postgres(db) => {
                Arc::new(PostgresStore::connect(&db.conninfo, None).await.unwrap())
            }
            Shared::Sqlite(path) => {
                Arc::new(SqliteStore::open(path, SqliteOptions::default()).unwrap())
            }
        }
    }
}

/// A host with a short lease (renewed every third of it).
fn leased(dir: &Path, db: &Shared, name: &str, lease_ms: u64) -> Server {
    let [flag, value] = db.args();
    let lease = lease_ms.to_string();
    start_with(
        dir,
        &format!("{name}.sock"),
        &[&flag, &value, "--host-id", name, "--lease-ms", &lease],
    )
}

fn signal(pid: u32, signal: Signal) {
    let pid = Pid::from_raw(pid as i32).unwrap();
    kill_process(pid, signal).unwrap();
}

/// SIGKILLs `pid` unless it is gone already (ESRCH: a plugin that died
/// with its host by its parent-death signal, which is what was wanted).
fn kill_if_alive(pid: u32) {
    let pid = Pid::from_raw(pid as i32).unwrap();
    match kill_process(pid, Signal::KILL) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => {}
        Err(e) => panic!("kill({pid:?}): {e}"),
    }
}

/// The records of `run`'s trail of `kind` for `tool`.
async fn records(db: &Shared, run: &str, kind: &str, tool: &str) -> usize {
    db.store()
        .await
        .audit_trail(run)
        .await
        .unwrap()
        .iter()
        .filter(|r| r.kind == kind && r.tool.as_deref() == Some(tool))
        .count()
}

/// The journal's event types, in order, read from the store.
async fn journal(db: &Shared, run: &str) -> Vec<String> {
    db.store()
        .await
        .events_after(run, None, 1000)
        .await
        .unwrap()
        .iter()
        .map(|e| e.kind.to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_a_killed_host_is_taken_over_by_the_other_without_replay_postgres() {
    let dir = tempfile::tempdir().unwrap();
    killed_host_taken_over(dir.path(), Shared::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_a_killed_host_is_taken_over_by_the_other_without_replay_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    killed_host_taken_over(dir.path(), Shared::sqlite(dir.path())).await;
}

async fn killed_host_taken_over(dir: &Path, db: Shared) {
    write_config_with(dir, "");
    let mut a = leased(dir, &db, "a", 1000);
    let b = leased(dir, &db, "b", 1000);
    let session = open_session(&a.socket()).await;
    let script = json!([
        {"op": "emit_pid"},
        {"op": "call", "tool": "files.write", "arguments": {"path": "effect.txt", "content": "once"}},
        {"op": "emit", "type": "written", "data": {}},
        {"op": "stall"}
    ]);
    let run = start_run(&a.socket(), &session, "req-1", script).await;
    let mut events = Events::open(&b.socket(), &run, None).await;
    let plugin = events.until("written").await;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    if let Some(pid) = plugin {
        kill_if_alive(pid as u32);
    }
    let effect = agent_file(dir, "effect.txt");
    assert_eq!(std::fs::read_to_string(&effect).unwrap(), "once");
    std::fs::remove_file(&effect).unwrap();

    // No replacement of A starts: B takes the run over once A's lease
    // expired, and its observer sees the run end.
    let run_now = wait_state(&b.socket(), &run, "interrupted").await;
    let recovery = &run_now["recovery"];
    assert_eq!(recovery["reason"], "host_lease_expired", "{recovery}");
    assert_eq!(
        (&recovery["hostId"], &recovery["recoveredBy"]),
        (&json!("a"), &json!("b"))
    );
    assert_eq!(recovery["calls"][0]["outcome"], "succeeded", "{recovery}");
    assert_eq!(recovery["interrupted"], json!([]));
    let tail = events.kinds_to_end().await;
    assert_eq!(tail, vec!["run.interrupted".to_owned(), "end".to_owned()]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!effect.exists(), "the effect was not replayed");

    // One decision and one invocation of the write, both A's; the takeover
    // added no outcome (the write's was recorded).
    assert_eq!(
        records(&db, &run, "authorization.checked", "files.write").await,
        1
    );
    assert_eq!(records(&db, &run, "tool.invoked", "files.write").await, 1);
    let trail = db.store().await.audit_trail(&run).await.unwrap();
    assert!(
        trail
            .iter()
            .all(|r| r.reason.as_deref() != Some("host_lease_expired")),
        "{trail:?}"
    );
}

/// Waits until a `sharedos serve` log in `dir` has a line with both
/// `needle` and `run`.
fn wait_for_log(dir: &Path, needle: &str, run: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = std::fs::read_dir(dir).unwrap().flatten().any(|f| {
            f.file_name().to_string_lossy().starts_with("serve-")
                && std::fs::read_to_string(f.path())
                    .unwrap_or_default()
                    .lines()
                    .any(|l| l.contains(needle) && l.contains(run))
        });
        if found {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no log line {needle:?} for {run}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every `serve-*` log of `dir`, for a failure's message.
fn serve_logs(dir: &Path) -> String {
    let mut out = String::new();
    for f in std::fs::read_dir(dir).unwrap().flatten() {
        let name = f.file_name().to_string_lossy().into_owned();
        if name.starts_with("serve-") {
            let text = std::fs::read_to_string(f.path()).unwrap_or_default();
            out.push_str(&format!("--- {name}\n{text}\n"));
        }
    }
    out
}

async fn health(socket: &Path) -> (u16, Value) {
    call(socket, "GET", "/v1/health", "operator", Value::Null).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_a_paused_host_is_fenced_when_it_comes_back() {
    let db = Shared::postgres().await;
    let dir = tempfile::tempdir().unwrap();
    write_config_with(dir.path(), ONE_DELETE);
    let a = leased(dir.path(), &db, "a", 1000);
    let b = leased(dir.path(), &db, "b", 1000);
    let (sa, sb) = (a.socket(), b.socket());
    let (status, body) = health(&sa).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["lease"]["hostId"], "a");
    let once = agent_file(dir.path(), "once");
    std::fs::create_dir_all(&once).unwrap();
    std::fs::write(once.join("keep.txt"), "keep").unwrap();
    let go = dir.path().join("go");
    let session = open_session(&sa).await;
    let script = json!([
        {"op": "emit", "type": "started", "data": {}},
        {"op": "wait_path", "path": go.to_str().unwrap()},
        {"op": "call", "tool": "files.delete", "arguments": {"path": "once/keep.txt"}},
        {"op": "emit", "type": "after", "data": {}}
    ]);
    let run = start_run(&sa, &session, "paused", script).await;
    let mut events = Events::open(&sa, &run, None).await;
    events.until("started").await;
    drop(events);

    // A pauses past its lease; B takes its run over.
    signal(a.child.id(), Signal::STOP);
    let taken = wait_state(&sb, &run, "interrupted").await;
    assert_eq!(taken["recovery"]["reason"], "host_lease_expired");
    assert_eq!(taken["recovery"]["calls"], json!([]));
    // A comes back; its plugin now asks for the delete.
    std::fs::write(&go, "").unwrap();
    signal(a.child.id(), Signal::CONT);

    // A's turn ends; writing its end is refused.
    wait_for_log(dir.path(), "could not record the end of the run", &run);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = health(&sa).await;
        if status == 503 {
            assert_eq!(body["error"]["code"], "lease_lost", "{body}");
            assert_eq!(body["lease"]["hostId"], "a");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "A never reported its lease lost ({status} {body}); its log:\n{}",
            serve_logs(dir.path())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The late call had no effect, took no use and left no decision.
    assert!(once.join("keep.txt").exists(), "the fenced host deleted");
    assert_eq!(
        db.store().await.remaining("notes-once", 1).await.unwrap(),
        1,
        "the fenced host took no use"
    );
    assert_eq!(
        records(&db, &run, "authorization.checked", "files.delete").await,
        0
    );
    // The run stays as B left it; the journal ends with its takeover.
    let after = wait_state(&sb, &run, "interrupted").await;
    assert_eq!(after["result"], Value::Null, "{after}");
    let kinds = journal(&db, &run).await;
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("run.interrupted"),
        "{kinds:?}"
    );
    // A admits nothing more; B does.
    let (status, body) = call(
        &sa,
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        "operator",
        run_body("after-a", json!([])),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("lease_lost")),
        "{body}"
    );
    let on_b = start_run(&sb, &session, "after-b", json!([])).await;
    wait_state(&sb, &on_b, "ended").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_a_live_hosts_long_run_is_never_taken_over_postgres() {
    let dir = tempfile::tempdir().unwrap();
    long_run_kept(dir.path(), Shared::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_a_live_hosts_long_run_is_never_taken_over_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    long_run_kept(dir.path(), Shared::sqlite(dir.path())).await;
}

async fn long_run_kept(dir: &Path, db: Shared) {
    write_config_with(dir, "");
    let a = leased(dir, &db, "a", 600);
    let b = leased(dir, &db, "b", 600);
    let session = open_session(&a.socket()).await;
    // Five leases long.
    let mut script = Vec::new();
    for i in 0..10 {
        script.push(json!({"op": "emit", "type": "step", "data": {"i": i}}));
        script.push(json!({"op": "sleep", "ms": 300}));
    }
    let run = start_run(&a.socket(), &session, "long", Value::Array(script)).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let state = loop {
        let (_, body) = call(
            &b.socket(),
            "GET",
            &format!("/v1/runs/{run}"),
            "operator",
            Value::Null,
        )
        .await;
        if body["run"]["state"] != "in_flight" {
            break body["run"].clone();
        }
        assert!(Instant::now() < deadline, "the run never ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(state["state"], "ended", "{state}");
    assert_eq!(state["recovery"], Value::Null);
    let kinds = journal(&db, &run).await;
    assert!(kinds.len() >= 10, "every step journaled: {kinds:?}");
    assert!(!kinds.iter().any(|k| k == "run.interrupted"), "{kinds:?}");
}
