//! Two `sharedos serve` processes against one PostgreSQL: the last use of
//! a `maxUses` grant raced from both hosts (exactly one wins), one host's
//! events observed from the other, and a host SIGKILLed mid-run recovered
//! by its replacement without replaying an effect; grants added and
//! revoked with `sharedos grants` while both hosts run, the last use of a
//! store-held grant raced from both.

use std::time::Duration;

use serde_json::{Value, json};
use sharedos_store::cluster::TestDatabase;
use sharedos_tests::served::{
    Events, Server, agent_file, call, files_grant, grants_cli, open_session, run_body, run_to_end,
    start_run, start_with, wait_state, write_config_with,
};

/// One use of `files.delete` under `once/`, shared by every host (the
/// base configuration grants no delete).
const ONE_WRITE: &str = r#"
[[kernel.grants]]
id = "notes-once"
subject = { kind = "agent", agentId = "alice" }
issuer = { kind = "service", serviceId = "test-host" }
namespaceId = "endings"
maxUses = 1
capabilities = [{ namespace = "files", path = ["alice", "once"], scope = "descendants", actions = ["delete"] }]
"#;

fn host(dir: &std::path::Path, db: &TestDatabase, name: &str) -> Server {
    start_with(
        dir,
        &format!("{name}.sock"),
        &["--postgres", &db.conninfo, "--host-id", name],
    )
}

fn delete_script(path: &str) -> Value {
    json!([{"op": "call", "tool": "files.delete", "arguments": {"path": path}}])
}

