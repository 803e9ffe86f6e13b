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
        // The teardown runs off the turn's path; settle_kills waits for it.
        sharedos_host::process::settle_kills();
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
        let report = sharedos_host::provenance::TurnReport::default();
        let out = rt
            .run_reported(
                turn_request("exec-echo", json!({})),
                host.clone(),
                Signal::never(),
                &report,
            )
            .await
            .unwrap();
        assert_eq!(out, RuntimeTurnOutcome::complete(json!({"results": []})));
        assert_eq!(
            report.sandbox().map(|r| r["level"].clone()),
            Some(json!("none")),
            "a direct launch says it has no sandbox"
        );
        // The teardown runs off the turn's path; settle_kills waits for it.
        sharedos_host::process::settle_kills();
        assert!(live_children().is_empty());
    })
}

#[test]
fn the_sdk_falls_back_when_stdio_is_a_file() {
    // It starts a child: keep it out of the other tests' child checks.
    let _serial = sharedos_tests::serial();
    // stdin and stdout are regular files, not pipes: the SDK cannot use
    // epoll pipes and falls back to blocking-thread file handles.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.ndjson");
    let output = dir.path().join("out.ndjson");
    let limits =
        json!({"maxMessageBytes": 1 << 20, "maxInflightToolCalls": 8, "maxConcurrentTurns": 1});
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize",
        "params":{"protocolVersions":[1],"host":{"name":"test","version":"0"},"limits":limits}});
    let run = json!({"jsonrpc":"2.0","id":2,"method":"turn/run","params":{
        "turnId":"t-file","request":turn_request("exec-file", json!({})),
        "limits":{"maxSteps":1,"maxToolCalls":1,"timeoutMs":1000}}});
    std::fs::write(&input, format!("{init}\n{run}\n")).unwrap();
    let status = std::process::Command::new(sharedos_tests::plugin_bin("sharedos-echo"))
        .env_clear()
        .env("SHAREDOS_PLUGIN", "1")
        .stdin(std::fs::File::open(&input).unwrap())
        .stdout(std::fs::File::create(&output).unwrap())
        .status()
        .unwrap();
    assert!(status.success());
    let out = std::fs::read_to_string(&output).unwrap();
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["id"], 1);
    assert_eq!(lines[0]["result"]["manifest"]["id"], "sharedos-echo");
    let outcome = lines
        .iter()
        .find(|l| l["id"] == 2)
        .expect("the turn/run answer");
    assert_eq!(outcome["result"]["type"], "complete");
    assert!(lines.iter().any(|l| l["method"] == "host/annotate"));
}
