//! Unresolved effects and their settlement at `sharedos serve`'s HTTP
//! boundary, on SQLite and on a real PostgreSQL server (docs/SERVE.md,
//! "Unresolved effects").
//!
//! A run's `files.write` has its effect (the file is on disk) while the
//! store holds back the call's outcome record (a trigger the test plants
//! in the real database stalls that one insert), and the host is
//! SIGKILLed right then: the decision is on record, the outcome is not.
//! The restarted host recovers the run `interrupted`; the call is listed
//! unresolved, refused settlements write nothing, eight concurrent
//! settlements record exactly one (`effect.settled` once in the audit,
//! once in the journal), the others and any later one get `409` with the
//! first settlement, and the call is then listed settled.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_tests::both_stores;
use sharedos_tests::served::{
    Backend, Events, Server, agent_file, call, open_session, run_to_end, start_run, wait_state,
    write_config,
};
use sharedos_tests::tenants::{Tcp, add_token, free_port, owner_only, start_tcp, store_args};
use sharedos_tests::turns::NAMESPACE;

both_stores!(an_effect_a_crash_left_unknown_is_listed_and_settled_once);
both_stores!(a_tenant_settles_with_its_token_and_another_tenant_finds_nothing);

/// Stalls the insert of a call's `succeeded` outcome: on SQLite a
/// trigger counting a cross join far too large to finish, on PostgreSQL
/// one that sleeps. Only the killed host ever meets it.
async fn stall_outcomes(backend: &Backend, dir: &Path) {
    let sql = match backend {
        Backend::Sqlite => {
            "CREATE TABLE stall_rows (x INTEGER);
             WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3000)
               INSERT INTO stall_rows SELECT x FROM c;
             CREATE TRIGGER stall_outcome BEFORE INSERT ON audit_records
               WHEN NEW.kind = 'tool.invoked' AND NEW.outcome = 'succeeded'
               BEGIN SELECT COUNT(*) FROM stall_rows a, stall_rows b, stall_rows c; END;"
        }
        Backend::Postgres(_) => {
            "CREATE FUNCTION stall_outcome() RETURNS trigger AS $$
             BEGIN
               IF NEW.kind = 'tool.invoked' AND NEW.outcome = 'succeeded' THEN
                 PERFORM pg_sleep(600);
               END IF;
               RETURN NEW;
             END $$ LANGUAGE plpgsql;
             CREATE TRIGGER stall_outcome BEFORE INSERT ON audit_records
               FOR EACH ROW EXECUTE FUNCTION stall_outcome();"
        }
    };
    backend.execute(dir, sql).await;
}

/// Removes the stall once its host is dead (on PostgreSQL, the dead
/// host's session still sleeping is ended too).
async fn unstall(backend: &Backend, dir: &Path) {
    let sql = match backend {
        Backend::Sqlite => "DROP TRIGGER stall_outcome; DROP TABLE stall_rows;",
        Backend::Postgres(_) => {
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
               WHERE wait_event = 'PgSleep' AND datname = current_database();
             DROP TRIGGER stall_outcome ON audit_records;"
        }
    };
    backend.execute(dir, sql).await;
}

async fn count(backend: &Backend, dir: &Path, run: &str, kind: &str) -> i64 {
    let sql = format!(
        "SELECT CAST(COUNT(*) AS BIGINT) FROM audit_records WHERE trace_id = '{run}' AND kind = '{kind}'"
    );
    backend.count(dir, &sql).await
}

fn settle_path(run: &str, op: &str) -> String {
    format!("/v1/runs/{run}/effects/{op}/settle")
}

fn code(answer: &(u16, Value)) -> (u16, Option<&str>) {
    (answer.0, answer.1["error"]["code"].as_str())
}

/// What the crash left: the restarted host, the session, the stalled
/// run, the run that ended before it, and the stalled call's operation id.
struct Crashed {
    server: Server,
    session: String,
    run: String,
    ended: String,
    op: String,
}

