//! Bad input at `sharedos serve`'s HTTP boundary, on SQLite and on a real
//! PostgreSQL server: sequences of 2^63 and more, negative or not numbers;
//! a body without `Content-Type: application/json`; control characters in
//! a requestId or a scope, hostile path ids (NUL, `../`, 10,000
//! characters), unknown fields. Each gets a 4xx with a code and nothing is
//! written; a conflicting requestId answers with the original run's id.

use std::path::Path;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use serde_json::{Value, json};
use sharedos_tests::served::{
    Backend, call, open_session, run_body, run_to_end, scope, send, write_config,
};

sharedos_tests::both_stores!(huge_or_malformed_sequences_are_refused_never_replayed);
sharedos_tests::both_stores!(a_body_that_is_not_declared_json_is_415);
sharedos_tests::both_stores!(hostile_ids_and_unknown_fields_are_4xx_and_write_nothing);
sharedos_tests::both_stores!(a_conflicting_request_id_names_the_original_run);

/// A request with exactly these headers; the status and the JSON answer
/// (`Null` when the answer is not JSON, e.g. an event stream).
async fn raw(
    socket: &Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Value) {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://sharedos{path}"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = send(
        socket,
        req.body(Full::new(Bytes::from(body.to_owned()))).unwrap(),
    )
    .await;
    let status = resp.status().as_u16();
    let json = resp
        .headers()
        .get("content-type")
        .is_some_and(|t| t == "application/json");
    let value = if json {
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    } else {
        Value::Null
    };
    (status, value)
}

fn code(answer: &Value) -> &str {
    answer["error"]["code"].as_str().unwrap_or("none")
}

async fn huge_or_malformed_sequences_are_refused_never_replayed(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = backend.start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let script = json!([{"op": "emit", "type": "step", "data": {}}]);
    let run = run_to_end(&socket, &session, "r", script).await;
    let run = run["id"].as_str().unwrap();
    let events = format!("/v1/runs/{run}/events");
    let operator = scope("operator");
    let with_scope = [("sharedos-scope", operator.as_str())];

    for huge in [
        "9223372036854775807",
        "9223372036854775808",
        "18446744073709551615",
    ] {
        let (status, err) = raw(
            &socket,
            "GET",
            &format!("{events}?afterSequence={huge}"),
            &with_scope,
            "",
        )
        .await;
        assert_eq!(
            (status, code(&err)),
            (400, "sequence_beyond_end"),
            "{huge}: {err}"
        );
        let message = err["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("afterSequence {huge}")),
            "{message}"
        );
        let header = [with_scope[0], ("last-event-id", huge)];
        let (status, err) = raw(&socket, "GET", &events, &header, "").await;
        assert_eq!(
            (status, code(&err)),
            (400, "sequence_beyond_end"),
            "{huge}: {err}"
        );
    }
    for bad in ["-1", "18446744073709551616", "+1", "1e3", "", "%00"] {
        let (status, err) = raw(
            &socket,
            "GET",
            &format!("{events}?afterSequence={bad}"),
            &with_scope,
            "",
        )
        .await;
        assert_eq!(
            (status, code(&err)),
            (400, "invalid_sequence"),
            "{bad:?}: {err}"
        );
        let header = [with_scope[0], ("last-event-id", bad)];
        let (status, err) = raw(&socket, "GET", &events, &header, "").await;
        assert_eq!(
            (status, code(&err)),
            (400, "invalid_sequence"),
            "{bad:?}: {err}"
        );
    }
    // The journal itself is still served from the start.
    let (status, _) = raw(&socket, "GET", &events, &with_scope, "").await;
    assert_eq!(status, 200);
}

