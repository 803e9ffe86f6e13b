//! The API's route table (docs/SERVE.md, "OpenAPI"): every endpoint with
//! its method, path, whether it needs the scope header, its body, its
//! answers and the error codes it may refuse with. The router dispatches
//! by it ([`find`]: a request no row matches is `404 no_route`), and
//! `GET /v1/openapi.json` is the OpenAPI 3.1 document generated from it
//! (`openapi.rs`), so the two cannot name different endpoints.

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::Serialize;
use serde_json::{Map, Value};
use sharedos_store::{RunRecord, SessionRecord};

use crate::session::{AdmissionStatus, LeaseStatus, OpenSession, RunInput, SettleRequest};

/// What the router does with a request: one per row of [`ROUTES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Health,
    Metrics,
    OpenApi,
    Preflight,
    OpenSession,
    ListSessions,
    GetSession,
    CloseSession,
    ListRuns,
    SessionEffects,
    PutFile,
    GetFile,
    PostRun,
    GetRun,
    DeleteRun,
    CancelRun,
    RunEvents,
    RunEffects,
    SettleEffect,
}

/// A body's media type, and for JSON its schema.
#[derive(Clone, Copy)]
pub enum Content {
    Json(fn(&mut SchemaGenerator) -> Schema),
    EventStream,
    OpenMetrics,
    Bytes,
}

/// One answer an endpoint gives on success.
pub struct Answer {
    pub status: u16,
    pub what: &'static str,
    pub content: Content,
}

/// One row of the table.
pub struct Route {
    pub op: Op,
    pub method: &'static str,
    /// `{name}` is one path segment; a last `{path}` is the rest.
    pub path: &'static str,
    pub summary: &'static str,
    /// Needs the `Sharedos-Scope` header (every endpoint but health,
    /// metrics and this document).
    pub scoped: bool,
    pub query: &'static [(&'static str, &'static str)],
    pub request: Option<Content>,
    pub answers: &'static [Answer],
    /// The error codes particular to this endpoint, with their status;
    /// [`COMMON_REFUSALS`] apply to every scoped one besides.
    pub refusals: &'static [(u16, &'static str)],
}

pub(super) fn schema<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    g.subschema_for::<T>()
}

/// The body of `POST /v1/sessions/{id}/runs`.
#[derive(JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
struct RunBody {
    request_id: String,
    #[serde(flatten)]
    input: RunInput,
}

/// Every error answer: `{"error": {"code", "message", ...}}`.
#[derive(Serialize, JsonSchema)]
pub(super) struct ErrorAnswer {
    error: ErrorBody,
}

#[derive(Serialize, JsonSchema)]
struct ErrorBody {
    /// Stable: what a client branches on.
    code: String,
    /// What to fix, for a person.
    message: String,
}

/// `{"session": ...}`.
#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct SessionAnswer {
    session: SessionRecord,
}

#[derive(JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
struct SessionWithRun {
    session: SessionRecord,
    /// The id of the session's earliest-admitted run still in flight.
    active_run: Option<String>,
}

#[derive(JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
struct SessionPage {
    sessions: Vec<SessionRecord>,
    next_cursor: Option<String>,
}

#[derive(JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
struct RunPage {
    runs: Vec<RunRecord>,
    next_cursor: Option<String>,
}

#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RunAnswer {
    run: RunRecord,
}

#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct PostedRun {
    run: RunRecord,
    /// The requestId was seen before: this is the original run.
    repeated: bool,
}

#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Closed {
    closed: String,
}

#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Deleted {
    deleted: String,
}

/// `{"closed": id}`, or with `purge=true` `{"deleted": id}`.
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum ClosedOrDeleted {
    Closed(Closed),
    Deleted(Deleted),
}

#[derive(JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
struct Cancelled {
    /// Whether a host was asked to cancel it (it was in flight).
    cancelled: bool,
    host_id: Option<String>,
}

#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Health {
    lease: LeaseStatus,
    admission: AdmissionStatus,
}

/// An effect as its audit records hold it (docs/SERVE.md, "Unresolved
/// effects"): `runId`, `operationId`, `state` and the audit's members.
#[derive(JsonSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct Effect {
    run_id: String,
    operation_id: String,
    state: String,
    #[serde(flatten)]
    audit: Map<String, Value>,
}

#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct SessionEffects {
    effects: Vec<Effect>,
    /// More effects exist than the listing holds.
    truncated: bool,
}

#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct RunEffects {
    effects: Vec<Effect>,
}

