//! The standard runtime in process, against the real kernel, on the demo's
//! configuration and request.

use std::sync::Arc;

use sharedos_host::config::HostConfig;
use sharedos_host::executor::{ExecuteOptions, Executor, ExecutorOptions, Seat};
use sharedos_kernel::{Kernel, MemoryAuditSink};
use sharedos_protocol::{ExecutionRequest, ExecutionStatus};

#[tokio::test]
async fn demo_transcript_runs_in_process_against_the_real_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let config = HostConfig::parse(
        include_str!("../demo/host.toml"),
        "demo/host.toml",
        dir.path(),
    )
    .unwrap();
    let audit = Arc::new(MemoryAuditSink::new());
    let files_root = config.resolve(&config.host.files_root);
    std::fs::create_dir_all(&files_root).unwrap();
    let kernel = Arc::new(Kernel::from_config(&config.kernel, &files_root, audit.clone()).unwrap());
    let entry = config.runtime_for("alice").unwrap();
    let plugin = sharedos_standard::plugin(entry.transcript.clone().unwrap()).unwrap();
    let executor =
        Executor::new(kernel, Seat::in_process(plugin), ExecutorOptions::default()).unwrap();
    let request: ExecutionRequest =
        serde_json::from_str(include_str!("../demo/turn.json")).unwrap();
    let result = executor
        .execute(request, ExecuteOptions::default())
        .await
        .unwrap();

    assert_eq!(result.status, ExecutionStatus::Succeeded, "{result:#?}");
    let results = result.output.as_ref().unwrap()["results"]
        .as_array()
        .unwrap()
        .clone();
    let statuses: Vec<(&str, &str)> = results
        .iter()
        .map(|r| (r["tool"].as_str().unwrap(), r["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        statuses,
        vec![
            ("files.write", "succeeded"),
            ("files.list", "succeeded"),
            ("files.read", "succeeded"),
            ("files.write", "denied"),
            ("files.delete", "denied"),
            ("files.read", "failed"),
        ]
    );
    // Re-authorized by the kernel: outside the granted subtree.
    assert_eq!(results[3]["code"], "no_matching_grant");
    // Refused by the envelope: not in the permission-filtered catalogue.
    assert_eq!(results[4]["code"], "tool_unavailable");
    assert_eq!(
        results[2]["output"]["content"],
        "1. read the brief\n2. write the plan\n"
    );
    // The file is on disk, inside the agent's directory, and nothing left it.
    assert!(files_root.join("demo/alice/notes/plan.md").is_file());
    assert!(!files_root.join("etc").exists());
    assert!(!files_root.join("demo/alice/secrets").exists());
    // Provenance and the prompt hash stated by the loop.
    assert_eq!(result.metadata["runtime"]["id"], "sharedos.standard");
    assert_eq!(result.metadata["promptHash"].as_str().unwrap().len(), 64);
    let kinds = result.event_types();
    assert_eq!(kinds.first(), Some(&"turn.started"));
    assert_eq!(kinds.last(), Some(&"turn.completed"));
    assert_eq!(kinds.iter().filter(|k| **k == "tool.requested").count(), 6);
    assert_eq!(kinds.iter().filter(|k| **k == "tool.completed").count(), 6);
    // The audit trail records the end of the turn and every call.
    let types: Vec<String> = audit
        .records()
        .iter()
        .map(|r| {
            serde_json::to_value(r).unwrap()["type"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    assert!(types.iter().any(|t| t == "turn.ended"), "{types:?}");
    assert!(
        types.iter().filter(|t| *t == "tool.invoked").count() >= 6,
        "{types:?}"
    );
}
