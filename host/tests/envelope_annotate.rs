//! envelope.md G 40–52: `host.annotate` and the one merge order (B.4, A.8).

mod support;

use std::sync::Arc;

use serde_json::json;
use sharedos_plugin_sdk::{RuntimeError, RuntimeHost};
use sharedos_protocol::{ErrorKind, ExecutionStatus, ProtocolError, Reason, RuntimeTurnOutcome};
use support::*;

const H: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

#[tokio::test(start_paused = true)]
async fn g40_annotation_on_completed_keeps_runtime() {
    let kernel = TestKernel::new(vec![]);
    let (plugin, _) = ScriptPlugin::new(vec![Step::annotate("promptHash", json!(H))]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(request(&[])).await;
    assert_eq!(r.status, ExecutionStatus::Succeeded);
    assert_eq!(r.metadata.get("promptHash"), Some(&json!(H)));
    assert_eq!(r.metadata.get("runtime"), Some(&expected_runtime()));
    // Annotations are not events.
    assert_eq!(types(&r), ["turn.started", "turn.completed"]);
}

#[tokio::test(start_paused = true)]
async fn g41_annotation_survives_a_throw() {
    let kernel = TestKernel::new(vec![]);
    let (plugin, _) = ScriptPlugin::new(vec![
        Step::annotate("promptHash", json!(H)),
        Step::throw("boom"),
    ]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(request(&[])).await;
    assert_eq!(code(&r), "runtime_failed");
    assert_eq!(r.metadata.get("promptHash"), Some(&json!(H)));
    assert_eq!(r.metadata.get("runtime"), Some(&expected_runtime()));
}

#[tokio::test(start_paused = true)]
async fn g42_annotation_survives_the_deadline() {
    let kernel = TestKernel::new(vec![]);
    let (plugin, _) = ScriptPlugin::new(vec![Step::annotate("promptHash", json!(H)), Step::Stall]);
    let h = executor(&kernel, plugin, 0);
    let (r, took) = timed(&h, request(&[])).await;
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(took, 120_000);
    assert_eq!(r.metadata.get("promptHash"), Some(&json!(H)));
}

#[tokio::test(start_paused = true)]
async fn g43_annotation_survives_an_outcome_that_does_not_parse() {
    let kernel = TestKernel::new(vec![]);
    let plugin = FnPlugin(|_, host: Arc<dyn RuntimeHost>, _| async move {
        host.annotate("promptHash", json!(H)).unwrap();
        Err(RuntimeError::InvalidOutcome("bad".into()))
    });
    let h = executor(&kernel, Arc::new(plugin), 0);
    let r = h.run(request(&[])).await;
    assert_eq!(code(&r), "invalid_runtime_outcome");
    assert_eq!(r.metadata.get("promptHash"), Some(&json!(H)));
}

#[tokio::test(start_paused = true)]
async fn g44_annotation_survives_an_audit_outage() {
    let kernel = TestKernel::new(vec![write_tool("transfer_funds")]).handler(
        "transfer_funds",
        Handler::Transfer {
            work_ms: 0,
            honour_abort: true,
        },
    );
    lock(&kernel.fail_decision).insert("c1".into());
    let (plugin, _) = ScriptPlugin::new(vec![
        Step::annotate("promptHash", json!(H)),
        Step::call("c1", "transfer_funds"),
    ]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(request(&["transfer_funds"])).await;
    assert_eq!(code(&r), "audit_unavailable");
    assert_eq!(r.metadata.get("promptHash"), Some(&json!(H)));
    assert_eq!(r.metadata.get("runtime"), Some(&expected_runtime()));
}

#[tokio::test(start_paused = true)]
async fn g45_annotation_outranks_outcome_metadata() {
    let kernel = TestKernel::new(vec![]);
    let (plugin, _) = ScriptPlugin::new(vec![
        Step::annotate("k", json!(1)),
        Step::returns(RuntimeTurnOutcome::Complete {
            output: json!(null),
            metadata: Some(json!({"k": 2, "other": 3}).as_object().unwrap().clone()),
        }),
    ]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(request(&[])).await;
    assert_eq!(r.metadata.get("k"), Some(&json!(1)));
    assert_eq!(r.metadata.get("other"), Some(&json!(3)));
    // The same on a fail outcome and on an escalation.
    for outcome in [
        RuntimeTurnOutcome::Fail {
            error: ProtocolError::new("x_failed", "x", Some(false)),
            metadata: Some(json!({"k": 2}).as_object().unwrap().clone()),
        },
        RuntimeTurnOutcome::Escalate {
            reason: Reason::new("r").unwrap(),
            metadata: Some(json!({"k": 2}).as_object().unwrap().clone()),
        },
    ] {
        let kernel = TestKernel::new(vec![escalate_tool()]);
        let (plugin, _) =
            ScriptPlugin::new(vec![Step::annotate("k", json!(1)), Step::returns(outcome)]);
        let r = executor(&kernel, plugin, 0)
            .run(request(&["sharedos.escalate"]))
            .await;
        assert_eq!(r.metadata.get("k"), Some(&json!(1)), "{:?}", r.status);
    }
}

#[tokio::test(start_paused = true)]
async fn g46_refused_keys_are_invalid() {
    let kernel = TestKernel::new(vec![]);
    let plugin = FnPlugin(|_, host: Arc<dyn RuntimeHost>, _| async move {
        for key in ["runtime", "", "__proto__"] {
            let err = host.annotate(key, json!(1)).unwrap_err();
            assert_eq!(err.kind, ErrorKind::InvalidParams, "{key:?}");
            assert_eq!(
                err.message,
                "Runtime annotation key must be a non-empty string other than 'runtime' or '__proto__'"
            );
        }
        Ok(RuntimeTurnOutcome::complete(json!("checked")))
    });
    let h = executor(&kernel, Arc::new(plugin), 0);
    let r = h.run(request(&[])).await;
    assert_eq!(r.output, Some(json!("checked")));
    assert_eq!(r.metadata.get("runtime"), Some(&expected_runtime()));
    assert!(!r.metadata.contains_key(""));
    assert!(!r.metadata.contains_key("__proto__"));
}

// G47 (non-JSON values) is a property of the wire: a plugin can only
// annotate what arrives as JSON. `g47_non_json_values_are_unrepresentable`
// in host/src/process/driver/tests.rs drives NaN, Infinity and undefined through
// the host's reader.

/// Writes through the turn's captured host at the last moment a write could
/// still reach the result: the observer hears the turn's ending after the
/// host closed and before the result is built from the annotation store.
struct LateWriter {
    log: Arc<PluginLog>,
    /// Per turn: (the host refused an emit, so it was closed; annotate
    /// answered without an error).
    seen: std::sync::Mutex<Vec<(bool, bool)>>,
}

impl LateWriter {
    fn on_event(self: &Arc<Self>) -> sharedos_host::executor::OnEvent {
        let late = self.clone();
        Arc::new(move |e: &sharedos_protocol::ExecutionEvent| {
            if e.kind.as_str() == "turn.started" || !e.kind.as_str().starts_with("turn.") {
                return;
            }
            let host = late.log.host();
            let closed = host
                .emit(sharedos_protocol::RuntimeEvent {
                    kind: sharedos_protocol::ident("late"),
                    data: json!(1),
                })
                .is_err();
            let ok = host.annotate("k", json!("late")).is_ok()
                && host.annotate("late", json!(1)).is_ok();
            late.seen.lock().unwrap().push((closed, ok));
        })
    }
}

/// G48: after the turn closed, `annotate` answers without an error and the
/// write goes nowhere. Through every branch:
/// - the write made once the host is closed but before the result is built
///   (the observer hearing the ending) does not reach that result;
/// - a host captured during a turn and used during the next turn of the
///   same executor and plugin writes into neither;
/// - refused keys stay refused, and the stale host is closed for tool calls.
#[tokio::test(start_paused = true)]
async fn g48_annotate_after_close_is_dropped_without_error() {
    let kernel = TestKernel::new(vec![read_tool("files.read")]);
    let (plugin, log) = ScriptPlugin::new(vec![
        Step::CaptureHost,
        Step::annotate("k", json!(0)),
        Step::sleep(1_000),
    ]);
    let late = Arc::new(LateWriter {
        log: log.clone(),
        seen: Default::default(),
    });
    let h = executor(&kernel, plugin, 0);
    let run = |request| {
        let opts = sharedos_host::executor::ExecuteOptions {
            on_event: Some(late.on_event()),
            ..Default::default()
        };
        let executor = &h.executor;
        async move { executor.execute(request, opts).await.expect("a result") }
    };
    let first = run(request(&["files.read"])).await;
    assert_eq!(
        *late.seen.lock().unwrap(),
        [(true, true)],
        "the late write must come after close, and be answered"
    );
    assert_eq!(first.metadata.get("k"), Some(&json!(0)), "{first:?}");
    assert!(!first.metadata.contains_key("late"), "{first:?}");
    let stale = log.host();
    let during_next = async {
        // Mid-way through the second turn (virtual time).
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        assert!(
            stale.annotate("k", json!(1)).is_ok(),
            "no error after close"
        );
        assert!(stale.annotate("late", json!(1)).is_ok());
        // Refused keys are still refused: they are plugin bugs, whatever the state.
        assert!(stale.annotate("runtime", json!(1)).is_err());
        let err = stale
            .invoke_tool(call("late-call", "files.read"), None)
            .await
            .unwrap_err();
        assert_eq!(err.message, "Runtime host is closed");
    };
    let (second, ()) = tokio::join!(run(request(&["files.read"])), during_next);
    assert_eq!(second.metadata.get("k"), Some(&json!(0)), "{second:?}");
    assert!(!second.metadata.contains_key("late"));
    assert_eq!(late.seen.lock().unwrap().len(), 2);
    assert!(
        kernel.invoked().is_empty(),
        "the stale host reached the kernel"
    );
}

#[tokio::test(start_paused = true)]
async fn g49_annotation_made_on_the_hard_abort_is_kept() {
    let kernel = TestKernel::new(vec![]);
    let (plugin, _) = ScriptPlugin::new(vec![Step::catch_abort_and_annotate(
        "stoppedAt",
        json!("abort"),
    )]);
    let h = executor(&kernel, plugin, 0);
    let (r, took) = timed(
        &h,
        request_with(&[], |v| v["options"] = json!({"timeoutMs": 1_000})),
    )
    .await;
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(took, 1_000);
    assert_eq!(r.metadata.get("stoppedAt"), Some(&json!("abort")));
}

/// The same with the abort caught from inside a pending tool call.
#[tokio::test(start_paused = true)]
async fn g49_annotation_made_when_a_call_is_aborted_is_kept() {
    let kernel = TestKernel::new(vec![read_tool("files.read")]).handler(
        "files.read",
        Handler::Slow {
            work_ms: 10_000,
            honour_abort: false,
        },
    );
    let plugin = FnPlugin(|_, host: Arc<dyn RuntimeHost>, _| async move {
        let err = host
            .invoke_tool(call("c1", "files.read"), None)
            .await
            .unwrap_err();
        host.annotate("callError", json!(err.kind.as_str()))
            .unwrap();
        Err(RuntimeError::Failed("rethrown".into()))
    });
    let h = executor(&kernel, Arc::new(plugin), 0);
    let r = h
        .run(request_with(&["files.read"], |v| {
            v["options"] = json!({"timeoutMs": 1_000})
        }))
        .await;
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(r.metadata.get("callError"), Some(&json!("cancelled")));
}

#[tokio::test(start_paused = true)]
async fn g50_last_write_wins_and_the_stored_value_is_a_copy() {
    let kernel = TestKernel::new(vec![]);
    let plugin = FnPlugin(|_, host: Arc<dyn RuntimeHost>, _| async move {
        let mut v = json!({"n": 1});
        host.annotate("first", json!("a")).unwrap();
        host.annotate("k", v.clone()).unwrap();
        host.annotate("k", json!(2)).unwrap();
        host.annotate("obj", v.clone()).unwrap();
        v["n"] = json!(99);
        host.annotate("last", json!("z")).unwrap();
        Ok(RuntimeTurnOutcome::complete(v))
    });
    let h = executor(&kernel, Arc::new(plugin), 0);
    let r = h.run(request(&[])).await;
    assert_eq!(r.metadata.get("k"), Some(&json!(2)));
    assert_eq!(r.metadata.get("obj"), Some(&json!({"n": 1})));
    assert_eq!(r.output, Some(json!({"n": 99})));
}

/// G51 as a direct plugin (the standard loop is tested with the loop): a
/// prompt hash stated after "open" and a seat that never answers; and a
/// turn cancelled before anything was stated records nothing.
#[tokio::test(start_paused = true)]
async fn g51_prompt_hash_stated_before_a_stall_survives_cancellation() {
    let kernel = TestKernel::new(vec![]);
    let (plugin, _) = ScriptPlugin::new(vec![
        Step::sleep(10),
        Step::annotate("promptHash", json!(H)),
        Step::Stall,
    ]);
    let h = executor(&kernel, plugin, 0);
    let r = h
        .run(request_with(&[], |v| {
            v["options"] = json!({"timeoutMs": 100})
        }))
        .await;
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert_eq!(r.metadata.get("promptHash"), Some(&json!(H)));

    // Cancelled inside "open" (before the hash was computed): nothing.
    let kernel = TestKernel::new(vec![]);
    let (plugin, _) = ScriptPlugin::new(vec![
        Step::sleep(1_000),
        Step::annotate("promptHash", json!(H)),
        Step::Stall,
    ]);
    let h = executor(&kernel, plugin, 0);
    let r = h
        .run(request_with(&[], |v| {
            v["options"] = json!({"timeoutMs": 100})
        }))
        .await;
    assert_eq!(r.status, ExecutionStatus::Cancelled);
    assert!(!r.metadata.contains_key("promptHash"));
}

/// G52 as a direct plugin: the seat states `escalationAsked` and escalates
/// on a granted turn; the record lifts the annotation.
#[tokio::test(start_paused = true)]
async fn g52_escalation_asked_is_carried_and_lifted() {
    let kernel = TestKernel::new(vec![escalate_tool()]);
    let asked = json!({"tool": "sharedos.escalate", "reason": "R"});
    let (plugin, _) = ScriptPlugin::new(vec![
        Step::annotate("escalationAsked", asked.clone()),
        Step::returns(RuntimeTurnOutcome::Escalate {
            reason: Reason::new("R").unwrap(),
            metadata: None,
        }),
    ]);
    let h = executor(&kernel, plugin, 0);
    let req = request(&["sharedos.escalate"]);
    let r = h.run(req.clone()).await;
    assert_eq!(r.status, ExecutionStatus::Escalated);
    assert_eq!(r.metadata.get("escalationAsked"), Some(&asked));
    let record = sharedos_host::executor::record::assemble(&req, &r, &manifest());
    let lifted = record.execution.escalation_asked.unwrap();
    assert_eq!(
        (lifted.tool.as_str(), lifted.reason.as_str()),
        ("sharedos.escalate", "R")
    );
    assert_eq!(
        record.execution.terminal_reason_code.as_deref(),
        Some("escalation_requested")
    );
}