#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Settled {
    /// The `effect.settled` audit record.
    settlement: Map<String, Value>,
}

#[derive(JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
struct PreflightAnswer {
    namespace_id: String,
    /// Each agent the scope may name: its runtime's sandbox here and the
    /// catalogue's tools with whether a live grant covers each.
    agents: Vec<Map<String, Value>>,
}

#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Uploaded {
    path: String,
    bytes: u64,
    sha256: String,
}

const OK: u16 = 200;
const CREATED: u16 = 201;

/// Refusals every scoped endpoint may answer.
pub const COMMON_REFUSALS: &[(u16, &str)] = &[
    (400, "missing_scope"),
    (400, "invalid_scope"),
    (401, "unauthorized"),
    (403, "scope_not_permitted"),
    (503, "store_unavailable"),
    (503, "lease_lost"),
    (503, "shutting_down"),
    (503, "too_many_connections"),
];

pub(super) const JSON_BODY: &[(u16, &str)] = &[
    (400, "invalid_body"),
    (408, "request_timeout"),
    (415, "unsupported_media_type"),
];

const SESSION_LISTING: &[(&str, &str)] = &[
    ("state", "open or closed"),
    ("createdAfter", "an RFC 3339 time with an offset"),
    ("createdBefore", "an RFC 3339 time with an offset"),
    ("limit", "at most this many (1..=500, default 50)"),
    ("cursor", "the nextCursor of the previous page"),
];

const RUN_LISTING: &[(&str, &str)] = &[
    ("state", "in_flight, ended or interrupted"),
    ("admittedAfter", "an RFC 3339 time with an offset"),
    ("admittedBefore", "an RFC 3339 time with an offset"),
    ("limit", "at most this many (1..=500, default 50)"),
    ("cursor", "the nextCursor of the previous page"),
];

