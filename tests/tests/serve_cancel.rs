//! Cancel across hosts, on both stores: two `sharedos serve` hosts share
//! one store; a run admitted by one is cancelled by a request sent to the
//! other, which answers `{"cancelled": true, "hostId": <the owner>}`, and
//! the owner ends the run `cancelled` long before its own deadline. A
//! cancel of a run that ended is `false` on either host.

use std::path::Path;

use serde_json::{Value, json};
use sharedos_tests::both_stores;
use sharedos_tests::served::{
    Backend, Server, call, open_session, start_with, wait_state, write_config,
};

fn host(dir: &Path, backend: &Backend, name: &str) -> Server {
    let db = dir.join("sharedos.db").display().to_string();
    let store: [&str; 2] = match backend {
        Backend::Sqlite => ["--database", &db],
        Backend::Postgres(pg) => ["--postgres", &pg.conninfo],
    };
    start_with(
        dir,
        &format!("{name}.sock"),
        &[store[0], store[1], "--host-id", name],
    )
}

both_stores!(a_cancel_sent_to_another_host_ends_the_run_on_its_owner);

async fn a_cancel_sent_to_another_host_ends_the_run_on_its_owner(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let owner = host(dir.path(), &backend, "host-a");
    let other = host(dir.path(), &backend, "host-b");
    let (a, b) = (owner.socket(), other.socket());
    let session = open_session(&a).await;
    // A turn that never ends by itself, with a deadline far beyond the
    // bound `wait_state` waits.
    let body = json!({"requestId": "held", "payload": {"script": [{"op": "stall"}], "traceFromTurn": true},
                      "options": {"timeoutMs": 600000}});
    let (status, admitted) = call(
        &a,
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        "operator",
        body,
    )
    .await;
    assert_eq!(status, 201, "{admitted}");
    let run = admitted["run"]["id"].as_str().unwrap().to_owned();

    let (status, answer) = call(
        &b,
        "POST",
        &format!("/v1/runs/{run}/cancel"),
        "operator",
        Value::Null,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer, json!({"cancelled": true, "hostId": "host-a"}));

    let ended = wait_state(&b, &run, "ended").await;
    assert_eq!(ended["result"]["status"], "cancelled", "{ended}");
    for socket in [&a, &b] {
        let (status, answer) = call(
            socket,
            "POST",
            &format!("/v1/runs/{run}/cancel"),
            "operator",
            Value::Null,
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer, json!({"cancelled": false, "hostId": null}));
    }
}
