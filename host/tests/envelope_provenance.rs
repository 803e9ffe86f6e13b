//! envelope.md G 10–17: sanitization, the effective catalogue, events and
//! provenance; plus `on_event` and memory bounds under a flood.

mod support;

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use sharedos_host::executor::{ExecuteOptions, ExecutorOptions, OnEvent};
use sharedos_protocol::{ExecutionEvent, ExecutionStatus, ReachResult, RuntimeTurnOutcome};
use support::*;

#[tokio::test(start_paused = true)]
async fn g10_runtime_sees_kernel_definitions_and_no_authority() {
    let kernel = TestKernel::new(vec![read_tool("files.read")]);
    let (plugin, log) = ScriptPlugin::new(vec![]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(request(&["files.read"])).await;
    assert_eq!(r.status, ExecutionStatus::Succeeded);
    let seen = log.request();
    assert_eq!(
        seen.tools,
        vec![read_tool("files.read")],
        "the kernel's definition wins"
    );
    assert_eq!(
        seen.tools[0].description.as_str(),
        "kernel description of files.read"
    );
    let ctx = serde_json::to_value(&seen.context).unwrap();
    let keys: Vec<&str> = ctx
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    for forbidden in ["authority", "enabledToolNamespaces", "grants"] {
        assert!(!keys.contains(&forbidden), "{forbidden} leaked: {keys:?}");
    }
    let whole = serde_json::to_string(&seen).unwrap();
    assert!(
        !whole.contains("issuer"),
        "the issuing authority never reaches the runtime"
    );
    // "Frozen": the runtime gets an owned value; nothing it does to it
    // reaches the envelope (the typed port has no shared mutable request).
    assert_eq!(seen.execution_id.as_str(), EXEC_ID);
}

#[tokio::test(start_paused = true)]
async fn g11_catalogue_is_listing_intersect_requested() {
    let kernel = TestKernel::new(vec![read_tool("B"), read_tool("C")])
        .handler("B", Handler::Succeed(json!(1)))
        .handler("C", Handler::Succeed(json!(1)));
    let (plugin, log) = ScriptPlugin::new(vec![
        Step::call("c-a", "A"),
        Step::call("c-c", "C"),
        Step::call("c-b", "B"),
    ]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(request(&["A", "B"])).await;
    assert_eq!(r.status, ExecutionStatus::Succeeded);
    let started = events_of(&r, "turn.started");
    assert_eq!(
        *started[0],
        json!({
            "agent": {"kind": "agent", "agentId": AGENT},
            "visibleTools": ["B"],
            "runtime": {"id": "sharedos-testplugin", "version": "0.1.0", "protocolVersion": "1"}
        })
    );
    assert_eq!(log.code("c-a").as_deref(), Some("tool_unavailable"));
    assert_eq!(log.code("c-c").as_deref(), Some("tool_unavailable"));
    assert!(log.result("c-b").unwrap().error().is_none());
    assert_eq!(kernel.invoked(), ["c-b"]);
}

#[tokio::test(start_paused = true)]
async fn g12_reach_is_narrowed_to_the_effective_namespaces() {
    let kernel = TestKernel::new(vec![read_tool("files.read")]);
    *lock(&kernel.reach) = serde_json::from_value(json!({"status": "computed", "reach": [
        {"namespace": "files", "path": ["docs"], "actions": ["read"], "scope": "descendants"},
        {"namespace": "bank", "path": ["acct"], "actions": ["write"], "scope": "exact"}
    ]}))
    .unwrap();
    let (plugin, log) = ScriptPlugin::new(vec![]);
    let h = executor(&kernel, plugin, 0);
    h.run(request(&["files.read"])).await;
    let reach = serde_json::to_value(&log.request().context.reach).unwrap();
    assert_eq!(
        reach,
        json!({"status": "computed", "reach": [{"namespace": "files", "path": ["docs"], "actions": ["read"], "scope": "descendants"}]})
    );

    // The store cannot be read: the runtime is told so, with the code.
    let kernel = TestKernel::new(vec![read_tool("files.read")]);
    *lock(&kernel.reach) = serde_json::from_value(
        json!({"status": "unavailable", "reasonCode": "usage_store_unavailable"}),
    )
    .unwrap();
    let (plugin, log) = ScriptPlugin::new(vec![]);
    let h = executor(&kernel, plugin, 0);
    h.run(request(&["files.read"])).await;
    assert!(
        matches!(log.request().context.reach, ReachResult::Unavailable { ref reason_code } if reason_code == "usage_store_unavailable")
    );
}

#[tokio::test(start_paused = true)]
async fn g13_emitted_turn_completed_is_a_runtime_event() {
    let kernel = TestKernel::new(vec![]);
    let (plugin, _) =
        ScriptPlugin::new(vec![Step::emit("turn.completed", json!({"forged": true}))]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(request(&[])).await;
    assert_eq!(
        types(&r),
        ["turn.started", "runtime.event", "turn.completed"]
    );
    assert_eq!(
        r.events[1].data,
        json!({"runtime": {"id": "sharedos-testplugin", "version": "0.1.0", "protocolVersion": "1"}, "type": "turn.completed", "data": {"forged": true}})
    );
    assert_eq!(r.events[2].data, json!({}));
}

#[tokio::test(start_paused = true)]
async fn g14_outcome_cannot_forge_runtime_provenance() {
    let kernel = TestKernel::new(vec![]);
    let md = json!({"model": "m", "runtime": "forged"})
        .as_object()
        .unwrap()
        .clone();
    let (plugin, _) = ScriptPlugin::new(vec![Step::returns(RuntimeTurnOutcome::Complete {
        output: json!("ok"),
        metadata: Some(md),
    })]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(request(&[])).await;
    assert_eq!(r.metadata.get("model"), Some(&json!("m")));
    assert_eq!(r.metadata.get("runtime"), Some(&expected_runtime()));
    // turn.started names the runtime without its metadata.
    assert_eq!(
        events_of(&r, "turn.started")[0]["runtime"],
        json!({"id": "sharedos-testplugin", "version": "0.1.0", "protocolVersion": "1"})
    );
}

fn collecting() -> (OnEvent, Arc<Mutex<Vec<ExecutionEvent>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    (
        Arc::new(move |e: &ExecutionEvent| lock(&sink).push(e.clone())),
        seen,
    )
}

#[tokio::test(start_paused = true)]
async fn g15_on_event_sees_every_event_in_order() {
    let kernel = TestKernel::new(vec![read_tool("files.read")])
        .handler("files.read", Handler::Succeed(json!(1)));
    let (plugin, _) = ScriptPlugin::new(vec![
        Step::emit("progress", json!(1)),
        Step::call("c1", "files.read"),
        Step::call("c2", "nope"),
        Step::emit("progress", json!(2)),
    ]);
    let h = executor(&kernel, plugin, 0);
    let (on_event, seen) = collecting();
    let r = h
        .executor
        .execute(
            request(&["files.read"]),
            ExecuteOptions {
                cancel: None,
                on_event: Some(on_event),
            },
        )
        .await
        .unwrap();
    // The same values, in the same order, as the result carries. The
    // callback gets `&ExecutionEvent`: it cannot change what is recorded.
    assert_eq!(*lock(&seen), r.events);
    assert_eq!(
        types(&r),
        [
            "turn.started",
            "runtime.event",
            "tool.requested",
            "tool.completed",
            "tool.requested",
            "tool.completed",
            "runtime.event",
            "turn.completed"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn g15_panicking_on_event_changes_nothing() {
    let run = |on_event: Option<OnEvent>| async move {
        let kernel = TestKernel::new(vec![read_tool("files.read")])
            .handler("files.read", Handler::Succeed(json!(1)));
        let (plugin, _) = ScriptPlugin::new(vec![
            Step::emit("progress", json!(1)),
            Step::call("c1", "files.read"),
        ]);
        let h = executor(&kernel, plugin, 0);
        let r = h
            .executor
            .execute(
                request(&["files.read"]),
                ExecuteOptions {
                    cancel: None,
                    on_event,
                },
            )
            .await
            .unwrap();
        (r, kernel.turn_ends())
    };
    let (quiet, quiet_ends) = run(None).await;
    let (loud, loud_ends) = run(Some(Arc::new(|_: &ExecutionEvent| panic!("observer bug")))).await;
    assert_eq!(loud.status, ExecutionStatus::Succeeded);
    assert_eq!(types(&loud), types(&quiet));
    let strip = |r: &sharedos_protocol::ExecutionResult| -> Vec<Value> {
        r.events
            .iter()
            .map(|e| json!([e.sequence, e.kind, e.data]))
            .collect()
    };
    assert_eq!(strip(&loud), strip(&quiet));
    assert_eq!(loud.output, quiet.output);
    assert_eq!(loud_ends, quiet_ends);
}

#[tokio::test(start_paused = true)]
async fn g16_events_are_sequenced_and_stamped() {
    let kernel = TestKernel::new(vec![]);
    let (plugin, _) = ScriptPlugin::new(vec![
        Step::emit("a", json!(1)),
        Step::sleep(250),
        Step::emit("b", json!(2)),
    ]);
    let h = executor(&kernel, plugin, 0);
    let r = h.run(request(&[])).await;
    let mut ids = std::collections::HashSet::new();
    for (i, e) in r.events.iter().enumerate() {
        assert_eq!(e.sequence, i as u64);
        assert_eq!(e.trace_id.as_str(), TRACE);
        assert_eq!(e.execution_id.as_str(), EXEC_ID);
        assert!(ids.insert(e.event_id.clone()), "event ids are unique");
    }
    // occurredAt comes from the executor's clock (virtual time here).
    assert_eq!(r.events[1].occurred_at.as_str(), "2026-09-18T10:00:00Z");
    assert_eq!(
        r.events[2].occurred_at.to_offset() - r.events[1].occurred_at.to_offset(),
        time_ms(250)
    );
}

fn time_ms(n: i64) -> time::Duration {
    time::Duration::milliseconds(n)
}

/// G17's executor half: the manifest snapshot is taken once, when the seat
/// is built, and a malformed manifest cannot be constructed (the typed
/// `RuntimeManifest` refuses it on parse). The registry half is tested with
/// the registry.
#[tokio::test(start_paused = true)]
async fn g17_manifest_is_validated_and_snapshotted() {
    assert!(
        serde_json::from_value::<sharedos_protocol::RuntimeManifest>(
            json!({"id": "", "version": "1", "protocolVersion": "1"})
        )
        .is_err()
    );
    assert!(
        serde_json::from_value::<sharedos_protocol::RuntimeManifest>(
            json!({"id": "a", "version": "1", "protocolVersion": "2"})
        )
        .is_err()
    );
    let kernel = TestKernel::new(vec![]);
    let (plugin, _) = ScriptPlugin::new(vec![]);
    let h = executor(&kernel, plugin, 0);
    assert_eq!(h.executor.manifest(), &manifest());
}

/// A flood of emits and of calls past the ceiling. What the executor keeps
/// per turn is bounded: the kernel is reached at most `maxToolCalls` times,
/// declared steps are remembered at most `maxSteps` times, the annotation
/// store holds one value per key, and the event log is held to the turn's
/// event budget (`max_events_per_turn`, here 1 000): the plugin action that
/// would go past it stops the seat and the turn ends `failed
/// runtime_failed`, its log the events so far plus the ending
/// (docs/ENVELOPE.md, "Bounded memory"; more in `envelope_budget.rs`).
#[tokio::test(start_paused = true)]
async fn flood_of_emits_and_calls() {
    const N: usize = 5_000;
    let kernel = TestKernel::new(vec![read_tool("files.read")])
        .handler("files.read", Handler::Succeed(json!(1)));
    let plugin = FnPlugin(
        |_req, host: Arc<dyn sharedos_plugin_sdk::RuntimeHost>, _abort| async move {
            let stopped = |e: sharedos_plugin_sdk::HostCallError| {
                sharedos_plugin_sdk::RuntimeError::Failed(e.to_string())
            };
            for i in 0..N {
                host.emit(sharedos_protocol::RuntimeEvent {
                    kind: sharedos_protocol::ident("tick"),
                    data: json!(i),
                })
                .map_err(stopped)?;
                host.annotate("progress", json!(i)).unwrap();
                host.invoke_tool(call(&format!("c{i}"), "files.read"), Some(i as u64))
                    .await
                    .map_err(stopped)?;
            }
            Ok(RuntimeTurnOutcome::complete(json!("done")))
        },
    );
    let (mut opts, errors) = options(0);
    opts.max_events_per_turn = 1_000;
    let h = executor_with(&kernel, Arc::new(plugin), opts, errors);
    let r = h
        .run(request_with(&["files.read"], |v| {
            v["options"] = json!({"maxSteps": 4, "maxToolCalls": 8})
        }))
        .await;
    assert_eq!(r.status, ExecutionStatus::Failed);
    assert_eq!(r.code(), Some("runtime_failed"));
    assert_eq!(
        r.events
            .last()
            .map(|e| (e.kind.to_string(), e.data.clone().into_value())),
        Some((
            "turn.failed".to_owned(),
            json!({"code": "runtime_failed", "source": "envelope"})
        ))
    );
    assert_eq!(
        kernel.invoked().len(),
        4,
        "steps 0..4 only; later steps are refused before the kernel"
    );
    // 3 events per iteration: 332 whole iterations and the 333rd's emit
    // fit; its call, which must keep room for its answer and the ending,
    // does not. 1 + 3 × 332 + 1 + turn.failed = 999.
    assert!(r.events.len() <= 1_000, "{}", r.events.len());
    assert_eq!(r.events.len(), 999);
    assert_eq!(r.metadata.get("progress"), Some(&json!(332)));
    assert_eq!(r.metadata.len(), 2, "one value per annotation key");
    assert_eq!(
        h.turn_errors()
            .into_iter()
            .map(|(e, _)| e)
            .collect::<Vec<_>>(),
        vec![sharedos_host::executor::TurnError::Violation {
            reason: "rate_limit_exceeded"
        }]
    );
}

#[test]
fn executor_options_are_checked() {
    use sharedos_host::executor::{Executor, Seat};
    let kernel_opts = |o: ExecutorOptions| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let kernel = TestKernel::new(vec![]);
            let (plugin, _) = ScriptPlugin::new(vec![]);
            Executor::new(kernel, Seat::in_process(plugin), o).map(|_| ())
        })
    };
    assert!(
        kernel_opts(ExecutorOptions {
            default_timeout_ms: 0,
            ..Default::default()
        })
        .is_err()
    );
    assert!(
        kernel_opts(ExecutorOptions {
            default_max_steps: 0,
            ..Default::default()
        })
        .is_err()
    );
    assert!(
        kernel_opts(ExecutorOptions {
            default_max_tool_calls: Some(10_001),
            ..Default::default()
        })
        .is_err()
    );
    assert!(kernel_opts(ExecutorOptions::default()).is_ok());
}

/// `on_event` sees events in `sequence` order even when calls complete on
/// several worker threads at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_event_order_holds_across_threads() {
    const CALLS: usize = 400;
    for _ in 0..5 {
        let kernel = TestKernel::new(vec![read_tool("files.read")])
            .handler("files.read", Handler::Succeed(json!(1)));
        let plugin = FnPlugin(
            |_req, host: Arc<dyn sharedos_plugin_sdk::RuntimeHost>, _abort| async move {
                let calls = (0..CALLS).map(|i| {
                    let host = host.clone();
                    tokio::spawn(async move {
                        host.invoke_tool(call(&format!("c{i}"), "files.read"), None)
                            .await
                    })
                });
                for c in futures_util::future::join_all(calls).await {
                    c.unwrap().unwrap();
                }
                Ok(RuntimeTurnOutcome::complete(json!("done")))
            },
        );
        let h = executor(&kernel, Arc::new(plugin), 0);
        let (on_event, seen) = collecting();
        let r = h
            .executor
            .execute(
                request_with(&["files.read"], |v| {
                    v["options"] = json!({"maxToolCalls": 10_000})
                }),
                ExecuteOptions {
                    cancel: None,
                    on_event: Some(on_event),
                },
            )
            .await
            .unwrap();
        assert_eq!(r.status, ExecutionStatus::Succeeded);
        let seqs: Vec<u64> = lock(&seen).iter().map(|e| e.sequence).collect();
        assert_eq!(seqs, (0..r.events.len() as u64).collect::<Vec<_>>());
    }
}
