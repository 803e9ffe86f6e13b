//! The egress gateway served inside real turns: the standard runtime with
//! the Chat Completions driver, in the full sandbox, reaches a mock model
//! on the host's loopback only through the gateway's listener in its own
//! network namespace (docs/EGRESS.md). Observed from the host: what the
//! upstream received, the plugin's environment read from /proc, the
//! result, the events and the audit file.

use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use sharedos_host::config::HostConfig;
use sharedos_host::egress::mock::{MockModel, MockOptions, OnRequest, Wire, plan_script};
use sharedos_host::executor::{ExecuteOptions, Executor, ExecutorOptions, OnEvent};
use sharedos_host::process::Launcher;
use sharedos_host::sandboxed::SandboxLauncher;
use sharedos_host::seat::registry_from_config;
use sharedos_kernel::{JsonlAuditSink, Kernel};
use sharedos_protocol::{ExecutionEvent, ExecutionResult, ExecutionStatus};
use sharedos_tests::bait::helper_exe;
use sharedos_tests::turns::{
    AGENT, NAMESPACE, request as testplugin_request, testplugin_host_toml, workspace_bin,
};

const REAL_KEY: &str = "sk-real-e2e-91f0c3aa6d";
const PLACEHOLDER: &str = "sharedos-placeholder";

const MODEL_GRANT: &str = r#"
[[kernel.grants]]
id = "alice-model"
subject = { kind = "agent", agentId = "alice" }
issuer = { kind = "service", serviceId = "demo-host" }
namespaceId = "demo"
[[kernel.grants.capabilities]]
namespace = "egress"
path = ["openai"]
scope = "exact"
actions = ["request"]
"#;

/// The demo's configuration with the standard runtime on the chat driver
/// and a route to `upstream`; `extra` is appended (grants).
fn config_text(upstream: &str, key_file: &Path, budget: &str, extra: &str) -> String {
    let demo = include_str!("../../host/demo/host.toml");
    let start = demo.find("transcript = [").expect("the demo's transcript");
    let end = demo[start..].find("\n]\n").expect("its end") + start + 3;
    let runtime = format!(
        r#"driver = {{ kind = "openai-chat", baseUrl = "http://127.0.0.1:8787/openai", model = "test-model" }}
[runtimes.network]
routes = [{{ name = "openai", upstream = "{upstream}", secret = "file:{key}", api = "openai", allow = ["loopback"] }}]
{budget}
"#,
        key = key_file.display(),
    );
    let program = workspace_bin("sharedos-standard");
    let text = format!("{}{}{}", &demo[..start], runtime, &demo[end..]);
    text.replace(
        "program = \"sharedos-standard\"",
        &format!("program = \"{}\"", program.display()),
    ) + extra
}

struct Turn {
    result: ExecutionResult,
    events: Vec<ExecutionEvent>,
    audit: String,
}

/// One turn of `demo/turn.json` through the real host path: the registry
/// from the configuration, the sandbox launcher, the kernel with a JSONL
/// audit file; the turn the executor opens is the gateway's authority.
async fn run(dir: &Path, text: &str) -> Turn {
    let request = include_str!("../../host/demo/turn.json");
    run_request(dir, text, "sharedos.standard", request, None).await
}

async fn run_request(
    dir: &Path,
    text: &str,
    runtime: &str,
    request: &str,
    watch: Option<OnEvent>,
) -> Turn {
    let config = HostConfig::parse(text, "egress-e2e.toml", dir).expect("the configuration");
    let launcher_for = |e: &sharedos_host::config::RuntimeEntry| {
        let l: Arc<dyn Launcher> = Arc::new(SandboxLauncher::new(helper_exe(), e.sandbox_policy()));
        Ok(l)
    };
    let registry = registry_from_config(&config, launcher_for).expect("the seats");
    let seat = registry.resolve(runtime).unwrap().clone();
    let files_root = config.resolve(&config.host.files_root);
    std::fs::create_dir_all(&files_root).unwrap();
    let audit_path = dir.join("audit.jsonl");
    let audit = JsonlAuditSink::open(&audit_path).unwrap();
    let kernel =
        Arc::new(Kernel::from_config(&config.kernel, &files_root, Arc::new(audit)).unwrap());
    let executor = Executor::new(kernel, seat, ExecutorOptions::default()).expect("the executor");
    let events: Arc<Mutex<Vec<ExecutionEvent>>> = Arc::default();
    let sink = events.clone();
    let on_event: OnEvent = Arc::new(move |e| {
        sink.lock().unwrap().push(e.clone());
        if let Some(watch) = &watch {
            watch(e);
        }
    });
    let result = executor
        .execute_json(
            request,
            ExecuteOptions {
                cancel: None,
                on_event: Some(on_event),
            },
        )
        .await
        .expect("a valid request");
    drop(executor);
    drop(registry);
    sharedos_host::process::settle_kills();
    let events = events.lock().unwrap().clone();
    Turn {
        result,
        events,
        audit: std::fs::read_to_string(&audit_path).unwrap_or_default(),
    }
}

