//! Listing at `sharedos serve`'s HTTP boundary, on SQLite and on a real
//! PostgreSQL server: the caller scope's sessions and a session's runs in
//! creation order, a keyset page at a time (`limit`, `nextCursor`),
//! filtered by state and time; a session's active run; another scope's
//! session is not found; every malformed query a 400 with a code.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use sharedos_tests::both_stores;
use sharedos_tests::served::{Backend, call, open_session, run_to_end, wait_state, write_config};

both_stores!(sessions_are_listed_by_scope_page_by_page_and_filtered);
both_stores!(runs_are_listed_page_by_page_and_the_active_run_is_named);
both_stores!(malformed_listing_queries_are_400_with_a_code);

/// `GET path` as `user`; the status and the answer.
async fn get(socket: &Path, path: &str, user: &str) -> (u16, Value) {
    call(socket, "GET", path, user, Value::Null).await
}

/// Every id of a listing, following `nextCursor` from `path` (whose query
/// ends with a `limit`); the pages' sizes.
async fn all_pages(socket: &Path, path: &str, key: &str) -> (Vec<String>, Vec<usize>) {
    let (mut ids, mut sizes, mut next) = (Vec::new(), Vec::new(), None::<String>);
    loop {
        let url = match &next {
            Some(c) => format!("{path}&cursor={c}"),
            None => path.to_owned(),
        };
        let (status, page) = get(socket, &url, "operator").await;
        assert_eq!(status, 200, "{url}: {page}");
        let items = page[key].as_array().unwrap();
        sizes.push(items.len());
        ids.extend(items.iter().map(|i| i["id"].as_str().unwrap().to_owned()));
        match page["nextCursor"].as_str() {
            Some(c) => next = Some(c.to_owned()),
            None => return (ids, sizes),
        }
        assert!(sizes.len() < 20, "the pages never end: {sizes:?}");
    }
}

fn ids(answer: &Value, key: &str) -> Vec<String> {
    answer[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} in {answer}"))
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect()
}

