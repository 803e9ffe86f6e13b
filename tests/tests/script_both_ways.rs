//! One scenario, written once as a `sharedos_testplugin::Script`, run both
//! ways: in process (`ScriptPlugin`, as host/tests and the bench seat it)
//! and by the `sharedos-testplugin` binary over the protocol
//! (`ProcessRuntime`). The host sees the same calls, events and
//! annotations, in the same order, and the same ending.

use serde_json::{Value, json};
use sharedos_plugin_sdk::{RuntimeError, RuntimePlugin, RuntimeTurnOutcome, Signal};
use sharedos_testplugin::{Script, ScriptPlugin, Step};
use sharedos_tests::{Record, RecordingHost, isolated, testplugin, turn_request};

type Ending = Result<RuntimeTurnOutcome, RuntimeError>;

/// Runs `script` in process and from the binary, each against its own
/// recording host (`prepare` sets both up alike); what each host recorded
/// and how each turn ended.
async fn both_ways(script: Script, prepare: impl Fn(&RecordingHost)) -> [(Vec<Record>, Ending); 2] {
    let request = turn_request("exec-both", script.payload());
    let (plugin, log) = ScriptPlugin::fixed(script);
    let host = RecordingHost::new();
    prepare(&host);
    let in_process = plugin
        .run(request.clone(), host.clone(), Signal::never())
        .await;
    assert!(log.ran());
    let wire_host = RecordingHost::new();
    prepare(&wire_host);
    let over_wire = testplugin("normal")
        .run(request, wire_host.clone(), Signal::never())
        .await;
    // The binary's first record is nothing of the script's: none expected.
    [
        (host.records(), in_process),
        (wire_host.records(), over_wire),
    ]
}

fn error_text(ending: &Ending) -> String {
    match ending {
        Err(e) => e.to_string(),
        Ok(o) => panic!("expected the turn to fail, it ended {o:?}"),
    }
}

#[test]
fn calls_events_annotations_and_the_outcome_are_the_same_both_ways() {
    isolated(async {
        let outcome = RuntimeTurnOutcome::complete(json!({"answer": 42}));
        let script = Script(vec![
            Step::emit("progress", json!({"pct": 10})),
            Step::annotate("model", json!("m-1")),
            Step::call_with("c1", "echo", json!({"n": 1}), Some(0)),
            Step::try_call("c2", "forbidden"),
            Step::emit("progress", json!({"pct": 100})),
            Step::returns(outcome.clone()),
            Step::emit("never", json!(null)),
        ]);
        let [(records, ending), (wire_records, wire_ending)] = both_ways(script, |_| {}).await;
        let expected = vec![
            Record::Emit {
                kind: "progress".into(),
                data: json!({"pct": 10}),
            },
            Record::Annotate {
                key: "model".into(),
                value: json!("m-1"),
            },
            Record::Tool {
                tool: "echo".into(),
                step: Some(0),
                arguments: json!({"n": 1}),
            },
            Record::Tool {
                tool: "forbidden".into(),
                step: None,
                arguments: json!({}),
            },
            Record::Emit {
                kind: "progress".into(),
                data: json!({"pct": 100}),
            },
        ];
        assert_eq!(records, expected);
        assert_eq!(wire_records, expected);
        assert_eq!(ending.unwrap(), outcome);
        assert_eq!(wire_ending.unwrap(), outcome);
    })
}

#[test]
fn a_throw_fails_the_turn_both_ways_and_nothing_after_it_runs() {
    isolated(async {
        let script = Script(vec![
            Step::emit("before", json!(1)),
            Step::throw("the model broke"),
            Step::emit("after", json!(1)),
        ]);
        for (records, ending) in both_ways(script, |_| {}).await {
            assert!(
                error_text(&ending).contains("the model broke"),
                "{ending:?}"
            );
            assert_eq!(
                records,
                [Record::Emit {
                    kind: "before".into(),
                    data: json!(1)
                }]
            );
        }
    })
}

#[test]
fn the_drain_is_seen_both_ways() {
    isolated(async {
        // Over the wire the drain is a notification the plugin reads when
        // it next reads: a scenario waits for it before it checks.
        let script = Script(vec![
            Step::WaitDraining,
            Step::emit("drained", json!(null)),
            Step::ThrowIfDraining,
            Step::emit("never", json!(null)),
        ]);
        let drained = |host: &RecordingHost| host.drain.raise();
        for (records, ending) in both_ways(script, drained).await {
            assert!(error_text(&ending).contains("draining"), "{ending:?}");
            assert_eq!(
                records,
                [Record::Emit {
                    kind: "drained".into(),
                    data: json!(null)
                }]
            );
        }
    })
}

#[test]
fn a_step_that_only_exists_in_process_fails_the_binary_closed() {
    isolated(async {
        let [(_, ending), (_, wire_ending)] =
            both_ways(Script(vec![Step::CaptureHost]), |_| {}).await;
        assert_eq!(ending.unwrap(), RuntimeTurnOutcome::complete(json!(null)));
        assert!(error_text(&wire_ending).contains("in process only"));
    })
}

/// Calls kept in flight (written in batches by the binary, once no answer
/// is left to read) are each made once and answered, both ways.
#[test]
fn calls_in_flight_are_each_made_once_both_ways() {
    isolated(async {
        let script = Script(vec![Step::ParallelCalls {
            tool: "echo".into(),
            n: 300,
            inflight: 64,
            arguments: Value::Null,
        }]);
        let [(records, ending), (wire_records, wire_ending)] = both_ways(script, |_| {}).await;
        for (records, ending) in [(records, ending), (wire_records, wire_ending)] {
            assert_eq!(records.len(), 300, "{records:?}");
            assert!(
                records
                    .iter()
                    .all(|r| matches!(r, Record::Tool { tool, .. } if tool == "echo")),
                "{records:?}"
            );
            match ending.unwrap() {
                RuntimeTurnOutcome::Complete { output, .. } => {
                    assert!(output["parallelNs"].is_u64(), "{output}");
                }
                other => panic!("expected a complete outcome: {other:?}"),
            }
        }
    })
}
