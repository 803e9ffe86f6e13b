//! `sharedos`: runs untrusted agent runtimes behind a fixed security
//! envelope.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use sharedos_cli as cli;
use sharedos_host::config::HostConfig;
use sharedos_host::seat::LauncherFor;

mod telemetry;

/// `sharedos --version`: the crate's version, the protocol versions it
/// speaks and the commit it was built from (cli/build.rs).
static VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let protocols: Vec<String> = sharedos_protocol::PROTOCOL_VERSIONS
        .iter()
        .map(u32::to_string)
        .collect();
    format!(
        "{} (protocol {}, commit {})",
        env!("CARGO_PKG_VERSION"),
        protocols.join(", "),
        env!("SHAREDOS_COMMIT")
    )
});

#[derive(Parser)]
#[command(
    name = "sharedos",
    version = VERSION.as_str(),
    about = "Runs untrusted agent runtimes behind a fixed security envelope."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// mimalloc instead of glibc's malloc: a profile of the host under 64
/// tool calls in flight put about 40% of its CPU in glibc's malloc and free
/// (`malloc_consolidate` above all); every message, event and audit
/// record is a handful of short-lived allocations (docs/BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Subcommand)]
enum Command {
    /// Run one real turn on the embedded defaults: the standard runtime in a
    /// child process, file tools over a temporary directory, one agent.
    Demo {
        /// Keep the temporary directory (files and audit trail).
        #[arg(long)]
        keep: bool,
        #[command(flatten)]
        model: cli::demo::ModelArgs,
    },
    /// Run one turn from a host configuration (TOML) and a request (JSON).
    Run {
        #[arg(long, value_name = "host.toml")]
        config: PathBuf,
        #[arg(long, value_name = "turn.json")]
        request: PathBuf,
    },
    /// Serve sessions and runs over HTTP+JSON on a unix socket (docs/SERVE.md).
    Serve(cli::serve::ServeArgs),
    /// List, add or revoke the grants a served host reads from its store
    /// (docs/STORE.md).
    Grants(cli::grants::GrantsArgs),
    /// Add, list or revoke the tenants' tokens of `sharedos serve` over TCP
    /// (docs/SERVE.md, "Tenants").
    Tokens(cli::tokens::TokensArgs),
    /// What the sandbox can enforce on this machine.
    Sandbox {
        #[command(subcommand)]
        command: SandboxCommand,
    },
    /// Check that a plugin speaks the protocol: a battery of checks, each
    /// naming the section of docs/PROTOCOL.md it enforces and the fix.
    Conformance(cli::ConformanceArgs),
}

#[derive(Subcommand)]
enum SandboxCommand {
    /// Print what this kernel and host can enforce, layer by layer, the
    /// level a plugin would get, and the fix for each missing layer. With
    /// `--runtime`, exactly what that runtime of `--config` will see: every
    /// bound path (ro/rw), the program's path inside, the environment keys
    /// and the layers (its sandbox is built, its plugin never started).
    Check {
        /// The runtime to describe (its `id` in the configuration).
        #[arg(long, requires = "config")]
        runtime: Option<String>,
        /// The host configuration the runtime is defined in.
        #[arg(long, value_name = "host.toml", requires = "runtime")]
        config: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    if let Some(code) = internal_subcommand() {
        return code;
    }
    cli::timings::start();
    let telemetry = match telemetry::init() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("sharedos: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = sharedos_host::process::raise_fd_limit() {
        eprintln!("sharedos: could not raise the open-file limit: {e}");
    }
    let cli = Cli::parse();
    let runtime = match async_runtime() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sharedos: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    if let Command::Sandbox {
        command: SandboxCommand::Check { runtime, config },
    } = &cli.command
    {
        let code = sandbox_check(runtime.as_deref(), config.as_deref());
        telemetry.shutdown();
        return code;
    }
    if let Command::Conformance(args) = &cli.command {
        let code = cli::conformance(args);
        telemetry.shutdown();
        return ExitCode::from(code as u8);
    }
    // A command that runs its turns and exits adopts its orphans (a
    // sandbox's pid 1 that outlives its helper by an instant), so it can
    // reap them before it exits and leave no zombie behind.
    let adopted = matches!(cli.command, Command::Run { .. } | Command::Demo { .. })
        && match sharedos_host::process::adopt_orphans() {
            Ok(()) => true,
            Err(e) => {
                eprintln!("sharedos: cannot become the reaper of its orphans: {e}");
                false
            }
        };
    cli::timings::mark("started");
    let code = runtime.block_on(dispatch(cli.command));
    // No plugin tree outlives its host: wait for kills deferred so that a
    // `turn/abort` could reach the plugin first.
    sharedos_host::process::settle_kills();
    cli::timings::mark("kills");
    if adopted {
        sharedos_host::process::reap_orphans(std::time::Duration::from_secs(2));
        cli::timings::mark("reaped");
    }
    // The runtime's blocking threads are shut down before the last stamp,
    // so the timings see that too.
    drop(runtime);
    cli::timings::mark("dropped");
    telemetry.shutdown();
    cli::timings::print();
    ExitCode::from(code.clamp(0, 255) as u8)
}

/// The subcommand the binary serves to itself before anything else runs:
/// the sandbox helper (single-threaded). The bench and the soak are
/// `sharedos-bench`'s (bench/src/main.rs), not the product's.
fn internal_subcommand() -> Option<ExitCode> {
    let mut args = std::env::args_os();
    let _exe = args.next();
    let first = args.next()?;
    if first == sharedos_sandbox::HELPER_SUBCOMMAND {
        sharedos_sandbox::helper_main(args.collect())
    }
    None
}

/// A command runs one turn at a time, so the host runs on one thread by
/// default: no cross-thread wake-up on a tool call's path (the bench
/// measures both, docs/BENCHMARKS.md). Blocking work (sandbox spawns, file
/// tools, fsync) goes to tokio's blocking pool either way.
/// `SHAREDOS_RUNTIME=multi` selects the multi-threaded runtime.
fn async_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let multi = std::env::var_os("SHAREDOS_RUNTIME").is_some_and(|v| v == "multi");
    if multi {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }
}

