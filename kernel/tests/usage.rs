//! Use counters: atomic under concurrency, durable across a restart.

mod common;

use std::sync::Arc;

use common::*;
use serde_json::json;
use sharedos_kernel::{
    JsonlUsageStore, Kernel, KernelConfig, MemoryAuditSink, MemoryUsageStore, Scope, TurnKernel,
    UsageStore,
};
use sharedos_protocol::ToolStatus;
use tokio_util::sync::CancellationToken;

async fn race(store: Arc<dyn UsageStore>) -> usize {
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let s = Arc::clone(&store);
        tasks.push(tokio::spawn(
            async move { s.try_consume("g", 3).await.unwrap() },
        ));
    }
    let mut won = 0;
    for t in tasks {
        won += usize::from(t.await.unwrap());
    }
    won
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_consumers_never_take_more_than_max_uses() {
    assert_eq!(race(Arc::new(MemoryUsageStore::new())).await, 3);
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        race(Arc::new(
            JsonlUsageStore::open(dir.path().join("uses.jsonl")).unwrap()
        ))
        .await,
        3
    );
}

#[tokio::test]
async fn a_restart_keeps_the_count() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("uses.jsonl");
    let store = JsonlUsageStore::open(&path).unwrap();
    assert!(store.try_consume("g", 2).await.unwrap());
    drop(store);
    // A torn line from a crash mid-write is cut on open.
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("\"g");
    std::fs::write(&path, text).unwrap();
    let store = JsonlUsageStore::open(&path).unwrap();
    assert_eq!(store.remaining("g", 2).await.unwrap(), 1);
    assert!(store.try_consume("g", 2).await.unwrap());
    assert!(!store.try_consume("g", 2).await.unwrap());
}

#[tokio::test]
async fn from_config_uses_the_durable_store_when_configured() {
    let dir = tempfile::tempdir().unwrap();
    let mut g = grant(
        "once",
        "alice",
        vec![cap("files", &["alice"], Scope::Descendants, &["*"])],
    );
    g.max_uses = Some(1);
    let config = KernelConfig {
        grants: vec![g, admission("alice")],
        usage_store_path: Some(dir.path().join("uses.jsonl")),
        ..KernelConfig::default()
    };
    let ctx = context("alice");
    let write = call(
        "c1",
        "files.write",
        json!({"path": "a.txt", "content": "x"}),
    );
    for expected in [ToolStatus::Succeeded, ToolStatus::Denied] {
        // A new kernel each time: the count survives it.
        let kernel = Kernel::from_config(
            &config,
            &dir.path().join("files"),
            Arc::new(MemoryAuditSink::new()),
        )
        .unwrap();
        let turn = kernel.open_turn(&ctx).await.unwrap();
        let r = turn
            .invoke_tool(&ctx, &write, CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(r.status(), expected);
    }
}
