//! Session affinity (issue 15), from the outside: sessions over the SQLite
//! store, the real kernel and executor, and `sharedos-testplugin` in the
//! full sandbox. What is asserted is what the host sees: the pid of the
//! launched process (`metadata.runtime.affinity.pid`, checked in `/proc`),
//! what the plugin read from its own `/tmp`, and, at the end of each test,
//! no descendant of this process, no cgroup and no workspace of it. The tests of this
//! binary run one at a time (they count this process's descendants).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Value, json};
use sharedos_host::executor::{ExecuteOptions, Executor, ExecutorOptions};
use sharedos_host::process::{AffinityConfig, ProcessRuntime, ProcessRuntimeConfig};
use sharedos_host::seat::process_seat;
use sharedos_kernel::{AuditSink, Kernel, UsageStore};
use sharedos_serve::session::{OpenSession, RunInput, Scope, Sessions};
use sharedos_store::{SqliteOptions, SqliteStore, Store};
use sharedos_tests::leftovers::{eventually, own_cgroups, own_workspaces};
use sharedos_tests::turns::{
    AGENT, Launch, NAMESPACE, descendants, is_alive, kernel_config, testplugin_manifest,
    workspace_bin,
};

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

struct Host {
    sessions: Arc<Sessions>,
    executor: Arc<Executor>,
    _files: tempfile::TempDir,
    _db: tempfile::TempDir,
}

/// A host whose one runtime is the testplugin in `mode`, sandboxed, with
/// `affinity = { ttlMs = ttl_ms }`.
fn host(mode: &str, ttl_ms: u64) -> Host {
    host_with(mode, ttl_ms, ExecutorOptions::default())
}

fn host_with(mode: &str, ttl_ms: u64, options: ExecutorOptions) -> Host {
    let db = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let store = Arc::new(
        SqliteStore::open(db.path().join("sharedos.db"), SqliteOptions::default()).unwrap(),
    );
    let kernel = Kernel::builder_from_config(
        &kernel_config(),
        files.path(),
        store.clone() as Arc<dyn AuditSink>,
    )
    .unwrap()
    .usage_store(store.clone() as Arc<dyn UsageStore>)
    .build();
    let mut config =
        ProcessRuntimeConfig::new(workspace_bin("sharedos-testplugin"), testplugin_manifest());
    config.args = vec![mode.to_owned()];
    config.affinity = Some(AffinityConfig { ttl_ms });
    let runtime = ProcessRuntime::new(config, Launch::Sandbox.launcher()).unwrap();
    let executor = Arc::new(
        Executor::new(Arc::new(kernel), process_seat(Arc::new(runtime)), options).unwrap(),
    );
    let sessions = Sessions::new(
        store as Arc<dyn Store>,
        HashMap::from([("sharedos-testplugin".to_owned(), executor.clone())]),
        HashMap::from([(AGENT.to_owned(), "sharedos-testplugin".to_owned())]),
        "host-affinity",
    );
    Host {
        sessions: Arc::new(sessions),
        executor,
        _files: files,
        _db: db,
    }
}

fn scope() -> Scope {
    serde_json::from_value(json!({
        "namespaceId": NAMESPACE,
        "authority": {"kind": "service", "serviceId": "test-host"},
        "owner": {"kind": "human", "userId": "operator"}
    }))
    .unwrap()
}

fn spec() -> OpenSession {
    serde_json::from_value(json!({"agentId": AGENT, "purpose": "Exercise session affinity"}))
        .unwrap()
}

fn input(script: Value) -> RunInput {
    serde_json::from_value(json!({"payload": {"script": script}, "options": {"timeoutMs": 20000}}))
        .unwrap()
}

/// Runs one turn of `session` and returns its result.
async fn run(h: &Host, session: &str, request_id: &str, script: Value) -> Value {
    let handle = h
        .sessions
        .run(&scope(), session, request_id, input(script))
        .await
        .unwrap();
    let ended = h.sessions.wait(&scope(), &handle.run.id).await.unwrap();
    ended.result.unwrap()
}

fn affinity(result: &Value) -> Value {
    result["metadata"]["runtime"]["affinity"].clone()
}

