//! Bounded memory in the envelope (docs/ENVELOPE.md, "Bounded memory";
//! protocol.md B.4 and D 34, 35): a per-turn event budget that ends a
//! flooding turn `failed runtime_failed`, and a bounded annotation store
//! that drops, never refuses.

mod support;

use std::sync::Arc;

use serde_json::{Value, json};
use sharedos_host::executor::{
    DEFAULT_MAX_ANNOTATION_BYTES, DEFAULT_MAX_ANNOTATION_KEYS, DEFAULT_MAX_EVENTS_PER_TURN,
    DEFAULT_MAX_TURN_BYTES, EVENT_OVERHEAD_BYTES, Executor, ExecutorOptions, MAX_TURN_BYTES,
    STDERR_TAIL_RESERVE_BYTES, Seat, TurnError, VALUE_NODE_BYTES,
};
use sharedos_host::process::stderr::{TAIL_LINE_BYTES, TAIL_LINES};
use sharedos_plugin_sdk::{HostCallError, RuntimeError, RuntimeHost};
use sharedos_protocol::{
    ErrorKind, ExecutionResult, ExecutionStatus, RuntimeEvent, RuntimeTurnOutcome, ident,
};
use support::*;

fn budget_options(
    max_events: usize,
    max_bytes: usize,
    grace_ms: u64,
) -> (ExecutorOptions, TurnErrors) {
    let (mut o, errors) = options(grace_ms);
    o.max_events_per_turn = max_events;
    o.max_turn_bytes = max_bytes;
    (o, errors)
}

fn tick(i: usize, data: Value) -> RuntimeEvent {
    let _ = i;
    RuntimeEvent {
        kind: ident("tick"),
        data,
    }
}

fn data_bytes(r: &ExecutionResult) -> usize {
    r.events
        .iter()
        .map(|e| serde_json::to_vec(&e.data).unwrap().len())
        .sum()
}

/// The ending every budget violation must have.
fn assert_stopped_for_the_budget(h: &Harness, kernel: &TestKernel, r: &ExecutionResult) {
    assert_eq!(r.status, ExecutionStatus::Failed, "{:?}", r.error);
    assert_eq!(code(r), "runtime_failed");
    assert_eq!(
        r.error.as_ref().unwrap().message.as_str(),
        "The runtime plugin failed."
    );
    assert_eq!(
        last_event(r),
        (
            "turn.failed".to_owned(),
            json!({"code": "runtime_failed", "source": "envelope"})
        )
    );
    let errors: Vec<TurnError> = h.turn_errors().into_iter().map(|(e, _)| e).collect();
    assert_eq!(
        errors,
        vec![TurnError::Violation {
            reason: "rate_limit_exceeded"
        }]
    );
    // The reason is a fixed token in `error.details`; a flood repeats on
    // a retry, so the ending is never retryable.
    let error = r.error.as_ref().unwrap();
    assert_eq!(
        json!(error.details),
        json!({"reason": "rate_limit_exceeded"}),
        "the violation is named in the result"
    );
    assert_eq!(error.retryable, Some(false));
    let ends = kernel.turn_ends();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].reason_code.as_deref(), Some("runtime_failed"));
    assert_eq!(ends[0].ended_by.as_deref(), Some("envelope"));
    let seq: Vec<u64> = r.events.iter().map(|e| e.sequence).collect();
    assert_eq!(seq, (0..r.events.len() as u64).collect::<Vec<_>>());
}

