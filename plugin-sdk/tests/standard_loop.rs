//! The standard loop alone (envelope.md D): a scripted driver seated in
//! `create_standard_runtime`, run against a recording `RuntimeHost` double.
//! Every test runs on tokio's paused clock.

mod loop_doubles;

use std::sync::Arc;

use serde_json::json;
use sharedos_plugin_sdk::protocol::{
    ProtocolError, Reason, RuntimeManifest, RuntimeTurnOutcome, ToolStatus,
};
use sharedos_plugin_sdk::{
    AgentTurnDecision, AgentTurnInput, DriverError, RuntimeError, RuntimeHost, SessionOutcome,
    Signal, SignalSource, create_standard_runtime, standard_runtime_manifest,
};

use loop_doubles::*;

// ----------------------------------------------------------------- tests

#[tokio::test(start_paused = true)]
async fn manifest_is_the_drivers_or_sharedos_standard() {
    let t = Timeline::default();
    let plain = ScriptDriver::new(vec![], &t);
    let (o, _, _) = options(plain);
    let m = create_standard_runtime(o).manifest();
    assert_eq!(m, standard_runtime_manifest());
    assert_eq!(m.id.as_str(), "sharedos.standard");
    assert_eq!(serde_json::to_value(m.protocol_version).unwrap(), "1");
    assert_eq!(
        m.metadata.as_ref().unwrap()["executionModel"],
        "bounded-driver-loop"
    );

    let mut seated = ScriptDriver::new(vec![], &t);
    seated.manifest = Some(RuntimeManifest::new("acme.driver", "2.1.0").unwrap());
    let (o, _, _) = options(seated);
    let m = create_standard_runtime(o).manifest();
    assert_eq!(m.id.as_str(), "acme.driver");
    assert_eq!(m.version.as_str(), "2.1.0");
}

#[tokio::test(start_paused = true)]
async fn prompt_hash_is_annotated_after_open_and_before_step_0() {
    let t = Timeline::default();
    let host = RecHost::new(4, Answer::Succeed, &t);
    let driver = ScriptDriver::new(
        vec![
            Next::Decide(tool_call("c1", None)),
            Next::Decide(complete(json!("done"))),
        ],
        &t,
    );
    let r = run(driver, &host).await;
    assert_eq!(
        r.outcome,
        Ok(RuntimeTurnOutcome::Complete {
            output: json!("done"),
            metadata: None
        })
    );
    assert_eq!(host.annotation("promptHash"), Some(json!(HASH)));
    assert_eq!(
        *lock(&t),
        vec![
            "open",
            "annotate:promptHash",
            "next:start",
            "invoke:c1@Some(0)",
            "next:succeeded"
        ]
    );
    assert_eq!(r.closed(), vec![SessionOutcome::Succeeded]);
}

#[tokio::test(start_paused = true)]
async fn no_prompt_hash_is_annotated_when_the_session_states_none() {
    let t = Timeline::default();
    let host = RecHost::new(4, Answer::Succeed, &t);
    let mut driver = ScriptDriver::new(vec![Next::Decide(complete(json!(1)))], &t);
    driver.prompt_hash = None;
    let r = run(driver, &host).await;
    assert!(r.outcome.is_ok());
    assert_eq!(host.annotation("promptHash"), None);
}

