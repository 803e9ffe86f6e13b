//! The egress gateway served inside real turns in the full sandbox
//! (docs/EGRESS.md): grants, budgets, what a plugin cannot reach, and the
//! bounds of the gateway, observed from the host (what the upstream
//! received, the result, the events, the audit file, /proc). The drivers'
//! turns are in egress_drivers_sandbox.rs, CONNECT in
//! egress_connect_sandbox.rs.

use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use sharedos_egress::mock::{MockModel, Wire, plan_script};
use sharedos_host::executor::OnEvent;
use sharedos_protocol::{ExecutionEvent, ExecutionStatus};
use sharedos_tests::bait::helper_exe;
use sharedos_tests::egress::{
    Bystander, Turn, egress_grant, key_file, model_text, probe_targets, run, run_request,
};
use sharedos_tests::turns::{request as testplugin_request, testplugin_host_toml};

/// The demo's configuration on the chat driver with a route to
/// `upstream`; `network_extra` goes in `[runtimes.network]`.
fn config_text(upstream: &str, key_file: &Path, network_extra: &str, grant: bool) -> String {
    model_text("openai-chat", upstream, key_file, network_extra, "", grant)
}

fn codes(events: &[ExecutionEvent], kind: &str) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e.kind.as_str() == kind)
        .map(|e| e.data.clone().into_value())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_without_the_egress_grant_is_refused_and_audited() {
    let dir = tempfile::tempdir().unwrap();
    let model = MockModel::start(plan_script(Wire::OpenaiChat))
        .await
        .unwrap();
    let text = config_text(&model.base_url(), &key_file(dir.path()), "", false);
    let turn = run(dir.path(), &text).await;

    assert_eq!(
        turn.result.status,
        ExecutionStatus::Failed,
        "{:#?}",
        turn.result
    );
    let error = turn.result.error.as_ref().unwrap();
    assert_eq!(error.code.as_str(), "model_http_403", "{error:?}");
    assert!(
        model.seen().is_empty(),
        "the upstream was reached without a grant"
    );
    let denied: Vec<&str> = turn
        .audit
        .lines()
        .filter(|l| l.contains("\"effect.authorized\"") && l.contains("denied"))
        .collect();
    assert_eq!(denied.len(), 1, "{}", turn.audit);
    assert!(denied[0].contains("openai"), "{}", denied[0]);
    let requests = codes(&turn.events, "egress.request");
    assert_eq!(requests.len(), 1, "{:?}", turn.events);
    assert_eq!(requests[0]["status"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_request_budget_ends_the_turn_egress_budget_exceeded() {
    let dir = tempfile::tempdir().unwrap();
    let model = MockModel::start(plan_script(Wire::OpenaiChat))
        .await
        .unwrap();
    let budget = "budget = { requests = 1 }";
    let text = config_text(&model.base_url(), &key_file(dir.path()), budget, true);
    let turn = run(dir.path(), &text).await;

    assert_eq!(
        turn.result.status,
        ExecutionStatus::Failed,
        "{:#?}",
        turn.result
    );
    let error = turn.result.error.as_ref().unwrap();
    assert_eq!(error.code.as_str(), "egress_budget_exceeded", "{error:?}");
    // The first request reached the model; the second did not.
    assert_eq!(model.seen().len(), 1);
    let exceeded = codes(&turn.events, "egress.budget_exceeded");
    assert_eq!(exceeded.len(), 1, "{:?}", turn.events);
    assert_eq!(exceeded[0]["budget"], "requests");
}

/// The testplugin in the full sandbox with a route to `upstream`, granted
/// to its agent.
fn testplugin_text(upstream: &str, key_file: &Path) -> String {
    let network = format!(
        "launcher = \"sandbox\"\nnetwork = {{ routes = [{{ name = \"openai\", upstream = \"{upstream}\", secret = \"file:{}\", api = \"openai\", allow = [\"loopback\"] }}] }}\n",
        key_file.display()
    );
    let grant = egress_grant("alice-model", "openai", "request");
    testplugin_host_toml("egress-e2e", "sandbox", 60_000)
        .replace("launcher = \"sandbox\"\n", &network)
        + &grant
}

async fn testplugin_turn(dir: &Path, upstream: &str, script: Value) -> (Turn, Vec<Value>) {
    testplugin_turn_watched(dir, upstream, script, None).await
}

async fn testplugin_turn_watched(
    dir: &Path,
    upstream: &str,
    script: Value,
    watch: Option<OnEvent>,
) -> (Turn, Vec<Value>) {
    let text = testplugin_text(upstream, &key_file(dir));
    let request = testplugin_request("egress-e2e-1", script, &[], 60_000).to_string();
    let turn = run_request(dir, &text, "sharedos-testplugin", &request, watch).await;
    assert_eq!(
        turn.result.status,
        ExecutionStatus::Succeeded,
        "{:#?}",
        turn.result
    );
    let emitted = turn
        .events
        .iter()
        .filter(|e| e.kind.as_str() == "runtime.event")
        .map(|e| e.data.clone().into_value())
        .collect();
    (turn, emitted)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_connections_dns_and_raw_sockets_fail_and_the_host_listener_sees_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let model = MockModel::start(plan_script(Wire::OpenaiChat))
        .await
        .unwrap();
    // A listener on the host's loopback that no policy allows.
    let bystander = Bystander::start().await;
    let targets = probe_targets(bystander.port, model.port);
    let script = json!([{"op": "net_probe", "targets": targets, "resolve": "example.com"}]);
    let (_turn, emitted) = testplugin_turn(dir.path(), &model.base_url(), script).await;
    let probe = &emitted
        .iter()
        .find(|e| e["type"] == "net_probe")
        .expect("the probe's event")["data"];
    // Only the gateway's own listener answers.
    assert_eq!(probe["127.0.0.1:8787"], "connected", "{probe}");
    for t in &targets[..4] {
        let got = probe[t.as_str()].as_str().unwrap_or_default();
        assert_ne!(got, "connected", "{t}: {probe}");
    }
    assert!(probe["resolve example.com"].is_string(), "{probe}");
    assert!(
        !probe["resolve example.com"]
            .as_str()
            .unwrap()
            .starts_with("resolved"),
        "{probe}"
    );
    assert!(
        probe["udp"].as_str().unwrap().contains("os error 1"),
        "{probe}"
    );
    assert!(
        probe["raw"].as_str().unwrap().contains("os error 1"),
        "{probe}"
    );
    // Observed on the host: nothing reached the bystander or the model.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(bystander.accepted(), 0);
    assert!(model.seen().is_empty(), "{:?}", model.seen());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_connections_and_a_gigabyte_body_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let model = MockModel::start(plan_script(Wire::OpenaiChat))
        .await
        .unwrap();
    let fds_before = open_fds();
    let script = json!([
        {"op": "egress_flood", "n": 10_000, "path": "/openai/chat/completions"},
        {"op": "egress_body", "bytes": 1u64 << 30, "path": "/openai/chat/completions"},
    ]);
    let (turn, emitted) = testplugin_turn(dir.path(), &model.base_url(), script).await;
    let data = |op: &str| {
        emitted
            .iter()
            .find(|e| e["type"] == op)
            .map(|e| e["data"].clone())
            .unwrap_or_else(|| panic!("no {op} event: {emitted:?}"))
    };
    let flood = data("egress_flood");
    assert_eq!(
        flood["connected"].as_u64().unwrap() + flood["failed"].as_u64().unwrap(),
        10_000,
        "{flood}"
    );
    // After the flood the gateway still serves an ordinary request.
    assert_eq!(flood["status"], "200", "{flood}");
    let body = data("egress_body");
    assert_eq!(body["status"], "413", "{body}");
    // The gateway stopped reading long before the gigabyte.
    assert!(body["sent"].as_u64().unwrap() < 256 << 20, "{body}");
    // Only the one ordinary request reached the model.
    assert_eq!(model.seen().len(), 1, "{:?}", model.seen().len());
    let requests = codes(&turn.events, "egress.request");
    assert!(
        requests
            .iter()
            .any(|r| r["code"] == "egress_body_too_large"),
        "{requests:?}"
    );
    // Every connection of the turn is closed in the host.
    let fds_after = open_fds();
    assert!(
        fds_after <= fds_before + 8,
        "fds {fds_before} -> {fds_after}"
    );
}

#[test]
fn demo_model_mock_runs_a_model_turn_through_the_gateway() {
    let out = std::process::Command::new(helper_exe())
        .args(["demo", "--model", "--mock"])
        .env_remove("OPENAI_API_KEY")
        .output()
        .expect("sharedos runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let result: Value = serde_json::from_str(&stdout).expect("the result JSON");
    assert_eq!(result["status"], "succeeded", "{stdout}");
    assert_eq!(result["output"]["text"], "Plan written.");
    assert!(stderr.contains("egress.request   openai → 200"), "{stderr}");
    assert!(stderr.contains("40+6 tokens"), "{stderr}");
    assert!(!format!("{stdout}{stderr}").contains("sharedos-mock-key"));
}

/// The socket inodes a process holds (`socket:[N]` links in its fd table).
fn socket_inodes(pid: &str) -> Vec<String> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    fds.flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .map(|l| l.to_string_lossy().into_owned())
        .filter(|l| l.starts_with("socket:"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_process_of_the_sandbox_holds_the_gateway_listener() {
    let dir = tempfile::tempdir().unwrap();
    let model = MockModel::start(plan_script(Wire::OpenaiChat))
        .await
        .unwrap();
    // While the plugin runs: every socket of the host (this process, which
    // holds the gateway's listener) against every socket of each process
    // of the sandbox (its supervisor, pid 1 and the plugin). A shared
    // inode would be the listener left open inside.
    let shared: Arc<Mutex<Option<Vec<String>>>> = Arc::default();
    let found = shared.clone();
    let watch: OnEvent = Arc::new(move |e| {
        if e.kind.as_str() != "runtime.event" || e.data["type"] != "check" {
            return;
        }
        let host = socket_inodes("self");
        let mut inside = Vec::new();
        let mut processes = 0;
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let pid = entry.file_name().to_string_lossy().into_owned();
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            if cmdline.contains("sharedos-testplugin") || cmdline.starts_with("sandbox-init") {
                processes += 1;
                inside.extend(socket_inodes(&pid).into_iter().filter(|s| host.contains(s)));
            }
        }
        assert!(processes >= 3, "only {processes} sandbox processes found");
        *found.lock().unwrap() = Some(inside);
    });
    let script = json!([
        {"op": "net_probe", "targets": ["127.0.0.1:8787"]},
        {"op": "emit", "type": "check", "data": {}},
    ]);
    let (_turn, emitted) =
        testplugin_turn_watched(dir.path(), &model.base_url(), script, Some(watch)).await;
    // The listener was there and served the plugin.
    assert_eq!(
        emitted[0]["data"]["127.0.0.1:8787"], "connected",
        "{emitted:?}"
    );
    let shared = shared.lock().unwrap().clone().expect("the check ran");
    assert!(
        shared.is_empty(),
        "sockets shared with the sandbox: {shared:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_plugin_reaches_only_the_routes_model_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let model = MockModel::start(plan_script(Wire::OpenaiChat))
        .await
        .unwrap();
    let paths = [
        ("/openai/../admin", "400"),
        ("/openai/%2e%2e/admin", "400"),
        ("/openai/v1/%2E%2E/%2e%2E/organization", "400"),
        ("/openai/files", "403"),
        ("/openai/organization/admin_api_keys", "403"),
        ("/openai/chat/completions", "200"),
    ];
    let script: Vec<Value> = paths
        .iter()
        .map(|(p, _)| json!({"op": "egress_flood", "n": 0, "path": p}))
        .collect();
    let (turn, emitted) = testplugin_turn(dir.path(), &model.base_url(), json!(script)).await;
    let statuses: Vec<Value> = emitted
        .iter()
        .filter(|e| e["type"] == "egress_flood")
        .map(|e| e["data"]["status"].clone())
        .collect();
    let want: Vec<Value> = paths.iter().map(|(_, s)| json!(s)).collect();
    assert_eq!(statuses, want);
    // Only the model endpoint reached the upstream, under its base.
    let seen = model.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].path, "/v1/chat/completions");
    let requests = codes(&turn.events, "egress.request");
    let got: Vec<Value> = requests.iter().map(|r| r["code"].clone()).collect();
    let invalid = json!("egress_path_invalid");
    let refused = json!("egress_endpoint_refused");
    let want = [&invalid, &invalid, &invalid, &refused, &refused].map(Clone::clone);
    assert_eq!(got[..5], want, "{requests:?}");
    // The model's answer: the plugin reads its status line and hangs up,
    // before or after the gateway sent the body's end.
    assert_eq!(requests[5]["status"], 200, "{requests:?}");
    assert!(
        got[5].is_null() || got[5] == "client_closed",
        "{requests:?}"
    );
    // Each refusal is on the audit file with its code.
    for code in ["egress_path_invalid", "egress_endpoint_refused"] {
        assert!(turn.audit.contains(code), "{code}: {}", turn.audit);
    }
}
