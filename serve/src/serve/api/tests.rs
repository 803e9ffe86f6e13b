use super::super::openapi::document;
use super::*;
use serde_json::json;

/// A concrete path of a template: each `{name}` an example segment.
fn concrete(template: &str) -> Vec<String> {
    template
        .trim_matches('/')
        .split('/')
        .map(|s| {
            if s.starts_with('{') {
                "x1".to_owned()
            } else {
                s.to_owned()
            }
        })
        .collect()
}

#[test]
fn every_row_matches_its_own_paths_alone_and_the_document_has_each_once() {
    let doc = document();
    let mut operations = 0;
    for route in ROUTES {
        let parts = concrete(route.path);
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        let found = find(route.method, &parts).map(|r| r.op);
        assert_eq!(found, Some(route.op), "{} {}", route.method, route.path);
        let op = &doc["paths"][route.path][route.method.to_ascii_lowercase()];
        assert!(
            op.is_object(),
            "{} {} is in the document",
            route.method,
            route.path
        );
        operations += 1;
    }
    let in_doc: usize = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .map(|item| item.as_object().unwrap().len())
        .sum();
    assert_eq!(
        in_doc, operations,
        "the document holds the table's operations only"
    );
    for (method, path) in [
        ("GET", "/v1/nothing"),
        ("PATCH", "/v1/sessions"),
        ("GET", "/v1/sessions/a/files"),
    ] {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        assert!(find(method, &parts).is_none(), "{method} {path}");
    }
    let deep = ["v1", "sessions", "s", "files", "a", "b"];
    assert_eq!(find("PUT", &deep).map(|r| r.op), Some(Op::PutFile));
}

#[test]
fn every_schema_of_the_document_compiles_and_every_ref_resolves() {
    let doc = document();
    let text = doc.to_string();
    for piece in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
        let name = &piece[..piece.find('"').unwrap()];
        assert!(doc["components"]["schemas"][name].is_object(), "{name}");
    }
    let error = &doc["paths"]["/v1/runs/{runId}"]["get"]["responses"]["404"];
    let codes = &error["content"]["application/json"]["schema"]["allOf"][1]["properties"]["error"]
        ["properties"]["code"]["enum"];
    assert_eq!(codes, &json!(["not_found"]));
}

/// The schema of `method template` answering `status`, its
/// references resolvable.
fn answer(doc: &Value, template: &str, method: &str, status: &str) -> jsonschema::Validator {
    let mut root = doc["paths"][template][method]["responses"][status]["content"]
        ["application/json"]["schema"]
        .clone();
    root["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
    root["components"] = doc["components"].clone();
    jsonschema::validator_for(&root).unwrap()
}

#[test]
fn the_schemas_refuse_an_answer_of_another_shape_or_an_unlisted_code() {
    let doc = document();
    let run = json!({"id": "r", "sessionId": "s", "requestId": "q", "payloadDigest": "d",
                     "input": {}, "state": "ended", "hostId": "h", "result": null,
                     "recovery": null, "droppedThrough": null, "admittedAt": "t", "endedAt": null});
    let posted = answer(&doc, "/v1/sessions/{sessionId}/runs", "post", "201");
    assert!(posted.is_valid(&json!({"run": run, "repeated": false})));
    assert!(
        !posted.is_valid(&json!({"run": run})),
        "repeated is required"
    );
    assert!(!posted.is_valid(&json!({"run": run, "repeated": false, "more": 1})));
    let mut bad_state = run.clone();
    bad_state["state"] = json!("finished");
    assert!(!posted.is_valid(&json!({"run": bad_state, "repeated": false})));
    let not_found = answer(&doc, "/v1/runs/{runId}", "get", "404");
    assert!(not_found.is_valid(&json!({"error": {"code": "not_found", "message": "m"}})));
    assert!(!not_found.is_valid(&json!({"error": {"code": "no_such_code", "message": "m"}})));
    assert!(!not_found.is_valid(&json!({"code": "not_found"})));
}
