//! The `sharedos-echo` template plugin (built on the SDK's `serve`) through
//! `ProcessRuntime`: several tool calls, progress events and an
//! annotation, in order.

use serde_json::json;
use sharedos_plugin_sdk::{RuntimePlugin, RuntimeTurnOutcome, Signal};
use sharedos_tests::{Record, RecordingHost, isolated, live_children, runtime, turn_request};

#[test]
fn echo_calls_each_tool_then_completes_with_the_results() {
    isolated(async {
        let rt = runtime(
            "sharedos-echo",
            &[],
            ("sharedos-echo", env!("CARGO_PKG_VERSION")),
            |_| {},
        );
        let host = RecordingHost::new();
        let payload = json!({"calls": [
            {"tool": "files.read", "arguments": {"path": "a.txt"}},
            {"tool": "forbidden", "arguments": {}},
            {"tool": "files.read", "arguments": {"path": "b.txt"}},
        ]});
        let out = rt
            .run(
                turn_request("exec-echo", payload),
                host.clone(),
                Signal::never(),
            )
            .await
            .unwrap();
        let RuntimeTurnOutcome::Complete { output, .. } = out else {
            panic!("{out:?}")
        };
        let results = output["results"].as_array().unwrap();
        assert_eq!(results.len(), 3);
        assert_eq!(results[0]["status"], "succeeded");
        assert_eq!(results[0]["output"]["echo"]["path"], "a.txt");
        assert_eq!(results[1]["status"], "denied");
        assert_eq!(results[1]["error"]["code"], "tool_unavailable");
        let tool = |path: &str, step| Record::Tool {
            tool: "files.read".into(),
            step: Some(step),
            arguments: json!({"path": path}),
        };
        let progress = |done| Record::Emit {
            kind: "progress".into(),
            data: json!({"done": done, "total": 3}),
        };
        assert_eq!(
            host.records(),
            [
                tool("a.txt", 0),
                progress(1),
                Record::Tool {
                    tool: "forbidden".into(),
                    step: Some(1),
                    arguments: json!({})
                },
                progress(2),
                tool("b.txt", 2),
                progress(3),
                Record::Annotate {
                    key: "echo.calls".into(),
                    value: json!(3)
                },
            ]
        );
        assert!(live_children().is_empty());
    })
}

#[test]
fn echo_passes_the_manifest_check_and_handles_an_empty_turn() {
    isolated(async {
        let rt = runtime(
            "sharedos-echo",
            &[],
            ("sharedos-echo", env!("CARGO_PKG_VERSION")),
            |_| {},
        );
        let host = RecordingHost::new();
        let out = rt
            .run(
                turn_request("exec-echo", json!({})),
                host.clone(),
                Signal::never(),
            )
            .await
            .unwrap();
        assert_eq!(out, RuntimeTurnOutcome::complete(json!({"results": []})));
        assert!(
            rt.take_sandbox_report("exec-echo").is_none(),
            "a direct launch has no sandbox report"
        );
        assert!(live_children().is_empty());
    })
}
