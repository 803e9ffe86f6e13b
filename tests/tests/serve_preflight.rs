//! `GET /v1/preflight` at the HTTP boundary of a real `sharedos serve`:
//! a tenant sees its own scope's grants (read from the store, both
//! stores, a revocation showing from the next request); the sandbox level
//! it announces for a runtime in the real sandbox is the one a real run of
//! that runtime reports; a runtime that cannot reach its `minLevel` or
//! memory bound says so with the fix; an unknown agent or parameter is a
//! `400` with a code; a store that is down is `503`.

use std::path::Path;

use serde_json::{Value, json};
use sharedos_tests::both_stores;
use sharedos_tests::served::{
    Backend, call_as, grants_cli, scope, start, start_with, wait_state_as, write_config,
};
use sharedos_tests::tenants::{Tcp, add_token, free_port, owner_only, start_tcp, store_args};
use sharedos_tests::turns::{AGENT, NAMESPACE};

both_stores!(each_tenant_sees_its_own_grants_and_a_revocation_at_once);

/// The tools of the answer's only agent: name -> granted.
fn granted(answer: &Value) -> Vec<(String, bool)> {
    let agents = answer["agents"].as_array().expect("agents");
    assert_eq!(agents.len(), 1, "{answer}");
    assert_eq!(agents[0]["agentId"], AGENT, "{answer}");
    agents[0]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| {
            assert!(t["description"].as_str().is_some_and(|d| !d.is_empty()));
            (t["name"].as_str().unwrap().to_owned(), t["granted"] == true)
        })
        .collect()
}

fn tools(read_write_list: bool) -> Vec<(String, bool)> {
    [
        ("files.delete", false),
        ("files.list", read_write_list),
        ("files.read", read_write_list),
        ("files.write", read_write_list),
        // No grant of these tests covers escalation.
        ("sharedos.escalate", false),
    ]
    .map(|(n, g)| (n.to_owned(), g))
    .to_vec()
}

async fn each_tenant_sees_its_own_grants_and_a_revocation_at_once(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let store = store_args(&backend, dir.path());
    let (_, a) = add_token(dir.path(), &store, NAMESPACE, "test-host");
    let (_, b) = add_token(dir.path(), &store, "tenant-b", "app-b");
    let addr = free_port();
    let _server = start_tcp(dir.path(), addr, &store);
    let tcp = Tcp(addr);
    let get = |token: String, path: &'static str| {
        let tcp = &tcp;
        async move {
            tcp.call("GET", path, Some(&token), &owner_only("u"), Value::Null)
                .await
        }
    };

    let (status, _, answer) = get(a.clone(), "/v1/preflight").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["namespaceId"], NAMESPACE);
    assert_eq!(granted(&answer), tools(true), "{answer}");
    // The configured runtime is launched directly: no sandbox, said so.
    let sandbox = &answer["agents"][0]["sandbox"];
    assert_eq!(
        (&sandbox["engine"], &sandbox["level"]),
        (&json!("direct"), &json!("none")),
        "{answer}"
    );
    assert!(
        sandbox["refused"]
            .as_str()
            .is_some_and(|r| r.contains("launcher = \"sandbox\"")),
        "{answer}"
    );

    // Another tenant: the same agent, none of the first tenant's grants.
    let (status, _, answer) = get(b.clone(), "/v1/preflight").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["namespaceId"], "tenant-b");
    assert_eq!(granted(&answer), tools(false), "{answer}");

    // A grant revoked in the store is gone from the next answer.
    let store_refs: Vec<&str> = store.iter().map(String::as_str).collect();
    let (code, _, err) = grants_cli(dir.path(), &store_refs, &["revoke", "files"]);
    assert_eq!(code, 0, "{err}");
    let (status, _, answer) = get(a.clone(), "/v1/preflight").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(granted(&answer), tools(false), "{answer}");
}

/// The quick start's `host.toml` of docs/SERVE.md (the standard runtime in
/// the real sandbox), its session and run bodies and its scope.
fn quick_start() -> (String, Value, Value, String) {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/SERVE.md");
    let page = std::fs::read_to_string(page).unwrap();
    let start = page.find("## Quick start").expect("a quick start section");
    let end = page[start..].find("\n## Running it").expect("its end") + start;
    let section = &page[start..end];
    let block = |lang: &str, n: usize| {
        let fence = format!("```{lang}\n");
        let mut rest = section;
        for _ in 0..n {
            rest = &rest[rest.find(&fence).unwrap() + fence.len()..];
        }
        let at = rest.find(&fence).unwrap() + fence.len();
        rest[at..at + rest[at..].find("```").unwrap()].to_owned()
    };
    let scope = block("sh", 0)
        .lines()
        .find_map(|l| l.strip_prefix("SCOPE='Sharedos-Scope: "))
        .and_then(|l| l.strip_suffix('\''))
        .expect("the SCOPE line")
        .to_owned();
    let session = serde_json::from_str(&block("json", 0)).unwrap();
    let run = serde_json::from_str(&block("json", 1)).unwrap();
    (block("toml", 0), session, run, scope)
}