/// `sharedos sandbox check [--runtime ID --config host.toml]`.
fn sandbox_check(runtime: Option<&str>, config: Option<&std::path::Path>) -> ExitCode {
    let mut out = std::io::stdout().lock();
    if let (Some(runtime), Some(config)) = (runtime, config) {
        let code = cli::sandbox_check::check_runtime(config, runtime, &mut out);
        drop(out);
        sharedos_host::process::settle_kills();
        return ExitCode::from(code as u8);
    }
    let checked = sharedos_sandbox::check(&mut out);
    let _ = cli::engines::print_engines(checked.as_ref().ok().copied(), &mut out);
    match checked {
        Ok(level) if level >= sharedos_sandbox::SandboxPolicy::default().min_level => {
            ExitCode::SUCCESS
        }
        Ok(_) => ExitCode::from(1),
        Err(e) => {
            eprintln!("sharedos sandbox check: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs a command that needs the async runtime; returns its exit code.
async fn dispatch(command: Command) -> i32 {
    let launcher_for: Box<LauncherFor> = Box::new(sharedos_host::seat::configured_launcher);
    match command {
        Command::Demo { keep, model } => cli::demo::demo(keep, &model, &*launcher_for).await,
        Command::Run { config, request } => run(&config, &request, &*launcher_for).await,
        Command::Serve(args) => cli::serve::command(args, &*launcher_for).await,
        Command::Grants(args) => cli::grants::command(args).await,
        Command::Tokens(args) => cli::tokens::command(args).await,
        Command::Sandbox { .. } | Command::Conformance(_) => 2,
    }
}

/// `sharedos run`'s live event lines on stderr. The turn queues each line;
/// one task writes what is queued with one `write` as soon as the turn's
/// task yields, so a burst of calls answered in one poll (64 in flight)
/// costs one system call, not three a call, and every line is still out
/// within the poll that made it. What is queued when the turn returns is
/// written before anything else is printed.
#[derive(Default)]
struct EventLines {
    queued: std::sync::Mutex<Vec<u8>>,
    ready: tokio::sync::Notify,
}

impl EventLines {
    fn push(&self, line: &str) {
        let mut queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        let was_empty = queued.is_empty();
        queued.extend_from_slice(line.as_bytes());
        queued.push(b'\n');
        drop(queued);
        if was_empty {
            self.ready.notify_one();
        }
    }

    fn write_queued(&self) {
        use std::io::Write;
        let bytes = std::mem::take(&mut *self.queued.lock().unwrap_or_else(|p| p.into_inner()));
        if !bytes.is_empty() {
            let _ = std::io::stderr().lock().write_all(&bytes);
        }
    }

    async fn write_when_queued(self: Arc<Self>) {
        loop {
            self.ready.notified().await;
            self.write_queued();
        }
    }
}

/// `sharedos run --config host.toml --request turn.json`.
async fn run(
    config: &std::path::Path,
    request: &std::path::Path,
    launcher_for: &LauncherFor,
) -> i32 {
    let config = match HostConfig::load(config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sharedos: {e}");
            return 2;
        }
    };
    let text = match cli::read_file(request) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("sharedos: {e}");
            return 2;
        }
    };
    cli::timings::mark("config");
    let lines = Arc::new(EventLines::default());
    let writer = tokio::spawn(Arc::clone(&lines).write_when_queued());
    let queue = Arc::clone(&lines);
    let printer: Arc<dyn Fn(String) + Send + Sync> = Arc::new(move |line| queue.push(&line));
    let ran = cli::run_turn(
        &config,
        &text,
        &request.display().to_string(),
        launcher_for,
        Some(printer),
    )
    .await;
    writer.abort();
    lines.write_queued();
    match ran {
        Ok(run) => {
            let code = cli::print_result(&run.result);
            cli::timings::mark("printed");
            code
        }
        Err(e) => {
            eprintln!("sharedos: {e}");
            2
        }
    }
}
