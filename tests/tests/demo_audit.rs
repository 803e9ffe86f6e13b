//! The demo tells the whole story: a real sandboxed turn of the standard
//! runtime (`host/demo/host.toml` + `host/demo/turn.json`, copied to a
//! temporary directory and run with `sharedos run`, and `sharedos demo
//! --keep` itself) leaves an audit trail that says, in order, who had what
//! authority, that the turn was admitted, which catalogue it was served,
//! for every call the decision before its outcome (or the envelope's
//! refusal), and how the turn ended, with no arguments or file contents,
//! and whose calls match the result's events one for one.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};
use sharedos_tests::turns::{parse_jsonl_strict, workspace_bin};

fn demo_file(name: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    std::fs::read_to_string(root.join("host/demo").join(name)).unwrap()
}

/// Checks the trail against the result printed on stdout.
fn check_story(audit_path: &Path, result: &Value) {
    let records = parse_jsonl_strict(audit_path);
    let kinds: Vec<&str> = records
        .iter()
        .map(|r| r["type"].as_str().unwrap())
        .collect();
    assert_eq!(result["status"], "succeeded", "{result}");
    assert_eq!(
        result["metadata"]["runtime"]["sandbox"]["level"],
        sharedos_tests::full_level(),
        "the demo ran sandboxed: {}",
        result["metadata"]["runtime"]
    );

    // Every record belongs to this turn.
    for r in &records {
        assert_eq!(r["traceId"], "trace-demo-1", "{r}");
        assert_eq!(r["namespaceId"], "demo", "{r}");
        assert_eq!(
            r["actor"],
            json!({"kind": "agent", "agentId": "alice"}),
            "{r}"
        );
    }

    // The opening: authority, admission, catalogue.
    assert_eq!(
        &kinds[..3],
        [
            "authority.resolved",
            "authorization.checked",
            "tool.catalog.listed"
        ],
        "{kinds:?}"
    );
    assert_eq!(records[0]["outcome"], "allowed");
    assert!(records[0]["authorityHash"].is_string());
    let admission = &records[1];
    assert_eq!(admission["outcome"], "allowed", "{admission}");
    assert_eq!(admission["action"], "invoke");
    assert_eq!(admission["resource"]["namespace"], "sharedos.execution");
    assert_eq!(admission["resource"]["path"], json!(["agent", "alice"]));
    assert_eq!(admission["grantId"], "alice-admission");
    let listed = &records[2];
    let catalog_hash = listed["metadata"]["catalogHash"].clone();
    assert!(catalog_hash.is_string(), "{listed}");
    // files.read, files.write, files.list; files.delete (no grant) and
    // sharedos.escalate (no grant) withheld.
    assert_eq!(listed["metadata"]["listedCount"], 3, "{listed}");
    assert_eq!(listed["metadata"]["withheldCount"], 2, "{listed}");
    let started = &result["events"][0];
    assert_eq!(started["type"], "turn.started");
    assert_eq!(
        started["data"]["visibleTools"],
        json!(["files.read", "files.write", "files.list"])
    );

    // The ending.
    let last = records.last().unwrap();
    assert_eq!(last["type"], "turn.ended");
    assert_eq!(last["outcome"], "succeeded");
    assert_eq!(last["operationId"], "demo-turn-1");
    assert_eq!(kinds.iter().filter(|k| **k == "turn.ended").count(), 1);

    // Every call of the result, in order, against its records.
    let calls: Vec<&Value> = result["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "tool.completed")
        .collect();
    assert_eq!(calls.len(), 6, "the demo's transcript makes six calls");
    let invoked: Vec<usize> = (0..records.len())
        .filter(|i| records[*i]["type"] == "tool.invoked")
        .collect();
    assert_eq!(invoked.len(), calls.len(), "one tool.invoked per call");
    let mut seen_kinds = Vec::new();
    for (event, &at) in calls.iter().zip(&invoked) {
        let data = &event["data"];
        let rec = &records[at];
        let call_id = &data["callId"];
        assert_eq!(&rec["operationId"], call_id, "calls out of order: {rec}");
        assert_eq!(rec["tool"], data["tool"], "{rec}");
        assert_eq!(rec["outcome"], data["status"], "{rec} vs {data}");
        assert_eq!(
            rec["reason"],
            data.get("code").cloned().unwrap_or(Value::Null),
            "{rec}"
        );
        let decisions: Vec<usize> = (0..records.len())
            .filter(|i| {
                records[*i]["type"] == "authorization.checked"
                    && &records[*i]["operationId"] == call_id
            })
            .collect();
        let kind = match rec["source"].as_str() {
            Some("envelope") => {
                // Refused by the envelope: the kernel never decided.
                assert!(decisions.is_empty(), "{rec}");
                assert_eq!(rec["cause"], "not_offered", "{rec}");
                "envelope refusal"
            }
            Some("kernel") if rec["reason"] == "invalid_tool_arguments" => {
                // Arguments refused before any authorization.
                assert!(decisions.is_empty(), "{rec}");
                assert_eq!(rec["outcome"], "failed");
                "invalid arguments"
            }
            Some("kernel") => {
                let [d] = decisions.as_slice() else {
                    panic!("call {call_id} has {} decisions", decisions.len());
                };
                assert!(*d < at, "the decision of {call_id} comes after its outcome");
                // Nothing else happened between the decision and the outcome.
                assert_eq!(*d + 1, at, "records interleaved within {call_id}");
                let decision = &records[*d];
                assert_eq!(decision["resource"], rec["resource"]);
                assert_eq!(decision["action"], rec["action"]);
                if rec["outcome"] == "denied" {
                    assert_eq!(decision["outcome"], "denied");
                    assert_eq!(decision["reason"], rec["reason"]);
                    "kernel denial"
                } else {
                    assert_eq!(decision["outcome"], "allowed", "{decision}");
                    assert_eq!(decision["grantId"], "alice-memory");
                    assert_eq!(rec["grantId"], "alice-memory");
                    "kernel allowed"
                }
            }
            other => panic!("tool.invoked source {other:?}"),
        };
        if rec["source"] == "kernel" {
            assert_eq!(rec["metadata"]["catalogHash"], catalog_hash, "{rec}");
        }
        seen_kinds.push(kind);
    }
    assert_eq!(
        seen_kinds,
        [
            "kernel allowed",
            "kernel allowed",
            "kernel allowed",
            "kernel denial",
            "envelope refusal",
            "invalid arguments"
        ]
    );
    // The written plan resource, and the denied secret, as resources only.
    assert_eq!(
        records[invoked[0]]["resource"]["path"],
        json!(["alice", "notes", "plan.md"])
    );
    assert_eq!(
        records[invoked[3]]["resource"]["path"],
        json!(["alice", "secrets", "key.txt"])
    );
    // Between the catalogue and the end there are only call records.
    for k in &kinds[3..kinds.len() - 1] {
        assert!(
            ["authorization.checked", "tool.invoked"].contains(k),
            "unexpected record {k}"
        );
    }

    // No arguments, file contents, payloads or outputs anywhere.
    let text = std::fs::read_to_string(audit_path).unwrap();
    for needle in [
        "read the brief",
        "write the plan",
        "\"nope\"",
        "etc/passwd",
        "\"arguments\"",
        "\"content\"",
        "Write your plan",
        "\"output\"",
    ] {
        assert!(!text.contains(needle), "the audit trail contains {needle}");
    }
}

#[test]
fn run_of_the_demo_config_tells_the_whole_story() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("host.toml"), demo_file("host.toml")).unwrap();
    std::fs::write(dir.path().join("turn.json"), demo_file("turn.json")).unwrap();
    let out = Command::new(workspace_bin("sharedos"))
        .arg("run")
        .arg("--config")
        .arg(dir.path().join("host.toml"))
        .arg("--request")
        .arg(dir.path().join("turn.json"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "sharedos run failed: {stderr}");
    let result: Value = serde_json::from_slice(&out.stdout).expect("the result JSON on stdout");
    check_story(&dir.path().join("audit.jsonl"), &result);
    // The file the turn wrote is on disk.
    assert_eq!(
        std::fs::read_to_string(dir.path().join("files/demo/alice/notes/plan.md")).unwrap(),
        "1. read the brief\n2. write the plan\n"
    );
}

#[test]
fn demo_keep_tells_the_whole_story() {
    let out = Command::new(workspace_bin("sharedos"))
        .args(["demo", "--keep"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "sharedos demo failed: {stderr}");
    let kept = stderr
        .lines()
        .find_map(|l| l.strip_prefix("sharedos demo: kept "))
        .unwrap_or_else(|| panic!("no kept directory in: {stderr}"))
        .trim()
        .to_owned();
    let kept = std::path::PathBuf::from(kept);
    let result: Value = serde_json::from_slice(&out.stdout).expect("the result JSON on stdout");
    let audit = kept.join("audit.jsonl");
    let outcome = std::panic::catch_unwind(|| check_story(&audit, &result));
    let _ = std::fs::remove_dir_all(&kept);
    if let Err(e) = outcome {
        std::panic::resume_unwind(e);
    }
}