async fn a_body_that_is_not_declared_json_is_415(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = backend.start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let before = backend.rows(dir.path()).await;
    let operator = scope("operator");
    let run = run_body("typed", json!([])).to_string();
    let spec = sharedos_tests::served::session_spec().to_string();
    let runs = format!("/v1/sessions/{session}/runs");
    for (path, body) in [("/v1/sessions", &spec), (runs.as_str(), &run)] {
        for content_type in [
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
            Some("application/jsonp"),
            None,
        ] {
            let mut headers = vec![("sharedos-scope", operator.as_str())];
            if let Some(t) = content_type {
                headers.push(("content-type", t));
            }
            let (status, err) = raw(&socket, "POST", path, &headers, body).await;
            assert_eq!(
                (status, code(&err)),
                (415, "unsupported_media_type"),
                "{path} {content_type:?}: {err}"
            );
            assert!(
                err["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("Content-Type: application/json"),
                "{err}"
            );
        }
    }
    assert_eq!(backend.rows(dir.path()).await, before, "nothing written");
    let headers = [
        ("sharedos-scope", operator.as_str()),
        ("content-type", "Application/JSON; charset=utf-8"),
    ];
    let (status, answer) = raw(&socket, "POST", &runs, &headers, &run).await;
    assert_eq!(status, 201, "JSON with a charset is JSON: {answer}");
}

async fn hostile_ids_and_unknown_fields_are_4xx_and_write_nothing(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = backend.start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let before = backend.rows(dir.path()).await;
    let runs = format!("/v1/sessions/{session}/runs");

    let long = "x".repeat(10_000);
    for (request_id, why) in [
        ("a\u{0}b", "control character"),
        ("bell\u{7}", "control character"),
        ("", "1 to 256"),
        (long.as_str(), "1 to 256"),
    ] {
        let (status, err) = call(
            &socket,
            "POST",
            &runs,
            "operator",
            run_body(request_id, json!([])),
        )
        .await;
        assert_eq!((status, code(&err)), (400, "invalid_request_id"), "{err}");
        let message = err["error"]["message"].as_str().unwrap();
        assert!(message.contains(why) && message.len() < 400, "{message}");
    }

    let nul_scope = scope("operator").replace("operator", "oper\\u0000ator");
    let bad_scopes = [
        nul_scope,
        scope("operator").replace('}', ",\"extra\":1}"),
        "{}".to_owned(),
    ];
    for bad in &bad_scopes {
        let headers = [
            ("sharedos-scope", bad.as_str()),
            ("content-type", "application/json"),
        ];
        let spec = sharedos_tests::served::session_spec().to_string();
        let (status, err) = raw(&socket, "POST", "/v1/sessions", &headers, &spec).await;
        assert_eq!((status, code(&err)), (400, "invalid_scope"), "{bad}: {err}");
    }

    let mut unknown = run_body("unknown", json!([]));
    unknown["priority"] = json!(1);
    let mut negative = run_body("negative", json!([]));
    negative["options"]["timeoutMs"] = json!(-1);
    for body in [unknown, negative, json!({"payload": {}})] {
        let (status, err) = call(&socket, "POST", &runs, "operator", body).await;
        assert_eq!((status, code(&err)), (400, "invalid_body"), "{err}");
    }
    let mut spec = sharedos_tests::served::session_spec();
    spec["runtimeId"] = json!("chosen-by-the-caller");
    let (status, err) = call(&socket, "POST", "/v1/sessions", "operator", spec).await;
    assert_eq!((status, code(&err)), (400, "invalid_body"), "{err}");

    let operator = scope("operator");
    let with_scope = [
        ("sharedos-scope", operator.as_str()),
        ("content-type", "application/json"),
    ];
    let hostile = ["%00", "..", "%2e%2e%2f%2e%2e", long.as_str(), "not-a-uuid"];
    for id in hostile {
        for (method, path) in [
            ("GET", format!("/v1/sessions/{id}")),
            ("DELETE", format!("/v1/sessions/{id}")),
            ("GET", format!("/v1/runs/{id}")),
            ("POST", format!("/v1/runs/{id}/cancel")),
            ("GET", format!("/v1/runs/{id}/events")),
        ] {
            let (status, err) = raw(&socket, method, &path, &with_scope, "").await;
            assert_eq!(
                (status, code(&err)),
                (400, "invalid_id"),
                "{method} {path:.80}: {err}"
            );
            assert!(err["error"]["message"].as_str().unwrap().len() < 400);
        }
        let (status, err) = raw(
            &socket,
            "POST",
            &format!("/v1/sessions/{id}/runs"),
            &with_scope,
            &run_body("to-nowhere", json!([])).to_string(),
        )
        .await;
        assert_eq!((status, code(&err)), (400, "invalid_id"), "{id:.80}: {err}");
    }
    assert_eq!(backend.rows(dir.path()).await, before, "nothing written");
}

async fn a_conflicting_request_id_names_the_original_run(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = backend.start(dir.path());
    let socket = server.socket();
    let session = open_session(&socket).await;
    let runs = format!("/v1/sessions/{session}/runs");
    let (status, first) = call(
        &socket,
        "POST",
        &runs,
        "operator",
        run_body("once", json!([])),
    )
    .await;
    assert_eq!(status, 201, "{first}");
    let script = json!([{"op": "emit", "type": "other", "data": {}}]);
    let (status, conflict) =
        call(&socket, "POST", &runs, "operator", run_body("once", script)).await;
    assert_eq!(
        (status, code(&conflict)),
        (409, "request_conflict"),
        "{conflict}"
    );
    assert_eq!(conflict["error"]["runId"], first["run"]["id"], "{conflict}");
    let message = conflict["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(first["run"]["id"].as_str().unwrap()),
        "{message}"
    );
}
