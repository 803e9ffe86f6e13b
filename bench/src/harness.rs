//! The MCP harness's figures (`sharedos-bench --only harness`), in one
//! run: the time from `execute()` to the CLI's first MCP `tools/list`, and
//! one MCP tool call through the relay, the bridge and the envelope
//! against the same call from an in-process plugin.
//!
//! The CLI is shell-free and small: `sharedos-bench __bench-mcp-client`, a
//! blocking Rust MCP client that spawns the stdio relay, initializes,
//! lists the tools (noting the wall clock), calls `bench.noop` `CALLS`
//! times timing each, and prints what it measured as its last line. The
//! harness and the client run in the full sandbox (the harness binary's
//! directory is bound read-only).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use sharedos_protocol::RuntimeManifest;
use sharedos_protocol::harness::{
    FinalMessage, HarnessLaunch, HarnessSpec, McpTransport, StdoutTake,
};

use super::{Figure, fixture};
use sharedos_host::executor::{ExecuteOptions, Executor};
use sharedos_host::process::{ProcessRuntime, ProcessRuntimeConfig};
use sharedos_host::sandboxed::SandboxLauncher;
use sharedos_host::seat::process_seat;

/// The hidden subcommand of the bench's MCP client.
pub const MCP_CLIENT_SUBCOMMAND: &str = "__bench-mcp-client";

fn epoch_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// `sharedos-bench __bench-mcp-client <relay> <relay args...>` (env `CALLS`).
pub fn mcp_client_main(args: Vec<std::ffi::OsString>) -> ExitCode {
    match mcp_client(args) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sharedos {MCP_CLIENT_SUBCOMMAND}: {e}");
            ExitCode::from(1)
        }
    }
}

fn mcp_client(args: Vec<std::ffi::OsString>) -> Result<Value, String> {
    let (relay, rest) = args.split_first().ok_or("usage: <relay> <args...>")?;
    let calls: usize = std::env::var("CALLS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut child = Command::new(relay)
        .args(rest)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn the relay: {e}"))?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let mut stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
    let mut ask = |id: u64, method: &str, params: Value| -> Result<Value, String> {
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(stdin, "{msg}").map_err(|e| e.to_string())?;
        let mut line = String::new();
        stdout.read_line(&mut line).map_err(|e| e.to_string())?;
        serde_json::from_str(&line).map_err(|e| format!("{e}: {line:?}"))
    };
    ask(
        1,
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "sharedos-bench", "version": "1"}}),
    )?;
    let listed = ask(2, "tools/list", json!({}))?;
    let listed_at = epoch_secs();
    if listed["result"]["tools"]
        .as_array()
        .is_none_or(|t| t.is_empty())
    {
        return Err(format!("no tools listed: {listed}"));
    }
    let mut call_ns = Vec::with_capacity(calls);
    for i in 0..calls {
        let t = Instant::now();
        let r = ask(
            3 + i as u64,
            "tools/call",
            json!({"name": fixture::NOOP_TOOL, "arguments": {}}),
        )?;
        call_ns.push(t.elapsed().as_nanos() as u64);
        if r["result"]["isError"] != false {
            return Err(format!("the call failed: {r}"));
        }
    }
    Ok(json!({"listedAt": listed_at, "callNs": call_ns}))
}

