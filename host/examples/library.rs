//! The library example of the README: one turn of a plugin binary behind
//! the envelope, with the embedded kernel.
//!
//! `cargo run -p sharedos-host --example library -- <host.toml> <turn.json>`

use std::sync::Arc;

use sharedos_host::executor::{ExecuteOptions, Executor, ExecutorOptions};
use sharedos_host::process::{ProcessRuntime, ProcessRuntimeConfig};
use sharedos_host::sandboxed::SandboxLauncher;
use sharedos_host::seat::process_seat;
use sharedos_kernel::{JsonlAuditSink, Kernel, KernelConfig};
use sharedos_protocol::{ExecutionRequest, RuntimeManifest};

async fn run_one_turn(
    kernel_config: KernelConfig,
    request: ExecutionRequest,
) -> Result<(), Box<dyn std::error::Error>> {
    // The kernel: grants from trusted configuration, an fsync'd audit trail,
    // the built-in file tools over each agent's directory.
    let audit = Arc::new(JsonlAuditSink::open("audit.jsonl")?);
    let kernel = Arc::new(Kernel::from_config(
        &kernel_config,
        "files".as_ref(),
        audit,
    )?);

    // The seat: a plugin binary in the full sandbox, checked against its
    // trusted manifest.
    let manifest = RuntimeManifest::new("sharedos-echo", "0.1.0")?;
    let launcher = SandboxLauncher::current_exe(Default::default())?;
    let runtime = ProcessRuntime::new(
        ProcessRuntimeConfig::new("target/release/sharedos-echo", manifest),
        Arc::new(launcher),
    )?;
    let seat = process_seat(Arc::new(runtime));
    let executor = Executor::new(kernel, seat, ExecutorOptions::default())?;

    // One turn. Every ending is a result with its status, events and
    // provenance (the manifest and the sandbox report).
    let result = executor.execute(request, ExecuteOptions::default()).await?;
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A host binary that launches sandboxed plugins serves as its own
    // sandbox helper: dispatch `__sandbox-exec` first, before any thread or
    // async runtime starts.
    let mut argv = std::env::args_os().skip(1);
    if argv
        .next()
        .is_some_and(|a| a == sharedos_sandbox::HELPER_SUBCOMMAND)
    {
        sharedos_sandbox::helper_main(argv.collect());
    }
    let mut args = std::env::args().skip(1);
    let (Some(config), Some(request)) = (args.next(), args.next()) else {
        eprintln!("usage: library <kernel.toml> <turn.json>");
        std::process::exit(2);
    };
    let kernel_config: KernelConfig = toml::from_str(&std::fs::read_to_string(config)?)?;
    let request: ExecutionRequest = serde_json::from_str(&std::fs::read_to_string(request)?)?;
    let outcome = tokio::runtime::Runtime::new()?.block_on(run_one_turn(kernel_config, request));
    // Plugin trees killed at an abort go a moment later (so `turn/abort`
    // reaches them first); a host waits for that before it exits.
    sharedos_host::process::settle_kills();
    outcome
}