fn pid(result: &Value) -> u32 {
    affinity(result)["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .unwrap_or_else(|| panic!("no affinity pid in {result:#}"))
}

/// Nothing of this host survives: no descendant, no cgroup, no workspace
/// (polled under a generous bound; the teardown runs off the turn's path).
fn assert_nothing_left(what: &str) {
    let me = std::process::id();
    assert!(
        eventually(Duration::from_secs(20), || descendants(me).is_empty()),
        "{what}: processes left: {:?}",
        descendants(me)
    );
    assert!(
        eventually(Duration::from_secs(20), || own_cgroups().is_empty()),
        "{what}: cgroups left: {:?}",
        own_cgroups()
    );
    assert!(
        eventually(Duration::from_secs(20), || own_workspaces().is_empty()),
        "{what}: workspaces left: {:?}",
        own_workspaces()
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

const WRITE: &str = "/tmp/affinity.txt";

fn write_tmp() -> Value {
    json!([{"op": "write_file", "path": WRITE, "text": "left by turn 1"}])
}

fn read_tmp() -> Value {
    json!([{"op": "read_file", "path": WRITE}])
}

fn read_text(result: &Value) -> Value {
    result["output"]["results"][0]["text"].clone()
}

#[test]
fn turns_of_one_session_share_a_process_and_its_tmp_and_no_one_else_does() {
    let _serial = serial();
    runtime().block_on(async {
        let h = host("many", 300_000);
        let s1 = h.sessions.open_session(&scope(), spec()).await.unwrap();
        let first = run(&h, &s1.id, "a-1", write_tmp()).await;
        assert_eq!(first["status"], "succeeded", "{first:#}");
        let p = pid(&first);
        let first_id = first["executionId"].clone();
        assert_eq!(
            affinity(&first),
            json!({"reused": false, "firstExecutionId": first_id, "turn": 1, "pid": p})
        );
        // Parked: the process of turn 1 is alive between the turns.
        assert!(is_alive(p), "the process of turn 1 is gone");

        let second = run(&h, &s1.id, "a-2", read_tmp()).await;
        assert_eq!(second["status"], "succeeded", "{second:#}");
        assert_eq!(
            affinity(&second),
            json!({"reused": true, "firstExecutionId": first_id, "turn": 2, "pid": p})
        );
        assert_eq!(second["output"]["turnsServed"], 2);
        assert_eq!(read_text(&second), "left by turn 1", "{second:#}");
        // The isolation the process was started under is every turn's.
        let sandbox = &first["metadata"]["runtime"]["sandbox"];
        assert_eq!(
            sandbox["level"],
            sharedos_tests::full_level(),
            "{sandbox:#}"
        );
        assert_eq!(&second["metadata"]["runtime"]["sandbox"], sandbox);

        // Another session of the same agent and scope: a fresh process,
        // which sees nothing of the first one's /tmp.
        let s2 = h.sessions.open_session(&scope(), spec()).await.unwrap();
        let other = run(&h, &s2.id, "b-1", read_tmp()).await;
        assert_eq!(other["status"], "succeeded", "{other:#}");
        assert_ne!(pid(&other), p);
        assert_eq!(affinity(&other)["reused"], false);
        assert_eq!(read_text(&other), Value::Null, "{other:#}");
        let q = pid(&other);

        // Closing the first session kills its process; the second's stays.
        h.sessions.close_session(&scope(), &s1.id).await.unwrap();
        assert!(
            eventually(Duration::from_secs(20), || !is_alive(p)),
            "the closed session's process is alive"
        );
        assert!(is_alive(q), "the other session's process was killed");

        // A bare `execute` (no session) never takes a parked process.
        let bare: sharedos_protocol::ExecutionRequest = serde_json::from_value(
            sharedos_tests::turns::request("bare-1", read_tmp(), &[], 20000),
        )
        .unwrap();
        let bare = h
            .executor
            .execute(bare, ExecuteOptions::default())
            .await
            .unwrap();
        let bare = serde_json::to_value(&bare).unwrap();
        assert_eq!(bare["status"], "succeeded", "{bare:#}");
        assert_eq!(affinity(&bare), Value::Null, "{bare:#}");
        assert_eq!(read_text(&bare), Value::Null);

        // Shutdown kills what is parked.
        h.sessions.drain().await;
        assert!(
            eventually(Duration::from_secs(20), || !is_alive(q)),
            "the parked process outlived the shutdown"
        );
    });
    assert_nothing_left("after the shutdown");
}

#[test]
fn a_turn_that_did_not_complete_leaves_nothing_parked() {
    let _serial = serial();
    runtime().block_on(async {
        let h = host("many", 300_000);
        let s = h.sessions.open_session(&scope(), spec()).await.unwrap();
        let fail = json!([{"op": "outcome", "value": {"type": "fail",
            "error": {"code": "nope", "message": "failed on purpose", "retryable": false}}}]);
        let failed = run(&h, &s.id, "f-1", fail).await;
        assert_eq!(failed["status"], "failed", "{failed:#}");
        let p = pid(&failed);
        assert!(
            eventually(Duration::from_secs(20), || !is_alive(p)),
            "the failed turn's process is alive"
        );
        assert_nothing_left("after a failed turn");
        let next = run(&h, &s.id, "f-2", json!([])).await;
        assert_eq!(next["status"], "succeeded", "{next:#}");
        assert_ne!(pid(&next), p);
        assert_eq!(affinity(&next)["turn"], 1);
        // `settle_kills` kills a parked process too, and waits for it.
        assert!(is_alive(pid(&next)));
        sharedos_host::process::settle_kills();
        assert!(
            !is_alive(pid(&next)),
            "settle_kills left the parked process"
        );
    });
    assert_nothing_left("after settle_kills");
}

#[test]
fn a_turn_that_completed_during_a_drain_leaves_nothing_parked() {
    let _serial = serial();
    runtime().block_on(async {
        // A grace as long as the turn's limit: the turn drains from its
        // first instant; its outcome is honoured, its process not kept.
        let options = ExecutorOptions {
            drain_grace_ms: 20_000,
            ..ExecutorOptions::default()
        };
        let h = host_with("many", 300_000, options);
        let s = h.sessions.open_session(&scope(), spec()).await.unwrap();
        let drained = run(&h, &s.id, "d-1", write_tmp()).await;
        assert_eq!(drained["status"], "succeeded", "{drained:#}");
        let warnings = drained["metadata"]["runtime"]["warnings"].to_string();
        assert!(
            warnings.contains("drained from its first instant"),
            "{drained:#}"
        );
        let p = pid(&drained);
        assert!(
            eventually(Duration::from_secs(20), || !is_alive(p)),
            "the drained turn's process is alive"
        );
        assert_nothing_left("after a drained turn");
        let next = run(&h, &s.id, "d-2", read_tmp()).await;
        assert_ne!(pid(&next), p);
        assert_eq!(read_text(&next), Value::Null);
        h.sessions.drain().await;
    });
    assert_nothing_left("after the shutdown");
}

#[test]
fn the_ttl_ends_a_parked_process() {
    let _serial = serial();
    runtime().block_on(async {
        let h = host("many", 200);
        let s = h.sessions.open_session(&scope(), spec()).await.unwrap();
        let first = run(&h, &s.id, "t-1", write_tmp()).await;
        assert_eq!(first["status"], "succeeded", "{first:#}");
        let p = pid(&first);
        // Nothing else ends it: no close, no shutdown, no settle_kills.
        assert!(
            eventually(Duration::from_secs(20), || !is_alive(p)),
            "the parked process outlived its TTL"
        );
        assert_nothing_left("after the TTL");
        let next = run(&h, &s.id, "t-2", read_tmp()).await;
        assert_ne!(pid(&next), p);
        assert_eq!(affinity(&next)["reused"], false);
        assert_eq!(read_text(&next), Value::Null);
        h.sessions.drain().await;
    });
    assert_nothing_left("after the shutdown");
}

#[test]
fn a_plugin_that_did_not_accept_many_turns_is_never_reused() {
    let _serial = serial();
    runtime().block_on(async {
        let h = host("normal", 300_000);
        let s = h.sessions.open_session(&scope(), spec()).await.unwrap();
        let first = run(&h, &s.id, "n-1", write_tmp()).await;
        assert_eq!(first["status"], "succeeded", "{first:#}");
        let p = pid(&first);
        assert!(
            eventually(Duration::from_secs(20), || !is_alive(p)),
            "the process of a plugin without turns: many was kept"
        );
        let second = run(&h, &s.id, "n-2", read_tmp()).await;
        assert_eq!(second["status"], "succeeded", "{second:#}");
        assert_ne!(pid(&second), p);
        assert_eq!(affinity(&second)["turn"], 1);
        assert_eq!(read_text(&second), Value::Null);
    });
    assert_nothing_left("after a plugin without turns: many");
}