/// A second agent on a runtime that asks more than any sandbox here gives.
const STRICT: &str = r#"
[[runtimes]]
id = "strict"
version = "0.1.0"
program = "sharedos-standard"
[runtimes.sandbox]
minLevel = "strong"
requireMemoryBound = true

[[agents]]
agentId = "bob"
runtime = "strict"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_announced_level_is_the_one_a_real_run_reports() {
    let (toml, session, run, scope) = quick_start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("host.toml"), format!("{toml}\n{STRICT}")).unwrap();
    let server = start(dir.path());
    let socket = server.socket();
    let get = |path: &'static str| call_as(&socket, "GET", path, &scope, Value::Null);

    let (status, all) = get("/v1/preflight").await;
    assert_eq!(status, 200, "{all}");
    let ids: Vec<&Value> = all["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| &a["agentId"])
        .collect();
    assert_eq!(ids, [&json!("alice"), &json!("bob")], "{all}");
    let (status, alice) = get("/v1/preflight?agent=alice").await;
    assert_eq!(status, 200, "{alice}");
    assert_eq!(alice["agents"].as_array().unwrap().len(), 1, "{alice}");
    let sandbox = alice["agents"][0]["sandbox"].clone();
    assert_eq!(sandbox["engine"], "sandbox", "{alice}");
    assert_eq!(sandbox["runtimeId"], "sharedos.standard", "{alice}");
    assert!(sandbox["level"].is_string(), "{alice}");

    // bob's runtime cannot be met here: no memory controller is
    // delegated, so no sandbox is strong or bounds the tree's memory.
    let (status, bob) = get("/v1/preflight?agent=bob").await;
    assert_eq!(status, 200, "{bob}");
    let strict = &bob["agents"][0]["sandbox"];
    assert_eq!(strict["level"], sandbox["level"], "{bob}");
    assert_eq!(strict["memoryBound"], "unbounded", "{bob}");
    assert_eq!(
        (&strict["meetsMinLevel"], &strict["meetsMemoryBound"]),
        (&json!(false), &json!(false)),
        "{bob}"
    );
    let refused = strict["refused"].as_str().unwrap_or_default();
    assert!(
        refused.contains("minLevel strong") && refused.contains("fix"),
        "{bob}"
    );

    // A real run of alice's runtime reports the level announced.
    let (status, opened) = call_as(&socket, "POST", "/v1/sessions", &scope, session).await;
    assert_eq!(status, 201, "{opened}");
    let runs = format!(
        "/v1/sessions/{}/runs",
        opened["session"]["id"].as_str().unwrap()
    );
    let (status, admitted) = call_as(&socket, "POST", &runs, &scope, run).await;
    assert_eq!(status, 201, "{admitted}");
    let run_id = admitted["run"]["id"].as_str().unwrap();
    let ended = wait_state_as(&socket, run_id, &scope, "ended").await;
    assert_eq!(ended["result"]["status"], "succeeded", "{ended}");
    assert_eq!(
        ended["result"]["metadata"]["runtime"]["sandbox"]["level"], sandbox["level"],
        "{ended}"
    );
    // The answer is the same on a second request (built once, kept).
    assert_eq!(get("/v1/preflight?agent=alice").await, (200, alice));

    let long = format!("/v1/preflight?agent={}", "a".repeat(10_000));
    let (status, err) = call_as(&socket, "GET", &long, &scope, Value::Null).await;
    assert_eq!(
        (status, &err["error"]["code"]),
        (400, &json!("unknown_agent"))
    );
    assert!(err.to_string().len() < 1_000, "not echoed whole: {err}");
    for (path, code) in [
        ("/v1/preflight?agent=mallory", "unknown_agent"),
        ("/v1/preflight?agent=%00", "unknown_agent"),
        ("/v1/preflight?agent=..%2F..%2Fetc", "unknown_agent"),
        ("/v1/preflight?agent=%zz", "invalid_query"),
        ("/v1/preflight?agents=alice", "unknown_parameter"),
    ] {
        let (status, err) = get(path).await;
        assert_eq!(
            (status, &err["error"]["code"]),
            (400, &json!(code)),
            "{path}: {err}"
        );
    }
    let (_, err) = get("/v1/preflight?agents=alice").await;
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("takes agent"), "{message}");
    let (_, err) = get("/v1/preflight?agent=mallory").await;
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("alice, bob"),
        "names the agents: {message}"
    );
}

/// The grants cannot be read (the PostgreSQL server is down): `503
/// store_unavailable`, never an answer that says nothing is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_is_down_is_503_not_an_empty_answer() {
    let mut db = sharedos_store::cluster::TestDatabase::private()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let server = start_with(dir.path(), "serve.sock", &["--postgres", &db.conninfo]);
    let socket = server.socket();
    let scope = scope("u");
    let (status, answer) = call_as(&socket, "GET", "/v1/preflight", &scope, Value::Null).await;
    assert_eq!(status, 200, "{answer}");
    db.stop();
    let (status, err) = call_as(&socket, "GET", "/v1/preflight", &scope, Value::Null).await;
    assert_eq!(
        (status, &err["error"]["code"]),
        (503, &json!("store_unavailable")),
        "{err}"
    );
    drop(server);
}
