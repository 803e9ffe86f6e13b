//! The standard runtime's Chat Completions driver, in process against the
//! real kernel, reaching a scripted mock model only through the egress
//! gateway.

#[path = "../../egress/tests/egress_support/mod.rs"]
mod egress_support;

use std::sync::Arc;

use egress_support::*;
use serde_json::json;
use sharedos_egress::GatewayLimits;
use sharedos_egress::mock::{Wire, plan_script};
use sharedos_host::config::HostConfig;
use sharedos_host::executor::{ExecuteOptions, Executor, ExecutorOptions, Seat};
use sharedos_kernel::{Kernel, MemoryAuditSink};
use sharedos_protocol::{ExecutionRequest, ExecutionStatus};

#[tokio::test]
async fn chat_driver_calls_a_tool_through_the_kernel_and_answers() {
    let dir = tempfile::tempdir().unwrap();
    let model = MockModel::start(plan_script(Wire::OpenaiChat))
        .await
        .unwrap();
    let policy = json!({"routes": [{"name": "openai", "upstream": model.base_url(),
        "secret": key_file(dir.path()), "api": "openai", "allow": ["loopback"]}]});
    let gw = serve(
        policy,
        vec![egress_grant("alice", "openai", "request", None)],
        "alice",
        GatewayLimits::default(),
    )
    .await;

    let config = HostConfig::parse(
        include_str!("../demo/host.toml"),
        "demo/host.toml",
        dir.path(),
    )
    .unwrap();
    let files_root = config.resolve(&config.host.files_root);
    std::fs::create_dir_all(&files_root).unwrap();
    let kernel = Arc::new(
        Kernel::from_config(
            &config.kernel,
            &files_root,
            Arc::new(MemoryAuditSink::new()),
        )
        .unwrap(),
    );
    let plugin = sharedos_standard::chat_plugin(
        &format!("http://{}/openai", gw.addr),
        "test-model",
        PLACEHOLDER,
    )
    .unwrap();
    let executor =
        Executor::new(kernel, Seat::in_process(plugin), ExecutorOptions::default()).unwrap();
    let request: ExecutionRequest =
        serde_json::from_str(include_str!("../demo/turn.json")).unwrap();
    let result = executor
        .execute(request, ExecuteOptions::default())
        .await
        .unwrap();

    assert_eq!(result.status, ExecutionStatus::Succeeded, "{result:#?}");
    assert_eq!(result.output.as_ref().unwrap()["text"], "Plan written.");
    // The tool call ran through the kernel: the file exists.
    let written = std::fs::read_to_string(files_root.join("demo/alice/notes/plan.md")).unwrap();
    assert_eq!(written, "step one");
    let seen = model.seen();
    assert_eq!(seen.len(), 2);
    // The model got the catalogue as functions with their schemas, and
    // the tool's result back on the second request.
    let tools = seen[0].body["tools"].as_array().unwrap();
    assert!(
        tools
            .iter()
            .any(|t| t["function"]["name"] == "files__write"),
        "{tools:?}"
    );
    let messages = seen[1].body["messages"].as_array().unwrap();
    let tool_msg = messages.iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(tool_msg["tool_call_id"], "call_1");
    assert!(tool_msg["content"].as_str().unwrap().contains("succeeded"));
    // The upstream saw the real key; the driver only ever held the placeholder.
    for s in &seen {
        assert_eq!(
            s.authorization(),
            Some(format!("Bearer {REAL_KEY}").as_str())
        );
    }
    let dump = format!("{result:?}");
    assert!(!dump.contains(REAL_KEY));
    assert!(
        dump.contains("finishReason") && dump.contains("\"stop\""),
        "{dump}"
    );
}