#[tokio::test(start_paused = true)]
async fn g51_prompt_hash_stays_when_next_never_answers_and_is_absent_when_cancelled_in_open() {
    // `next` never answers; the hard abort comes at 5 ms.
    let t = Timeline::default();
    let host2 = RecHost::new(4, Answer::Succeed, &t);
    let source = Arc::new(SignalSource::new());
    let signal = source.signal();
    let s2 = source.clone();
    tokio::spawn(async move {
        tokio::time::sleep(ms(5)).await;
        s2.raise();
    });
    let driver = ScriptDriver::new(vec![Next::Hang], &t);
    let r = run_with(driver, &host2, signal).await;
    assert!(
        matches!(r.outcome, Err(RuntimeError::Failed(_))),
        "a cancelled loop throws for the envelope: {:?}",
        r.outcome
    );
    assert_eq!(host2.annotation("promptHash"), Some(json!(HASH)));
    assert_eq!(r.closed(), vec![SessionOutcome::Cancelled]);
    assert!(
        lock(&r.errors).is_empty(),
        "a cancellation is no driver error"
    );

    // Cancelled inside `open`: nothing to state, no session to close.
    let t = Timeline::default();
    let host3 = RecHost::new(4, Answer::Succeed, &t);
    let source = Arc::new(SignalSource::new());
    let signal = source.signal();
    let s3 = source.clone();
    tokio::spawn(async move {
        tokio::time::sleep(ms(5)).await;
        s3.raise();
    });
    let mut driver = ScriptDriver::new(vec![Next::Decide(complete(json!(1)))], &t);
    driver.open_ms = u64::MAX;
    let r = run_with(driver, &host3, signal).await;
    assert!(matches!(r.outcome, Err(RuntimeError::Failed(_))));
    assert_eq!(host3.annotation("promptHash"), None);
    assert!(r.inputs().is_empty());
    assert!(r.closed().is_empty(), "no session was opened");
}

#[tokio::test(start_paused = true)]
async fn g52_escalate_annotates_escalation_asked_and_closes_escalated() {
    let t = Timeline::default();
    let host = RecHost::new(4, Answer::Succeed, &t);
    let reason = Reason::new("needs the owner's approval").unwrap();
    let driver = ScriptDriver::new(
        vec![Next::Decide(AgentTurnDecision::Escalate {
            reason: reason.clone(),
            metadata: None,
        })],
        &t,
    );
    let r = run(driver, &host).await;
    assert_eq!(
        r.outcome,
        Ok(RuntimeTurnOutcome::Escalate {
            reason,
            metadata: None
        })
    );
    assert_eq!(
        host.annotation("escalationAsked"),
        Some(json!({"tool": "sharedos.escalate", "reason": "needs the owner's approval"}))
    );
    assert_eq!(r.closed(), vec![SessionOutcome::Escalated]);
}

#[tokio::test(start_paused = true)]
async fn a_denied_result_is_passed_back_and_the_turn_continues() {
    let t = Timeline::default();
    let host = RecHost::new(4, Answer::Deny, &t);
    let driver = ScriptDriver::new(
        vec![
            Next::Decide(tool_call("c1", None)),
            Next::Decide(tool_call("c2", None)),
            Next::Decide(complete(json!("after two denials"))),
        ],
        &t,
    );
    let r = run(driver, &host).await;
    assert!(matches!(r.outcome, Ok(RuntimeTurnOutcome::Complete { .. })));
    let inputs = r.inputs();
    assert_eq!(inputs.len(), 3);
    for i in &inputs[1..] {
        match i {
            AgentTurnInput::ToolResult(res) => {
                assert_eq!(res.status(), ToolStatus::Denied);
                assert_eq!(res.error().unwrap().code.as_str(), "no_matching_grant");
            }
            other => panic!("expected a result, got {other:?}"),
        }
    }
    assert_eq!(
        host.calls(),
        vec![("c1".into(), Some(0)), ("c2".into(), Some(1))]
    );
}

#[tokio::test(start_paused = true)]
async fn the_loops_own_step_ceiling_ends_the_turn_failed_not_retryable() {
    let t = Timeline::default();
    let host = RecHost::new(2, Answer::Succeed, &t);
    let driver = ScriptDriver::new(
        vec![
            Next::Decide(tool_call("c1", None)),
            Next::Decide(tool_call("c2", None)),
            Next::Decide(tool_call("c3", None)),
        ],
        &t,
    );
    let r = run(driver, &host).await;
    assert_eq!(r.failed(), ("step_limit_exceeded".into(), Some(false)));
    assert_eq!(host.calls().len(), 2, "the third decision is never asked");
    assert_eq!(r.inputs().len(), 2);
    assert_eq!(r.closed(), vec![SessionOutcome::Failed]);
}