#[tokio::test(start_paused = true)]
async fn an_emit_flood_ends_runtime_failed_with_a_bounded_event_count() {
    let kernel = TestKernel::new(vec![]);
    let refused: Arc<std::sync::Mutex<Option<HostCallError>>> = Arc::default();
    let seen = refused.clone();
    // A plugin that ignores the stop and completes anyway.
    let plugin = FnPlugin(move |_req, host: Arc<dyn RuntimeHost>, _abort| {
        let seen = seen.clone();
        async move {
            for i in 0..1_000_000usize {
                if let Err(e) = host.emit(tick(i, json!(i))) {
                    *lock(&seen) = Some(e);
                    break;
                }
            }
            Ok(RuntimeTurnOutcome::complete(json!("ignored the stop")))
        }
    });
    let (o, errors) = budget_options(1_000, DEFAULT_MAX_TURN_BYTES, 0);
    let h = executor_with(&kernel, Arc::new(plugin), o, errors);
    let r = h.run(request(&[])).await;
    assert_stopped_for_the_budget(&h, &kernel, &r);
    assert_eq!(r.events.len(), 1_000, "the budget, the ending included");
    assert_eq!(events_of(&r, "runtime.event").len(), 998);
    assert_eq!(
        lock(&refused).as_ref().map(|e| e.kind),
        Some(ErrorKind::TurnNotActive),
        "the emit over the budget is answered as one after the abort"
    );
    // No call was made, but a flood repeats: never retryable.
    assert_eq!(
        r.error.as_ref().unwrap().retryable,
        Some(false),
        "a deterministic violation"
    );
}

#[tokio::test(start_paused = true)]
async fn a_plugin_just_under_the_budget_completes() {
    // turn.started + 998 emits + turn.completed = 1000 events: it fits.
    let kernel = TestKernel::new(vec![]);
    let plugin = FnPlugin(|_req, host: Arc<dyn RuntimeHost>, _abort| async move {
        for i in 0..998usize {
            host.emit(tick(i, json!(i)))
                .map_err(|e| RuntimeError::Failed(e.to_string()))?;
        }
        Ok(RuntimeTurnOutcome::complete(json!("fits")))
    });
    let (o, errors) = budget_options(1_000, DEFAULT_MAX_TURN_BYTES, 0);
    let h = executor_with(&kernel, Arc::new(plugin), o, errors);
    let r = h.run(request(&[])).await;
    assert_eq!(r.status, ExecutionStatus::Succeeded);
    assert_eq!(r.events.len(), 1_000);
    assert_eq!(last_event(&r).0, "turn.completed");
    assert!(h.turn_errors().is_empty());
}

/// What the ledger charges for the events of a result: each whole, plus
/// its parsed values and its overhead (docs/PROTOCOL.md section 5).
fn ledger_bytes(r: &ExecutionResult) -> usize {
    fn nodes(v: &Value) -> usize {
        1 + match v {
            Value::Array(a) => a.iter().map(nodes).sum(),
            Value::Object(o) => o.values().map(nodes).sum(),
            _ => 0,
        }
    }
    r.events
        .iter()
        .map(|e| {
            serde_json::to_vec(e).unwrap().len()
                + nodes(&e.data) * VALUE_NODE_BYTES
                + EVENT_OVERHEAD_BYTES
        })
        .sum()
}

/// A flood stopped by the byte ledger: `failed runtime_failed`, the
/// reason and the limit named, not retryable.
fn assert_stopped_for_the_ledger(h: &Harness, r: &ExecutionResult, limit: usize) {
    assert_eq!(r.status, ExecutionStatus::Failed, "{:?}", r.error);
    assert_eq!(code(r), "runtime_failed");
    let error = r.error.as_ref().unwrap();
    assert_eq!(
        json!(error.details),
        json!({"reason": "turn_memory_exceeded", "limitBytes": limit})
    );
    assert_eq!(error.retryable, Some(false));
    let errors: Vec<TurnError> = h.turn_errors().into_iter().map(|(e, _)| e).collect();
    assert_eq!(
        errors,
        vec![TurnError::Violation {
            reason: "turn_memory_exceeded"
        }]
    );
    assert_eq!(last_event(r).0, "turn.failed");
    assert!(
        ledger_bytes(r) + STDERR_TAIL_RESERVE_BYTES <= limit,
        "{} bytes held past the {limit} limit",
        ledger_bytes(r)
    );
}

