//! `GET /v1/openapi.json` against the server that serves it
//! (docs/SERVE.md, "OpenAPI"): every operation the document names is
//! answered by the router (never `no_route`), paths it does not name are
//! `no_route`, and the real answers of a session's life (opened, listed,
//! a run started, repeated, ended, read, its effects, cancelled, deleted,
//! the session closed and purged, the preflight, health, refusals)
//! validate against the document's schema for their status.

use std::path::Path;

use serde_json::{Value, json};
use sharedos_tests::served::{call, open_session, run_body, start, wait_state, write_config};

/// The document's schema for `method template` answering `status` (JSON),
/// with the document's components beside it so its references resolve.
fn answer_schema(doc: &Value, template: &str, method: &str, status: u16) -> Value {
    let response =
        &doc["paths"][template][method.to_ascii_lowercase()]["responses"][status.to_string()];
    let schema = &response["content"]["application/json"]["schema"];
    assert!(
        schema.is_object(),
        "{method} {template}: the document has no JSON answer {status}"
    );
    let mut root = schema.clone();
    root["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
    root["components"] = doc["components"].clone();
    root
}

/// Validates a real answer against the document; panics naming what differs.
fn conforms(doc: &Value, template: &str, method: &str, (status, body): &(u16, Value)) {
    let schema = answer_schema(doc, template, method, *status);
    let validator = jsonschema::validator_for(&schema).unwrap_or_else(|e| {
        panic!("{method} {template} {status}: the schema does not compile: {e}")
    });
    let errors: Vec<String> = validator.iter_errors(body).map(|e| e.to_string()).collect();
    assert!(
        errors.is_empty(),
        "{method} {template} answered {status} {body}, not as documented: {errors:?}"
    );
}

/// A run or session id of the form sharedos issues (a UUID) that names
/// nothing.
const NOTHING: &str = "00000000-0000-4000-8000-000000000000";

async fn get_doc(socket: &Path) -> Value {
    let (status, doc) = call(socket, "GET", "/v1/openapi.json", "operator", Value::Null).await;
    assert_eq!(status, 200, "{doc}");
    assert_eq!(doc["openapi"], "3.1.0");
    doc
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_operation_is_routed_and_nothing_else_is() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = start(dir.path());
    let socket = server.socket();
    let doc = get_doc(&socket).await;
    let mut operations = 0;
    for (template, item) in doc["paths"].as_object().unwrap() {
        // Ids of the form sharedos issues, naming nothing.
        let path = template
            .replace("{path}", "a.txt")
            .replace("{operationId}", "op-1")
            .replace("{sessionId}", NOTHING)
            .replace("{runId}", NOTHING);
        for method in item.as_object().unwrap().keys() {
            let method = method.to_ascii_uppercase();
            let (status, body) = call(&socket, &method, &path, "operator", json!({})).await;
            assert_ne!(
                body["error"]["code"], "no_route",
                "{method} {template} is documented but not routed ({status})"
            );
            let documented = &item[method.to_ascii_lowercase()]["responses"][status.to_string()];
            assert!(
                documented.is_object(),
                "{method} {path} answered {status} {body}, a status the document does not list"
            );
            if documented["content"]["application/json"].is_object() {
                conforms(&doc, template, &method, &(status, body));
            }
            operations += 1;
        }
    }
    assert!(operations >= 19, "{operations} operations documented");
    for (method, path) in [
        ("GET", "/v1/nothing"),
        ("PATCH", "/v1/sessions"),
        ("PUT", "/v1/runs/x"),
        ("GET", "/v1/sessions/x/files"),
        ("POST", "/v1/health"),
    ] {
        let (status, body) = call(&socket, method, path, "operator", json!({})).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (404, Some("no_route")),
            "{method} {path} is not documented, so it is not routed: {body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_real_answers_validate_against_the_document() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = start(dir.path());
    let socket = server.socket();
    let doc = get_doc(&socket).await;
    let s = socket.as_path();
    let get = |path: String| async move { call(s, "GET", &path, "operator", Value::Null).await };

    conforms(&doc, "/v1/health", "GET", &get("/v1/health".into()).await);
    conforms(
        &doc,
        "/v1/preflight",
        "GET",
        &get("/v1/preflight".into()).await,
    );
    let session = open_session(s).await;
    conforms(
        &doc,
        "/v1/sessions/{sessionId}",
        "GET",
        &get(format!("/v1/sessions/{session}")).await,
    );
    conforms(
        &doc,
        "/v1/sessions",
        "GET",
        &get("/v1/sessions?limit=5".into()).await,
    );

    let body = run_body("r1", json!([]));
    let runs = format!("/v1/sessions/{session}/runs");
    let first = call(s, "POST", &runs, "operator", body.clone()).await;
    assert_eq!(first.0, 201, "{}", first.1);
    conforms(&doc, "/v1/sessions/{sessionId}/runs", "POST", &first);
    let again = call(s, "POST", &runs, "operator", body).await;
    assert_eq!(again.0, 200, "{}", again.1);
    conforms(&doc, "/v1/sessions/{sessionId}/runs", "POST", &again);
    let run = first.1["run"]["id"].as_str().unwrap().to_owned();
    wait_state(s, &run, "ended").await;

    conforms(
        &doc,
        "/v1/runs/{runId}",
        "GET",
        &get(format!("/v1/runs/{run}")).await,
    );
    conforms(
        &doc,
        "/v1/sessions/{sessionId}/runs",
        "GET",
        &get(runs.clone()).await,
    );
    conforms(
        &doc,
        "/v1/runs/{runId}/effects",
        "GET",
        &get(format!("/v1/runs/{run}/effects")).await,
    );
    let effects = get(format!("/v1/sessions/{session}/effects")).await;
    conforms(&doc, "/v1/sessions/{sessionId}/effects", "GET", &effects);
    let cancel = call(
        s,
        "POST",
        &format!("/v1/runs/{run}/cancel"),
        "operator",
        Value::Null,
    )
    .await;
    conforms(&doc, "/v1/runs/{runId}/cancel", "POST", &cancel);
    let deleted = call(
        s,
        "DELETE",
        &format!("/v1/runs/{run}"),
        "operator",
        Value::Null,
    )
    .await;
    conforms(&doc, "/v1/runs/{runId}", "DELETE", &deleted);

    // Refusals carry the error object and a code the document lists.
    let missing = get(format!("/v1/runs/{NOTHING}")).await;
    assert_eq!(missing.0, 404, "{}", missing.1);
    conforms(&doc, "/v1/runs/{runId}", "GET", &missing);
    let bad_limit = get("/v1/sessions?limit=0".into()).await;
    conforms(&doc, "/v1/sessions", "GET", &bad_limit);
    let unknown = call(
        s,
        "POST",
        "/v1/sessions",
        "operator",
        json!({"agentId": "nobody", "purpose": "p"}),
    )
    .await;
    conforms(&doc, "/v1/sessions", "POST", &unknown);

    let session_path = format!("/v1/sessions/{session}");
    let closed = call(s, "DELETE", &session_path, "operator", Value::Null).await;
    conforms(&doc, "/v1/sessions/{sessionId}", "DELETE", &closed);
    let purged = call(
        s,
        "DELETE",
        &format!("{session_path}?purge=true"),
        "operator",
        Value::Null,
    )
    .await;
    assert_eq!(purged.0, 200, "{}", purged.1);
    conforms(&doc, "/v1/sessions/{sessionId}", "DELETE", &purged);
}