#[tokio::test(start_paused = true)]
async fn a_declared_step_behind_the_loop_is_an_invalid_decision() {
    let t = Timeline::default();
    let host = RecHost::new(8, Answer::Succeed, &t);
    let driver = ScriptDriver::new(
        vec![
            // Ahead of the loop is allowed and passed on as declared.
            Next::Decide(tool_call("c1", Some(3))),
            // The same position as the loop is allowed.
            Next::Decide(tool_call("c2", Some(1))),
            // Behind the loop (position 2) is not.
            Next::Decide(tool_call("c3", Some(1))),
        ],
        &t,
    );
    let r = run(driver, &host).await;
    assert_eq!(r.failed(), ("invalid_driver_decision".into(), Some(false)));
    match &r.outcome {
        Ok(RuntimeTurnOutcome::Fail { error, .. }) => {
            assert!(error.message.as_str().contains("behind"), "{error:?}")
        }
        _ => unreachable!(),
    }
    assert_eq!(
        host.calls(),
        vec![("c1".into(), Some(3)), ("c2".into(), Some(1))],
        "the call behind is never forwarded"
    );
    assert_eq!(r.closed(), vec![SessionOutcome::Failed]);
}

#[tokio::test(start_paused = true)]
async fn an_invalid_decision_is_invalid_driver_decision() {
    let t = Timeline::default();
    let host = RecHost::new(4, Answer::Succeed, &t);
    let driver = ScriptDriver::new(
        vec![Next::Error(DriverError::InvalidDecision(
            "unknown key".into(),
        ))],
        &t,
    );
    let r = run(driver, &host).await;
    assert_eq!(r.failed(), ("invalid_driver_decision".into(), Some(false)));
    assert!(
        lock(&r.errors).is_empty(),
        "not reported as a driver failure"
    );
    assert_eq!(r.closed(), vec![SessionOutcome::Failed]);
}