#[tokio::test(start_paused = true)]
async fn an_emit_flood_over_the_byte_ledger_ends_runtime_failed() {
    let kernel = TestKernel::new(vec![]);
    let plugin = FnPlugin(|_req, host: Arc<dyn RuntimeHost>, _abort| async move {
        let blob = "x".repeat(10 * 1024);
        for i in 0..10_000usize {
            host.emit(tick(i, json!(blob)))
                .map_err(|e| RuntimeError::Failed(e.to_string()))?;
        }
        Ok(RuntimeTurnOutcome::complete(json!("never")))
    });
    let limit = 256 * 1024;
    let (o, errors) = budget_options(DEFAULT_MAX_EVENTS_PER_TURN, limit, 0);
    let h = executor_with(&kernel, Arc::new(plugin), o, errors);
    let r = h.run(request(&[])).await;
    assert_stopped_for_the_ledger(&h, &r, limit);
    let emitted = events_of(&r, "runtime.event").len();
    assert!(
        (17..=20).contains(&emitted),
        "{emitted} emits of 10 KiB fit"
    );
}

/// The ledger counts what the host holds, not wire bytes: an event of
/// small JSON values (a 2-byte `0,` is a 32-byte value in memory) is
/// charged for each value, so `[0,0,…]` cannot multiply the limit.
#[tokio::test(start_paused = true)]
async fn small_values_are_charged_for_what_they_cost_parsed() {
    let kernel = TestKernel::new(vec![]);
    let plugin = FnPlugin(|_req, host: Arc<dyn RuntimeHost>, _abort| async move {
        let zeros = Value::Array(vec![json!(0); 1024]);
        for i in 0..10_000usize {
            host.emit(tick(i, zeros.clone()))
                .map_err(|e| RuntimeError::Failed(e.to_string()))?;
        }
        Ok(RuntimeTurnOutcome::complete(json!("never")))
    });
    let limit = 1024 * 1024;
    let (o, errors) = budget_options(DEFAULT_MAX_EVENTS_PER_TURN, limit, 0);
    let h = executor_with(&kernel, Arc::new(plugin), o, errors);
    let r = h.run(request(&[])).await;
    assert_stopped_for_the_ledger(&h, &r, limit);
    // 2 KiB on the wire each, about 50 KiB held: some 19 fit, not 500.
    let emitted = events_of(&r, "runtime.event").len();
    assert!((15..=20).contains(&emitted), "{emitted} emits fit");
    assert!(data_bytes(&r) < 64 * 1024);
}

/// Annotations and events share one ledger: a store filled with
/// annotations leaves less room for events, and an annotation past the
/// ledger is dropped (never refused).
#[tokio::test(start_paused = true)]
async fn annotations_and_events_share_the_ledger() {
    let kernel = TestKernel::new(vec![]);
    let plugin = FnPlugin(|_req, host: Arc<dyn RuntimeHost>, _abort| async move {
        let blob = "a".repeat(100 * 1024);
        for i in 0..5usize {
            host.annotate(&format!("k{i}"), json!(blob)).unwrap();
        }
        for i in 0..10_000usize {
            host.emit(tick(i, json!("x".repeat(1024))))
                .map_err(|e| RuntimeError::Failed(e.to_string()))?;
        }
        Ok(RuntimeTurnOutcome::complete(json!("never")))
    });
    let limit = 256 * 1024;
    let (o, errors) = budget_options(DEFAULT_MAX_EVENTS_PER_TURN, limit, 0);
    let h = executor_with(&kernel, Arc::new(plugin), o, errors);
    let r = h.run(request(&[])).await;
    assert_stopped_for_the_ledger(&h, &r, limit);
    // Two annotations of 100 KiB fit next to the reserves; the third and
    // later are dropped; what is left for events is a few KiB.
    let kept: Vec<&str> = r
        .metadata
        .keys()
        .map(String::as_str)
        .filter(|k| k.starts_with('k'))
        .collect();
    assert_eq!(kept, vec!["k0", "k1"]);
    let held = ledger_bytes(&r) + 2 * (2 + 100 * 1024 + 2 + VALUE_NODE_BYTES);
    assert!(held + STDERR_TAIL_RESERVE_BYTES <= limit, "{held}");
    assert!(events_of(&r, "runtime.event").len() < 20);
}

