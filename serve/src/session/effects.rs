//! The tool calls of a run that a crash left unresolved, and their
//! settlement by an operator who looked at the source (docs/SERVE.md,
//! "Unresolved effects"). What the audit trail holds decides: recovery
//! marked each call allowed without an outcome `interrupted`; a settlement
//! is one `effect.settled` record (and its journal event), written once.

use serde::Deserialize;
use serde_json::{Value, json};
use sharedos_kernel::{AuditOutcome, AuditRecord};
use sharedos_protocol::Timestamp;
use sharedos_store::effects::{self, Effect, EffectState, Settled, Settlement};
use sharedos_store::{RunQuery, RunState, StoreError};

use super::{Scope, SessionError, Sessions, request};

/// The longest `note` kept, in characters.
pub const MAX_NOTE_CHARS: usize = 1024;
/// The most `observed` may weigh, serialized.
pub const MAX_OBSERVED_BYTES: usize = 16 * 1024;
/// The longest operation id read from a path.
const MAX_OPERATION_ID_CHARS: usize = 256;
/// The most effects one listing of a session answers (`truncated` beyond).
pub const MAX_LISTED_EFFECTS: usize = 10_000;

/// What the operator saw at the call's source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Observed {
    Succeeded,
    Failed,
}

/// The body of a settlement.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SettleRequest {
    pub outcome: Observed,
    /// What was seen at the source (any JSON).
    pub observed: Value,
    #[serde(default)]
    pub note: Option<String>,
}

impl SettleRequest {
    fn check(&self) -> Result<(), SessionError> {
        let bad = |m: String| Err(SessionError::InvalidSettlement(m));
        if self.observed.is_null() {
            return bad(
                "observed is required: what was seen at the source (any JSON but null)".into(),
            );
        }
        let weight = serde_json::to_string(&self.observed).map_or(usize::MAX, |t| t.len());
        if weight > MAX_OBSERVED_BYTES {
            return bad(format!(
                "observed weighs {weight} bytes serialized; at most {MAX_OBSERVED_BYTES}"
            ));
        }
        if let Some(note) = &self.note {
            if note.chars().count() > MAX_NOTE_CHARS {
                return bad(format!("note is longer than {MAX_NOTE_CHARS} characters"));
            }
            if note
                .chars()
                .any(|c| c.is_control() && c != '\n' && c != '\t')
            {
                return bad(
                    "note holds a control character (only newline and tab are kept)".into(),
                );
            }
        }
        Ok(())
    }
}

/// An operation id as a path names it: 1 to 256 characters, none a control
/// character or a `/`.
fn check_operation_id(id: &str) -> Result<(), SessionError> {
    let fine = !id.is_empty()
        && id.chars().count() <= MAX_OPERATION_ID_CHARS
        && !id.chars().any(|c| c.is_control() || c == '/');
    if fine {
        return Ok(());
    }
    let shown: String = id.chars().take(64).collect();
    Err(SessionError::InvalidOperationId(shown))
}

/// A session's effects and whether the listing stopped at its bound.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectList {
    pub effects: Vec<Effect>,
    pub truncated: bool,
}

impl Sessions {
    /// Every tool call the kernel allowed in run `run_id` and where it
    /// stands.
    pub async fn run_effects(
        &self,
        scope: &Scope,
        run_id: &str,
    ) -> Result<Vec<Effect>, SessionError> {
        self.get_run(scope, run_id).await?;
        let trail = self.store.audit_trail(run_id).await?;
        Ok(effects::effects_of(run_id, &trail))
    }

    /// The calls of the session's interrupted runs (the only runs whose
    /// calls can be unresolved), those in `state` only when given, in
    /// admission order of their runs and decision order within each.
    pub async fn session_effects(
        &self,
        scope: &Scope,
        session_id: &str,
        state: Option<EffectState>,
    ) -> Result<EffectList, SessionError> {
        request::check_issued_id("session", session_id)?;
        self.session(scope, session_id).await?;
        let mut query = RunQuery {
            session_id: session_id.to_owned(),
            state: Some(RunState::Interrupted),
            admitted: Default::default(),
            after: None,
            limit: 200,
        };
        let mut list = EffectList {
            effects: Vec::new(),
            truncated: false,
        };
        loop {
            let runs = self.store.list_runs(&query).await?;
            for run in &runs {
                let trail = self.store.audit_trail(&run.id).await?;
                let of_run = effects::effects_of(&run.id, &trail);
                list.effects.extend(
                    of_run
                        .into_iter()
                        .filter(|e| state.is_none_or(|s| e.state == s)),
                );
                if list.effects.len() > MAX_LISTED_EFFECTS {
                    list.effects.truncate(MAX_LISTED_EFFECTS);
                    list.truncated = true;
                    return Ok(list);
                }
            }
            match runs.last() {
                Some(last) if runs.len() == query.limit => {
                    query.after = Some(sharedos_store::Keyset {
                        at_ms: super::listing::millis(&last.admitted_at),
                        id: last.id.clone(),
                    });
                }
                _ => return Ok(list),
            }
        }
    }

    /// Settles the unresolved call `operation_id` of run `run_id` with what
    /// the operator observed, once: `settled_by` names the credential.
    pub async fn settle_effect(
        &self,
        scope: &Scope,
        run_id: &str,
        operation_id: &str,
        body: &SettleRequest,
        settled_by: &str,
    ) -> Result<AuditRecord, SessionError> {
        check_operation_id(operation_id)?;
        self.get_run(scope, run_id).await?;
        body.check()?;
        let trail = self.store.audit_trail(run_id).await?;
        let effect = effects::effects_of(run_id, &trail)
            .into_iter()
            .find(|e| e.operation_id == operation_id)
            .ok_or_else(|| StoreError::NotFound {
                what: "effect",
                id: operation_id.to_owned(),
            })?;
        match effect.state {
            EffectState::Unresolved => {}
            EffectState::Settled => {
                let first = effect.settlement.clone().ok_or_else(|| {
                    StoreError::Corrupt("a settled effect without its record".into())
                })?;
                return Err(SessionError::EffectSettled {
                    operation_id: operation_id.to_owned(),
                    settlement: Box::new(first),
                });
            }
            other => {
                return Err(SessionError::EffectNotUnresolved {
                    operation_id: operation_id.to_owned(),
                    state: other.as_str(),
                });
            }
        }
        let decision = trail
            .iter()
            .find(|r| r.id == effect.decision_id)
            .ok_or_else(|| StoreError::Corrupt("an effect without its decision".into()))?;
        let outcome = match body.outcome {
            Observed::Succeeded => AuditOutcome::Succeeded,
            Observed::Failed => AuditOutcome::Failed,
        };
        let metadata = json!({
            "observed": body.observed,
            "note": body.note,
            "settledBy": {"credential": settled_by, "owner": scope.owner},
            "unresolvedBecause": effect.unresolved_because,
        });
        let Value::Object(metadata) = metadata else {
            return Err(StoreError::Corrupt("settlement metadata".into()).into());
        };
        let settlement = Settlement::new(&effect, decision, outcome, metadata, &Timestamp::now());
        match self.store.settle_effect(&settlement).await? {
            Settled::Now => Ok(settlement.record),
            Settled::Before(first) => Err(SessionError::EffectSettled {
                operation_id: operation_id.to_owned(),
                settlement: first,
            }),
        }
    }
}
