//! The SQLite store's thread budget: 200 runs admitted at once, each
//! followed by its events, cost the process one store thread, not a
//! blocked thread per operation, and every operation still lands.

#[path = "backend/records.rs"]
mod records;

use std::sync::Arc;

use records::event;
use sharedos_store::{SqliteOptions, SqliteStore, Store};

/// The threads of this process now.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_runs_hold_one_store_thread() {
    let dir = tempfile::tempdir().unwrap();
    let store =
        Arc::new(SqliteStore::open(dir.path().join("s.db"), SqliteOptions::default()).unwrap());
    store.open_session(&records::session("s1")).await.unwrap();
    let before = threads();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let store = Arc::clone(&store);
        tasks.spawn(async move {
            let id = format!("r{i}");
            let run = records::new_run(&id, &format!("req-{i}"), "d", "h1");
            store.admit_run(&run).await.unwrap();
            for sequence in 0..5 {
                store
                    .append_event(&id, &event(&id, sequence))
                    .await
                    .unwrap();
            }
        });
    }
    let mut peak = 0;
    while !tasks.is_empty() {
        peak = peak.max(threads());
        if let Ok(Some(done)) =
            tokio::time::timeout(std::time::Duration::from_millis(1), tasks.join_next()).await
        {
            done.unwrap();
        }
    }
    // A blocking pool keeps its idle threads for 10 s: a pool grown by the
    // burst would still be counted here.
    let after = threads();
    assert!(
        peak.max(after) <= before + 2,
        "{before} threads before, {peak} at the peak, {after} after"
    );
    for i in [0, 99, 199] {
        let events = store
            .events_after(&format!("r{i}"), None, 100)
            .await
            .unwrap();
        assert_eq!(events.len(), 5, "run r{i}");
    }
}
