//! Listing on both backends: sessions and runs come in the order of their
//! time, not of its text (an RFC 3339 fraction has no fixed width, and an
//! offset moves the instant), a keyset page starts right after the last
//! row of the one before, and time bounds are exclusive instants.

#[macro_use]
mod backend;

use backend::Backend;
use backend::records::{new_run, session};
use serde_json::json;
use sharedos_store::{Keyset, RunQuery, RunState, SessionQuery, TimeRange};

both!(sessions_and_runs_are_paged_in_time_order_not_text_order);

/// (id, stored time): text order differs from time order, and the last
/// one's offset makes it the earliest instant.
const TIMES: [(&str, &str); 5] = [
    ("a", "2026-12-01T00:00:52Z"),
    ("b", "2026-12-01T00:00:52.5Z"),
    ("c", "2026-12-01T00:00:52.101Z"),
    ("d", "2026-12-01T00:00:52.1Z"),
    ("e", "2026-12-01T01:00:51.9+01:00"),
];
/// The ids in time order.
const ORDER: [&str; 5] = ["e", "a", "d", "c", "b"];

/// 2026-12-01T00:00:52Z in milliseconds since the Unix epoch.
const AT_52: i64 = 1_796_083_252_000;

async fn sessions_and_runs_are_paged_in_time_order_not_text_order(backend: Backend) {
    let store = backend.open().await;
    let scope = json!({"namespaceId": "tenant-1"});
    for (id, at) in TIMES {
        let mut s = session(id);
        s.created_at = at.into();
        store.open_session(&s).await.unwrap();
    }
    let mut other = session("z");
    other.scope = json!({"namespaceId": "tenant-2"});
    store.open_session(&other).await.unwrap();
    store
        .close_session("d", "2026-12-01T00:01:00Z")
        .await
        .unwrap();

    let query = |after: Option<Keyset>, created: TimeRange, limit| SessionQuery {
        scope: scope.clone(),
        open: None,
        created,
        after,
        limit,
    };
    let ids = |list: Vec<sharedos_store::SessionRecord>| -> Vec<String> {
        list.into_iter().map(|s| s.id).collect()
    };
    let all = store
        .list_sessions(&query(None, TimeRange::default(), 10))
        .await;
    assert_eq!(ids(all.unwrap()), ORDER);
    let first = store
        .list_sessions(&query(None, TimeRange::default(), 2))
        .await;
    assert_eq!(ids(first.unwrap()), ["e", "a"]);
    let after_a = Some(Keyset {
        at_ms: AT_52,
        id: "a".into(),
    });
    let rest = store
        .list_sessions(&query(after_a, TimeRange::default(), 10))
        .await;
    assert_eq!(ids(rest.unwrap()), ["d", "c", "b"]);
    let range = TimeRange {
        after_ms: Some(AT_52),
        before_ms: Some(AT_52 + 500),
    };
    let inside = store.list_sessions(&query(None, range, 10)).await;
    assert_eq!(ids(inside.unwrap()), ["d", "c"], "both bounds exclusive");
    let mut closed = query(None, TimeRange::default(), 10);
    closed.open = Some(false);
    assert_eq!(ids(store.list_sessions(&closed).await.unwrap()), ["d"]);
    let mut theirs = query(None, TimeRange::default(), 10);
    theirs.scope = json!({"namespaceId": "tenant-2"});
    assert_eq!(ids(store.list_sessions(&theirs).await.unwrap()), ["z"]);

    store.open_session(&session("s1")).await.unwrap();
    for (id, at) in TIMES {
        let mut run = new_run(id, &format!("q-{id}"), "d", "h");
        run.admitted_at = at.into();
        store.admit_run(&run).await.unwrap();
    }
    store
        .end_run("c", &json!({}), "2026-12-01T00:02:00Z")
        .await
        .unwrap();
    let runs = |state, limit| RunQuery {
        session_id: "s1".into(),
        state,
        admitted: TimeRange::default(),
        after: None,
        limit,
    };
    let run_ids = |list: Vec<sharedos_store::RunRecord>| -> Vec<String> {
        list.into_iter().map(|r| r.id).collect()
    };
    assert_eq!(
        run_ids(store.list_runs(&runs(None, 10)).await.unwrap()),
        ORDER
    );
    let flying = store.list_runs(&runs(Some(RunState::InFlight), 3)).await;
    assert_eq!(run_ids(flying.unwrap()), ["e", "a", "d"]);
    let ended = store.list_runs(&runs(Some(RunState::Ended), 10)).await;
    assert_eq!(run_ids(ended.unwrap()), ["c"]);
    let mut elsewhere = runs(None, 10);
    elsewhere.session_id = "z".into();
    assert!(store.list_runs(&elsewhere).await.unwrap().is_empty());
}