/// The table. Order matters only for reading: no two rows match the same
/// method and path.
pub const ROUTES: &[Route] = &[
    Route {
        op: Op::Health,
        method: "GET",
        path: "/v1/health",
        summary: "This host's lease and admission; 503 lease_lost once another host took it over",
        scoped: false,
        query: &[],
        request: None,
        answers: &[
            Answer {
                status: OK,
                what: "the lease holds",
                content: Content::Json(schema::<Health>),
            },
            Answer {
                status: 503,
                what: "the lease was lost (error code lease_lost)",
                content: Content::Json(schema::<ErrorAnswer>),
            },
        ],
        refusals: &[],
    },
    Route {
        op: Op::Metrics,
        method: "GET",
        path: "/metrics",
        summary: "The OpenMetrics exposition (refused to a tenant's credential)",
        scoped: false,
        query: &[],
        request: None,
        answers: &[Answer {
            status: OK,
            what: "the metrics",
            content: Content::OpenMetrics,
        }],
        refusals: &[(403, "operator_only")],
    },
    Route {
        op: Op::OpenApi,
        method: "GET",
        path: "/v1/openapi.json",
        summary: "This document",
        scoped: false,
        query: &[],
        request: None,
        answers: &[Answer {
            status: OK,
            what: "the OpenAPI 3.1 document",
            content: Content::Json(schema::<Map<String, Value>>),
        }],
        refusals: &[],
    },
    Route {
        op: Op::Preflight,
        method: "GET",
        path: "/v1/preflight",
        summary: "What a session in the caller's scope would get on this host",
        scoped: true,
        query: &[("agent", "only this agent")],
        request: None,
        answers: &[Answer {
            status: OK,
            what: "the agents, their sandboxes and tools",
            content: Content::Json(schema::<PreflightAnswer>),
        }],
        refusals: &[
            (400, "unknown_agent"),
            (400, "unknown_parameter"),
            (404, "no_route"),
        ],
    },
    Route {
        op: Op::OpenSession,
        method: "POST",
        path: "/v1/sessions",
        summary: "Opens a session",
        scoped: true,
        query: &[],
        request: Some(Content::Json(schema::<OpenSession>)),
        answers: &[Answer {
            status: CREATED,
            what: "the session",
            content: Content::Json(schema::<SessionAnswer>),
        }],
        refusals: &[
            (400, "unknown_agent"),
            (400, "unknown_tool"),
            (400, "invalid_id"),
        ],
    },
    Route {
        op: Op::ListSessions,
        method: "GET",
        path: "/v1/sessions",
        summary: "The scope's sessions, newest first, in keyset pages",
        scoped: true,
        query: SESSION_LISTING,
        request: None,
        answers: &[Answer {
            status: OK,
            what: "a page",
            content: Content::Json(schema::<SessionPage>),
        }],
        refusals: &[
            (400, "unknown_parameter"),
            (400, "invalid_query"),
            (400, "invalid_cursor"),
            (400, "invalid_limit"),
            (400, "invalid_time"),
            (400, "invalid_state"),
        ],
    },
    Route {
        op: Op::GetSession,
        method: "GET",
        path: "/v1/sessions/{sessionId}",
        summary: "A session with its active run",
        scoped: true,
        query: &[],
        request: None,
        answers: &[Answer {
            status: OK,
            what: "the session",
            content: Content::Json(schema::<SessionWithRun>),
        }],
        refusals: &[(404, "not_found")],
    },
    Route {
        op: Op::CloseSession,
        method: "DELETE",
        path: "/v1/sessions/{sessionId}",
        summary: "Closes a session; with purge=true deletes a closed one with its runs",
        scoped: true,
        query: &[("purge", "true: delete the closed session")],
        request: None,
        answers: &[Answer {
            status: OK,
            what: "closed ({closed}) or deleted ({deleted})",
            content: Content::Json(schema::<ClosedOrDeleted>),
        }],
        refusals: &[
            (404, "not_found"),
            (409, "session_open"),
            (409, "run_in_flight"),
            (400, "unknown_parameter"),
        ],
    },
    Route {
        op: Op::ListRuns,
        method: "GET",
        path: "/v1/sessions/{sessionId}/runs",
        summary: "A session's runs, newest first, in keyset pages",
        scoped: true,
        query: RUN_LISTING,
        request: None,
        answers: &[Answer {
            status: OK,
            what: "a page",
            content: Content::Json(schema::<RunPage>),
        }],
        refusals: &[
            (404, "not_found"),
            (400, "unknown_parameter"),
            (400, "invalid_query"),
            (400, "invalid_cursor"),
            (400, "invalid_limit"),
            (400, "invalid_time"),
            (400, "invalid_state"),
        ],
    },
    Route {
        op: Op::SessionEffects,
        method: "GET",
        path: "/v1/sessions/{sessionId}/effects",
        summary: "A session's effects (allowed tool calls), by state",
        scoped: true,
        query: &[("state", "unresolved, settled, succeeded or failed")],
        request: None,
        answers: &[Answer {
            status: OK,
            what: "the effects",
            content: Content::Json(schema::<SessionEffects>),
        }],
        refusals: &[
            (404, "not_found"),
            (400, "unknown_parameter"),
            (400, "invalid_query"),
            (400, "invalid_state"),
        ],
    },
    Route {
        op: Op::PutFile,
        method: "PUT",
        path: "/v1/sessions/{sessionId}/files/{path}",
        summary: "Puts a file into the session's files",
        scoped: true,
        query: &[],
        request: Some(Content::Bytes),
        answers: &[Answer {
            status: CREATED,
            what: "the file written",
            content: Content::Json(schema::<Uploaded>),
        }],
        refusals: &[
            (400, "invalid_path"),
            (400, "path_not_allowed"),
            (400, "path_too_long"),
            (404, "not_found"),
            (404, "files_disabled"),
            (409, "session_closed"),
            (409, "file_too_large"),
            (409, "is_a_directory"),
            (409, "not_a_directory"),
            (413, "payload_too_large"),
        ],
    },
    Route {
        op: Op::GetFile,
        method: "GET",
        path: "/v1/sessions/{sessionId}/files/{path}",
        summary: "A file of the session's files, its bytes (X-Sharedos-Sha256: their digest)",
        scoped: true,
        query: &[],
        request: None,
        answers: &[Answer {
            status: OK,
            what: "the bytes",
            content: Content::Bytes,
        }],
        refusals: &[
            (400, "invalid_path"),
            (400, "path_not_allowed"),
            (400, "path_too_long"),
            (404, "not_found"),
            (404, "file_not_found"),
            (404, "files_disabled"),
            (409, "is_a_directory"),
            (409, "not_a_file"),
        ],
    },
    Route {
        op: Op::PostRun,
        method: "POST",
        path: "/v1/sessions/{sessionId}/runs",
        summary: "Starts a run (201), or answers the run a repeated requestId started (200)",
        scoped: true,
        query: &[],
        request: Some(Content::Json(schema::<RunBody>)),
        answers: &[
            Answer {
                status: CREATED,
                what: "a new run",
                content: Content::Json(schema::<PostedRun>),
            },
            Answer {
                status: OK,
                what: "the run this requestId started",
                content: Content::Json(schema::<PostedRun>),
            },
        ],
        refusals: &[
            (400, "invalid_input"),
            (400, "invalid_request_id"),
            (404, "not_found"),
            (409, "request_conflict"),
            (409, "session_closed"),
            (429, "too_many_runs"),
            (503, "runtime_unavailable"),
        ],
    },
    Route {
        op: Op::GetRun,
        method: "GET",
        path: "/v1/runs/{runId}",
        summary: "A run: its state, and its result once ended",
        scoped: true,
        query: &[],
        request: None,
        answers: &[Answer {
            status: OK,
            what: "the run",
            content: Content::Json(schema::<RunAnswer>),
        }],
        refusals: &[(404, "not_found")],
    },
    Route {
        op: Op::DeleteRun,
        method: "DELETE",
        path: "/v1/runs/{runId}",
        summary: "Deletes a run no longer in flight with its journal",
        scoped: true,
        query: &[],
        request: None,
        answers: &[Answer {
            status: OK,
            what: "deleted",
            content: Content::Json(schema::<Deleted>),
        }],
        refusals: &[(404, "not_found"), (409, "run_in_flight")],
    },
    Route {
        op: Op::CancelRun,
        method: "POST",
        path: "/v1/runs/{runId}/cancel",
        summary: "Cancels a run in flight, on whichever host runs it",
        scoped: true,
        query: &[],
        request: None,
        answers: &[Answer {
            status: OK,
            what: "whether it was in flight",
            content: Content::Json(schema::<Cancelled>),
        }],
        refusals: &[(404, "not_found")],
    },
    Route {
        op: Op::RunEvents,
        method: "GET",
        path: "/v1/runs/{runId}/events",
        summary: "A run's events as server-sent events, then `end`",
        scoped: true,
        query: &[
            (
                "afterSequence",
                "only events after this sequence (or the Last-Event-ID header)",
            ),
            (
                "types",
                "only these event types (comma-separated; a trailing .* is a prefix)",
            ),
        ],
        request: None,
        answers: &[Answer {
            status: OK,
            what: "the event stream",
            content: Content::EventStream,
        }],
        refusals: &[
            (404, "not_found"),
            (400, "invalid_sequence"),
            (400, "sequence_beyond_end"),
            (410, "sequence_dropped"),
            (400, "invalid_types"),
        ],
    },
    Route {
        op: Op::RunEffects,
        method: "GET",
        path: "/v1/runs/{runId}/effects",
        summary: "A run's effects (allowed tool calls)",
        scoped: true,
        query: &[],
        request: None,
        answers: &[Answer {
            status: OK,
            what: "the effects",
            content: Content::Json(schema::<RunEffects>),
        }],
        refusals: &[(404, "not_found"), (400, "unknown_parameter")],
    },
    Route {
        op: Op::SettleEffect,
        method: "POST",
        path: "/v1/runs/{runId}/effects/{operationId}/settle",
        summary: "Settles an unresolved effect with the outcome observed at its source",
        scoped: true,
        query: &[],
        request: Some(Content::Json(schema::<SettleRequest>)),
        answers: &[Answer {
            status: CREATED,
            what: "the settlement",
            content: Content::Json(schema::<Settled>),
        }],
        refusals: &[
            (400, "invalid_settlement"),
            (400, "invalid_id"),
            (404, "not_found"),
            (409, "effect_settled"),
            (409, "effect_not_unresolved"),
        ],
    },
];

/// The row `method` and the path's segments (`parts`, the path between
/// its outer slashes split at `/`) match, if any.
pub fn find(method: &str, parts: &[&str]) -> Option<&'static Route> {
    ROUTES
        .iter()
        .find(|r| r.method == method && matches(r.path, parts))
}

/// Whether `parts` fill `template`: a literal segment equal, a `{name}`
/// any one segment, a last `{path}` one or more.
fn matches(template: &str, parts: &[&str]) -> bool {
    let want: Vec<&str> = template.trim_matches('/').split('/').collect();
    if want.last() == Some(&"{path}") {
        let fixed = want.len() - 1;
        return parts.len() > fixed && segments_match(&want[..fixed], &parts[..fixed]);
    }
    want.len() == parts.len() && segments_match(&want, parts)
}

fn segments_match(want: &[&str], parts: &[&str]) -> bool {
    want.iter()
        .zip(parts)
        .all(|(w, p)| (w.starts_with('{') && w.ends_with('}')) || w == p)
}

#[cfg(test)]
mod tests;
