//! The audit trail survives a host crash with 64 calls in flight, where
//! the JSONL sink commits many records per `fsync` (group commit): a real
//! `sharedos run` writes files through the kernel, 64 calls at a time, and
//! is SIGKILLed after a random number of them. Afterwards the trail parses
//! to its last line (no torn record), every file on disk has its call's
//! allowed decision, any outcome comes after its decision, and only calls
//! in flight at the crash lack an outcome.

use std::collections::HashSet;
use std::hash::BuildHasher;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_tests::turns::{
    AGENT, NAMESPACE, parse_jsonl_strict, request, testplugin_host_toml, workspace_bin,
};

const CALLS: u64 = 1000;
const IN_FLIGHT: u64 = 64;

/// Files in place under `dir` (a write's temp file is not one yet), and
/// the temp files.
fn files(dir: &std::path::Path) -> (Vec<String>, Vec<String>) {
    let names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names
        .into_iter()
        .partition(|n| !n.starts_with(".sharedos-tmp-"))
}

fn crash_after(launcher: &str, after_files: usize) {
    let dir = tempfile::tempdir().unwrap();
    let marker = format!("crash-inflight-{launcher}-{}", std::process::id());
    let config = dir.path().join("host.toml");
    std::fs::write(&config, testplugin_host_toml(&marker, launcher, 120_000)).unwrap();
    let script = json!([{"op": "parallel_calls", "tool": "files.write", "n": CALLS,
        "inflight": IN_FLIGHT,
        "arguments": {"path": "inflight/f{n}.txt", "content": "entry {n}\n"}}]);
    let req: PathBuf = dir.path().join("turn.json");
    let turn = request("crash-inflight-1", script, &["files.write"], 120_000);
    std::fs::write(&req, turn.to_string()).unwrap();
    let mut host = Command::new(workspace_bin("sharedos"))
        .arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--request")
        .arg(&req)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("stderr")).unwrap())
        .spawn()
        .unwrap();
    let written = dir
        .path()
        .join("files")
        .join(NAMESPACE)
        .join(AGENT)
        .join("inflight");
    let until = Instant::now() + Duration::from_secs(60);
    while files(&written).0.len() < after_files {
        if let Ok(Some(status)) = host.try_wait() {
            panic!(
                "sharedos run ended before the crash ({status}): {}",
                std::fs::read_to_string(dir.path().join("stderr")).unwrap_or_default()
            );
        }
        assert!(Instant::now() < until, "the calls never got going");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The crash.
    // SAFETY: kill(2) on the child we spawned.
    unsafe {
        libc::kill(host.id() as i32, libc::SIGKILL);
    }
    host.wait().unwrap();

    let records = parse_jsonl_strict(&dir.path().join("audit.jsonl"));
    let (finals, temps) = files(&written);
    assert!(
        finals.len() >= after_files && (finals.len() as u64) < CALLS,
        "{} files: not a crash mid-turn",
        finals.len()
    );
    let decision_of = |name: &str| {
        let path = json!([AGENT, "inflight", name]);
        records.iter().position(|r| {
            r["type"] == "authorization.checked"
                && r["outcome"] == "allowed"
                && r["action"] == "write"
                && r["resource"]["path"] == path
        })
    };
    for f in &finals {
        let Some(decision) = decision_of(f) else {
            panic!("{f} is on disk without an allowed authorization.checked record");
        };
        let op = &records[decision]["operationId"];
        if let Some(outcome) = records
            .iter()
            .position(|r| r["type"] == "tool.invoked" && &r["operationId"] == op)
        {
            assert!(outcome > decision, "{f}: its outcome before its decision");
            assert_eq!(records[outcome]["outcome"], "succeeded");
        }
    }
    // Only the calls in flight at the crash lack an outcome, and only they
    // can have left a temp file.
    let outcomes: HashSet<&Value> = records
        .iter()
        .filter(|r| r["type"] == "tool.invoked")
        .map(|r| &r["operationId"])
        .collect();
    let in_flight = records
        .iter()
        .filter(|r| r["type"] == "authorization.checked" && r["action"] == "write")
        .filter(|d| !outcomes.contains(&d["operationId"]))
        .count();
    assert!(
        in_flight as u64 <= IN_FLIGHT,
        "{in_flight} calls without an outcome"
    );
    assert!(
        temps.len() <= in_flight,
        "temps {temps:?}, in flight {in_flight}"
    );
}

/// A point of the run picked at random for each test run.
fn random_point() -> usize {
    let r = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
    20 + (r % 600) as usize
}

#[test]
fn a_crash_with_calls_in_flight_leaves_every_effect_with_its_decision() {
    for _ in 0..3 {
        let point = random_point();
        eprintln!("crash after {point} files");
        crash_after("direct", point);
    }
}
