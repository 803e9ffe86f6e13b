//! Sessions and runs over the SQLite store, with real turns: the real
//! kernel (auditing into the store, counting uses in it), the real
//! executor, and `sharedos-testplugin` in a child process.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use sharedos_host::executor::{Executor, ExecutorOptions};
use sharedos_host::process::{DirectLauncher, ProcessRuntime, ProcessRuntimeConfig};
use sharedos_host::seat::process_seat;
use sharedos_kernel::{AuditOutcome, AuditSink, Kernel, UsageStore};
use sharedos_serve::session::{OpenSession, RunInput, Scope, SessionError, Sessions};
use sharedos_store::{RunState, SqliteOptions, SqliteStore, Store, StoreError};
use sharedos_tests::turns::{AGENT, NAMESPACE, kernel_config, testplugin_manifest, workspace_bin};

struct Host {
    sessions: Arc<Sessions>,
    store: Arc<SqliteStore>,
    files: tempfile::TempDir,
    _db: tempfile::TempDir,
}

fn host(options: SqliteOptions) -> Host {
    let db = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(db.path().join("sharedos.db"), options).unwrap());
    let kernel = Kernel::builder_from_config(
        &kernel_config(),
        files.path(),
        store.clone() as Arc<dyn AuditSink>,
    )
    .unwrap()
    .usage_store(store.clone() as Arc<dyn UsageStore>)
    .build();
    let runtime = ProcessRuntime::new(
        ProcessRuntimeConfig::new(workspace_bin("sharedos-testplugin"), testplugin_manifest()),
        Arc::new(DirectLauncher),
    )
    .unwrap();
    let executor = Executor::new(
        Arc::new(kernel),
        process_seat(Arc::new(runtime)),
        ExecutorOptions::default(),
    )
    .unwrap();
    let sessions = Sessions::new(
        store.clone() as Arc<dyn Store>,
        HashMap::from([("sharedos-testplugin".to_owned(), Arc::new(executor))]),
        HashMap::from([(AGENT.to_owned(), "sharedos-testplugin".to_owned())]),
        "host-test",
    );
    Host {
        sessions: Arc::new(sessions),
        store,
        files,
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

fn other_scope() -> Scope {
    let mut s = scope();
    s.owner = serde_json::from_value(json!({"kind": "human", "userId": "mallory"})).unwrap();
    s
}

fn spec() -> OpenSession {
    serde_json::from_value(json!({
        "agentId": AGENT,
        "purpose": "Exercise sessions",
        "enabledToolNamespaces": ["files"],
        "tools": [{"name": "files.write", "description": "w", "namespace": "files", "source": "request",
                   "readWrite": "write", "inputSchema": {},
                   "requiredCapability": {"resource": {"namespace": "files", "path": []}, "action": "write"}}]
    }))
    .unwrap()
}

fn input(script: Value) -> RunInput {
    serde_json::from_value(json!({"payload": {"script": script, "traceFromTurn": true}, "options": {"timeoutMs": 20000}}))
        .unwrap()
}

fn status(run: &sharedos_store::RunRecord) -> String {
    run.result.as_ref().unwrap()["status"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_request_id_runs_once_and_a_changed_payload_is_refused() {
    let h = host(SqliteOptions::default());
    let s = h.sessions.open_session(&scope(), spec()).await.unwrap();
    let write = json!([{"op": "call", "tool": "files.write",
                        "arguments": {"path": "once.txt", "content": "x"}}]);
    let first = h
        .sessions
        .run(&scope(), &s.id, "req-1", input(write.clone()))
        .await
        .unwrap();
    assert!(!first.repeated);
    let ended = h.sessions.wait(&scope(), &first.run.id).await.unwrap();
    assert_eq!(status(&ended), "succeeded");
    assert!(
        h.files
            .path()
            .join(NAMESPACE)
            .join(AGENT)
            .join("once.txt")
            .is_file()
    );

    let again = h
        .sessions
        .run(&scope(), &s.id, "req-1", input(write))
        .await
        .unwrap();
    assert!(again.repeated);
    assert_eq!(again.run.id, first.run.id);
    assert_eq!(again.run.result, ended.result, "the original result");
    let writes = h
        .store
        .audit_trail(&first.run.id)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.kind == "tool.invoked" && r.outcome == AuditOutcome::Succeeded)
        .count();
    assert_eq!(writes, 1, "the repeat did not run the tool again");

    let err = h
        .sessions
        .run(&scope(), &s.id, "req-1", input(json!([])))
        .await
        .unwrap_err();
    assert!(
        matches!(err, SessionError::Store(StoreError::RequestConflict { .. })),
        "{err}"
    );

    // The session and the run are invisible from another scope.
    let err = h
        .sessions
        .get_run(&other_scope(), &first.run.id)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            SessionError::Store(StoreError::NotFound { what: "run", .. })
        ),
        "{err}"
    );
    let err = h
        .sessions
        .run(&other_scope(), &s.id, "req-2", input(json!([])))
        .await
        .unwrap_err();
    assert!(
        matches!(err, SessionError::Store(StoreError::NotFound { .. })),
        "{err}"
    );
    assert!(
        h.sessions
            .cancel(&other_scope(), &first.run.id)
            .await
            .is_err()
    );
    assert!(
        h.sessions
            .observe(&other_scope(), &first.run.id, None)
            .await
            .is_err()
    );

    h.sessions.close_session(&scope(), &s.id).await.unwrap();
    let err = h
        .sessions
        .run(&scope(), &s.id, "req-3", input(json!([])))
        .await
        .unwrap_err();
    assert!(
        matches!(err, SessionError::Store(StoreError::SessionClosed(_))),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_get_history_then_live_events_without_gap_or_duplicate() {
    let h = host(SqliteOptions::default());
    let s = h.sessions.open_session(&scope(), spec()).await.unwrap();
    let mut script = Vec::new();
    for i in 0..20 {
        script.push(json!({"op": "emit", "type": "step", "data": {"i": i}}));
        if i % 5 == 0 {
            script.push(json!({"op": "sleep", "ms": 50}));
        }
    }
    let run = h
        .sessions
        .run(&scope(), &s.id, "req-1", input(Value::Array(script)))
        .await
        .unwrap()
        .run;
    // One observer from the start while the run is live; another that
    // joins mid-run after reading the first three events and dropping.
    let mut whole = h.sessions.observe(&scope(), &run.id, None).await.unwrap();
    let mut seen = Vec::new();
    while let Some(e) = whole.next().await.unwrap() {
        seen.push(e.sequence);
        if seen.len() == 3 {
            let sessions = h.sessions.clone();
            let id = run.id.clone();
            let resumed = tokio::spawn(async move {
                let mut o = sessions.observe(&scope(), &id, Some(2)).await.unwrap();
                let mut rest = Vec::new();
                while let Some(e) = o.next().await.unwrap() {
                    rest.push(e.sequence);
                }
                rest
            });
            let rest = resumed.await.unwrap();
            assert_eq!(rest.first(), Some(&3), "re-attached right after sequence 2");
            assert!(rest.windows(2).all(|w| w[1] == w[0] + 1), "{rest:?}");
        }
    }
    let expected: Vec<u64> = (0..seen.len() as u64).collect();
    assert_eq!(seen, expected, "every sequence exactly once, in order");
    let ended = h.sessions.get_run(&scope(), &run.id).await.unwrap();
    assert_eq!(ended.state, RunState::Ended);
    let steps = seen.len();
    assert!(steps > 20, "the 20 emitted events and the envelope's own");

    let last = *seen.last().unwrap();
    let err = h
        .sessions
        .observe(&scope(), &run.id, Some(last + 5))
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("beyond the end"), "{err}");
    let mut tail = h
        .sessions
        .observe(&scope(), &run.id, Some(last))
        .await
        .unwrap();
    assert!(tail.next().await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_says_what_was_dropped() {
    let h = host(SqliteOptions {
        keep_events_per_run: Some(2),
        ..SqliteOptions::default()
    });
    let s = h.sessions.open_session(&scope(), spec()).await.unwrap();
    let script =
        json!([{"op": "emit", "type": "a", "data": {}}, {"op": "emit", "type": "b", "data": {}}]);
    let run = h
        .sessions
        .run(&scope(), &s.id, "r", input(script))
        .await
        .unwrap()
        .run;
    let ended = h.sessions.wait(&scope(), &run.id).await.unwrap();
    let dropped = ended.dropped_through.expect("events were dropped");
    let err = h
        .sessions
        .observe(&scope(), &run.id, None)
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("dropped by retention"), "{err}");
    let mut o = h
        .sessions
        .observe(&scope(), &run.id, Some(dropped))
        .await
        .unwrap();
    let mut kept = 0;
    while o.next().await.unwrap().is_some() {
        kept += 1;
    }
    assert_eq!(kept, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_run_ends_cancelled_and_observers_see_the_end() {
    let h = host(SqliteOptions::default());
    let s = h.sessions.open_session(&scope(), spec()).await.unwrap();
    let script = json!([{"op": "emit", "type": "parked", "data": {}}, {"op": "stall"}]);
    let run = h
        .sessions
        .run(&scope(), &s.id, "r", input(script))
        .await
        .unwrap()
        .run;
    let mut o = h.sessions.observe(&scope(), &run.id, None).await.unwrap();
    loop {
        let e = o
            .next()
            .await
            .unwrap()
            .expect("the run emits before it stalls");
        if e.kind.as_str() == "runtime.event" && e.data["type"] == "parked" {
            break;
        }
    }
    assert!(
        h.sessions
            .cancel(&scope(), &run.id)
            .await
            .unwrap()
            .is_some()
    );
    let rest = tokio::time::timeout(Duration::from_secs(30), async {
        let mut kinds = Vec::new();
        while let Some(e) = o.next().await.unwrap() {
            kinds.push(e.kind.to_string());
        }
        kinds
    })
    .await
    .expect("the observer ends after the cancel");
    assert!(
        rest.iter()
            .any(|k| k == "turn.cancelled" || k.contains("cancel")),
        "{rest:?}"
    );
    let ended = h.sessions.get_run(&scope(), &run.id).await.unwrap();
    assert_eq!(status(&ended), "cancelled");
    h.sessions.drain().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_database_refuses_the_run_before_dispatch() {
    let h = host(SqliteOptions {
        busy_timeout: Duration::from_millis(200),
        ..SqliteOptions::default()
    });
    let s = h.sessions.open_session(&scope(), spec()).await.unwrap();
    // Another process's writer holds the database.
    let other = rusqlite::Connection::open(h.store.path()).unwrap();
    other.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let write = json!([{"op": "call", "tool": "files.write",
                        "arguments": {"path": "locked.txt", "content": "x"}}]);
    let err = h
        .sessions
        .run(&scope(), &s.id, "req-1", input(write.clone()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, SessionError::Store(StoreError::Unavailable(_))),
        "{err}"
    );
    other.execute_batch("ROLLBACK").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !h.files
            .path()
            .join(NAMESPACE)
            .join(AGENT)
            .join("locked.txt")
            .exists(),
        "nothing was dispatched"
    );
    // Once the lock is gone the same requestId is admitted afresh.
    let run = h
        .sessions
        .run(&scope(), &s.id, "req-1", input(write))
        .await
        .unwrap();
    assert!(!run.repeated);
    let ended = h.sessions.wait(&scope(), &run.run.id).await.unwrap();
    assert_eq!(status(&ended), "succeeded");
}