async fn sessions_are_listed_by_scope_page_by_page_and_filtered(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = backend.start(dir.path());
    let socket = server.socket();
    let mut opened = Vec::new();
    let mut created = Vec::new();
    for _ in 0..5 {
        let id = open_session(&socket).await;
        let (_, s) = get(&socket, &format!("/v1/sessions/{id}"), "operator").await;
        created.push(s["session"]["createdAt"].as_str().unwrap().to_owned());
        opened.push(id);
        // Distinct creation times, so the time filters below split them.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Another owner's session is never listed for the operator.
    let spec = sharedos_tests::served::session_spec();
    let (status, theirs) = call(&socket, "POST", "/v1/sessions", "mallory", spec).await;
    assert_eq!(status, 201, "{theirs}");
    let theirs = theirs["session"]["id"].as_str().unwrap().to_owned();
    let (status, _) = call(
        &socket,
        "DELETE",
        &format!("/v1/sessions/{}", opened[1]),
        "operator",
        Value::Null,
    )
    .await;
    assert_eq!(status, 200);

    let (listed, sizes) = all_pages(&socket, "/v1/sessions?limit=2", "sessions").await;
    assert_eq!(
        listed, opened,
        "every session of the scope, in creation order, once"
    );
    assert_eq!(sizes, vec![2, 2, 1]);
    let (status, all) = get(&socket, "/v1/sessions", "operator").await;
    assert_eq!(
        (status, ids(&all, "sessions")),
        (200, opened.clone()),
        "{all}"
    );
    assert_eq!(all["nextCursor"], Value::Null);
    let (_, mine) = get(&socket, "/v1/sessions", "mallory").await;
    assert_eq!(ids(&mine, "sessions"), vec![theirs]);

    let (_, open) = get(&socket, "/v1/sessions?state=open", "operator").await;
    let expected: Vec<String> = opened
        .iter()
        .filter(|i| **i != opened[1])
        .cloned()
        .collect();
    assert_eq!(ids(&open, "sessions"), expected);
    let (_, closed) = get(&socket, "/v1/sessions?state=closed", "operator").await;
    assert_eq!(ids(&closed, "sessions"), vec![opened[1].clone()]);
    assert_eq!(closed["sessions"][0]["open"], false);

    // Both bounds are exclusive; `+` may be sent as it is or as %2B.
    let between = format!(
        "/v1/sessions?createdAfter={}&createdBefore={}",
        created[0], created[3]
    );
    let (status, middle) = get(&socket, &between, "operator").await;
    assert_eq!(status, 200, "{middle}");
    assert_eq!(ids(&middle, "sessions"), opened[1..3].to_vec());
    let (_, none) = get(
        &socket,
        "/v1/sessions?createdAfter=2999-01-01T00:00:00%2B01:00",
        "operator",
    )
    .await;
    assert_eq!(ids(&none, "sessions"), Vec::<String>::new());
    let (_, every) = get(
        &socket,
        "/v1/sessions?createdBefore=2999-01-01T00:00:00+01:00&state=open&limit=500",
        "operator",
    )
    .await;
    assert_eq!(ids(&every, "sessions"), expected);
}

async fn runs_are_listed_page_by_page_and_the_active_run_is_named(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = backend.start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let other = open_session(&socket).await;
    let script = json!([{"op": "emit", "type": "step", "data": {}}]);
    let mut ended = Vec::new();
    for i in 0..3 {
        let run = run_to_end(&socket, &session, &format!("r{i}"), script.clone()).await;
        ended.push(run["id"].as_str().unwrap().to_owned());
    }
    run_to_end(&socket, &other, "elsewhere", script.clone()).await;
    let path = format!("/v1/sessions/{session}");
    let (status, idle) = get(&socket, &path, "operator").await;
    assert_eq!(status, 200, "{idle}");
    assert_eq!(idle["activeRun"], Value::Null, "{idle}");
    assert_eq!(idle["session"]["id"], session.as_str());

    let body = json!({"requestId": "held", "payload": {"script": [{"op": "stall"}], "traceFromTurn": true},
                      "options": {"timeoutMs": 600000}});
    let (status, held) = call(&socket, "POST", &format!("{path}/runs"), "operator", body).await;
    assert_eq!(status, 201, "{held}");
    let held = held["run"]["id"].as_str().unwrap().to_owned();
    let (_, busy) = get(&socket, &path, "operator").await;
    assert_eq!(busy["activeRun"], held.as_str(), "{busy}");

    let (listed, sizes) = all_pages(&socket, &format!("{path}/runs?limit=3"), "runs").await;
    let mut every = ended.clone();
    every.push(held.clone());
    assert_eq!(
        listed, every,
        "every run of the session, in admission order, once"
    );
    assert_eq!(sizes, vec![3, 1]);
    let (_, flying) = get(&socket, &format!("{path}/runs?state=in_flight"), "operator").await;
    assert_eq!(ids(&flying, "runs"), vec![held.clone()]);
    let (_, done) = get(
        &socket,
        &format!("{path}/runs?state=ended&limit=2"),
        "operator",
    )
    .await;
    assert_eq!(ids(&done, "runs"), ended[..2].to_vec());
    assert!(done["nextCursor"].is_string(), "{done}");
    let first = done["runs"][0]["admittedAt"].as_str().unwrap().to_owned();
    let (_, later) = get(
        &socket,
        &format!("{path}/runs?admittedAfter={first}&state=interrupted"),
        "operator",
    )
    .await;
    assert_eq!(ids(&later, "runs"), Vec::<String>::new());

    // Another owner sees neither the session nor its runs.
    let (status, refused) = get(&socket, &format!("{path}/runs"), "mallory").await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{refused}"
    );
    let (status, _) = get(&socket, &path, "mallory").await;
    assert_eq!(status, 404);

    let (status, _) = call(
        &socket,
        "POST",
        &format!("/v1/runs/{held}/cancel"),
        "operator",
        Value::Null,
    )
    .await;
    assert_eq!(status, 200);
    wait_state(&socket, &held, "ended").await;
    let (_, idle) = get(&socket, &path, "operator").await;
    assert_eq!(idle["activeRun"], Value::Null, "{idle}");
}

