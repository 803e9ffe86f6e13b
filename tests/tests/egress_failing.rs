//! A model that keeps failing ends the turn with a code that says so
//! (docs/EGRESS.md, "A model that keeps failing"): `maxFailures` failed
//! answers in a row on one route (5xx, 429, no answer) end it
//! `model_unavailable`, retryable; 401 or 403 end it
//! `model_access_refused`, not retryable; an answer in between starts the
//! count again, and `maxFailures = 0` never ends it. A plugin that retries
//! without end no longer runs to its deadline. Observed from the host: the
//! result, the events, what the upstream received, the audit file.

use std::path::Path;

use serde_json::{Value, json};
use sharedos_egress::mock::{MockModel, Reply, Wire, plan_script};
use sharedos_protocol::ExecutionStatus;
use sharedos_tests::egress::{REAL_KEY, Turn, egress_grant, key_file, run_request};
use sharedos_tests::turns::{request as testplugin_request, testplugin_host_toml};

/// The testplugin in the full sandbox with a route `openai` to `upstream`,
/// the route's own settings added after `allow`.
fn config(dir: &Path, upstream: &str, route_extra: &str) -> String {
    let network = format!(
        "launcher = \"sandbox\"\nnetwork = {{ routes = [{{ name = \"openai\", upstream = \"{upstream}\", secret = \"file:{}\", api = \"openai\", allow = [\"loopback\"]{route_extra} }}] }}\n",
        key_file(dir).display()
    );
    testplugin_host_toml("egress-failing", "sandbox", 60_000)
        .replace("launcher = \"sandbox\"\n", &network)
        + &egress_grant("alice-model", "openai", "request")
}

/// A turn whose plugin sends `n` chat requests, one after the other (a
/// client that retries), then emits `done`.
async fn retrying_turn(dir: &Path, model: &MockModel, route_extra: &str, n: usize) -> Turn {
    let text = config(dir, &model.base_url(), route_extra);
    let mut script: Vec<Value> = (0..n)
        .map(|_| json!({"op": "egress_flood", "n": 0, "path": "/openai/chat/completions"}))
        .collect();
    script.push(json!({"op": "emit", "type": "done", "data": {}}));
    let request = testplugin_request("egress-failing-1", json!(script), &[], 60_000).to_string();
    run_request(dir, &text, "sharedos-testplugin", &request, None).await
}

fn status(code: u16) -> Reply {
    Reply::Status(
        code,
        json!({"error": {"message": "the model is having a bad day"}}),
    )
}

fn emitted_done(turn: &Turn) -> bool {
    turn.events_of("runtime.event")
        .iter()
        .any(|e| e["type"] == "done")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_server_errors_in_a_row_end_the_turn_model_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    // An upstream that reflects the key in its error: the turn's account
    // keeps the body's beginning with the key masked.
    let reflecting = || {
        Reply::Status(
            500,
            json!({"error": {"message": format!("the model is having a bad day ({REAL_KEY})")}}),
        )
    };
    let model = MockModel::start((0..8).map(|_| reflecting()).collect())
        .await
        .unwrap();
    let turn = retrying_turn(dir.path(), &model, "", 8).await;

    assert_eq!(
        turn.result.status,
        ExecutionStatus::Failed,
        "{:#?}",
        turn.result
    );
    let error = turn.result.error.as_ref().unwrap();
    assert_eq!(error.code.as_str(), "model_unavailable", "{error:?}");
    assert_eq!(error.retryable, Some(true), "{error:?}");
    // The default `maxFailures` is 3: the fourth request never left.
    assert_eq!(model.seen().len(), 3);
    assert!(!emitted_done(&turn), "the plugin ran on past the ending");
    let failing = turn.events_of("egress.model_failing");
    assert_eq!(failing.len(), 1, "{:?}", turn.events);
    assert_eq!(
        failing[0],
        json!({"route": "openai", "failures": 3, "status": 500, "code": null})
    );
    // Each request is on the audit file, failed, with its status.
    let failed_records = turn
        .audit
        .lines()
        .filter(|l| l.contains("\"effect.completed\"") && l.contains("\"status\":500"))
        .count();
    assert_eq!(failed_records, 3, "{}", turn.audit);
    // The result says why: the model's answers by status, the last error's
    // beginning (escaped, the key masked), the route giving up.
    let egress = egress_account(&turn);
    assert_eq!(egress["answers"], json!({"500": 3}), "{egress}");
    assert_eq!(egress["lastError"]["route"], "openai", "{egress}");
    assert_eq!(egress["lastError"]["status"], 500, "{egress}");
    let head = egress["lastError"]["bodyHead"].as_str().unwrap();
    assert!(head.contains("the model is having a bad day"), "{head}");
    assert!(!head.contains(REAL_KEY), "{head}");
    assert_eq!(egress["modelFailing"]["failures"], 3, "{egress}");
    assert!(egress["refused"].is_null(), "{egress}");
}

