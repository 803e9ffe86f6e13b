//! Real runtimes under the full sandbox and its seccomp allowlist: Python
//! 3.11 and Node 20 programs doing real work (threads, subprocesses, file
//! I/O in the workspace and /tmp, timers, asyncio / promises, a Unix
//! socket, inotify, JSON, hashing, the environment) must exit 0 with the
//! expected output. The programs are in `tests/runtimes/`; their
//! `strace -f -c` outside the sandbox is the evidence behind the
//! allowlist (sandbox/src/layers/seccomp/allowed.rs).

mod common;

use std::path::Path;

use common::*;
use sharedos_sandbox::{LayerStatus, SandboxPolicy, SpawnSpec, spawn};

const PYTHON: &str = "/usr/bin/python3";
const NODE: &str = "/usr/bin/node";

/// Run `interpreter script` in the full sandbox with the script copied into
/// a fresh workspace; returns its parsed stdout and the workspace.
fn run_script(interpreter: &str, name: &str, text: &str) -> (serde_json::Value, tempfile::TempDir) {
    assert!(
        Path::new(interpreter).exists(),
        "{interpreter} is missing: these tests run the distribution's interpreters with the sandbox's default binds (scripts/test installs them as root, or says so)"
    );
    let ws = workspace();
    std::fs::write(ws.path().join(name), text).unwrap();
    let v = run_program(Path::new(interpreter), &[name], &ws);
    (v, ws)
}

/// Run `program args` in the full sandbox in `ws`; returns its parsed stdout.
fn run_program(program: &Path, args: &[&str], ws: &tempfile::TempDir) -> serde_json::Value {
    let spec = SpawnSpec {
        helper_exe: helper(),
        program: program.into(),
        args: args.iter().map(Into::into).collect(),
        env: vec![("SHAREDOS_RUNTIME_PROBE".into(), "from-the-host".into())],
        policy: SandboxPolicy::default(),
        // A host workspace: the scripts are written there before the spawn.
        workspace: Some(ws.path().to_path_buf()),
    };
    let mut child = spawn(&spec).expect("spawn the runtime");
    assert_eq!(child.report.level, full_level());
    assert_eq!(child.report.seccomp.status, LayerStatus::Applied);
    assert_eq!(child.report.seccomp.mode, "namespace");
    assert_eq!(child.report.seccomp.default_action, "ENOSYS");
    assert_eq!(child.report.seccomp.memfd_create, "deny");
    drop(child.stdin.take());
    let stderr = child.stderr.take().unwrap();
    let err_thread = std::thread::spawn(move || read_all(stderr));
    let out = read_all(child.stdout.take().unwrap());
    let status = child.wait().expect("wait");
    let err = err_thread.join().unwrap();
    let name = program.display();
    assert!(
        status.success(),
        "{name} failed under the filter: {status}\nstderr:\n{err}\nstdout:\n{out}"
    );
    serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("{name} printed {out:?}: {e}; stderr={err}"))
}

/// The workspace file the program wrote, read on the host side.
fn written(ws: &tempfile::TempDir, name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(ws.path().join(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn python_does_real_work_under_the_filter() {
    let (v, ws) = run_script(PYTHON, "work.py", include_str!("runtimes/work.py"));
    let expected = serde_json::json!({
        "asyncio": [3, "async:5", 0],
        "env": "from-the-host",
        "pool": [0, 1, 4, 9, 16],
        "random": 16,
        "self": "1024",
        "sh": "sub:42",
        "sha": "a49b32098ed43bb0",
        "threads": ["c31bca45", "8bfa2fa5", "c29a7b52", "d90e4db1"],
        "timer": true,
        "tmp": "tmp-ok",
        "unknown_syscall": "ENOSYS",
        "ws": [1, 2, 3],
    });
    assert_eq!(v, expected);
    assert_eq!(
        written(&ws, "py-out.json"),
        serde_json::json!({"k": [1, 2, 3]})
    );
}

#[test]
fn node_does_real_work_under_the_filter() {
    let (v, ws) = run_script(NODE, "work.js", include_str!("runtimes/work.js"));
    let expected = serde_json::json!({
        "env": "from-the-host",
        "random": 16,
        "self": ["1024", 0],
        "sh": "sub:42",
        "sha": "a49b32098ed43bb0",
        "threads": ["c31bca45", "8bfa2fa5", "c29a7b52", "d90e4db1"],
        "timer": true,
        "tmp": "tmp-ok",
        "unix": "ping",
        "watch": true,
        "ws": [1, 2, 3],
    });
    assert_eq!(v, expected);
    assert_eq!(
        written(&ws, "js-out.json"),
        serde_json::json!({"k": [1, 2, 3]})
    );
}

#[test]
fn static_rust_binary_does_real_work_under_the_filter() {
    // Built here with crt-static, as vendor CLIs like Codex ship: a static
    // binary makes its syscalls itself, with no shared libc in between.
    let build = tempfile::tempdir().unwrap();
    let exe = build.path().join("work-static");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/runtimes/work.rs");
    let out = std::process::Command::new(std::env::var("RUSTC").unwrap_or("rustc".into()))
        .args([
            "--edition",
            "2021",
            "-C",
            "target-feature=+crt-static",
            "-o",
        ])
        .arg(&exe)
        .arg(src)
        .output()
        .expect("run rustc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ws = workspace();
    let v = run_program(&exe, &[], &ws);
    let expected = serde_json::json!({
        "threads": [0, 499500, 999000, 1498500],
        "sh": "sub:42",
        "ws": "ws-ok",
        "tmp": "tmp-ok",
        "timer": true,
        "unix": "ping",
        "env": "from-the-host",
    });
    assert_eq!(v, expected);
    let text = std::fs::read_to_string(ws.path().join("rs-out.txt")).unwrap();
    assert_eq!(text, "ws-ok");
}

/// A WebAssembly module with one memory of 1 GiB (16384 pages, at most
/// 4 GiB), then a `fetch` to a closed port: undici compiles its
/// WebAssembly HTTP parser before it connects.
const WASM_FETCH: &str = r#"
(async () => {
  const bytes = new Uint8Array([0,97,115,109,1,0,0,0, 5,8,1,1,128,128,1,128,128,4]);
  const { instance } = await WebAssembly.instantiate(bytes);
  let fetchError = "none";
  try { await fetch("http://127.0.0.1:9/"); }
  catch (e) { fetchError = e.cause ? String(e.cause.message || e.cause) : String(e); }
  console.log(JSON.stringify({ ok: instance instanceof WebAssembly.Instance, fetchError }));
})().catch(e => { console.log(JSON.stringify({ ok: false, error: String(e) })); });
"#;

#[test]
fn node_instantiates_a_large_wasm_memory_and_fetch_loads_its_parser_under_the_default_policy() {
    let (v, _ws) = run_script(NODE, "wasm_fetch.js", WASM_FETCH);
    assert_eq!(v["ok"], true, "{v}");
    let fetch = v["fetchError"].as_str().unwrap_or_default();
    assert_ne!(fetch, "none", "the sandbox has no route to the port: {v}");
    assert!(!fetch.contains("memory"), "{v}");
}