fn key_file(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("model.key");
    std::fs::write(&p, REAL_KEY).unwrap();
    p
}

/// The environment of every process running the chat driver, read by the
/// host from /proc while the plugin waits for its model.
fn driver_environments() -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains("openai-chat")
            && let Ok(env) = std::fs::read(entry.path().join("environ"))
        {
            out.push(String::from_utf8_lossy(&env).replace('\0', "\n"));
        }
    }
    out
}

fn codes(events: &[ExecutionEvent], kind: &str) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e.kind.as_str() == kind)
        .map(|e| e.data.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandboxed_chat_driver_reaches_its_model_only_through_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let environs: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen_env = environs.clone();
    let hook: OnRequest = Arc::new(move |_| seen_env.lock().unwrap().extend(driver_environments()));
    let model = MockModel::start_with(
        plan_script(Wire::OpenaiChat),
        MockOptions {
            tls: None,
            on_request: Some(hook),
        },
    )
    .await
    .unwrap();
    let text = config_text(&model.base_url(), &key_file(dir.path()), "", MODEL_GRANT);
    let turn = run(dir.path(), &text).await;

    let result = &turn.result;
    assert_eq!(result.status, ExecutionStatus::Succeeded, "{result:#?}");
    assert_eq!(result.output.as_ref().unwrap()["text"], "Plan written.");
    // The tool call went through the envelope and the kernel.
    let written = std::fs::read_to_string(dir.path().join("files/demo/alice/notes/plan.md"));
    assert_eq!(written.unwrap(), "step one");
    // The sandbox said what it allowed: TCP to the gateway's port only.
    let sandbox = &result.metadata["runtime"]["sandbox"];
    assert_eq!(sandbox["level"], "strong", "{sandbox}");
    assert_eq!(sandbox["landlock"]["net"], "tcp-connect:8787", "{sandbox}");
    assert_eq!(sandbox["seccomp"]["mode"], "namespace+egress", "{sandbox}");

    // The upstream saw the real key on every request, through the route.
    let seen = model.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for s in &seen {
        assert_eq!(
            s.authorization(),
            Some(format!("Bearer {REAL_KEY}").as_str())
        );
        assert_eq!(s.path, "/v1/chat/completions");
    }
    // The plugin's own environment: the gateway's URL and the placeholder,
    // never the key.
    let environs = environs.lock().unwrap().clone();
    assert!(
        !environs.is_empty(),
        "the driver process was not found in /proc"
    );
    for env in &environs {
        assert!(
            env.contains(&format!("SHAREDOS_MODEL_KEY={PLACEHOLDER}")),
            "{env}"
        );
        assert!(
            env.contains("SHAREDOS_EGRESS_URL=http://127.0.0.1:8787"),
            "{env}"
        );
        assert!(
            !env.contains(REAL_KEY),
            "the key is in the plugin's environment"
        );
    }
    // Each model request is an event of the turn and an audit record.
    let requests = codes(&turn.events, "egress.request");
    assert_eq!(requests.len(), 2, "{:?}", turn.events);
    assert!(
        requests
            .iter()
            .all(|r| r["route"] == "openai" && r["status"] == 200),
        "{requests:?}"
    );
    assert_eq!(requests[1]["inputTokens"], 40);
    assert_eq!(
        turn.audit.matches("\"effect.authorized\"").count(),
        2,
        "{}",
        turn.audit
    );
    assert_eq!(
        turn.audit.matches("\"effect.completed\"").count(),
        2,
        "{}",
        turn.audit
    );
    // Nothing the host wrote holds the key.
    let everything = format!(
        "{}\n{}\n{}",
        serde_json::to_string(result).unwrap(),
        serde_json::to_string(&turn.events).unwrap(),
        turn.audit
    );
    assert!(
        !everything.contains(REAL_KEY),
        "the key leaked into the host's output"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_without_the_egress_grant_is_refused_and_audited() {
    let dir = tempfile::tempdir().unwrap();
    let model = MockModel::start(plan_script(Wire::OpenaiChat))
        .await
        .unwrap();
    let text = config_text(&model.base_url(), &key_file(dir.path()), "", "");
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
    let text = config_text(
        &model.base_url(),
        &key_file(dir.path()),
        budget,
        MODEL_GRANT,
    );
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
    let grant = format!(
        r#"
[[kernel.grants]]
id = "alice-model"
subject = {{ kind = "agent", agentId = "{AGENT}" }}
issuer = {{ kind = "service", serviceId = "test-host" }}
namespaceId = "{NAMESPACE}"
[[kernel.grants.capabilities]]
namespace = "egress"
path = ["openai"]
scope = "exact"
actions = ["request"]
"#
    );
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
        .map(|e| e.data.clone())
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
    let bystander = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = bystander.local_addr().unwrap().port();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while bystander.accept().await.is_ok() {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let targets = [
        format!("127.0.0.1:{port}"),
        format!("127.0.0.1:{}", model.port),
        "10.0.0.1:443".to_owned(),
        "1.1.1.1:443".to_owned(),
        "127.0.0.1:8787".to_owned(),
    ];
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
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 0);
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
