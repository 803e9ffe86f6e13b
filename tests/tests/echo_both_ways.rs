//! The same plugin code runs in process and out of process unchanged: the
//! echo plugin through the envelope with the real kernel, once called
//! directly, once as a child process (direct launch and full sandbox). The
//! results agree on everything but ids, clocks and the provenance of
//! isolation.

use std::sync::Arc;

use serde_json::{Value, json};
use sharedos_host::executor::{ExecuteOptions, Executor, ExecutorOptions, Seat};
use sharedos_host::process::{DirectLauncher, Launcher, ProcessRuntime, ProcessRuntimeConfig};
use sharedos_host::sandboxed::SandboxLauncher;
use sharedos_host::seat::process_seat;
use sharedos_protocol::{ExecutionRequest, ExecutionResult, ExecutionStatus, RuntimeManifest};
use sharedos_tests::{demo_kernel, plugin_bin};

fn request() -> ExecutionRequest {
    let mut r: ExecutionRequest =
        serde_json::from_str(include_str!("../../host/demo/turn.json")).unwrap();
    r.message.payload = json!({"calls": [
        {"tool": "files.write", "arguments": {"path": "a.txt", "content": "hello"}},
        {"tool": "files.read", "arguments": {"path": "a.txt"}},
        {"tool": "files.delete", "arguments": {"path": "a.txt"}},
        {"tool": "files.read", "arguments": {"path": "../../x"}}
    ]});
    r
}

async fn run(seat: Seat) -> (ExecutionResult, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let kernel = demo_kernel(dir.path());
    let executor = Executor::new(Arc::new(kernel), seat, ExecutorOptions::default()).unwrap();
    let result = executor
        .execute(request(), ExecuteOptions::default())
        .await
        .unwrap();
    (result, dir)
}

fn process(launcher: Arc<dyn Launcher>) -> Seat {
    let manifest = RuntimeManifest::new("sharedos-echo", env!("CARGO_PKG_VERSION")).unwrap();
    let runtime = ProcessRuntime::new(
        ProcessRuntimeConfig::new(plugin_bin("sharedos-echo"), manifest),
        launcher,
    )
    .unwrap();
    process_seat(Arc::new(runtime))
}

/// What must agree: status, output without clocks, event kinds and data
/// without ids and clocks, metadata without the isolation report.
fn comparable(r: &ExecutionResult) -> Value {
    fn strip(v: &Value) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .filter(|(k, _)| !matches!(k.as_str(), "completedAt" | "sandbox"))
                    .map(|(k, v)| (k.clone(), strip(v)))
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.iter().map(strip).collect()),
            other => other.clone(),
        }
    }
    json!({
        "status": r.status,
        "output": strip(r.output.as_ref().unwrap_or(&Value::Null)),
        "events": r.events.iter().map(|e| json!({"type": e.kind.as_str(), "data": strip(&e.data)})).collect::<Vec<_>>(),
        "metadata": strip(&Value::Object(r.metadata.clone())),
    })
}

#[test]
fn echo_runs_unchanged_in_process_and_out_of_process() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (inproc, dir1) = run(Seat::in_process(Arc::new(sharedos_echo::Echo))).await;
        let (direct, dir2) = run(process(Arc::new(DirectLauncher))).await;
        let sandbox = SandboxLauncher::new(plugin_bin("sharedos"), Default::default());
        let (sandboxed, dir3) = run(process(Arc::new(sandbox))).await;

        assert_eq!(inproc.status, ExecutionStatus::Succeeded, "{inproc:#?}");
        let statuses: Vec<&str> = inproc.output.as_ref().unwrap()["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["status"].as_str().unwrap())
            .collect();
        assert_eq!(statuses, ["succeeded", "succeeded", "denied", "failed"]);
        assert_eq!(inproc.metadata["echo.calls"], 4);

        assert_eq!(
            comparable(&inproc),
            comparable(&direct),
            "in process vs direct child"
        );
        assert_eq!(
            comparable(&inproc),
            comparable(&sandboxed),
            "in process vs sandboxed child"
        );

        // What differs is only how the seat was isolated, and the result says so.
        assert!(inproc.metadata["runtime"].get("sandbox").is_none());
        assert_eq!(direct.metadata["runtime"]["sandbox"]["level"], "none");
        assert_eq!(
            sandboxed.metadata["runtime"]["sandbox"]["level"],
            sharedos_tests::full_level()
        );
        // The file the plugin wrote is on disk in each run's agent directory.
        for d in [&dir1, &dir2, &dir3] {
            assert_eq!(
                std::fs::read_to_string(d.path().join("demo/alice/a.txt")).unwrap(),
                "hello"
            );
        }
    });
}
