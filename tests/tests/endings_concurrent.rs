//! One executor keeps serving turns while another turn's plugin breaks the
//! protocol, floods, or crashes: each hostile turn ends the way the tables
//! say, and the well-behaved turns running beside it succeed.

use std::sync::Arc;

use serde_json::json;
use sharedos_host::executor::{ExecuteOptions, Executor, ExecutorOptions};
use sharedos_host::process::{DirectLauncher, ProcessRuntime, ProcessRuntimeConfig};
use sharedos_host::seat::process_seat;
use sharedos_protocol::{ExecutionRequest, ExecutionStatus, RuntimeManifest};
use sharedos_tests::{demo_kernel, plugin_bin};

fn request(execution_id: &str, script: serde_json::Value) -> ExecutionRequest {
    let mut r: ExecutionRequest =
        serde_json::from_str(include_str!("../../host/demo/turn.json")).unwrap();
    r.execution_id = sharedos_protocol::ident(execution_id);
    r.message.payload = json!({"script": script});
    // The test plugin's calls carry this trace id.
    r.context.trace_id = sharedos_protocol::ident("trace-testplugin");
    r.message.trace_id = sharedos_protocol::ident("trace-testplugin");
    r.options = Some(sharedos_protocol::ExecutionOptions {
        max_steps: Some(16),
        max_tool_calls: Some(64),
        timeout_ms: Some(10_000),
    });
    r
}

#[test]
fn hostile_turns_do_not_disturb_the_turns_beside_them() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let kernel = demo_kernel(dir.path());
        let manifest = RuntimeManifest::new("sharedos-testplugin", "0.1.0").unwrap();
        let runtime =
            ProcessRuntime::new(ProcessRuntimeConfig::new(plugin_bin("sharedos-testplugin"), manifest), Arc::new(DirectLauncher))
                .unwrap();
        let executor = Arc::new(Executor::new(Arc::new(kernel), process_seat(Arc::new(runtime)), ExecutorOptions::default()).unwrap());

        let good = |i: usize| {
            request(
                &format!("good-{i}"),
                json!([
                    {"op": "call", "tool": "files.write", "arguments": {"path": format!("g{i}.txt"), "content": "ok"}},
                    {"op": "emit", "type": "progress", "data": {"i": i}},
                    {"op": "annotate", "key": "k", "value": i}
                ]),
            )
        };
        let hostile = [
            ("garbage", json!([{"op": "raw", "line": "this is not JSON"}]), ExecutionStatus::Failed, "runtime_failed"),
            ("batch", json!([{"op": "batch"}]), ExecutionStatus::Failed, "runtime_failed"),
            ("flood", json!([{"op": "flood", "n": 200000}]), ExecutionStatus::Failed, "runtime_failed"),
            ("crash", json!([{"op": "crash"}]), ExecutionStatus::Failed, "runtime_failed"),
            (
                "bad-outcome",
                json!([{"op": "outcome", "value": {"type": "complete"}}]),
                ExecutionStatus::Failed,
                "invalid_runtime_outcome",
            ),
        ];
        let mut tasks = Vec::new();
        for (i, (name, script, status, code)) in hostile.into_iter().enumerate() {
            let ex = executor.clone();
            tasks.push(tokio::spawn(async move {
                let r = ex.execute(request(name, script), ExecuteOptions::default()).await.unwrap();
                assert_eq!((r.status, r.code()), (status, Some(code)), "{name}: {r:#?}");
            }));
            let ex = executor.clone();
            let req = good(i);
            tasks.push(tokio::spawn(async move {
                let r = ex.execute(req, ExecuteOptions::default()).await.unwrap();
                assert_eq!(r.status, ExecutionStatus::Succeeded, "{r:#?}");
                assert_eq!(r.metadata["k"], i);
                assert_eq!(r.output.as_ref().unwrap()["results"][0]["result"]["status"], "succeeded", "{:#?}", r.output);
                assert!(r.event_types().contains(&"runtime.event"));
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        for i in 0..5 {
            assert!(dir.path().join(format!("demo/alice/g{i}.txt")).is_file());
        }
    });
    sharedos_host::process::settle_kills();
}