#[test]
fn a_decision_with_an_unknown_key_does_not_parse() {
    let bad = json!({"type": "complete", "output": 1, "extra": true});
    assert!(serde_json::from_value::<AgentTurnDecision>(bad).is_err());
    let empty_reason = json!({"type": "escalate", "reason": "   "});
    assert!(serde_json::from_value::<AgentTurnDecision>(empty_reason).is_err());
    let ok = json!({"type": "complete", "output": {"answer": 42}});
    assert!(serde_json::from_value::<AgentTurnDecision>(ok).is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_driver_error_is_driver_failed_retryable_and_reported() {
    let t = Timeline::default();
    let host = RecHost::new(4, Answer::Succeed, &t);
    let driver = ScriptDriver::new(
        vec![
            Next::Decide(tool_call("c1", None)),
            Next::Error(DriverError::Failed("model 503 at /srv/x.rs:88".into())),
        ],
        &t,
    );
    let r = run(driver, &host).await;
    assert_eq!(r.failed(), ("driver_failed".into(), Some(true)));
    match &r.outcome {
        Ok(RuntimeTurnOutcome::Fail { error, .. }) => {
            assert_eq!(error.message.as_str(), "The agent turn driver failed.");
        }
        _ => unreachable!(),
    }
    assert_eq!(
        *lock(&r.errors),
        vec![(
            "model 503 at /srv/x.rs:88".to_owned(),
            "exec-1".to_owned(),
            "trace-1".to_owned()
        )]
    );
    assert_eq!(r.closed(), vec![SessionOutcome::Failed]);

    // A failing `open` is a driver failure too, with no session to close.
    let t = Timeline::default();
    let host = RecHost::new(4, Answer::Succeed, &t);
    let mut driver = ScriptDriver::new(vec![], &t);
    driver.open_error = Some(DriverError::Failed("no provider".into()));
    let r = run(driver, &host).await;
    assert_eq!(r.failed(), ("driver_failed".into(), Some(true)));
    assert!(r.closed().is_empty());
    assert_eq!(lock(&r.errors).len(), 1);

    // A rejected host call (not draining, not aborted) also ends the loop
    // `driver_failed`, as any throw inside the loop does.
    let t = Timeline::default();
    let host = RecHost::new(4, Answer::Reject, &t);
    let driver = ScriptDriver::new(vec![Next::Decide(tool_call("c1", None))], &t);
    let r = run(driver, &host).await;
    assert_eq!(r.failed(), ("driver_failed".into(), Some(true)));
}

#[tokio::test(start_paused = true)]
async fn g58_no_new_decision_is_started_while_draining() {
    let t = Timeline::default();
    let host = RecHost::new(4, Answer::Succeed, &t);
    // The drain begins while `open` is in progress; `open` lands.
    let d = host.clone();
    tokio::spawn(async move {
        tokio::time::sleep(ms(115_000)).await;
        d.draining.raise();
    });
    let mut driver = ScriptDriver::new(vec![Next::Decide(complete(json!(1)))], &t);
    driver.open_ms = 116_000;
    let r = run(driver, &host).await;
    assert!(matches!(r.outcome, Err(RuntimeError::Failed(_))));
    assert!(r.inputs().is_empty(), "next is never called");
    assert_eq!(
        host.annotation("promptHash"),
        Some(json!(HASH)),
        "open resolved, so its hash is stated"
    );
    assert_eq!(r.closed(), vec![SessionOutcome::Cancelled]);
    assert!(lock(&r.errors).is_empty());
}

#[tokio::test(start_paused = true)]
async fn g59_a_decision_in_progress_that_ends_the_turn_is_honoured() {
    let t = Timeline::default();
    let host = RecHost::new(4, Answer::Succeed, &t);
    let d = host.clone();
    tokio::spawn(async move {
        tokio::time::sleep(ms(115_000)).await;
        d.draining.raise();
    });
    let driver = ScriptDriver::new(
        vec![Next::After(116_000, complete(json!({"answer": 42})))],
        &t,
    );
    let r = run(driver, &host).await;
    assert_eq!(
        r.outcome,
        Ok(RuntimeTurnOutcome::Complete {
            output: json!({"answer": 42}),
            metadata: None
        })
    );
    assert_eq!(r.closed(), vec![SessionOutcome::Succeeded]);
}

#[tokio::test(start_paused = true)]
async fn g56_a_tool_call_decided_during_the_drain_is_forwarded_then_the_loop_stops() {
    // The loop forwards the landed call (the envelope refuses it
    // `turn_draining`) and then stops without asking the seat again.
    let t = Timeline::default();
    let host = RecHost::new(4, Answer::Deny, &t);
    let d = host.clone();
    tokio::spawn(async move {
        tokio::time::sleep(ms(115_000)).await;
        d.draining.raise();
    });
    let driver = ScriptDriver::new(
        vec![
            Next::After(116_000, tool_call("c1", None)),
            Next::Decide(complete(json!("never"))),
        ],
        &t,
    );
    let r = run(driver, &host).await;
    assert!(matches!(r.outcome, Err(RuntimeError::Failed(_))));
    assert_eq!(r.inputs(), vec![AgentTurnInput::Start], "next called once");
    assert_eq!(host.calls().len(), 1);
    assert_eq!(r.closed(), vec![SessionOutcome::Cancelled]);
}

#[tokio::test(start_paused = true)]
async fn g57_a_result_landing_during_the_drain_ends_the_loop_unseen() {
    // maxSteps 1: the cancellation wins over the loop's step ceiling.
    let t = Timeline::default();
    let host = RecHost::new(1, Answer::SucceedIntoDrain, &t);
    let driver = ScriptDriver::new(
        vec![
            Next::Decide(tool_call("c1", None)),
            Next::Decide(complete(json!("never"))),
        ],
        &t,
    );
    let r = run(driver, &host).await;
    assert!(
        matches!(r.outcome, Err(RuntimeError::Failed(_))),
        "cancelled, not step_limit_exceeded: {:?}",
        r.outcome
    );
    assert_eq!(r.inputs(), vec![AgentTurnInput::Start]);
    assert_eq!(r.closed(), vec![SessionOutcome::Cancelled]);
    assert!(lock(&r.errors).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_driver_error_while_draining_is_a_cancellation() {
    let t = Timeline::default();
    let host = RecHost::new(4, Answer::Succeed, &t);
    host.draining.raise();
    let driver = ScriptDriver::new(vec![], &t);
    let mut driver = driver;
    driver.open_error = Some(DriverError::Failed("gave up".into()));
    let r = run(driver, &host).await;
    assert!(matches!(r.outcome, Err(RuntimeError::Failed(_))));
    assert!(lock(&r.errors).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_hanging_close_is_bounded_by_the_close_timeout() {
    let t = Timeline::default();
    let host = RecHost::new(4, Answer::Succeed, &t);
    let mut driver = ScriptDriver::new(vec![Next::Decide(complete(json!("done")))], &t);
    driver.close_hangs = true;
    let (mut o, log, _) = options(driver);
    o.close_timeout = ms(250);
    let plugin = create_standard_runtime(o);
    let start = tokio::time::Instant::now();
    let dyn_host: Arc<dyn RuntimeHost> = host.clone();
    let outcome = plugin.run(request(), dyn_host, Signal::never()).await;
    assert_eq!(start.elapsed(), ms(250));
    assert!(matches!(outcome, Ok(RuntimeTurnOutcome::Complete { .. })));
    assert_eq!(*lock(&log.closed), vec![SessionOutcome::Succeeded]);
    assert_eq!(*lock(&log.opens), 1);

    // The default is one second.
    let t = Timeline::default();
    let mut driver = ScriptDriver::new(vec![Next::Decide(complete(json!("done")))], &t);
    driver.close_hangs = true;
    let r = {
        let start = tokio::time::Instant::now();
        let r = run(driver, &host).await;
        assert_eq!(start.elapsed(), ms(1000));
        r
    };
    assert!(r.outcome.is_ok());
}

#[test]
fn driver_errors_are_plain_values() {
    // The fail decision is passed through as the plugin's own outcome; the
    // envelope applies the retryable rule to it.
    let e = ProtocolError::new("model_refused", "no", Some(true));
    let d = AgentTurnDecision::Fail {
        error: e.clone(),
        metadata: None,
    };
    let v = serde_json::to_value(&d).unwrap();
    assert_eq!(v["type"], "fail");
    assert_eq!(v["error"]["code"], "model_refused");
}

#[tokio::test(start_paused = true)]
async fn a_fail_decision_is_passed_through_and_closes_failed() {
    let t = Timeline::default();
    let host = RecHost::new(4, Answer::Succeed, &t);
    let driver = ScriptDriver::new(
        vec![Next::Decide(AgentTurnDecision::Fail {
            error: ProtocolError::new("model_refused", "no", Some(true)),
            metadata: None,
        })],
        &t,
    );
    let r = run(driver, &host).await;
    assert_eq!(r.failed(), ("model_refused".into(), Some(true)));
    assert_eq!(r.closed(), vec![SessionOutcome::Failed]);
}
#[tokio::test(start_paused = true)]
async fn a_close_that_fails_is_swallowed() {
    let t = Timeline::default();
    let host = RecHost::new(4, Answer::Succeed, &t);
    let mut driver = ScriptDriver::new(vec![Next::Decide(complete(json!("done")))], &t);
    driver.close_panics = true;
    let r = run(driver, &host).await;
    assert_eq!(
        r.outcome,
        Ok(RuntimeTurnOutcome::Complete {
            output: json!("done"),
            metadata: None
        }),
        "close's failure does not change the turn"
    );
    assert_eq!(r.closed(), vec![SessionOutcome::Succeeded]);
}

#[tokio::test(start_paused = true)]
async fn a_driver_that_panics_is_driver_failed_and_its_session_is_closed() {
    let t = Timeline::default();
    let host = RecHost::new(4, Answer::Succeed, &t);
    let driver = ScriptDriver::new(vec![Next::Decide(tool_call("c1", None)), Next::Panic], &t);
    let r = run(driver, &host).await;
    assert_eq!(r.failed(), ("driver_failed".into(), Some(true)));
    assert_eq!(r.closed(), vec![SessionOutcome::Failed]);
    assert_eq!(lock(&r.errors).len(), 1);
}
