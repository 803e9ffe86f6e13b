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

#[cfg(test)]
mod tests {
    use sharedos_plugin_sdk::SignalSource;
    use sharedos_testkit::{Record, RecordingHost};

    use super::*;

    /// The events the plugin emitted, as (type, data).
    fn emitted(host: &RecordingHost) -> Vec<(String, Value)> {
        host.records()
            .into_iter()
            .filter_map(|r| match r {
                Record::Emit { kind, data } => Some((kind, data)),
                _ => None,
            })
            .collect()
    }

    fn request(payload: Value) -> RuntimeTurnRequest {
        let agent = json!({ "kind": "agent", "agentId": "adversary" });
        serde_json::from_value(json!({
            "version": "1",
            "executionId": "e1",
            "agent": agent,
            "context": {
                "actor": agent, "owner": agent, "namespaceId": "ns", "purpose": "sandbox test",
                "traceId": "t1", "now": "2026-01-01T00:00:00Z",
                "reach": { "status": "unavailable", "reasonCode": "test" }
            },
            "message": {
                "version": "1", "id": "m1", "sender": agent, "receiver": agent, "purpose": "sandbox test",
                "payload": payload, "traceId": "t1", "createdAt": "2026-01-01T00:00:00Z"
            },
            "tools": []
        }))
        .expect("a valid turn request")
    }

    #[tokio::test]
    async fn each_receipt_is_emitted_and_summarised() {
        let host = RecordingHost::new();
        let abort = SignalSource::new();
        let payload =
            json!({ "bait": { "cleanup": true }, "only": ["C10", "c12-bind-tcp-listener", "C62"] });
        let outcome = AdversaryPlugin
            .run(request(payload), host.clone(), abort.signal())
            .await
            .expect("the turn completes");
        let events = emitted(&host);
        let attacks: Vec<&str> = events
            .iter()
            .map(|(_, data)| data["attack"].as_str().unwrap())
            .collect();
        assert_eq!(
            attacks,
            [
                "C10-ipv6-socket",
                "C12-bind-tcp-listener",
                "C62-race-sandbox-setup"
            ]
        );
        for (kind, data) in &events {
            assert_eq!(kind, ATTACK_EVENT);
            let keys: Vec<&String> = data.as_object().unwrap().keys().collect();
            assert_eq!(keys.len(), 4, "{keys:?}");
        }
        let RuntimeTurnOutcome::Complete { output, .. } = outcome else {
            panic!("not complete: {outcome:?}")
        };
        assert_eq!(output["summary"]["attacks"], 3);
        assert_eq!(output["summary"]["notAttempted"], 1);
        assert_eq!(output["receipts"].as_array().unwrap().len(), 3);
    }

    /// The default sequence from a multi-threaded runtime: the probes that
    /// fork do so off a tokio blocking thread. C54 is left out: it would
    /// type into the terminal of whoever runs the tests.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_default_sequence_runs_inside_a_turn() {
        let host = RecordingHost::new();
        let ids: Vec<&str> = crate::attacks::default_sequence()
            .map(|a| a.id)
            .filter(|id| *id != "C54")
            .collect();
        let payload = json!({ "bait": { "cleanup": true }, "only": ids });
        let outcome = AdversaryPlugin
            .run(request(payload), host.clone(), Signal::never())
            .await
            .unwrap();
        let RuntimeTurnOutcome::Complete { output, .. } = outcome else {
            panic!()
        };
        assert_eq!(emitted(&host).len(), ids.len());
        assert_eq!(output["summary"]["attacks"], ids.len());
    }

    #[tokio::test]
    async fn a_raised_abort_stops_before_the_next_attempt() {
        let host = RecordingHost::new();
        let abort = SignalSource::new();
        abort.raise();
        let outcome = AdversaryPlugin
            .run(
                request(json!({ "only": "C10" })),
                host.clone(),
                abort.signal(),
            )
            .await
            .unwrap();
        assert!(emitted(&host).is_empty());
        let RuntimeTurnOutcome::Complete { output, .. } = outcome else {
            panic!()
        };
        assert_eq!(output["summary"]["attacks"], 0);
    }

    #[test]
    fn payload_errors_are_reported() {
        assert!(parse_payload(&json!({ "bait": { "tcp_port": "not a port" } })).is_err());
        assert!(parse_payload(&json!({ "only": 42 })).is_err());
        let (bait, sel) = parse_payload(&json!({})).unwrap();
        assert_eq!(bait, Bait::default());
        assert_eq!(sel, Selection::Default);
        assert!(Selection::Only(vec!["C99".into()]).attacks().is_err());
    }
}
