//! `sharedos-testplugin`: a scriptable, deliberately hostile runtime plugin
//! for the host's tests. It speaks raw NDJSON itself (not through the SDK)
//! so that it can break every rule on purpose.
//!
//! Before the handshake, the first argument selects a mode:
//! `normal` (default), `silent` (never answers `initialize`), `noise`
//! (prints to stdout before the handshake), `wrong-manifest` (reports
//! another runtime id), `bad-version` (chooses protocol version 99),
//! `exit-early` (exits 3 before reading anything), `crash-early` (aborts,
//! SIGABRT, before reading anything), `stderr-exit` (writes 200 numbered
//! stderr lines, then exits 4 before reading anything), `early-request` (sends a
//! request of an unknown method before answering `initialize`), `many`
//! (accepts `turns: "many"`: serves turn after turn on one connection when
//! the host offers it; its outcome's `turnsServed` counts them).
//!
//! During the turn it runs the script in `request.message.payload.script`
//! (its tool calls carry the trace id `trace-testplugin`, or the turn's own
//! when the payload has `"traceFromTurn": true`),
//! an array of steps `{"op": ..., ...}`: first the steps it shares with the
//! in-process `ScriptPlugin` (`sharedos_testplugin::Step`: `call`, `emit`,
//! `annotate`, `sleep`, `stall`, `wait_draining`, `throw`, `return`, ...;
//! see `scripted.rs`), so a scenario is written once and runs both ways;
//! then the hostile ones only a raw speaker can send (see [`step`] and
//! [`file_step`]). Unless a step already answered `turn/run`, it completes
//! with `{"results": [...], "draining": ...}` (the answers to its tool
//! calls, and what the shared steps measured) at the end, then reads stdin
//! until EOF.
//!
//! `--sleeper [--setsid] [--double] [--pidfile PATH]` is the helper the
//! `fork` step starts: it keeps the inherited stdio open and sleeps.
//!
//! With `SHAREDOS_TEST_SIGNAL_LOG=<path>` in its environment, it appends a
//! line `<method> <unix ms>` to that file for every `turn/draining` and
//! `turn/abort` it reads, so a test can see the host's signals on the wire.
//! With `SHAREDOS_TEST_DRAIN_BUSY_MS=<ms>`, `hold` keeps a CPU busy for
//! that long after `turn/draining` before reading on (a plugin slow to
//! read).

#![forbid(unsafe_code)]

use std::fs::OpenOptions;
use std::io::{BufReader, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod connection;
mod egress;
mod inflight;
mod scripted;
mod tunnel;

use connection::{Plugin, hold};
use scripted::Flow;
use sharedos_testplugin::{ID, VERSION};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--sleeper") {
        sleeper(&args[2..]);
    }
    let mode = args.get(1).cloned().unwrap_or_else(|| "normal".into());
    eprintln!("testplugin: pid {} mode {mode}", std::process::id());
    if mode == "exit-early" {
        std::process::exit(3);
    }
    if mode == "crash-early" {
        eprintln!("testplugin: crashing before initialize");
        std::process::abort();
    }
    if mode == "stderr-exit" {
        stderr_lines(200);
        std::process::exit(4);
    }
    let mut p = Plugin {
        input: BufReader::new(std::io::stdin()),
        out: std::io::stdout(),
        turn_id: Value::Null,
        run_id: Value::Null,
        next_id: 1,
        ignore_abort: false,
        draining: false,
        aborted: false,
        outcome_sent: false,
        results: Vec::new(),
        reports: serde_json::Map::new(),
        trace: json!("trace-testplugin"),
    };
    if mode == "noise" {
        p.write_raw(b"Starting testplugin v0.1.0 ... ready\n");
    }
    let init = p.read();
    if mode == "early-request" {
        p.send(&json!({"jsonrpc":"2.0","id":"probe","method":"probe/unknown","params":{}}));
    }
    if mode == "silent" {
        loop {
            let _ = p.read();
        }
    }
    let (id, version) = match mode.as_str() {
        "wrong-manifest" => ("some-other-runtime", 1),
        "bad-version" => (ID, 99),
        _ => (ID, 1),
    };
    // `many` accepts several turns on the connection, when the host offers.
    let many = mode == "many" && init["params"]["capabilities"]["turns"] == json!("many");
    let capabilities = if mode == "many" {
        json!({"turns": "many"})
    } else {
        json!({})
    };
    p.send(&json!({"jsonrpc":"2.0","id":init["id"],"result":{
        "protocolVersion": version,
        "manifest": {"id": id, "version": VERSION, "protocolVersion": "1"},
        "sdk": "testplugin-raw", "capabilities": capabilities
    }}));
    let mut served = 0u64;
    loop {
        served += 1;
        serve_turn(&mut p, (mode == "many").then_some(served));
        if !many {
            break;
        }
    }
    loop {
        let _ = p.read();
    }
}