/// One run ends; the next one's call has its effect and the host is
/// SIGKILLed before its outcome is stored; the host is restarted.
async fn crash_mid_effect(backend: &Backend, dir: &Path) -> Crashed {
    write_config(dir);
    let mut server = backend.start(dir);
    let socket = server.socket();
    let session = open_session(&socket).await;
    let write = |path: &str| json!([{"op": "call", "tool": "files.write", "arguments": {"path": path, "content": "paid"}}]);
    let ended = run_to_end(&socket, &session, "ended", write("ended.txt")).await;
    let ended = ended["id"].as_str().unwrap().to_owned();

    stall_outcomes(backend, dir).await;
    let run = start_run(&socket, &session, "stalled", write("stalled.txt")).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !agent_file(dir, "stalled.txt").exists() {
        assert!(Instant::now() < deadline, "the call never had its effect");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // On PostgreSQL the outcome's insert outlives its client: wait until
    // the server holds it in the trigger, so it never lands afterwards.
    if let Backend::Postgres(_) = backend {
        let sleeping = "SELECT CAST(COUNT(*) AS BIGINT) FROM pg_stat_activity \
                        WHERE wait_event = 'PgSleep' AND datname = current_database()";
        while backend.count(dir, sleeping).await == 0 {
            assert!(
                Instant::now() < deadline,
                "the outcome never reached the store"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // The effect is done, its outcome held back: SIGKILL now.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    drop(server);
    assert_eq!(count(backend, dir, &run, "tool.invoked").await, 0);
    unstall(backend, dir).await;

    let server = backend.start(dir);
    let interrupted = wait_state(&server.socket(), &run, "interrupted").await;
    let op = interrupted["recovery"]["interrupted"][0]
        .as_str()
        .unwrap_or_else(|| panic!("no interrupted call in {interrupted}"))
        .to_owned();
    Crashed {
        server,
        session,
        run,
        ended,
        op,
    }
}

async fn an_effect_a_crash_left_unknown_is_listed_and_settled_once(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let Crashed {
        server,
        session,
        run,
        ended,
        op,
    } = crash_mid_effect(&backend, dir.path()).await;
    let socket = server.socket();

    let listed = effects_listed(&socket, &session, "?state=unresolved").await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let effect = &listed[0];
    assert_eq!(effect["runId"], json!(run));
    assert_eq!(effect["operationId"], json!(op));
    assert_eq!(effect["tool"], json!("files.write"));
    assert_eq!(effect["state"], json!("unresolved"));
    assert_eq!(effect["unresolvedBecause"], json!("host_restarted"));
    assert_eq!(effect["action"], json!("write"));
    assert!(effect["authorizedAt"].is_string(), "{effect}");
    assert!(effect["interruptedAt"].is_string(), "{effect}");
    let (status, of_run) = call(
        &socket,
        "GET",
        &format!("/v1/runs/{run}/effects"),
        "operator",
        Value::Null,
    )
    .await;
    assert_eq!((status, &of_run["effects"][0]), (200, effect), "{of_run}");

    refusals_write_nothing(&backend, dir.path(), &socket, (&session, &run, &op), &ended).await;
    settled_once(&backend, dir.path(), &socket, (&session, &run, &op)).await;
}

/// Eight settlements at once record one; a later one gets it; the call is
/// listed settled; the audit and the journal say it once.
async fn settled_once(
    backend: &Backend,
    dir: &Path,
    socket: &Path,
    (session, run, op): (&str, &str, &str),
) {
    let first = concurrent_settlements(socket, run, op).await;
    assert_eq!(first["type"], json!("effect.settled"));
    assert_eq!(first["outcome"], json!("succeeded"));
    assert_eq!(first["operationId"], json!(op));
    assert_eq!(
        first["metadata"]["observed"],
        json!({"file": "stalled.txt", "content": "paid"})
    );
    assert_eq!(
        first["metadata"]["settledBy"]["credential"],
        json!("operator")
    );
    assert_eq!(first["metadata"]["note"], json!("checked on disk"));

    // A later settlement, whatever it says, gets the first one.
    let body = json!({"outcome": "failed", "observed": "gone"});
    let again = call(socket, "POST", &settle_path(run, op), "operator", body).await;
    assert_eq!(code(&again), (409, Some("effect_settled")), "{}", again.1);
    assert_eq!(again.1["error"]["settlement"], first);

    assert!(
        effects_listed(socket, session, "?state=unresolved")
            .await
            .is_empty()
    );
    let settled = effects_listed(socket, session, "?state=settled").await;
    assert_eq!(settled.len(), 1, "{settled:?}");
    assert_eq!(settled[0]["settlement"], first);
    assert_eq!(count(backend, dir, run, "effect.settled").await, 1);
    let mut events = Events::open(socket, run, None).await;
    let kinds = events.kinds_to_end().await;
    let tail: Vec<&str> = kinds
        .iter()
        .rev()
        .take(3)
        .rev()
        .map(String::as_str)
        .collect();
    assert_eq!(
        tail,
        ["run.interrupted", "effect.settled", "end"],
        "{kinds:?}"
    );
}

async fn effects_listed(socket: &Path, session: &str, query: &str) -> Vec<Value> {
    let path = format!("/v1/sessions/{session}/effects{query}");
    let (status, body) = call(socket, "GET", &path, "operator", Value::Null).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["truncated"], json!(false));
    body["effects"].as_array().cloned().unwrap_or_default()
}

/// Each refusal is a 4xx with its code, and no settlement is recorded.
async fn refusals_write_nothing(
    backend: &Backend,
    dir: &Path,
    socket: &Path,
    (session, run, op): (&str, &str, &str),
    ended: &str,
) {
    let good = json!({"outcome": "succeeded", "observed": {"seen": true}});
    let cases = refusal_cases(run, op, &good);
    for (path, user, body, status, expected) in cases {
        let answer = call(socket, "POST", &path, user, body.clone()).await;
        assert_eq!(
            code(&answer),
            (status, Some(expected)),
            "{path} {body}: {}",
            answer.1
        );
    }
    let (status, listed) = call(
        socket,
        "GET",
        &format!("/v1/runs/{ended}/effects"),
        "operator",
        Value::Null,
    )
    .await;
    assert_eq!(status, 200, "{listed}");
    let done = listed["effects"][0]["operationId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(listed["effects"][0]["state"], json!("succeeded"));
    let answer = call(socket, "POST", &settle_path(ended, &done), "operator", good).await;
    assert_eq!(
        code(&answer),
        (409, Some("effect_not_unresolved")),
        "{}",
        answer.1
    );
    assert_eq!(answer.1["error"]["state"], json!("succeeded"));
    let bad_queries = [
        format!("/v1/sessions/{session}/effects?state=lost"),
        format!("/v1/sessions/{session}/effects?state=settled&state=settled"),
        format!("/v1/sessions/{session}/effects?cursor=1"),
        format!("/v1/runs/{run}/effects?state=unresolved"),
    ];
    for path in bad_queries {
        let (status, _) = call(socket, "GET", &path, "operator", Value::Null).await;
        assert_eq!(status, 400, "{path}");
    }
    assert_eq!(count(backend, dir, run, "effect.settled").await, 0);
    assert_eq!(count(backend, dir, ended, "effect.settled").await, 0);
}

/// A settlement refused: its path, its owner, its body, the status and
/// the code it gets.
type Case = (String, &'static str, Value, u16, &'static str);

fn refusal_cases(run: &str, op: &str, good: &Value) -> Vec<Case> {
    vec![
        (
            settle_path(run, op),
            "mallory",
            good.clone(),
            404,
            "not_found",
        ),
        (
            settle_path(run, "no-such-call"),
            "operator",
            good.clone(),
            404,
            "not_found",
        ),
        (
            settle_path(run, "a%00b"),
            "operator",
            good.clone(),
            400,
            "invalid_id",
        ),
        (
            settle_path(run, &"o".repeat(300)),
            "operator",
            good.clone(),
            400,
            "invalid_id",
        ),
        (
            settle_path("..%2F..", op),
            "operator",
            good.clone(),
            400,
            "invalid_id",
        ),
        (
            settle_path(run, op),
            "operator",
            json!({"outcome": "maybe", "observed": 1}),
            400,
            "invalid_body",
        ),
        (
            settle_path(run, op),
            "operator",
            json!({"outcome": "failed"}),
            400,
            "invalid_body",
        ),
        (
            settle_path(run, op),
            "operator",
            json!({"outcome": "failed", "observed": null}),
            400,
            "invalid_settlement",
        ),
        (
            settle_path(run, op),
            "operator",
            json!({"outcome": "failed", "observed": 1, "by": "me"}),
            400,
            "invalid_body",
        ),
        (
            settle_path(run, op),
            "operator",
            json!({"outcome": "failed", "observed": "x".repeat(20_000)}),
            400,
            "invalid_settlement",
        ),
        (
            settle_path(run, op),
            "operator",
            json!({"outcome": "failed", "observed": 1, "note": "a\u{0}b"}),
            400,
            "invalid_settlement",
        ),
    ]
}

/// Eight settlements at once: one `201`, seven `409` naming it. Returns it.
async fn concurrent_settlements(socket: &Path, run: &str, op: &str) -> Value {
    let body = json!({"outcome": "succeeded", "observed": {"file": "stalled.txt", "content": "paid"},
                      "note": "checked on disk"});
    let tries = (0..8).map(|_| {
        let (socket, path, body) = (socket.to_owned(), settle_path(run, op), body.clone());
        tokio::spawn(async move { call(&socket, "POST", &path, "operator", body).await })
    });
    let mut answers = Vec::new();
    for t in tries {
        answers.push(t.await.unwrap());
    }
    let created: Vec<&Value> = answers
        .iter()
        .filter(|a| a.0 == 201)
        .map(|a| &a.1["settlement"])
        .collect();
    assert_eq!(created.len(), 1, "{answers:?}");
    for (status, body) in answers.iter().filter(|a| a.0 != 201) {
        assert_eq!(
            (*status, body["error"]["code"].as_str()),
            (409, Some("effect_settled")),
            "{body}"
        );
        assert_eq!(&body["error"]["settlement"], created[0]);
    }
    created[0].clone()
}

/// Over TCP, a tenant's token settles its own session's call and is named
/// in the settlement; another tenant's token finds neither the call nor
/// the listing (`404`), and writes nothing.
async fn a_tenant_settles_with_its_token_and_another_tenant_finds_nothing(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let crashed = crash_mid_effect(&backend, dir.path()).await;
    let (run, op) = (crashed.run.as_str(), crashed.op.as_str());
    let store = store_args(&backend, dir.path());
    let (a_id, a) = add_token(dir.path(), &store, NAMESPACE, "test-host");
    let (_, b) = add_token(dir.path(), &store, "tenant-b", "app-b");
    let addr = free_port();
    let mut flags = store.clone();
    flags.extend(["--host-id".to_owned(), "tcp".to_owned()]);
    let _tcp_server = start_tcp(dir.path(), addr, &flags);
    let tcp = Tcp(addr);
    let owner = owner_only("operator");
    let body = json!({"outcome": "failed", "observed": {"row": null}, "note": "not in the ledger"});

    let listing = format!("/v1/sessions/{}/effects", crashed.session);
    let (status, _, answer) = tcp
        .call("GET", &listing, Some(&b), &owner, Value::Null)
        .await;
    assert_eq!(status, 404, "{answer}");
    let (status, _, answer) = tcp
        .call(
            "POST",
            &settle_path(run, op),
            Some(&b),
            &owner,
            body.clone(),
        )
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{answer}"
    );
    assert_eq!(count(&backend, dir.path(), run, "effect.settled").await, 0);

    let (status, _, answer) = tcp
        .call("POST", &settle_path(run, op), Some(&a), &owner, body)
        .await;
    assert_eq!(status, 201, "{answer}");
    let settlement = &answer["settlement"];
    assert_eq!(settlement["outcome"], json!("failed"));
    assert_eq!(
        settlement["metadata"]["settledBy"]["credential"],
        json!(format!("token {a_id}"))
    );
    assert_eq!(
        settlement["metadata"]["settledBy"]["owner"]["userId"],
        json!("operator")
    );
    let (status, _, answer) = tcp
        .call("GET", &listing, Some(&a), &owner, Value::Null)
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["effects"][0]["state"], json!("settled"), "{answer}");
    assert_eq!(count(&backend, dir.path(), run, "effect.settled").await, 1);
}