/// The status the tool call of a finished run got.
fn call_status(run: &Value) -> String {
    run["result"]["output"]["results"][0]["result"]["status"]
        .as_str()
        .unwrap_or("none")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_share_counters_and_events_through_postgres() {
    let db = TestDatabase::new().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_config_with(dir.path(), ONE_WRITE);
    let a = host(dir.path(), &db, "a");
    let b = host(dir.path(), &db, "b");
    let (sa, sb) = (a.socket(), b.socket());
    let session = open_session(&sa).await;
    let files = agent_file(dir.path(), "once");
    std::fs::create_dir_all(&files).unwrap();
    std::fs::write(files.join("a.txt"), "a").unwrap();
    std::fs::write(files.join("b.txt"), "b").unwrap();

    // The session opened on A is usable on B: one store.
    let runs = format!("/v1/sessions/{session}/runs");
    let (ra, rb) = tokio::join!(
        call(
            &sa,
            "POST",
            &runs,
            "operator",
            run_body("race-a", delete_script("once/a.txt"))
        ),
        call(
            &sb,
            "POST",
            &runs,
            "operator",
            run_body("race-b", delete_script("once/b.txt"))
        ),
    );
    assert_eq!((ra.0, rb.0), (201, 201), "{ra:?} {rb:?}");
    let id_a = ra.1["run"]["id"].as_str().unwrap().to_owned();
    let id_b = rb.1["run"]["id"].as_str().unwrap().to_owned();
    let end_a = wait_state(&sa, &id_a, "ended").await;
    let end_b = wait_state(&sb, &id_b, "ended").await;
    let statuses = [call_status(&end_a), call_status(&end_b)];
    let won = statuses.iter().filter(|s| *s == "succeeded").count();
    assert_eq!(won, 1, "exactly one host takes the last use: {statuses:?}");
    assert!(statuses.iter().any(|s| s == "denied"), "{statuses:?}");
    let files = agent_file(dir.path(), "once");
    let written = std::fs::read_dir(&files).map(|d| d.count()).unwrap_or(0);
    assert_eq!(written, 1, "one file written in all");

    // A run on A, observed live from B (woken by LISTEN/NOTIFY).
    let mut script = Vec::new();
    for i in 0..8 {
        script.push(json!({"op": "emit", "type": "step", "data": {"i": i}}));
        script.push(json!({"op": "sleep", "ms": 40}));
    }
    let (status, body) = call(
        &sa,
        "POST",
        &runs,
        "operator",
        run_body("live", Value::Array(script)),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let run = body["run"]["id"].as_str().unwrap().to_owned();
    let mut from_b = Events::open(&sb, &run, None).await;
    let mut seen = Vec::new();
    let mut steps = 0;
    let all = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some((id, kind, data)) = from_b.next().await {
            if kind == "end" {
                return true;
            }
            seen.push(id.unwrap());
            if data["data"]["type"] == "step" {
                steps += 1;
            }
        }
        false
    })
    .await
    .expect("B sees A's run to its end");
    assert!(all, "the stream ended with an end event");
    assert_eq!(steps, 8);
    let expected: Vec<u64> = (0..seen.len() as u64).collect();
    assert_eq!(seen, expected, "no gap, no duplicate across hosts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_mid_run_is_recovered_by_its_replacement_without_replay() {
    let db = TestDatabase::new().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_config_with(dir.path(), "");
    let mut a = host(dir.path(), &db, "a");
    let b = host(dir.path(), &db, "b");
    let session = open_session(&a.socket()).await;
    let script = json!([
        {"op": "emit_pid"},
        {"op": "call", "tool": "files.write", "arguments": {"path": "effect.txt", "content": "once"}},
        {"op": "emit", "type": "written", "data": {}},
        {"op": "stall"}
    ]);
    let run = start_run(&a.socket(), &session, "req-1", script).await;
    // Watched from B while A runs it.
    let mut events = Events::open(&b.socket(), &run, None).await;
    let plugin = events.until("written").await;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    if let Some(pid) = plugin.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
    let effect = agent_file(dir.path(), "effect.txt");
    std::fs::remove_file(&effect).unwrap();

    // A's replacement (same host id, another process) reconciles at start;
    // B's observer sees the run end.
    let replacement = host(dir.path(), &db, "a");
    let run_now = wait_state(&replacement.socket(), &run, "interrupted").await;
    assert_eq!(run_now["recovery"]["calls"][0]["outcome"], "succeeded");
    let tail = events.kinds_to_end().await;
    assert_eq!(tail, vec!["run.interrupted".to_owned(), "end".to_owned()]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!effect.exists(), "the effect was not replayed");

    // The audit trail: the write was decided and invoked once, by A; the
    // recovery added no decision and no invocation for it (its outcome
    // was recorded, so it is not marked interrupted either).
    let store = sharedos_store::PostgresStore::connect(&db.conninfo, None)
        .await
        .unwrap();
    let trail = sharedos_store::Store::audit_trail(&store, &run)
        .await
        .unwrap();
    let write = |kind: &str| {
        trail
            .iter()
            .filter(|r| r.kind == kind && r.tool.as_deref() == Some("files.write"))
            .count()
    };
    let allowed = trail
        .iter()
        .filter(|r| {
            r.kind == "authorization.checked"
                && r.operation_id.is_some()
                && serde_json::to_value(r.outcome).unwrap() == "allowed"
        })
        .count();
    assert_eq!(allowed, 1, "one decision for the one effect: {trail:?}");
    assert_eq!(write("tool.invoked"), 1, "{trail:?}");
    assert!(
        !trail
            .iter()
            .any(|r| r.reason.as_deref() == Some("host_restarted")),
        "{trail:?}"
    );
}

/// Runs `script` as a new run on `socket` and waits for its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_added_and_revoked_by_an_operator_reach_both_hosts() {
    let db = TestDatabase::new().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_config_with(dir.path(), "");
    let (a, b) = (host(dir.path(), &db, "a"), host(dir.path(), &db, "b"));
    let (sa, sb) = (a.socket(), b.socket());
    let session = open_session(&sa).await;
    let once = agent_file(dir.path(), "once");
    std::fs::create_dir_all(&once).unwrap();
    for f in ["a.txt", "b.txt", "c.txt", "d.txt"] {
        std::fs::write(once.join(f), f).unwrap();
    }
    let store = ["--postgres", db.conninfo.as_str()];
    let add = |grant: Value| {
        let file = dir
            .path()
            .join(format!("grant-{}.json", grant["id"].as_str().unwrap()));
        std::fs::write(&file, grant.to_string()).unwrap();
        grants_cli(dir.path(), &store, &["add", file.to_str().unwrap()])
    };

    // No delete grant yet: refused.
    let before = run_to_end(&sa, &session, "before", delete_script("once/a.txt")).await;
    assert_eq!(call_status(&before), "denied");

    // A grant that names a namespace the configuration does not know is
    // refused by the CLI, and nothing is stored.
    let mut bad = files_grant("bad", "once", &["delete"], None);
    bad["capabilities"][0]["namespace"] = json!("nowhere");
    let (code, _, err) = add(bad);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("unknown namespace \"nowhere\""), "{err}");

    // One use, added while both hosts run, raced from both: one wins.
    let (code, out, err) = add(files_grant("del-once", "once", &["delete"], Some(1)));
    assert_eq!((code, out.trim()), (0, "added del-once"), "{err}");
    let (ra, rb) = tokio::join!(
        run_to_end(&sa, &session, "race-a", delete_script("once/a.txt")),
        run_to_end(&sb, &session, "race-b", delete_script("once/b.txt")),
    );
    let statuses = [call_status(&ra), call_status(&rb)];
    assert_eq!(
        statuses.iter().filter(|s| *s == "succeeded").count(),
        1,
        "exactly one host takes the store-held grant's only use: {statuses:?}"
    );
    let left = ["a.txt", "b.txt"]
        .iter()
        .filter(|f| once.join(f).exists())
        .count();
    assert_eq!(left, 1, "one file deleted in all");

    // Unbounded, used on B, revoked with the CLI, then refused on A.
    let (code, _, err) = add(files_grant("del-any", "once", &["delete"], None));
    assert_eq!(code, 0, "{err}");
    let used = run_to_end(&sb, &session, "use-b", delete_script("once/c.txt")).await;
    assert_eq!(call_status(&used), "succeeded");
    assert!(!once.join("c.txt").exists());
    let (code, out, err) = grants_cli(dir.path(), &store, &["revoke", "del-any"]);
    assert_eq!((code, out.trim()), (0, "revoked del-any"), "{err}");
    let after = run_to_end(&sa, &session, "after-revoke", delete_script("once/d.txt")).await;
    assert_eq!(call_status(&after), "denied");
    assert!(
        once.join("d.txt").exists(),
        "the revoked grant allowed nothing"
    );

    let (code, out, _) = grants_cli(dir.path(), &store, &["list", "--json"]);
    assert_eq!(code, 0);
    let listed: Vec<Value> = serde_json::from_str(&out).unwrap();
    let find = |id: &str| {
        listed
            .iter()
            .find(|g| g["grant"]["id"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(find("del-once")["remainingUses"], 0);
    assert_eq!(find("del-any")["grant"]["revoked"], true);
    assert_eq!(
        find("files")["origin"],
        "configuration",
        "imported at start"
    );
    assert!(listed.iter().all(|g| g["grant"]["id"] != "bad"));
    let (code, _, err) = grants_cli(dir.path(), &store, &["revoke", "no-such"]);
    assert_eq!(code, 1);
    assert!(err.contains("sharedos grants list"), "{err}");
}