/// Waits for `turn/run`, runs its script, answers it. What a turn leaves
/// in the plugin's own state (`turn_id`, its results, the drain) is reset
/// here: only the process's memory (`served`) and files carry over.
fn serve_turn(p: &mut Plugin, served: Option<u64>) {
    let run = loop {
        let m = p.read();
        if m.get("method").and_then(Value::as_str) == Some("turn/run") {
            break m;
        }
    };
    p.turn_id = run["params"]["turnId"].clone();
    p.run_id = run["id"].clone();
    p.outcome_sent = false;
    p.draining = false;
    p.aborted = false;
    p.results.clear();
    p.reports.clear();
    p.trace = json!("trace-testplugin");
    if run["params"]["request"]["message"]["payload"]["traceFromTurn"] == json!(true) {
        p.trace = run["params"]["request"]["context"]["traceId"].clone();
    }
    let script = run["params"]["request"]["message"]["payload"]["script"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for s in &script {
        match scripted::run(p, s) {
            Some(Flow::End) => break,
            Some(Flow::Next) => {}
            None if file_step(p, s) => {}
            None => step(p, s),
        }
    }
    if !p.outcome_sent {
        let results = std::mem::take(&mut p.results);
        let mut output = json!({"results": results, "draining": p.draining});
        for (key, value) in std::mem::take(&mut p.reports) {
            output[key] = value;
        }
        if let Some(n) = served {
            output["turnsServed"] = json!(n);
        }
        p.outcome(json!({"type": "complete", "output": output}));
    }
}

/// `write_file {path, text}`, `read_file {path}`: a file of the plugin's
/// own (its `/tmp` in the sandbox), what happened going into results;
/// `false` for any other step.
fn file_step(p: &mut Plugin, s: &Value) -> bool {
    let path = s["path"].as_str().unwrap_or("/tmp/testplugin");
    match s.get("op").and_then(Value::as_str) {
        Some("write_file") => {
            let written = std::fs::write(path, s["text"].as_str().unwrap_or_default()).is_ok();
            p.results.push(json!({"wrote": path, "ok": written}));
        }
        Some("read_file") => {
            let text = std::fs::read_to_string(path).ok();
            p.results.push(json!({"read": path, "text": text}));
        }
        _ => return false,
    }
    true
}

fn num(s: &Value, key: &str, default: u64) -> u64 {
    s.get(key).and_then(Value::as_u64).unwrap_or(default)
}

/// One hostile script step (the shared ones, `emit`, `annotate`, `call`,
/// `sleep`, `stall`, ..., run first: `scripted.rs`). Ops:
/// - `call_nowait {tool, arguments, step?}`: sends the call, never reads the answer
/// - `send_call {tool, arguments}`: a tool call whose answer it does not
///   wait for (later reads skip it)
/// - `burst_calls {n, tool}`: n calls without waiting, then all n answers
/// - `flood {n}`: n emits as fast as the pipe takes them
/// - `spin {ms?}` (busy loop; forever without ms)
/// - `ignore_abort`: from now on `turn/abort` does not make it exit
/// - `hold`: keeps reading (and ignoring) host messages; at stdin EOF it
///   does not exit but sleeps forever (with `ignore_abort`: a plugin that
///   ignores both `turn/abort` and EOF)
/// - `emit_pid`: emits `{type:"pid", data:{pid}}`
/// - `fork {n, setsid?, double?, pidfile?}`: starts n sleepers that keep the
///   pipes open and emits `{type:"forked", data:{pids}}`
/// - `crash` (abort), `exit {code}`, `close_stdout` (then sleeps)
/// - `raw_unterminated {line}`: writes `line` without the `\n`
/// - `outcome_unterminated {value}`: answers `turn/run` without the `\n`
/// - `stderr_flood {bytes}`: writes that many bytes to stderr (lines of
///   1 KiB), as fast as the pipe takes them
/// - `raw {line}`, `invalid_utf8`, `long_line {bytes}`, `batch`,
///   `bogus_response` (an answer to id 999 never sent)
/// - `stderr {text}`: writes `text` and a newline to stderr
/// - `alloc {mib}`: allocates and touches `mib` MiB and keeps it
/// - `fs_probe {read, write}`: reads each path of `read` and writes each
///   of `write`, emitting `{type:"fs_probe", data:{read:{path: content or
///   "error: ..."}, write:{path: "ok" or "error: ..."}}}`
/// - `invoke_as_notification {tool, n?}`: sends `host/invokeTool` without an
///   id, n times (default 1)
/// - `big_calls {n, bytes, tool}`: n tool calls one after the other, each
///   carrying `bytes` bytes of padding in its arguments
/// - `write_files {n, bytes}`: n `files.write` calls one after the other,
///   `bulk/fNNNN.bin`, each `bytes` bytes long
/// - `emit_many {n, type, data}`: the same event `n` times, as fast as the
///   pipe takes them; `annotate_many {n, value}`: keys `k0`..`k<n-1>`
/// - `outcome {value}`: answers `turn/run` with `value` (again, if repeated)
/// - `error_outcome {code, message}`: answers `turn/run` with an error
/// - `net_probe {targets, resolve?}`, `egress_flood {n, path}`,
///   `egress_body {bytes, path}`, `egress_connect {target, caPem?,
///   serverName?, bytes?}`, `egress_tunnels {n, target}` (n CONNECT
///   attempts, the answered tunnels held open): network steps (see
///   `egress.rs`, `tunnel.rs`), each
///   emitting `{type: <op>, data: <what it observed>}`
fn step(p: &mut Plugin, s: &Value) {
    let op = s.get("op").and_then(Value::as_str).unwrap_or_default();
    let known = notification_step(p, op, s)
        || call_step(p, op, s)
        || process_step(p, op, s)
        || wire_step(p, op, s);
    if !known {
        eprintln!("testplugin: unknown step {op:?}");
    }
}

/// Notifications: emits and annotations. False when `op` is not one of them.
fn notification_step(p: &mut Plugin, op: &str, s: &Value) -> bool {
    match op {
        "flood" => {
            for i in 0..num(s, "n", 100_000) {
                let params = json!({"turnId": p.turn_id, "event": {"type": "flood", "data": i}});
                p.notify("host/emit", params);
            }
        }
        "emit_many" => {
            for _ in 0..num(s, "n", 1) {
                let params =
                    json!({"turnId": p.turn_id, "event": {"type": s["type"], "data": s["data"]}});
                p.notify("host/emit", params);
            }
        }
        "annotate_many" => {
            for i in 0..num(s, "n", 1) {
                let params =
                    json!({"turnId": p.turn_id, "key": format!("k{i}"), "value": s["value"]});
                p.notify("host/annotate", params);
            }
        }
        "fs_probe" => {
            let paths = |k: &str| -> Vec<String> {
                s[k].as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            };
            let mut read = serde_json::Map::new();
            for path in paths("read") {
                let got = std::fs::read_to_string(&path).unwrap_or_else(|e| format!("error: {e}"));
                read.insert(path, got.into());
            }
            let mut write = serde_json::Map::new();
            for path in paths("write") {
                let got = std::fs::write(&path, b"x")
                    .map_or_else(|e| format!("error: {e}"), |()| "ok".into());
                write.insert(path, got.into());
            }
            let data = json!({"read": read, "write": write});
            let params = json!({"turnId": p.turn_id, "event": {"type": "fs_probe", "data": data}});
            p.notify("host/emit", params);
        }
        "emit_pid" => {
            let params = json!({"turnId": p.turn_id, "event": {"type": "pid", "data": {"pid": std::process::id()}}});
            p.notify("host/emit", params);
        }
        _ => return false,
    }
    true
}

/// Tool calls, awaited or not, and malformed ones. False when `op` is not one of them.
fn call_step(p: &mut Plugin, op: &str, s: &Value) -> bool {
    match op {
        "call_nowait" => {
            let step = s.get("step").and_then(Value::as_u64);
            p.request_call(
                s["tool"].as_str().unwrap_or("missing"),
                s["arguments"].clone(),
                step,
            );
        }
        "send_call" => {
            let tool = s["tool"].as_str().unwrap_or("missing").to_owned();
            p.request_call(&tool, s["arguments"].clone(), None);
        }
        "burst_calls" => {
            let n = num(s, "n", 16);
            let tool = s["tool"].as_str().unwrap_or("echo").to_owned();
            let ids: Vec<u64> = (0..n)
                .map(|_| p.request_call(&tool, json!({}), None))
                .collect();
            let mut answers = Vec::new();
            while answers.len() < ids.len() {
                let m = p.read();
                if m.get("id")
                    .and_then(Value::as_u64)
                    .is_some_and(|id| ids.contains(&id))
                {
                    answers.push(m);
                }
            }
            p.results.extend(answers);
        }
        "invoke_as_notification" => {
            for _ in 0..num(s, "n", 1) {
                let params = json!({"turnId": p.turn_id, "call": {"id": "call-noid",
                    "tool": s["tool"], "arguments": {}, "traceId": "trace-testplugin",
                    "requestedAt": "2026-01-01T00:00:00Z"}});
                p.notify("host/invokeTool", params);
            }
        }
        "big_calls" => {
            let pad = "p".repeat(usize::try_from(num(s, "bytes", 1 << 20)).unwrap_or(1 << 20));
            let tool = s["tool"].as_str().unwrap_or("echo").to_owned();
            for _ in 0..num(s, "n", 1) {
                let answer = p.call(&tool, json!({ "pad": pad }), None);
                p.results
                    .push(json!({"id": answer["id"], "error": answer.get("error")}));
            }
        }
        "write_files" => {
            let content = "w".repeat(usize::try_from(num(s, "bytes", 1 << 20)).unwrap_or(1 << 20));
            for i in 0..num(s, "n", 1) {
                let path = format!("bulk/f{i:04}.bin");
                p.call(
                    "files.write",
                    json!({"path": path, "content": content}),
                    None,
                );
            }
        }
        _ => return false,
    }
    true
}

/// What the process does: sleep, spin, hold, fork, crash, exit, stderr. False when `op` is not one of them.
fn process_step(p: &mut Plugin, op: &str, s: &Value) -> bool {
    match op {
        // Waits until a host path exists (direct launch only): a test's
        // signal that it has set the stage for the next step.
        "wait_path" => {
            let path = std::path::PathBuf::from(s["path"].as_str().unwrap_or("/nonexistent"));
            while !path.exists() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        "spin" => {
            let until = s
                .get("ms")
                .and_then(Value::as_u64)
                .map(|ms| Instant::now() + Duration::from_millis(ms));
            let mut x: u64 = 0;
            while until.is_none_or(|u| Instant::now() < u) {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        "ignore_abort" => p.ignore_abort = true,
        "hold" => hold(p),
        "fork" => fork(p, s),
        "crash" => std::process::abort(),
        "stderr_lines" => stderr_lines(num(s, "n", 100)),
        "kill_self" => {
            // The plugin killed by a signal from outside its own code.
            let signal = s["signal"].as_str().unwrap_or("KILL");
            let _ = Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(std::process::id().to_string())
                .status();
            std::thread::sleep(Duration::from_secs(30));
        }
        "exit" => std::process::exit(i32::try_from(num(s, "code", 0)).unwrap_or(1)),
        "close_stdout" => {
            if let Ok(null) = OpenOptions::new().write(true).open("/dev/null") {
                let _ = rustix::stdio::dup2_stdout(&null);
            }
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        "stderr_flood" => {
            let mut line = vec![b'e'; 1023];
            line.push(b'\n');
            let mut err = std::io::stderr().lock();
            for _ in 0..num(s, "bytes", 16 << 20) / 1024 {
                if err.write_all(&line).is_err() {
                    break;
                }
            }
        }
        "stderr" => eprintln!("{}", s["text"].as_str().unwrap_or_default()),
        "alloc" => {
            // Allocates and touches `mib` MiB, one MiB at a time, and keeps it.
            let mut held: Vec<Vec<u8>> = Vec::new();
            for _ in 0..num(s, "mib", 64) {
                held.push(vec![1u8; 1 << 20]);
            }
            std::hint::black_box(&held);
        }
        _ => return false,
    }
    true
}

/// Bytes on the wire: raw and malformed lines, outcomes, network steps. False when `op` is not one of them.
fn wire_step(p: &mut Plugin, op: &str, s: &Value) -> bool {
    match op {
        "raw" => {
            let line = format!("{}\n", s["line"].as_str().unwrap_or_default());
            p.write_raw(line.as_bytes());
        }
        "raw_unterminated" => {
            let line = s["line"].as_str().unwrap_or_default().to_owned();
            p.write_raw(line.as_bytes());
        }
        "outcome_unterminated" => {
            let run_id = p.run_id.clone();
            let line = json!({"jsonrpc":"2.0","id":run_id,"result":s["value"]}).to_string();
            p.write_raw(line.as_bytes());
            p.outcome_sent = true;
        }
        "invalid_utf8" => {
            p.write_raw(b"{\"jsonrpc\":\"2.0\",\"method\":\"host/emit\",\"params\":\"\xff\xfe\"}\n")
        }
        "long_line" => {
            let mut line = vec![b'a'; usize::try_from(num(s, "bytes", 9 << 20)).unwrap_or(1 << 20)];
            line.push(b'\n');
            p.write_raw(&line);
        }
        "batch" => {
            let one = json!({"jsonrpc":"2.0","method":"host/emit","params":{"turnId":p.turn_id,"event":{"type":"b","data":1}}});
            p.send(&json!([one]));
        }
        "bogus_response" => p.send(&json!({"jsonrpc":"2.0","id":999,"result":{}})),
        "outcome" => p.outcome(s["value"].clone()),
        "error_outcome" => {
            let run_id = p.run_id.clone();
            let err = json!({"code": s.get("code").cloned().unwrap_or(json!(-32603)), "message": s["message"]});
            p.send(&json!({"jsonrpc":"2.0","id":run_id,"error":err}));
            p.outcome_sent = true;
        }
        "net_probe" | "egress_flood" | "egress_body" | "egress_connect" | "egress_tunnels" => {
            let path = s["path"].as_str().unwrap_or("/");
            let data = match op {
                "net_probe" => egress::probe(s),
                "egress_connect" | "egress_tunnels" => match egress::gateway() {
                    Some(gw) if op == "egress_connect" => tunnel::connect(&gw, s),
                    Some(gw) => tunnel::flood(&gw, s),
                    None => json!({"error": "no SHAREDOS_EGRESS_URL"}),
                },
                "egress_flood" => egress::flood(num(s, "n", 10_000), path),
                _ => egress::big_body(num(s, "bytes", 1 << 30), path),
            };
            let params = json!({"turnId": p.turn_id, "event": {"type": op, "data": data}});
            p.notify("host/emit", params);
        }
        _ => return false,
    }
    true
}

/// `fork {n, setsid?, double?, pidfile?}`: n sleepers, their pids emitted.
fn fork(p: &mut Plugin, s: &Value) {
    let mut pids = Vec::new();
    for _ in 0..num(s, "n", 1) {
        let mut args = vec!["--sleeper".to_owned()];
        if s["setsid"].as_bool() == Some(true) {
            args.push("--setsid".into());
        }
        if s["double"].as_bool() == Some(true) {
            args.push("--double".into());
        }
        if let Some(f) = s["pidfile"].as_str() {
            args.push("--pidfile".into());
            args.push(f.into());
        }
        let exe = std::env::current_exe().unwrap_or_else(|_| "/proc/self/exe".into());
        match Command::new(exe).args(&args).spawn() {
            Ok(child) => pids.push(child.id()),
            Err(e) => eprintln!("testplugin: fork failed: {e}"),
        }
    }
    let params = json!({"turnId": p.turn_id, "event": {"type": "forked", "data": {"pids": pids}}});
    p.notify("host/emit", params);
}

fn sleeper(args: &[String]) -> ! {
    let has = |flag: &str| args.iter().any(|a| a == flag);
    if has("--setsid") {
        let _ = rustix::process::setsid();
    }
    let pidfile = args
        .iter()
        .position(|a| a == "--pidfile")
        .and_then(|i| args.get(i + 1))
        .cloned();
    if has("--double") {
        let mut next: Vec<String> = vec!["--sleeper".into()];
        if let Some(f) = &pidfile {
            next.push("--pidfile".into());
            next.push(f.clone());
        }
        let exe = std::env::current_exe().unwrap_or_else(|_| "/proc/self/exe".into());
        let _ = Command::new(exe).args(&next).spawn();
        std::process::exit(0);
    }
    if let Some(f) = pidfile
        && let Ok(mut file) = OpenOptions::new().create(true).append(true).open(f)
    {
        let _ = writeln!(file, "{}", std::process::id());
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// `n` numbered lines on stderr, flushed: `testplugin: stderr line i of n`.
fn stderr_lines(n: u64) {
    let mut err = std::io::stderr().lock();
    for i in 1..=n {
        let _ = writeln!(err, "testplugin: stderr line {i} of {n}");
    }
    let _ = err.flush();
}