fn executor(exe: &Path, calls: usize) -> Result<Executor, String> {
    let dir = exe.parent().ok_or("the binary has no directory")?;
    let harness = dir.join("sharedos-harness");
    if !harness.is_file() {
        return Err(format!(
            "{} is not built (cargo build --workspace)",
            harness.display()
        ));
    }
    let manifest = RuntimeManifest::new("sharedos.bench.mcp", env!("CARGO_PKG_VERSION"))
        .map_err(|e| e.to_string())?;
    let launch = HarnessLaunch {
        manifest: manifest.clone(),
        spec: HarnessSpec {
            command: exe.display().to_string(),
            sha256: None,
            args: vec![
                MCP_CLIENT_SUBCOMMAND.into(),
                "{mcpCommand}".into(),
                "{mcpArgs}".into(),
            ],
            stdin: None,
            route: None,
            mcp: McpTransport::Stdio,
            env: [("CALLS".to_string(), calls.to_string())].into(),
            final_message: FinalMessage::Stdout {
                take: StdoutTake::LastLine,
            },
            escalation: false,
            files: Vec::new(),
            term_grace_ms: 1000,
        },
        route_url: None,
        placeholder_key: sharedos_protocol::PLACEHOLDER_MODEL_KEY.into(),
    };
    let mut config = ProcessRuntimeConfig::new(&harness, manifest);
    config.args = vec![
        "--harness".into(),
        serde_json::to_string(&launch).map_err(|e| e.to_string())?,
    ];
    let policy = sharedos_sandbox::SandboxPolicy {
        extra_ro_paths: vec![dir.display().to_string()],
        ..Default::default()
    };
    let launcher = Arc::new(SandboxLauncher::new(exe.to_path_buf(), policy));
    let runtime = ProcessRuntime::new(config, launcher).map_err(|e| e.to_string())?;
    Executor::new(
        Arc::new(fixture::kernel()),
        process_seat(Arc::new(runtime)),
        fixture::options(),
    )
    .map_err(|e| e.to_string())
}

/// Runs `rounds` harness turns; the time to the first `tools/list` of each,
/// and the MCP call samples of the last.
async fn harness_turns(
    exe: &Path,
    rounds: usize,
    calls: usize,
) -> Result<(Figure, Figure), String> {
    let executor = executor(exe, calls)?;
    let (mut to_list, mut samples) = (Vec::new(), Vec::new());
    for round in 0..rounds + 1 {
        let started = epoch_secs();
        let result = executor
            .execute(
                fixture::request(&format!("bench-harness-{round}"), json!("bench")),
                ExecuteOptions::default(),
            )
            .await
            .map_err(|e| e.to_string())?;
        let out = result
            .output
            .as_ref()
            .and_then(Value::as_str)
            .and_then(|s| serde_json::from_str::<Value>(s).ok())
            .ok_or_else(|| {
                format!(
                    "the turn ended {} {:?}",
                    result.status.as_str(),
                    result.code()
                )
            })?;
        // The first turn warms the page cache and is not kept.
        if round == 0 {
            continue;
        }
        let listed = out["listedAt"].as_f64().ok_or("no listedAt")?;
        to_list.push(Duration::from_secs_f64((listed - started).max(0.0)));
        samples = out["callNs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_u64)
            .map(Duration::from_nanos)
            .collect();
    }
    let mut samples: Vec<Duration> = samples;
    samples.drain(..50.min(samples.len() / 2));
    Ok((
        Figure::from_samples(
            "(h1) execute() → the CLI's first tools/list, full sandbox",
            to_list,
        ),
        Figure::from_samples(
            "(h2) tool call over MCP: relay, bridge, envelope, sandboxed",
            samples,
        ),
    ))
}

/// Prints the harness figures; `false` when one could not be measured.
pub async fn print(exe: &Path, rounds: usize, calls: usize) -> bool {
    println!(
        "== The MCP harness (issue 11): client `sharedos {MCP_CLIENT_SUBCOMMAND}`, stdio relay"
    );
    let harness = harness_turns(exe, rounds, calls).await;
    let inprocess = super::envelope::inprocess_calls(calls).await;
    match (harness, inprocess) {
        (Ok((h1, h2)), Ok(b)) => {
            println!("{}", h1.line());
            println!("{}", h2.line());
            println!("{}", b.line());
            println!(
                "    (h2) / (b): {:.1}× the in-process plugin's call",
                h2.median_us / b.median_us.max(1e-9)
            );
            true
        }
        (h, b) => {
            if let Err(e) = h {
                println!("    (harness not measured: {e})");
            }
            if let Err(e) = b {
                println!("    (in-process call not measured: {e})");
            }
            false
        }
    }
}
