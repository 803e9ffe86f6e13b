//! `GET /v1/sessions/{id}/effects`, `GET /v1/runs/{id}/effects` and
//! `POST /v1/runs/{id}/effects/{operationId}/settle` (docs/SERVE.md,
//! "Unresolved effects").

use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde_json::{Value, json};
use sharedos_store::effects::EffectState;

use super::listing::{Refusal, percent_decode};
use super::routes::{Body, Failure, body_of, json_response};
use crate::session::{Scope, Sessions, SettleRequest};

/// `state` of a session's effects listing: one of the states, or absent.
fn state_filter(query: Option<&str>) -> Result<Option<EffectState>, Failure> {
    let bad = |m: String| Failure::new(StatusCode::BAD_REQUEST, "invalid_query", m);
    let mut state = None;
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name != "state" {
            let shown: String = name.chars().take(64).collect();
            return Err(Failure::new(
                StatusCode::BAD_REQUEST,
                "unknown_parameter",
                format!("unknown query parameter {shown:?}: this listing takes state"),
            ));
        }
        if state.is_some() {
            return Err(bad("state is given more than once".into()));
        }
        let parsed = match value {
            "unresolved" => EffectState::Unresolved,
            "settled" => EffectState::Settled,
            "succeeded" => EffectState::Succeeded,
            "failed" => EffectState::Failed,
            _ => {
                return Err(Failure::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_state",
                    "state must be unresolved, settled, succeeded or failed",
                ));
            }
        };
        state = Some(parsed);
    }
    Ok(state)
}

/// The session's effects, or a run's.
pub(super) async fn list(
    sessions: &Arc<Sessions>,
    scope: &Scope,
    parts: &[&str],
    query: Option<&str>,
) -> Option<Result<Value, Failure>> {
    let answer = match parts {
        ["v1", "sessions", id, "effects"] => match state_filter(query) {
            Ok(state) => sessions
                .session_effects(scope, id, state)
                .await
                .map(|l| json!({"effects": l.effects, "truncated": l.truncated}))
                .map_err(Failure::from),
            Err(f) => Err(f),
        },
        ["v1", "runs", id, "effects"] => match query.filter(|q| !q.is_empty()) {
            Some(_) => Err(Failure::new(
                StatusCode::BAD_REQUEST,
                "unknown_parameter",
                "a run's effects take no query parameter",
            )),
            None => sessions
                .run_effects(scope, id)
                .await
                .map(|e| json!({"effects": e}))
                .map_err(Failure::from),
        },
        _ => return None,
    };
    Some(answer)
}

/// Settles one unresolved call; the credential of the request names who
/// did (a tenant's token id or mapped peer, else the operator).
pub(super) async fn settle(
    sessions: &Arc<Sessions>,
    scope: &Scope,
    run_id: &str,
    operation_id: &str,
    req: Request<Incoming>,
    body_within: Duration,
) -> Result<hyper::Response<Body>, Failure> {
    let operation_id = percent_decode(operation_id).map_err(|r| match r {
        Refusal::Query { code, message } => Failure::new(StatusCode::BAD_REQUEST, code, message),
        Refusal::Session(e) => e.into(),
    })?;
    let settled_by = req
        .extensions()
        .get::<super::tenants::Binding>()
        .map_or_else(|| "operator".to_owned(), |b| b.credential.clone());
    let body: SettleRequest = body_of(req, body_within).await?;
    let record = sessions
        .settle_effect(scope, run_id, &operation_id, &body, &settled_by)
        .await?;
    Ok(json_response(
        StatusCode::CREATED,
        &json!({"settlement": record}),
    ))
}