#[tokio::test(start_paused = true)]
async fn a_refusal_loop_ends_runtime_failed_with_bounded_events_and_records() {
    // Every call is refused (an unlisted tool, then the call ceiling); a
    // plugin that loops on refusals used to grow the log and the refusal
    // records until the deadline.
    let kernel = TestKernel::new(vec![read_tool("files.read")]);
    let plugin = FnPlugin(|_req, host: Arc<dyn RuntimeHost>, _abort| async move {
        let mut i = 0usize;
        loop {
            let r = host
                .invoke_tool(call(&format!("c{i}"), "files.secret"), None)
                .await;
            match r {
                Ok(res) => assert_eq!(res.status().as_str(), "denied"),
                Err(e) => return Err(RuntimeError::Failed(e.to_string())),
            }
            i += 1;
        }
    });
    let (o, errors) = budget_options(1_000, DEFAULT_MAX_TURN_BYTES, 0);
    let h = executor_with(&kernel, Arc::new(plugin), o, errors);
    let (r, took) = timed(&h, request(&["files.read"])).await;
    assert_stopped_for_the_budget(&h, &kernel, &r);
    assert_eq!(took, 0, "stopped at once, not at the deadline");
    // turn.started + 499 × (tool.requested, tool.completed) + turn.failed.
    assert_eq!(r.events.len(), 1_000);
    assert_eq!(events_of(&r, "tool.requested").len(), 499);
    assert_eq!(events_of(&r, "tool.completed").len(), 499);
    assert_eq!(
        kernel.refused().len(),
        499,
        "the refusal records are bounded too"
    );
    assert!(kernel.invoked().is_empty());
}

#[tokio::test(start_paused = true)]
async fn every_requested_call_keeps_room_for_its_completion() {
    // Calls that reach the kernel: the answer of each call admitted is
    // always written, so the log never holds a request without its answer
    // because of the budget.
    let kernel = TestKernel::new(vec![read_tool("files.read")])
        .handler("files.read", Handler::Succeed(json!({"ok": true})));
    let plugin = FnPlugin(|_req, host: Arc<dyn RuntimeHost>, _abort| async move {
        for i in 0.. {
            host.invoke_tool(call(&format!("c{i}"), "files.read"), None)
                .await
                .map_err(|e| RuntimeError::Failed(e.to_string()))?;
        }
        Ok(RuntimeTurnOutcome::complete(Value::Null))
    });
    let (o, errors) = budget_options(101, DEFAULT_MAX_TURN_BYTES, 0);
    let h = executor_with(&kernel, Arc::new(plugin), o, errors);
    let r = h
        .run(request_with(&["files.read"], |v| {
            v["options"] = json!({"maxSteps": 1000, "maxToolCalls": 1000})
        }))
        .await;
    assert_stopped_for_the_budget(&h, &kernel, &r);
    assert_eq!(events_of(&r, "tool.requested").len(), 49);
    assert_eq!(events_of(&r, "tool.completed").len(), 49);
    assert_eq!(kernel.invoked().len(), 49);
    assert!(r.events.len() <= 101);
    // Reads only, but the violation is deterministic: not retryable.
    assert_eq!(r.error.as_ref().unwrap().retryable, Some(false));
}

#[tokio::test(start_paused = true)]
async fn the_retryable_rule_applies_to_a_budget_ending() {
    let kernel = TestKernel::new(vec![write_tool("transfer_funds")]).handler(
        "transfer_funds",
        Handler::Transfer {
            work_ms: 0,
            honour_abort: true,
        },
    );
    let plugin = FnPlugin(|_req, host: Arc<dyn RuntimeHost>, _abort| async move {
        host.invoke_tool(call("pay", "transfer_funds"), None)
            .await
            .map_err(|e| RuntimeError::Failed(e.to_string()))?;
        loop {
            host.emit(tick(0, json!("spam")))
                .map_err(|e| RuntimeError::Failed(e.to_string()))?;
        }
    });
    let (o, errors) = budget_options(64, DEFAULT_MAX_TURN_BYTES, 0);
    let h = executor_with(&kernel, Arc::new(plugin), o, errors);
    let r = h.run(request(&["transfer_funds"])).await;
    assert_stopped_for_the_budget(&h, &kernel, &r);
    assert_eq!(r.events.len(), 64);
    assert_eq!(
        r.error.as_ref().unwrap().retryable,
        Some(false),
        "the write went through"
    );
    assert_eq!(kernel.ledger(), vec!["debit:pay", "credit:pay"]);
}