/// `metadata.runtime.egress` of the turn's result.
fn egress_account(turn: &Turn) -> Value {
    serde_json::to_value(&turn.result).unwrap()["metadata"]["runtime"]["egress"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_its_grant_is_named_in_the_result_with_the_grant_it_needed() {
    let dir = tempfile::tempdir().unwrap();
    let model = MockModel::start(plan_script(Wire::OpenaiChat))
        .await
        .unwrap();
    let granted = config(dir.path(), &model.base_url(), "");
    let text = granted.replace(&egress_grant("alice-model", "openai", "request"), "");
    assert_ne!(text, granted, "the grant was taken out");
    let script = json!([
        {"op": "egress_flood", "n": 0, "path": "/openai/chat/completions"},
        {"op": "emit", "type": "done", "data": {}},
    ]);
    let request = testplugin_request("egress-failing-2", script, &[], 60_000).to_string();
    let turn = run_request(dir.path(), &text, "sharedos-testplugin", &request, None).await;

    assert!(model.seen().is_empty(), "the model was reached");
    let egress = egress_account(&turn);
    assert_eq!(egress["requests"], 1, "{egress}");
    let refused = &egress["refused"];
    assert_eq!(
        refused["needed"],
        json!({"namespace": "egress", "path": ["openai"], "action": "request"}),
        "{egress}"
    );
    let code = refused["code"].as_str().unwrap_or_default();
    assert!(!code.is_empty(), "{egress}");
    assert_eq!(egress["failed"][code], 1, "{egress}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_key_ends_the_turn_model_access_refused_not_retryable() {
    let dir = tempfile::tempdir().unwrap();
    let model = MockModel::start((0..5).map(|_| status(401)).collect())
        .await
        .unwrap();
    let turn = retrying_turn(dir.path(), &model, ", maxFailures = 2", 5).await;

    let error = turn.result.error.as_ref().unwrap();
    assert_eq!(error.code.as_str(), "model_access_refused", "{error:?}");
    assert_eq!(error.retryable, Some(false), "{error:?}");
    assert_eq!(model.seen().len(), 2);
    let failing = turn.events_of("egress.model_failing");
    assert_eq!(failing[0]["status"], 401, "{failing:?}");
    assert_eq!(failing[0]["failures"], 2, "{failing:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_between_failures_starts_the_count_again() {
    let dir = tempfile::tempdir().unwrap();
    let answer = plan_script(Wire::OpenaiChat).remove(1);
    let replies = vec![status(503), status(429), answer, status(500), status(502)];
    let model = MockModel::start(replies).await.unwrap();
    let turn = retrying_turn(dir.path(), &model, "", 5).await;

    assert_eq!(
        turn.result.status,
        ExecutionStatus::Succeeded,
        "{:#?}",
        turn.result
    );
    assert_eq!(model.seen().len(), 5);
    assert!(emitted_done(&turn));
    assert!(turn.events_of("egress.model_failing").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_failures_zero_never_ends_the_turn() {
    let dir = tempfile::tempdir().unwrap();
    let model = MockModel::start((0..6).map(|_| status(500)).collect())
        .await
        .unwrap();
    let turn = retrying_turn(dir.path(), &model, ", maxFailures = 0", 6).await;

    assert_eq!(
        turn.result.status,
        ExecutionStatus::Succeeded,
        "{:#?}",
        turn.result
    );
    assert_eq!(model.seen().len(), 6);
    assert!(emitted_done(&turn));
    assert!(turn.events_of("egress.model_failing").is_empty());
}

/// A model request still waiting for its answer when the turn ends (here:
/// at its deadline) is closed on the audit before the ending: its
/// `effect.completed`, failed with `interrupted`, and its `egress.request`
/// event, so every effect the kernel authorized has an outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_open_when_the_turn_ends_is_closed_interrupted_before_the_ending() {
    let dir = tempfile::tempdir().unwrap();
    let model = MockModel::start(vec![Reply::Hang]).await.unwrap();
    let text = config(dir.path(), &model.base_url(), "");
    let script = json!([{"op": "egress_flood", "n": 0, "path": "/openai/chat/completions"}]);
    let request = testplugin_request("egress-open-1", script, &[], 3_000).to_string();
    let turn = run_request(dir.path(), &text, "sharedos-testplugin", &request, None).await;

    assert_eq!(
        turn.result.status,
        ExecutionStatus::Cancelled,
        "{:#?}",
        turn.result
    );
    assert_eq!(model.seen().len(), 1, "the request reached the model");
    let requests = turn.events_of("egress.request");
    assert_eq!(requests.len(), 1, "{:?}", turn.events);
    assert_eq!(requests[0]["code"], "interrupted", "{requests:?}");
    // On the audit: authorized, completed (failed, interrupted), then the
    // turn's end, in that order.
    let lines: Vec<&str> = turn.audit.lines().collect();
    let at = |needle: &dyn Fn(&str) -> bool| lines.iter().position(|l| needle(l));
    let authorized = at(&|l| l.contains("\"effect.authorized\"") && l.contains("egress"));
    let completed = at(&|l| l.contains("\"effect.completed\"") && l.contains("\"interrupted\""));
    let ended = at(&|l| l.contains("\"turn.ended\""));
    assert!(
        matches!((authorized, completed, ended), (Some(a), Some(c), Some(e)) if a < c && c < e),
        "authorized {authorized:?}, completed {completed:?}, ended {ended:?}: {}",
        turn.audit
    );
}
