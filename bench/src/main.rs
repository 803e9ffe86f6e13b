//! `sharedos-bench`: the figures of docs/BENCHMARKS.md and the soak of
//! docs/TESTING.md, in a binary of their own so the shipped `sharedos`
//! holds only the product. It is its own sandbox helper and serves the
//! bench's children (`__bench-*`) to itself, as `sharedos` does the helper.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The same allocator as the shipped `sharedos`: the host measured in
/// process is the host that ships (docs/BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "sharedos-bench",
    version,
    about = "Measure the envelope, the protocol and the sandbox (docs/BENCHMARKS.md), or soak the host with hostile plugins (docs/TESTING.md).",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Iterations of each round-trip measurement.
    #[arg(long, default_value_t = 2000)]
    iterations: usize,
    /// Only one part: `turns` (a zero-call turn stage by stage), `calls`
    /// (sequential and concurrent tool calls in every CPU placement), `spawn` (every sandbox mode
    /// against bwrap, layer costs and stage timings), `harness` (the MCP
    /// harness: execute() to the first tools/list, an MCP tool call against
    /// an in-process plugin's) or `affinity` (a session's next turn on its
    /// parked process), `whole-turn` (a zero-call `sharedos run`, direct and
    /// sandboxed, against the plugin binary alone and bwrap launching it),
    /// `serve` (runs admitted at speed through real `sharedos serve` hosts,
    /// and their events' latency over SSE) or `durable` (tool calls through
    /// a real `sharedos run` with its fsync'd audit trail, against a bare
    /// append + fsync) or `serve-turn` (a zero-call run through a real
    /// `sharedos serve` on a prepared sandbox, against an in-process turn
    /// plus one raw round trip) or `engines` (bwrap, the namespace sandbox
    /// cold and prepared, gVisor cold and prepared, the microVM cold and
    /// warm in one run: to `initialize`, a zero-call turn, the idle tree's
    /// memory, issue 30's goals; `--iterations / 20` rounds).
    #[arg(long)]
    only: Option<sharedos_bench::Only>,
    /// With `--only serve`: runs asked for at once (one session for every
    /// ten, at most 20 sessions).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=5000))]
    runs: u32,
    /// With `--only serve`: the store(s) the hosts share.
    #[arg(long, value_enum, default_value_t = StoreArg::Both)]
    store: StoreArg,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum StoreArg {
    Sqlite,
    Postgres,
    Both,
}

impl StoreArg {
    fn stores(self) -> Vec<sharedos_bench::served::Store> {
        use sharedos_bench::served::Store;
        match self {
            StoreArg::Sqlite => vec![Store::Sqlite],
            StoreArg::Postgres => vec![Store::Postgres],
            StoreArg::Both => vec![Store::Sqlite, Store::Postgres],
        }
    }
}

/// `--only serve` with its own options.
async fn serve(runs: u32, store: StoreArg) -> i32 {
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("sharedos-bench: cannot find its own binary: {e}");
            return 2;
        }
    };
    let ok = sharedos_bench::serve::run(&exe, runs as usize, &store.stores()).await;
    if ok { 0 } else { 1 }
}

#[derive(Subcommand)]
enum Command {
    /// Run many turns of hostile plugins in the full sandbox and report the
    /// host's memory, descriptors, processes, workspaces and cgroups; exits
    /// 1 on a leftover or on growth.
    Soak {
        /// Turns to run.
        #[arg(long, default_value_t = 1000)]
        turns: u32,
        /// Report every this many turns.
        #[arg(long, default_value_t = 200)]
        every: u32,
        /// The testplugin binary (default: next to this one).
        #[arg(long)]
        testplugin: Option<PathBuf>,
        /// The adversary binary (default: next to this one).
        #[arg(long)]
        adversary: Option<PathBuf>,
    },
}

/// The subcommands the binary serves to itself, before anything else runs:
/// the sandbox helper (single-threaded) and the bench's children.
fn internal_subcommand() -> Option<ExitCode> {
    let mut args = std::env::args_os();
    let _exe = args.next();
    let first = args.next()?;
    if first == sharedos_sandbox::HELPER_SUBCOMMAND {
        sharedos_sandbox::helper_main(args.collect())
    }
    if first == sharedos_bench::process::BENCH_PLUGIN_SUBCOMMAND {
        return Some(sharedos_bench::process::serve_bench_plugin());
    }
    if first == sharedos_bench::harness::MCP_CLIENT_SUBCOMMAND {
        return Some(sharedos_bench::harness::mcp_client_main(args.collect()));
    }
    if first == "__bench-echo" {
        return Some(ExitCode::from(sharedos_bench::echo_child() as u8));
    }
    None
}

/// As `sharedos` runs a command: one thread by default, the multi-threaded
/// runtime with `SHAREDOS_RUNTIME=multi` (docs/BENCHMARKS.md measures both).
fn async_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    if std::env::var_os("SHAREDOS_RUNTIME").is_some_and(|v| v == "multi") {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }
}

async fn soak(
    turns: u32,
    every: u32,
    testplugin: Option<PathBuf>,
    adversary: Option<PathBuf>,
) -> i32 {
    use sharedos_bench::soak::{SoakOptions, sibling};
    let options = SoakOptions {
        turns,
        every,
        testplugin: testplugin.unwrap_or_else(|| sibling("sharedos-testplugin")),
        adversary: adversary.unwrap_or_else(|| sibling("sharedos-adversary")),
    };
    match sharedos_bench::soak::soak(&options).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sharedos-bench soak: {e}");
            2
        }
    }
}

fn main() -> ExitCode {
    if let Some(code) = internal_subcommand() {
        return code;
    }
    if let Err(e) = sharedos_host::process::raise_fd_limit() {
        eprintln!("sharedos-bench: could not raise the open-file limit: {e}");
    }
    let cli = Cli::parse();
    let runtime = match async_runtime() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sharedos-bench: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let code = runtime.block_on(async {
        match cli.command {
            Some(Command::Soak {
                turns,
                every,
                testplugin,
                adversary,
            }) => soak(turns, every, testplugin, adversary).await,
            None if cli.only == Some(sharedos_bench::Only::Serve) => {
                serve(cli.runs, cli.store).await
            }
            None => sharedos_bench::run(cli.iterations, cli.only).await,
        }
    });
    // No plugin tree outlives its host.
    sharedos_host::process::settle_kills();
    ExitCode::from(code.clamp(0, 255) as u8)
}
