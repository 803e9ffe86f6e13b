//! The HTTP+JSON surface of `sharedos serve` (docs/SERVE.md).
//!
//! Every request names its trusted scope in the `Sharedos-Scope` header
//! (JSON: namespaceId, authority, owner); ids in paths are locators only.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};
use sharedos_store::StoreError;

use super::api::{self, Op};
use super::effects;
use super::event_filter::KindFilter;
use super::files;
use super::listing::{self, Refusal};
use crate::session::{
    Observer, OpenSession, RunInput, Scope, SessionError, Sessions, SettleRequest,
};

pub type Body = UnsyncBoxBody<Bytes, Infallible>;

use crate::limits::MAX_REQUEST_BODY_BYTES as MAX_BODY;

/// An error answer: a status, a stable code, a message saying what to fix.
pub struct Failure {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// More members of the error object (`runId` of a conflict).
    extra: Option<(&'static str, Value)>,
    /// `Retry-After`, in seconds (a refused run).
    retry_after_s: Option<u64>,
}

impl Failure {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            extra: None,
            retry_after_s: None,
        }
    }
    pub fn into_response(self) -> Response<Body> {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some((key, value)) = self.extra {
            error[key] = value;
        }
        let mut response = json_response(self.status, &json!({ "error": error }));
        if let Some(seconds) = self.retry_after_s {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

impl From<SessionError> for Failure {
    fn from(e: SessionError) -> Self {
        let message = e.to_string();
        let extra = match &e {
            SessionError::Store(StoreError::RequestConflict { run_id, .. }) => {
                Some(("runId", json!(run_id)))
            }
            SessionError::EffectSettled { settlement, .. } => {
                Some(("settlement", json!(settlement)))
            }
            SessionError::EffectNotUnresolved { state, .. } => Some(("state", json!(state))),
            _ => None,
        };
        let retry_after_s = match &e {
            SessionError::TooManyRuns { retry_after_s, .. } => Some(*retry_after_s),
            _ => None,
        };
        let (status, code) = match &e {
            SessionError::Store(s) => match s {
                StoreError::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
                StoreError::RequestConflict { .. } => (StatusCode::CONFLICT, "request_conflict"),
                StoreError::SessionClosed(_) => (StatusCode::CONFLICT, "session_closed"),
                StoreError::RunEnded(_) => (StatusCode::CONFLICT, "run_ended"),
                StoreError::RunInFlight(_) => (StatusCode::CONFLICT, "run_in_flight"),
                StoreError::SessionOpen(_) => (StatusCode::CONFLICT, "session_open"),
                StoreError::GrantConflict(_) => (StatusCode::CONFLICT, "grant_conflict"),
                StoreError::BeyondEnd { .. } => (StatusCode::BAD_REQUEST, "sequence_beyond_end"),
                StoreError::Dropped { .. } => (StatusCode::GONE, "sequence_dropped"),
                StoreError::Fenced { .. } => (StatusCode::SERVICE_UNAVAILABLE, "lease_lost"),
                StoreError::NewerSchema { .. }
                | StoreError::Unavailable(_)
                | StoreError::Corrupt(_) => (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"),
            },
            SessionError::UnknownAgent(_) => (StatusCode::BAD_REQUEST, "unknown_agent"),
            SessionError::UnknownTool { .. } => (StatusCode::BAD_REQUEST, "unknown_tool"),
            SessionError::NoSeat(_) => (StatusCode::SERVICE_UNAVAILABLE, "runtime_unavailable"),
            SessionError::InvalidInput(_) => (StatusCode::BAD_REQUEST, "invalid_input"),
            SessionError::InvalidRequestId(_) => (StatusCode::BAD_REQUEST, "invalid_request_id"),
            SessionError::InvalidId { .. } => (StatusCode::BAD_REQUEST, "invalid_id"),
            SessionError::InvalidScope(_) => (StatusCode::BAD_REQUEST, "invalid_scope"),
            SessionError::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
            SessionError::LeaseLost(_) => (StatusCode::SERVICE_UNAVAILABLE, "lease_lost"),
            SessionError::TooManyRuns { .. } => (StatusCode::TOO_MANY_REQUESTS, "too_many_runs"),
            SessionError::InvalidSettlement(_) => (StatusCode::BAD_REQUEST, "invalid_settlement"),
            SessionError::InvalidOperationId(_) => (StatusCode::BAD_REQUEST, "invalid_id"),
            SessionError::EffectSettled { .. } => (StatusCode::CONFLICT, "effect_settled"),
            SessionError::EffectNotUnresolved { .. } => {
                (StatusCode::CONFLICT, "effect_not_unresolved")
            }
            SessionError::Files(f) => (files_status(f.code), f.code),
            SessionError::FilesDisabled => (StatusCode::NOT_FOUND, "files_disabled"),
        };
        Failure {
            extra,
            retry_after_s,
            ..Failure::new(status, code, message)
        }
    }
}

/// The status of a file tools' code (docs/SERVE.md, "Files in and out").
fn files_status(code: &str) -> StatusCode {
    match code {
        "file_not_found" => StatusCode::NOT_FOUND,
        "path_not_allowed" | "path_too_long" => StatusCode::BAD_REQUEST,
        "is_a_directory" | "not_a_directory" | "not_a_file" | "file_too_large" => {
            StatusCode::CONFLICT
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

pub fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(value.to_string())).boxed_unsync());
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn scope_of(req: &Request<Incoming>) -> Result<Scope, Failure> {
    let text = req
        .headers()
        .get("sharedos-scope")
        .ok_or_else(|| {
            Failure::new(
                StatusCode::BAD_REQUEST,
                "missing_scope",
                "the Sharedos-Scope header is required: {\"namespaceId\":…,\"authority\":…,\"owner\":…}",
            )
        })?
        .to_str()
        .map_err(|_| Failure::new(StatusCode::BAD_REQUEST, "invalid_scope", "Sharedos-Scope is not text"))?;
    // A tenant's credential fixes the namespace and authority (docs/SERVE.md, "Tenants").
    let scope: Scope = match req.extensions().get::<super::tenants::Binding>() {
        Some(bound) => bound
            .scope(text)
            .map_err(|r| Failure::new(r.status, r.code, r.message))?,
        None => serde_json::from_str(text).map_err(|e| {
            Failure::new(
                StatusCode::BAD_REQUEST,
                "invalid_scope",
                format!("Sharedos-Scope: {e}"),
            )
        })?,
    };
    scope.check()?;
    Ok(scope)
}

/// A body is JSON only when it says so: `Content-Type: application/json`
/// (parameters such as `charset=utf-8` allowed); anything else, or none,
/// is `415` before the body is read.
fn json_content_type(req: &Request<Incoming>) -> Result<(), Failure> {
    let given = req.headers().get(CONTENT_TYPE).map(|v| v.to_str());
    let essence = match given {
        Some(Ok(text)) => text.split(';').next().unwrap_or_default().trim(),
        Some(Err(_)) => "(not text)",
        None => "",
    };
    if essence.eq_ignore_ascii_case("application/json") {
        return Ok(());
    }
    let given = if essence.is_empty() { "none" } else { essence };
    Err(Failure::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        format!("the body must be JSON sent with Content-Type: application/json (given: {given})"),
    ))
}

async fn body_of<T: for<'de> Deserialize<'de>>(
    req: Request<Incoming>,
    within: Duration,
) -> Result<T, Failure> {
    json_content_type(&req)?;
    let limited = http_body_util::Limited::new(req.into_body(), MAX_BODY);
    let bytes = tokio::time::timeout(within, limited.collect())
        .await
        .map_err(|_| {
            Failure::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                format!(
                    "the body did not arrive within {} ms of its head ([serve] headerReadTimeoutMs)",
                    within.as_millis()
                ),
            )
        })?
        .map_err(|e| {
            Failure::new(
                StatusCode::BAD_REQUEST,
                "invalid_body",
                format!("the body could not be read (at most {MAX_BODY} bytes): {e}"),
            )
        })?
        .to_bytes();
    serde_json::from_slice(&bytes)
        .map_err(|e| Failure::new(StatusCode::BAD_REQUEST, "invalid_body", e.to_string()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RunBody {
    request_id: String,
    #[serde(flatten)]
    input: RunInput,
}

/// Routes one request; a body must arrive within `body_within` of its head.
pub async fn route(
    sessions: Arc<Sessions>,
    req: Request<Incoming>,
    body_within: Duration,
) -> Response<Body> {
    match handle(&sessions, req, body_within).await {
        Ok(r) => r,
        Err(f) => f.into_response(),
    }
}

fn no_route() -> Failure {
    Failure::new(
        StatusCode::NOT_FOUND,
        "no_route",
        "no such endpoint: see docs/SERVE.md",
    )
}

async fn handle(
    sessions: &Arc<Sessions>,
    req: Request<Incoming>,
    body_within: Duration,
) -> Result<Response<Body>, Failure> {
    let path: Vec<String> = req
        .uri()
        .path()
        .trim_matches('/')
        .split('/')
        .map(str::to_owned)
        .collect();
    let parts: Vec<&str> = path.iter().map(String::as_str).collect();
    let route = api::find(req.method().as_str(), &parts).map(|r| r.op);
    match route {
        Some(Op::Health) => return Ok(health(sessions)),
        Some(Op::Metrics) => return Ok(metrics(sessions)),
        Some(Op::OpenApi) => return Ok(openapi()),
        _ => {}
    }
    let scope = scope_of(&req)?;
    if let Some((id, file)) = files::split(req.uri().path()) {
        let (id, file) = (id.to_owned(), file.to_owned());
        return transfer(sessions, &scope, (&id, &file), req, body_within).await;
    }
    let Some(op) = route else {
        return Err(no_route());
    };
    dispatch(sessions, &scope, (op, &parts), req, body_within).await
}

/// Answers a request of a row of the table (`op`, the path's `parts`)
/// whose scope is read.
async fn dispatch(
    sessions: &Arc<Sessions>,
    scope: &Scope,
    (op, parts): (Op, &[&str]),
    req: Request<Incoming>,
    body_within: Duration,
) -> Result<Response<Body>, Failure> {
    let query = req.uri().query();
    match (op, parts) {
        (Op::OpenSession, _) => {
            let spec: OpenSession = body_of(req, body_within).await?;
            let s = sessions.open_session(scope, spec).await?;
            Ok(json_response(StatusCode::CREATED, &json!({"session": s})))
        }
        (Op::ListSessions, _) => read(listing::sessions(sessions, scope, query).await),
        (Op::GetSession, [_, _, id]) => {
            let (s, active) = sessions.session_with_active_run(scope, id).await?;
            read(Ok(json!({"session": s, "activeRun": active})))
        }
        (Op::CloseSession, [_, _, id]) => close_or_delete(sessions, scope, id, query).await,
        (Op::ListRuns, [_, _, id, _]) => read(listing::runs(sessions, scope, id, query).await),
        (Op::Preflight, _) => match super::preflight::preflight(sessions, scope, query).await {
            Some(answer) => read(answer),
            None => Err(no_route()),
        },
        (Op::SessionEffects | Op::RunEffects, _) => {
            match effects::list(sessions, scope, parts, query).await {
                Some(answer) => read(answer),
                None => Err(no_route()),
            }
        }
        (Op::PostRun, [_, _, id, _]) => {
            let id = id.to_string();
            post_run(sessions, scope, &id, req, body_within).await
        }
        (Op::GetRun, [_, _, id]) => {
            let run = sessions.get_run(scope, id).await?;
            Ok(json_response(StatusCode::OK, &json!({"run": run})))
        }
        (Op::DeleteRun, [_, _, id]) => {
            sessions.delete_run(scope, id).await?;
            Ok(json_response(StatusCode::OK, &json!({"deleted": id})))
        }
        (Op::CancelRun, [_, _, id, _]) => {
            let host = sessions.cancel(scope, id).await?;
            Ok(json_response(
                StatusCode::OK,
                &json!({"cancelled": host.is_some(), "hostId": host}),
            ))
        }
        (Op::SettleEffect, [_, _, id, _, op, _]) => {
            let (id, op) = (id.to_string(), effects::operation_id(op)?);
            settle(sessions, scope, (&id, &op), req, body_within).await
        }
        (Op::RunEvents, [_, _, id, _]) => {
            let after = after_sequence(&req)?;
            let kinds = KindFilter::from_query(query)?;
            let observer = sessions.observe(scope, id, after).await?;
            Ok(sse(observer, kinds))
        }
        // Answered above (files by their raw path), or a row whose shape
        // the arms above do not name: never reached for the table's rows.
        _ => Err(no_route()),
    }
}

/// A read's answer as `200` JSON, or its refusal.
fn read(answer: Result<Value, Refusal>) -> Result<Response<Body>, Failure> {
    answer
        .map(|value| json_response(StatusCode::OK, &value))
        .map_err(Failure::from)
}

/// `GET /v1/openapi.json`: the document of the route table, built once.
fn openapi() -> Response<Body> {
    static DOCUMENT: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    json_response(
        StatusCode::OK,
        DOCUMENT.get_or_init(super::openapi::document),
    )
}

/// `POST /v1/sessions/{id}/runs`: `201` for a new run, `200` for a repeat.
async fn post_run(
    sessions: &Arc<Sessions>,
    scope: &Scope,
    id: &str,
    req: Request<Incoming>,
    body_within: Duration,
) -> Result<Response<Body>, Failure> {
    let body: RunBody = body_of(req, body_within).await?;
    let h = sessions
        .run(scope, id, &body.request_id, body.input)
        .await?;
    let status = if h.repeated {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok(json_response(
        status,
        &json!({"run": h.run, "repeated": h.repeated}),
    ))
}

/// `POST /v1/runs/{id}/effects/{operationId}/settle` (docs/SERVE.md,
/// "Unresolved effects"): `201` with the settlement.
async fn settle(
    sessions: &Arc<Sessions>,
    scope: &Scope,
    (run_id, operation_id): (&str, &str),
    req: Request<Incoming>,
    body_within: Duration,
) -> Result<Response<Body>, Failure> {
    let settled_by = effects::settled_by(&req);
    let body: SettleRequest = body_of(req, body_within).await?;
    let record = sessions
        .settle_effect(scope, run_id, operation_id, &body, &settled_by)
        .await?;
    Ok(json_response(
        StatusCode::CREATED,
        &json!({"settlement": record}),
    ))
}

impl From<files::Refused> for Failure {
    fn from(r: files::Refused) -> Self {
        Failure::new(r.status, r.code, r.message)
    }
}

/// `PUT` (`201 {path, bytes, sha256}`) or `GET` (the bytes) of a
/// session's file (docs/SERVE.md, "Files in and out").
async fn transfer(
    sessions: &Arc<Sessions>,
    scope: &Scope,
    (id, file): (&str, &str),
    req: Request<Incoming>,
    body_within: Duration,
) -> Result<Response<Body>, Failure> {
    let segments = files::segments(file)?;
    let path = segments.join("/");
    let max = sessions
        .max_upload_bytes()
        .ok_or(SessionError::FilesDisabled)?;
    if req.method() == Method::PUT {
        sessions.session(scope, id).await?;
        let bytes = files::body(req, max, body_within).await?;
        let done = sessions.upload(scope, id, segments, bytes.to_vec()).await?;
        let answer = json!({"path": path, "bytes": done.size, "sha256": done.sha256});
        return Ok(json_response(StatusCode::CREATED, &answer));
    }
    if req.method() != Method::GET {
        return Err(Failure::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "a session's file takes PUT (upload) or GET (download)",
        ));
    }
    let done = sessions.download(scope, id, segments, max).await?;
    let length = HeaderValue::from(done.size);
    let mut r = Response::new(Full::new(Bytes::from(done.bytes)).boxed_unsync());
    r.headers_mut().insert(CONTENT_LENGTH, length);
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(digest) = HeaderValue::from_str(&done.sha256) {
        r.headers_mut().insert("x-sharedos-sha256", digest);
    }
    Ok(r)
}

impl From<Refusal> for Failure {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::Query { code, message } => {
                Failure::new(StatusCode::BAD_REQUEST, code, message)
            }
            Refusal::Session(e) => e.into(),
        }
    }
}

/// `DELETE /v1/sessions/{id}`: closes the session, or with `purge=true`
/// deletes a closed one with its runs (docs/SERVE.md, "Deletion").
async fn close_or_delete(
    sessions: &Arc<Sessions>,
    scope: &Scope,
    id: &str,
    query: Option<&str>,
) -> Result<Response<Body>, Failure> {
    if listing::purge(query)? {
        sessions.delete_session(scope, id).await?;
        return Ok(json_response(StatusCode::OK, &json!({"deleted": id})));
    }
    sessions.close_session(scope, id).await?;
    Ok(json_response(StatusCode::OK, &json!({"closed": id})))
}

/// This host and its lease: `200` while the lease holds, `503 lease_lost`
/// once another host took it over (no scope needed: it says nothing of any
/// session).
fn health(sessions: &Sessions) -> Response<Body> {
    let lease = sessions.lease_status();
    let admission = sessions.admission_status();
    match &lease.lost {
        None => json_response(
            StatusCode::OK,
            &json!({"lease": lease, "admission": admission}),
        ),
        Some(why) => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"error": {"code": "lease_lost", "message": why}, "lease": lease, "admission": admission}),
        ),
    }
}