#[tokio::test(start_paused = true)]
async fn a_flood_while_draining_still_ends_runtime_failed() {
    // The violation is the runtime's doing; the drain does not turn it into
    // a cancellation (docs/ENVELOPE.md).
    let kernel = TestKernel::new(vec![]);
    let plugin = FnPlugin(|_req, host: Arc<dyn RuntimeHost>, _abort| async move {
        host.draining().raised().await;
        loop {
            host.emit(tick(0, json!(0)))
                .map_err(|e| RuntimeError::Failed(e.to_string()))?;
        }
    });
    let (o, errors) = budget_options(100, DEFAULT_MAX_TURN_BYTES, 5_000);
    let h = executor_with(&kernel, Arc::new(plugin), o, errors);
    let (r, took) = timed(&h, request(&[])).await;
    assert_stopped_for_the_budget(&h, &kernel, &r);
    assert_eq!(took, 115_000);
    assert_eq!(r.events.len(), 100);
}

#[tokio::test(start_paused = true)]
async fn the_annotation_store_is_bounded_in_keys_and_never_refuses() {
    let kernel = TestKernel::new(vec![]);
    let plugin = FnPlugin(|_req, host: Arc<dyn RuntimeHost>, _abort| async move {
        host.annotate("promptHash", json!("h")).unwrap();
        for i in 0..5_000usize {
            // Never an error: annotate does not refuse on host state.
            host.annotate(&format!("k{i}"), json!(i)).unwrap();
        }
        // An existing key can still be rewritten.
        host.annotate("promptHash", json!("h2")).unwrap();
        Ok(RuntimeTurnOutcome::complete(json!("done")))
    });
    let h = executor(&kernel, Arc::new(plugin), 0);
    let r = h.run(request(&[])).await;
    assert_eq!(r.status, ExecutionStatus::Succeeded);
    assert_eq!(
        r.metadata.len(),
        DEFAULT_MAX_ANNOTATION_KEYS + 1,
        "plus runtime"
    );
    assert_eq!(r.metadata["promptHash"], "h2");
    assert_eq!(r.metadata["k1022"], 1022, "the first keys are kept");
    assert!(
        r.metadata.get("k1023").is_none(),
        "later new keys are dropped"
    );
    assert_eq!(r.metadata["runtime"], expected_runtime());
}

#[tokio::test(start_paused = true)]
async fn the_annotation_store_is_bounded_in_bytes() {
    let kernel = TestKernel::new(vec![]);
    let plugin = FnPlugin(|_req, host: Arc<dyn RuntimeHost>, _abort| async move {
        let big = "a".repeat(600 * 1024);
        host.annotate("a", json!(big)).unwrap();
        host.annotate("b", json!(big)).unwrap(); // dropped: over the bytes
        host.annotate("a", json!(format!("{big}{big}"))).unwrap(); // dropped too
        host.annotate("c", json!("small")).unwrap();
        host.annotate("a", json!("now small")).unwrap(); // a rewrite that fits
        host.annotate("b", json!(big)).unwrap(); // fits again
        Ok(RuntimeTurnOutcome::complete(json!("done")))
    });
    let h = executor(&kernel, Arc::new(plugin), 0);
    let r = h.run(request(&[])).await;
    assert_eq!(r.status, ExecutionStatus::Succeeded);
    let keys: Vec<&str> = r.metadata.keys().map(String::as_str).collect();
    assert_eq!(keys.len(), 4, "{keys:?}");
    assert_eq!(r.metadata["a"], "now small");
    assert_eq!(r.metadata["c"], "small");
    assert_eq!(r.metadata["b"].as_str().unwrap().len(), 600 * 1024);
    let total: usize = r
        .metadata
        .iter()
        .filter(|(k, _)| *k != "runtime")
        .map(|(k, v)| k.len() + serde_json::to_vec(v).unwrap().len())
        .sum();
    assert!(total <= DEFAULT_MAX_ANNOTATION_BYTES);
}

