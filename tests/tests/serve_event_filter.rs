//! Server-side event filters at `sharedos serve`'s HTTP boundary, on
//! SQLite and on a real PostgreSQL server: `types` of exact kinds and
//! `prefix.*` keeps the journal's sequences (with gaps), combines with
//! `afterSequence`, and a malformed list is `400 invalid_types`.

use std::path::Path;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use serde_json::{Value, json};
use sharedos_tests::both_stores;
use sharedos_tests::served::{Backend, open_session, run_to_end, scope, send, write_config};

both_stores!(a_filtered_stream_carries_only_the_kinds_asked_for_under_their_sequences);

/// The whole event stream of an ended run at `query`: (sequence, kind) of
/// each event, `end` last; or the refusal's status and code.
async fn stream(
    socket: &Path,
    run: &str,
    query: &str,
) -> Result<Vec<(Option<u64>, String)>, (u16, Value)> {
    let req = Request::builder()
        .uri(format!("http://sharedos/v1/runs/{run}/events{query}"))
        .header("sharedos-scope", scope("operator"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = send(socket, req).await;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    if status != 200 {
        return Err((
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ));
    }
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    Ok(text
        .split("\n\n")
        .filter(|b| !b.is_empty())
        .map(|block| {
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|l| l.strip_prefix(name).map(str::to_owned))
            };
            (
                field("id: ").and_then(|i| i.parse().ok()),
                field("event: ").unwrap_or_default(),
            )
        })
        .collect())
}

async fn a_filtered_stream_carries_only_the_kinds_asked_for_under_their_sequences(
    backend: Backend,
) {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = backend.start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let script = json!([
        {"op": "emit", "type": "step", "data": {}},
        {"op": "call", "tool": "files.write", "arguments": {"path": "a.txt", "content": "1"}},
        {"op": "emit", "type": "step", "data": {}},
        {"op": "call", "tool": "files.write", "arguments": {"path": "b.txt", "content": "2"}}
    ]);
    let run = run_to_end(&socket, &session, "r", script).await;
    let run = run["id"].as_str().unwrap();
    let all = stream(&socket, run, "").await.unwrap();
    assert_eq!(all.last().map(|e| e.1.as_str()), Some("end"), "{all:?}");
    let pick = |keep: &dyn Fn(&str) -> bool| -> Vec<(Option<u64>, String)> {
        all.iter()
            .filter(|(_, k)| k == "end" || keep(k))
            .cloned()
            .collect()
    };

    let completed = stream(&socket, run, "?types=tool.completed").await.unwrap();
    assert_eq!(completed, pick(&|k| k == "tool.completed"));
    assert_eq!(completed.len(), 3, "two calls and the end: {all:?}");
    let turn = stream(&socket, run, "?types=turn.*").await.unwrap();
    assert_eq!(turn, pick(&|k| k.starts_with("turn.")));
    assert!(turn.len() >= 3, "the turn's start and end: {turn:?}");
    let mixed = stream(&socket, run, "?types=runtime.event%2Ctool.*")
        .await
        .unwrap();
    assert_eq!(
        mixed,
        pick(&|k| k == "runtime.event" || k.starts_with("tool."))
    );
    let none = stream(&socket, run, "?types=no.such.kind").await.unwrap();
    assert_eq!(none, pick(&|_| false));
    // After the first completed call, only the second.
    let first = completed[0].0.unwrap();
    let later = stream(
        &socket,
        run,
        &format!("?afterSequence={first}&types=tool.completed"),
    )
    .await
    .unwrap();
    assert_eq!(later, completed[1..].to_vec());

    let long = "a".repeat(129);
    let many = vec!["a"; 65].join(",");
    for bad in [
        "",
        "a,,b",
        "*",
        ".*",
        "tool.*.*",
        "tool.",
        "a%20b",
        "a%00",
        &long,
        &many,
        "a&types=b",
    ] {
        let refused = stream(&socket, run, &format!("?types={bad}"))
            .await
            .unwrap_err();
        assert_eq!(refused.0, 400, "{bad}: {refused:?}");
        assert_eq!(
            refused.1["error"]["code"], "invalid_types",
            "{bad}: {refused:?}"
        );
    }
}