/// The OpenMetrics text exposition Prometheus scrapes (no scope needed:
/// it names no session).
fn metrics(sessions: &Sessions) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(sessions.metrics_text())).boxed_unsync());
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    r.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// The observer's next event `kinds` admits (every one without a filter).
async fn next_admitted(
    observer: &mut Observer,
    kinds: Option<&KindFilter>,
) -> Result<Option<sharedos_protocol::ExecutionEvent>, SessionError> {
    loop {
        match observer.next().await? {
            Some(e) if kinds.is_some_and(|k| !k.admits(e.kind.as_str())) => continue,
            other => return Ok(other),
        }
    }
}

/// `afterSequence` from the query, or the SSE `Last-Event-ID` header a
/// reconnecting client sends.
fn after_sequence(req: &Request<Incoming>) -> Result<Option<u64>, Failure> {
    let parse = |what: &str, text: Option<&str>| {
        text.filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|t| t.parse::<u64>().ok())
            .map(Some)
            .ok_or_else(|| {
                Failure::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_sequence",
                    format!("{what} must be a sequence: decimal digits only, below 2^64"),
                )
            })
    };
    for pair in req.uri().query().unwrap_or_default().split('&') {
        if let Some(v) = pair.strip_prefix("afterSequence=") {
            return parse("afterSequence", Some(v));
        }
    }
    match req.headers().get("last-event-id") {
        Some(v) => parse("Last-Event-ID", v.to_str().ok()),
        None => Ok(None),
    }
}

/// The events as server-sent events: `id` is the sequence, `event` the
/// type, `data` the event; a last `end` event once the run has ended. A
/// client that goes away drops the stream, and with it the observer. With
/// `kinds`, only the events it admits (their sequences unchanged).
fn sse(observer: Observer, kinds: Option<KindFilter>) -> Response<Body> {
    let stream = futures_util::stream::unfold(Some((observer, kinds)), |state| async move {
        let (mut observer, kinds) = state?;
        let (frame, next) = match next_admitted(&mut observer, kinds.as_ref()).await {
            Ok(Some(e)) => {
                let data = serde_json::to_string(&e).unwrap_or_default();
                let text = format!("id: {}\nevent: {}\ndata: {data}\n\n", e.sequence, e.kind);
                (text, Some((observer, kinds)))
            }
            Ok(None) => ("event: end\ndata: {}\n\n".to_owned(), None),
            Err(e) => {
                let data = json!({"message": e.to_string()});
                (format!("event: error\ndata: {data}\n\n"), None)
            }
        };
        Some((Ok::<_, Infallible>(Frame::data(Bytes::from(frame))), next))
    });
    let mut r = Response::new(BodyExt::boxed_unsync(StreamBody::new(stream)));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    r.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}
