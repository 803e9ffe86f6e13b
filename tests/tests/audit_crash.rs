//! The audit trail survives a host crash: a real `sharedos run` process,
//! seating the testplugin in the sandbox, writes files through the kernel
//! in a loop and is SIGKILLed in the middle of the turn. Afterwards the
//! JSONL trail parses to its last line (no torn record), every file on
//! disk has the allowed `authorization.checked` decision of its call, and
//! no process of the turn survived the host (the sandbox's lifeline).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sharedos_tests::turns::{
    AGENT, NAMESPACE, descendants, is_alive, marked_pids, parse_jsonl_strict, request,
    testplugin_host_toml, wait_gone, workspace_bin,
};

/// Files (relative to the agent's directory, as path segments) under `dir`.
fn files_under(dir: &Path, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        prefix.push(name);
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            files_under(&e.path(), prefix, out);
        } else {
            out.push(prefix.clone());
        }
        prefix.pop();
    }
}

fn count_files(dir: &Path) -> usize {
    let mut out = Vec::new();
    files_under(dir, &mut Vec::new(), &mut out);
    out.len()
}

fn crash_once(launcher: &str, after_files: usize) {
    let dir = tempfile::tempdir().unwrap();
    let marker = format!("crash-{launcher}-{}-{after_files}", std::process::id());
    let config = dir.path().join("host.toml");
    std::fs::write(&config, testplugin_host_toml(&marker, launcher, 120_000)).unwrap();

    const N: usize = 200;
    // Sleepers in their own sessions that never exit on their own: only
    // the sandbox's lifeline can take them down with the host.
    let mut script = vec![json!({"op": "fork", "n": 2, "setsid": true})];
    for i in 0..N {
        script.push(json!({"op": "call", "tool": "files.write",
            "arguments": {"path": format!("notes/f{i:03}.txt"), "content": format!("entry {i}\n")}}));
        script.push(json!({"op": "sleep", "ms": 15}));
    }
    let req: PathBuf = dir.path().join("turn.json");
    std::fs::write(
        &req,
        request(
            "crash-turn-1",
            Value::Array(script),
            &["files.write"],
            120_000,
        )
        .to_string(),
    )
    .unwrap();

    let stdout = std::fs::File::create(dir.path().join("stdout")).unwrap();
    let stderr = std::fs::File::create(dir.path().join("stderr")).unwrap();
    let mut host = Command::new(workspace_bin("sharedos"))
        .arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--request")
        .arg(&req)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap();
    let host_pid = host.id();

    // Wait until the turn is well under way.
    let agent_dir = dir.path().join("files").join(NAMESPACE).join(AGENT);
    let until = Instant::now() + Duration::from_secs(60);
    while count_files(&agent_dir) < after_files {
        if let Ok(Some(status)) = host.try_wait() {
            panic!(
                "sharedos run ended before the crash ({status}): {}",
                std::fs::read_to_string(dir.path().join("stderr")).unwrap_or_default()
            );
        }
        assert!(Instant::now() < until, "the turn never got going");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Every process of the turn: the host's descendants (the sandbox
    // helper, its pid 1, the plugin) and anything carrying the marker.
    let mut tree = descendants(host_pid);
    for p in marked_pids(&marker) {
        if !tree.contains(&p) {
            tree.push(p);
        }
    }
    assert!(
        marked_pids(&marker).len() >= 3,
        "the plugin and its two sleepers are not all running (tree {tree:?})"
    );
    // The crash.
    // SAFETY: kill(2) on the child we spawned.
    unsafe {
        libc::kill(host_pid as i32, libc::SIGKILL);
    }
    let status = host.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );

    // No process of the turn survives its host.
    let until = Instant::now() + Duration::from_secs(10);
    let mut alive: Vec<u32> = tree.iter().copied().filter(|p| is_alive(*p)).collect();
    while !alive.is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
        alive = tree.iter().copied().filter(|p| is_alive(*p)).collect();
    }
    assert!(
        alive.is_empty(),
        "processes outlived the host: {alive:?} of {tree:?}"
    );
    assert!(
        wait_gone(&marker, Duration::from_secs(5)).is_empty(),
        "a marked process outlived the host"
    );

    // The trail parses to its last line.
    let records = parse_jsonl_strict(&dir.path().join("audit.jsonl"));
    assert!(!records.is_empty());
    assert!(
        !records.iter().any(|r| r["type"] == "turn.ended"),
        "the host was killed mid-turn, yet the turn ended"
    );
    let kinds: Vec<&str> = records
        .iter()
        .map(|r| r["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        &kinds[..3],
        [
            "authority.resolved",
            "authorization.checked",
            "tool.catalog.listed"
        ]
    );

    // Every file on disk has its call's allowed decision, written before
    // the effect.
    let mut files = Vec::new();
    files_under(&agent_dir, &mut Vec::new(), &mut files);
    let (temps, finals): (Vec<_>, Vec<_>) = files
        .into_iter()
        .partition(|f| f.last().is_some_and(|n| n.starts_with(".sharedos-tmp-")));
    assert!(
        finals.len() >= after_files && finals.len() < N,
        "{} files: not a crash mid-turn",
        finals.len()
    );
    let allowed_write = |r: &Value| {
        r["type"] == "authorization.checked"
            && r["outcome"] == "allowed"
            && r["action"] == "write"
            && r["resource"]["namespace"] == "files"
    };
    for f in &finals {
        let mut path = vec![json!(AGENT)];
        path.extend(f.iter().map(|s| json!(s)));
        let decision = records
            .iter()
            .position(|r| allowed_write(r) && r["resource"]["path"] == Value::Array(path.clone()));
        let Some(decision) = decision else {
            panic!("{f:?} is on disk without an allowed authorization.checked record");
        };
        let op = &records[decision]["operationId"];
        assert!(
            op.is_string(),
            "the decision names its call: {}",
            records[decision]
        );
        // The call's outcome record, when written, comes after its decision
        // and says it succeeded.
        if let Some(outcome) = records
            .iter()
            .position(|r| r["type"] == "tool.invoked" && &r["operationId"] == op)
        {
            assert!(outcome > decision);
            assert_eq!(
                records[outcome]["outcome"], "succeeded",
                "{}",
                records[outcome]
            );
        }
    }
    // A leftover temp file can only belong to the call that was in flight:
    // an allowed write whose outcome was never recorded.
    let in_flight = records
        .iter()
        .filter(|r| allowed_write(r))
        .filter(|d| {
            !records
                .iter()
                .any(|r| r["type"] == "tool.invoked" && r["operationId"] == d["operationId"])
        })
        .count();
    assert!(in_flight <= 1, "{in_flight} calls without an outcome");
    assert!(
        temps.len() <= in_flight,
        "temp files {temps:?}, in flight {in_flight}"
    );
    // No argument or file content reached the trail.
    let text = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
    assert!(!text.contains("entry "), "file contents in the audit trail");
    assert!(
        !text.contains("\"arguments\""),
        "arguments in the audit trail"
    );
}

/// Three crashes at different points of the turn.
#[test]
fn host_sigkill_mid_turn_sandboxed() {
    for after_files in [5, 30, 70] {
        crash_once("sandbox", after_files);
    }
}