#[tokio::test(start_paused = true)]
async fn the_bounds_have_their_defaults_and_are_checked() {
    let d = ExecutorOptions::default();
    assert_eq!(d.max_events_per_turn, 100_000);
    assert_eq!(d.max_turn_bytes, 16 * 1024 * 1024);
    assert_eq!(d.max_annotation_keys, 1024);
    assert_eq!(d.max_annotation_bytes, 1024 * 1024);
    let kernel = TestKernel::new(vec![]);
    let make = |o: ExecutorOptions| {
        let (plugin, _) = ScriptPlugin::new(vec![]);
        Executor::new(kernel.clone(), Seat::in_process(plugin), o).map(|_| ())
    };
    assert!(
        make(ExecutorOptions {
            max_events_per_turn: 0,
            ..Default::default()
        })
        .is_err()
    );
    assert!(
        make(ExecutorOptions {
            max_turn_bytes: 1_000,
            ..Default::default()
        })
        .is_err()
    );
    assert!(
        make(ExecutorOptions {
            max_turn_bytes: MAX_TURN_BYTES + 1,
            ..Default::default()
        })
        .is_err()
    );
    const { assert!(STDERR_TAIL_RESERVE_BYTES >= TAIL_LINES * (4 * TAIL_LINE_BYTES)) };
    assert!(make(ExecutorOptions::default()).is_ok());
}

#[tokio::test(start_paused = true)]
async fn the_stop_aborts_a_call_in_flight_and_keeps_the_annotations() {
    // One call is in its handler when a concurrent flood goes over the
    // budget: the handler is aborted as at the deadline (recorded
    // interrupted, no tool.completed), and what the plugin stated is on the
    // result.
    let kernel = TestKernel::new(vec![read_tool("files.read")]).handler(
        "files.read",
        Handler::Slow {
            work_ms: 60_000,
            honour_abort: true,
        },
    );
    let plugin = FnPlugin(|_req, host: Arc<dyn RuntimeHost>, _abort| async move {
        host.annotate("promptHash", json!("h")).unwrap();
        let slow = host.invoke_tool(call("slow", "files.read"), None);
        let flood = async {
            tokio::time::sleep(ms(10)).await;
            loop {
                if host.emit(tick(0, json!(0))).is_err() {
                    return;
                }
            }
        };
        let (called, ()) = tokio::join!(slow, flood);
        let e = called.expect_err("the call is stopped");
        Err(RuntimeError::Failed(e.to_string()))
    });
    let observed: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let sink = observed.clone();
    let (o, errors) = budget_options(50, DEFAULT_MAX_TURN_BYTES, 0);
    let h = executor_with(&kernel, Arc::new(plugin), o, errors);
    let (r, took) = {
        let start = tokio::time::Instant::now();
        let r = h
            .executor
            .execute(
                request(&["files.read"]),
                sharedos_host::executor::ExecuteOptions {
                    on_event: Some(Arc::new(move |e| lock(&sink).push(e.kind.to_string()))),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        (r, start.elapsed().as_millis() as u64)
    };
    assert_stopped_for_the_budget(&h, &kernel, &r);
    assert_eq!(took, 10);
    assert_eq!(r.metadata["promptHash"], "h");
    assert_eq!(events_of(&r, "tool.requested").len(), 1);
    assert!(events_of(&r, "tool.completed").is_empty());
    assert!(r.events.len() <= 50);
    assert_eq!(*lock(&observed), types(&r), "the observer saw the same log");
    settle().await;
    let slow = kernel.tool_invoked("slow");
    assert_eq!(slow.len(), 1);
    assert_eq!(slow[0].outcome, "interrupted");
    // Only a read ran, but the violation is deterministic.
    assert_eq!(
        r.error.as_ref().unwrap().retryable,
        Some(false),
        "a violation"
    );
}