async fn malformed_listing_queries_are_400_with_a_code(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = backend.start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    run_to_end(&socket, &session, "r0", json!([])).await;
    run_to_end(&socket, &session, "r1", json!([])).await;
    let runs = format!("/v1/sessions/{session}/runs");
    let (_, page) = get(&socket, &format!("{runs}?limit=1"), "operator").await;
    let run_cursor = page["nextCursor"].as_str().unwrap().to_owned();
    // A cursor cut short (its id one character short).
    let tampered = run_cursor[..run_cursor.len() - 2].to_owned();
    let long_id = "a".repeat(10_000);
    let cases = [
        ("/v1/sessions?limit=0".to_owned(), "invalid_limit"),
        ("/v1/sessions?limit=501".to_owned(), "invalid_limit"),
        ("/v1/sessions?limit=-1".to_owned(), "invalid_limit"),
        ("/v1/sessions?limit=%2B5".to_owned(), "invalid_limit"),
        (
            "/v1/sessions?limit=99999999999999999999999".to_owned(),
            "invalid_limit",
        ),
        ("/v1/sessions?state=in_flight".to_owned(), "invalid_state"),
        (format!("{runs}?state=open"), "invalid_state"),
        (
            "/v1/sessions?createdAfter=yesterday".to_owned(),
            "invalid_time",
        ),
        (
            "/v1/sessions?createdBefore=2026-13-01T00:00:00Z".to_owned(),
            "invalid_time",
        ),
        (
            "/v1/sessions?createdAfter=2026-01-01T00:00:00".to_owned(),
            "invalid_time",
        ),
        (
            format!("{runs}?createdAfter=2026-01-01T00:00:00Z"),
            "unknown_parameter",
        ),
        ("/v1/sessions?owner=mallory".to_owned(), "unknown_parameter"),
        ("/v1/sessions?limit=1&limit=2".to_owned(), "invalid_query"),
        ("/v1/sessions?state=%zz".to_owned(), "invalid_query"),
        ("/v1/sessions?state=%ff".to_owned(), "invalid_query"),
        ("/v1/sessions?cursor=zz".to_owned(), "invalid_cursor"),
        ("/v1/sessions?cursor=".to_owned(), "invalid_cursor"),
        (
            format!("/v1/sessions?cursor={run_cursor}"),
            "invalid_cursor",
        ),
        (
            format!("{runs}?cursor={}", "ab".repeat(5_000)),
            "invalid_cursor",
        ),
        (format!("{runs}?cursor={tampered}"), "invalid_cursor"),
        ("/v1/sessions/..%2F..%2Fetc/runs".to_owned(), "invalid_id"),
        ("/v1/sessions/%00/runs".to_owned(), "invalid_id"),
        (format!("/v1/sessions/{long_id}/runs"), "invalid_id"),
    ];
    for (path, code) in &cases {
        let (status, answer) = get(&socket, path, "operator").await;
        let shown: String = path.chars().take(120).collect();
        assert_eq!(status, 400, "{shown}: {answer}");
        assert_eq!(answer["error"]["code"], *code, "{shown}: {answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
    let (status, page) = get(
        &socket,
        &format!("{runs}?cursor={run_cursor}&limit=1"),
        "operator",
    )
    .await;
    assert_eq!(status, 200, "the untouched cursor still reads: {page}");
    assert_eq!(page["runs"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        backend.rows(dir.path()).await,
        (1, 2),
        "nothing was written"
    );
}
