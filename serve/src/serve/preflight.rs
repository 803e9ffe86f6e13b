//! `GET /v1/preflight`: what a session in the caller's scope would get on
//! this host (docs/SERVE.md, "Preflight").

use std::sync::Arc;

use serde_json::Value;

use super::listing::{self, Refusal};
use crate::preflight::PreflightError;
use crate::session::{Scope, SessionError, Sessions};

/// The agents the scope may name (or only `agent=`), each runtime's
/// sandbox here and the built-in tools with whether the scope's grants
/// cover them; `None` (no such route) for sessions not built from a
/// configuration.
pub(super) async fn preflight(
    sessions: &Arc<Sessions>,
    scope: &Scope,
    query: Option<&str>,
) -> Option<Result<Value, Refusal>> {
    let preflight = sessions.preflight()?;
    let agent = match listing::parameters(query, &["agent"]) {
        Ok(p) => p.into_iter().next().map(|(_, v)| v),
        Err(r) => return Some(Err(r)),
    };
    let answer = preflight
        .answer(
            sessions.store().as_ref(),
            &scope.namespace_id,
            &scope.authority,
            agent.as_deref(),
        )
        .await;
    Some(answer.map_err(|e| match e {
        PreflightError::UnknownAgent { .. } => Refusal::Query {
            code: "unknown_agent",
            message: e.to_string(),
        },
        PreflightError::Store(s) => Refusal::Session(SessionError::Store(s)),
    }))
}
