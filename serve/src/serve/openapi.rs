//! The OpenAPI 3.1 document of the route table (docs/SERVE.md, "OpenAPI"):
//! each row of [`ROUTES`] an operation, its schemas from the handlers'
//! types, each error status with the codes it may carry.

use schemars::{Schema, SchemaGenerator};
use serde_json::{Map, Value, json};

use super::api::{COMMON_REFUSALS, Content, ErrorAnswer, JSON_BODY, ROUTES, Route, schema};
use crate::session::Scope;

/// The OpenAPI 3.1 document of [`ROUTES`].
pub fn document() -> Value {
    let mut generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| s.definitions_path = "/components/schemas".into())
        .into_generator();
    let error = schema::<ErrorAnswer>(&mut generator);
    let mut paths = Map::new();
    for route in ROUTES {
        let operation = operation(route, &mut generator, &error);
        let item = paths
            .entry(route.path.to_owned())
            .or_insert_with(|| json!({}));
        item[route.method.to_ascii_lowercase()] = operation;
    }
    let schemas = generator.take_definitions(true);
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "sharedos serve",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Sessions and runs over HTTP+JSON (docs/SERVE.md). On the unix socket the peer is trusted (or mapped to a tenant by uid); over TCP every request carries a bearer token."
        },
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}
        },
        "security": [{}, {"bearer": []}]
    })
}

fn operation(route: &Route, generator: &mut SchemaGenerator, error: &Schema) -> Value {
    let mut parameters: Vec<Value> = route
        .path
        .split('/')
        .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
        .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
        .collect();
    if route.scoped {
        parameters.push(json!({
            "name": "Sharedos-Scope", "in": "header", "required": true,
            "description": "The trusted scope as JSON: {\"namespaceId\", \"authority\", \"owner\"}",
            "content": {"application/json": {"schema": schema::<Scope>(generator)}}
        }));
    }
    for (name, what) in route.query {
        parameters.push(json!({"name": name, "in": "query", "required": false,
                               "description": what, "schema": {"type": "string"}}));
    }
    let mut responses = Map::new();
    for a in route.answers {
        responses.insert(
            a.status.to_string(),
            json!({"description": a.what, "content": content(a.content, generator)}),
        );
    }
    let common = if route.scoped { COMMON_REFUSALS } else { &[] };
    let body = if matches!(route.request, Some(Content::Json(_))) {
        JSON_BODY
    } else {
        &[]
    };
    // An id in the path that sharedos never issues.
    let ids: &[(u16, &str)] = if route.path.contains("Id}") {
        &[(400, "invalid_id")]
    } else {
        &[]
    };
    let mut by_status: std::collections::BTreeMap<u16, Vec<&str>> = Default::default();
    for (status, code) in route.refusals.iter().chain(common).chain(body).chain(ids) {
        let codes = by_status.entry(*status).or_default();
        if !codes.contains(code) {
            codes.push(code);
        }
    }
    for (status, codes) in by_status {
        if responses.contains_key(&status.to_string()) {
            continue;
        }
        responses.insert(
            status.to_string(),
            json!({
                "description": format!("refused: {}", codes.join(", ")),
                "content": {"application/json": {"schema": {
                    "allOf": [error, {"properties": {"error": {"properties": {"code": {"enum": codes}}}}}]
                }}}
            }),
        );
    }
    let mut op = json!({
        "operationId": format!("{:?}", route.op).chars().enumerate()
            .map(|(i, c)| if i == 0 { c.to_ascii_lowercase() } else { c }).collect::<String>(),
        "summary": route.summary,
        "parameters": parameters,
        "responses": responses,
    });
    if !route.scoped {
        op["security"] = json!([{}, {"bearer": []}]);
    }
    if let Some(request) = route.request {
        op["requestBody"] = json!({"required": true, "content": content(request, generator)});
    }
    op
}

fn content(c: Content, generator: &mut SchemaGenerator) -> Value {
    match c {
        Content::Json(schema) => json!({"application/json": {"schema": schema(generator)}}),
        Content::EventStream => json!({"text/event-stream": {"schema": {"type": "string"}}}),
        Content::OpenMetrics => {
            json!({"application/openmetrics-text": {"schema": {"type": "string"}}})
        }
        Content::Bytes => {
            json!({"application/octet-stream": {"schema": {"type": "string", "contentEncoding": "binary"}}})
        }
    }
}
