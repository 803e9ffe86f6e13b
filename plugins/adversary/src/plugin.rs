//! The plugin mode: the same attacks, run inside a turn.
//!
//! The turn request's `message.payload` carries `bait` (a [`Bait`]) and
//! optionally `only` (an id or a list of ids, for the selectable attacks,
//! one per turn). Each receipt is emitted as a `sandbox.attack` runtime
//! event right after its attempt, so the receipts written before a crash
//! or a kill reach the host; the outcome is a summary with every receipt.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};
use sharedos_plugin_sdk::protocol::Identifier;
use sharedos_plugin_sdk::{
    RuntimeError, RuntimeEvent, RuntimeHost, RuntimeManifest, RuntimePlugin, RuntimeTurnOutcome,
    RuntimeTurnRequest, Signal,
};

use crate::bait::Bait;
use crate::receipt::Receipt;
use crate::run::{self, Selection};

/// The event type of one receipt.
pub const ATTACK_EVENT: &str = "sandbox.attack";

#[derive(Debug, Clone, Copy, Default)]
pub struct AdversaryPlugin;

/// Reads `bait` and `only` from a turn's payload.
pub fn parse_payload(payload: &Value) -> Result<(Bait, Selection), String> {
    let bait = match payload.get("bait") {
        None | Some(Value::Null) => Bait::default(),
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|e| format!("payload.bait does not describe bait: {e}"))?,
    };
    let selection = match payload.get("only") {
        None | Some(Value::Null) => Selection::Default,
        Some(Value::String(s)) => Selection::Only(vec![s.clone()]),
        Some(Value::Array(ids)) => Selection::Only(
            ids.iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or("payload.only must hold attack ids (strings)")
                })
                .collect::<Result<_, _>>()?,
        ),
        Some(_) => return Err("payload.only must be an attack id or a list of ids".into()),
    };
    Ok((bait, selection))
}

/// The runtime event for one receipt: `{attack, attempted, observed, blocked}`.
pub fn attack_event(receipt: &Receipt) -> RuntimeEvent {
    RuntimeEvent {
        kind: Identifier::new(ATTACK_EVENT).expect("a valid identifier literal"),
        data: serde_json::to_value(receipt).unwrap_or(Value::Null),
    }
}

#[async_trait]
impl RuntimePlugin for AdversaryPlugin {
    fn manifest(&self) -> RuntimeManifest {
        RuntimeManifest::new("sharedos-adversary", env!("CARGO_PKG_VERSION"))
            .expect("valid manifest literals")
    }

    async fn run(
        &self,
        request: RuntimeTurnRequest,
        host: Arc<dyn RuntimeHost>,
        abort: Signal,
    ) -> Result<RuntimeTurnOutcome, RuntimeError> {
        let (bait, selection) =
            parse_payload(&request.message.payload).map_err(RuntimeError::Failed)?;
        let attacks = selection.attacks().map_err(RuntimeError::Failed)?;
        // The attempts block, fork and sleep: keep them off the runtime's
        // workers, on one thread (ptrace ties a tracee to its tracer thread).
        let receipts = tokio::task::spawn_blocking(move || {
            let stop = move || abort.is_raised();
            run::run(&attacks, &bait, &stop, &mut |r| {
                // A refused emit means the turn is closed; the next attempt
                // is still made, as a hostile plugin would.
                let _ = host.emit(attack_event(r));
            })
        })
        .await
        .map_err(|e| RuntimeError::Failed(format!("the attack thread failed: {e}")))?;
        Ok(RuntimeTurnOutcome::complete(
            json!({ "summary": run::tally(&receipts), "receipts": receipts }),
        ))
    }
}
