//! The query and the path of `GET /v1/sessions/{id}/effects`,
//! `GET /v1/runs/{id}/effects` and `POST
//! /v1/runs/{id}/effects/{operationId}/settle` (docs/SERVE.md,
//! "Unresolved effects").

use std::sync::Arc;

use hyper::Request;
use serde_json::{Value, json};
use sharedos_store::effects::EffectState;

use super::listing::{Refusal, percent_decode};
use crate::session::{Scope, Sessions};

fn bad(code: &'static str, message: impl Into<String>) -> Refusal {
    Refusal::Query {
        code,
        message: message.into(),
    }
}

/// `state` of a session's effects listing: one of the states, or absent.
fn state_filter(query: Option<&str>) -> Result<Option<EffectState>, Refusal> {
    let mut state = None;
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name != "state" {
            let shown: String = name.chars().take(64).collect();
            return Err(bad(
                "unknown_parameter",
                format!("unknown query parameter {shown:?}: this listing takes state"),
            ));
        }
        if state.is_some() {
            return Err(bad("invalid_query", "state is given more than once"));
        }
        state = Some(match value {
            "unresolved" => EffectState::Unresolved,
            "settled" => EffectState::Settled,
            "succeeded" => EffectState::Succeeded,
            "failed" => EffectState::Failed,
            _ => {
                return Err(bad(
                    "invalid_state",
                    "state must be unresolved, settled, succeeded or failed",
                ));
            }
        });
    }
    Ok(state)
}

/// The session's effects, or a run's; `None` for any other path.
pub(super) async fn list(
    sessions: &Arc<Sessions>,
    scope: &Scope,
    parts: &[&str],
    query: Option<&str>,
) -> Option<Result<Value, Refusal>> {
    let answer = match parts {
        ["v1", "sessions", id, "effects"] => match state_filter(query) {
            Ok(state) => sessions
                .session_effects(scope, id, state)
                .await
                .map(|l| json!({"effects": l.effects, "truncated": l.truncated}))
                .map_err(Refusal::from),
            Err(refusal) => Err(refusal),
        },
        ["v1", "runs", id, "effects"] => match query.filter(|q| !q.is_empty()) {
            Some(_) => Err(bad(
                "unknown_parameter",
                "a run's effects take no query parameter",
            )),
            None => sessions
                .run_effects(scope, id)
                .await
                .map(|e| json!({"effects": e}))
                .map_err(Refusal::from),
        },
        _ => return None,
    };
    Some(answer)
}

/// The operation id of a settlement's path, its `%XX` escapes decoded
/// (what it may hold is the session layer's check).
pub(super) fn operation_id(raw: &str) -> Result<String, Refusal> {
    percent_decode(raw)
}

/// Who settles: a tenant's token id or its mapped peer, else the
/// operator (the operator's token, or the socket's owner).
pub(super) fn settled_by<B>(req: &Request<B>) -> String {
    req.extensions()
        .get::<super::tenants::Binding>()
        .map_or_else(|| "operator".to_owned(), |b| b.credential.clone())
}
