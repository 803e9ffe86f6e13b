//! The `sharedos` command line over the host library: `demo`, `run`,
//! `serve`, `grants`, `tokens`, `sandbox check`, `conformance` (the bench and the
//! soak are the `sharedos-bench` binary's). `main.rs` parses and dispatches.

#![forbid(unsafe_code)]

pub mod demo;
pub mod engines;
pub mod grants;
pub mod sandbox_check;
pub mod serve;
pub mod timings;
pub mod tokens;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sharedos_kernel::{JsonlAuditSink, Kernel};
use sharedos_protocol::text::escape_text;
use sharedos_protocol::{Address, ExecutionRequest, ExecutionResult, ExecutionStatus};

use sharedos_host::config::{HostConfig, LauncherKind};
use sharedos_host::executor::{ExecuteOptions, Executor, TurnError};
use sharedos_host::observe;
use sharedos_host::seat::{LauncherFor, SeatError, executor_options, registry_from_config};

/// An error for the person at the terminal: what failed and what to do.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Config(#[from] sharedos_host::config::ConfigError),
    #[error("{file}: {message}")]
    Request { file: String, message: String },
    #[error("{0}")]
    Seat(#[from] SeatError),
    #[error("{0}")]
    Setup(String),
}

/// What `run` prints and returns.
pub struct TurnRun {
    pub result: ExecutionResult,
    pub audit_path: PathBuf,
}

/// Runs one turn from a configuration and a request, streaming readable
/// events to `events` as they happen.
pub async fn run_turn(
    config: &HostConfig,
    request_json: &str,
    request_file: &str,
    launcher_for: &LauncherFor,
    events: Option<Arc<dyn Fn(String) + Send + Sync>>,
) -> Result<TurnRun, CliError> {
    let request_error = |message: String| CliError::Request {
        file: request_file.to_owned(),
        message,
    };
    let request: ExecutionRequest = serde_json::from_str(request_json).map_err(|e| {
        request_error(format!(
            "does not match the ExecutionRequest v1 contract: {e}"
        ))
    })?;
    request.check().map_err(|e| request_error(e.0))?;
    let Address::Agent { agent_id } = &request.agent else {
        return Err(request_error("agent: must be an agent address".into()));
    };
    let entry = config.runtime_for(agent_id.as_str()).ok_or_else(|| {
        request_error(format!(
            "agent {:?} is not bound to a runtime in the configuration (add an [[agents]] entry)",
            agent_id.as_str()
        ))
    })?;
    let registry = registry_from_config(config, launcher_for)?;
    let seat = registry
        .resolve(entry.id.as_str())
        .map_err(SeatError::from)?
        .clone();
    timings::mark("seated");
    let (kernel, audit, audit_path) = kernel(config)?;
    timings::mark("kernel");
    let options = executor_options(config, Arc::new(report_turn_error));
    let executor = Executor::new(Arc::new(kernel), seat, options)
        .map_err(|e| CliError::Setup(format!("executor: {e}")))?;
    timings::mark("executor");
    let on_event = events.map(|sink| {
        let cb: sharedos_host::executor::OnEvent = Arc::new(move |e| sink(observe::describe(e)));
        cb
    });
    let result = executor
        .execute(
            request,
            ExecuteOptions {
                cancel: None,
                on_event,
            },
        )
        .await
        .map_err(|e| request_error(e.to_string()))?;
    timings::mark("executed");
    let (records, commits) = audit.committed();
    tracing::debug!(
        target: "sharedos::audit",
        records,
        commits,
        "the audit trail committed {records} records in {commits} commits (one fsync each)"
    );
    Ok(TurnRun { result, audit_path })
}

/// The configuration's kernel: its grants, the JSONL audit trail at
/// `host.auditPath` (returned, with the sink) and the file tools over
/// `host.filesRoot`, both created when missing.
fn kernel(config: &HostConfig) -> Result<(Kernel, JsonlAuditSink, PathBuf), CliError> {
    let audit_path = config.resolve(&config.host.audit_path);
    if let Some(parent) = audit_path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| CliError::Setup(format!("cannot create {}: {e}", parent.display())))?;
    }
    let audit = JsonlAuditSink::open(&audit_path).map_err(|e| {
        CliError::Setup(format!(
            "cannot open the audit trail {}: {e}",
            audit_path.display()
        ))
    })?;
    let files_root = config.resolve(&config.host.files_root);
    std::fs::create_dir_all(&files_root).map_err(|e| {
        CliError::Setup(format!(
            "cannot create the files root {}: {e}",
            files_root.display()
        ))
    })?;
    let kernel = Kernel::from_config(&config.kernel, &files_root, Arc::new(audit.clone()))
        .map_err(|e| CliError::Setup(format!("kernel: {e}")))?;
    Ok((kernel, audit, audit_path))
}

/// A turn's error for the person at the terminal (and the log).
fn report_turn_error(error: &TurnError, ids: &sharedos_host::executor::TurnIds) {
    let what = match error {
        TurnError::Runtime(e) => e.to_string(),
        TurnError::AuditUnavailable { cause } => format!("the audit sink failed: {cause}"),
        TurnError::Kernel(m) => format!("kernel: {m}"),
        TurnError::Violation { reason } => format!("the runtime broke a host limit ({reason})"),
    };
    // The text may quote the plugin (its error message, its outcome).
    let what = escape_text(&what);
    tracing::error!(execution_id = %ids.execution_id, "turn failed: {what}");
    eprintln!("sharedos: turn {} failed: {what}", ids.execution_id);
}

/// Prints the result JSON on stdout; the exit code says whether the turn
/// succeeded.
pub fn print_result(result: &ExecutionResult) -> i32 {
    let mut out = std::io::stdout().lock();
    let text = serde_json::to_string_pretty(result).unwrap_or_else(|_| "{}".to_owned());
    let _ = writeln!(out, "{text}");
    if result.status == ExecutionStatus::Succeeded {
        0
    } else {
        1
    }
}

/// Reads a file for a command, naming it in the error.
pub fn read_file(path: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(path).map_err(|e| CliError::Request {
        file: path.display().to_string(),
        message: format!("cannot be read: {e}"),
    })
}

/// `sharedos conformance [--launcher sandbox|gvisor|microvm|direct] [--json] [--ro PATH]... -- PROGRAM [ARGS]`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConformanceArgs {
    /// `sandbox` (the default, the full sandbox), `gvisor` (runsc),
    /// `microvm` (a QEMU microVM: QEMU on PATH, the guest kernel
    /// SHAREDOS_MICROVM_KERNEL names or /boot's cloud kernel, the guest
    /// init beside `sharedos`) or `direct` (no isolation).
    #[arg(long, value_enum, default_value = "sandbox")]
    pub launcher: ConformanceLauncher,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// A host path to bind read-only into the sandbox (repeatable); a
    /// script argument's package directory is bound without asking.
    #[arg(long = "ro", value_name = "PATH")]
    pub ro: Vec<PathBuf>,
    /// How long `initialize` may take.
    #[arg(long, default_value_t = 10_000)]
    pub handshake_timeout_ms: u64,
    /// How long the plugin may stay silent while a turn is running.
    #[arg(long, default_value_t = 10_000)]
    pub step_timeout_ms: u64,
    /// Measure the tool-call round trip instead, over this many calls per
    /// turn; several plugins may be given, separated by `:::`.
    #[arg(long, value_name = "CALLS")]
    pub bench: Option<usize>,
    /// The plugin's command line.
    #[arg(last = true, required = true, value_name = "PROGRAM [ARGS]")]
    pub command: Vec<String>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ConformanceLauncher {
    Sandbox,
    Gvisor,
    Microvm,
    Direct,
}

/// Runs the conformance battery; the exit code is 0 when the plugin
/// conforms, 1 when a check failed, 2 on a usage or setup error.
pub fn conformance(args: &ConformanceArgs) -> i32 {
    let opts = sharedos_conformance::Options {
        command: args.command.clone(),
        launcher: match args.launcher {
            ConformanceLauncher::Sandbox => LauncherKind::Sandbox,
            ConformanceLauncher::Direct => LauncherKind::Direct,
            ConformanceLauncher::Gvisor => LauncherKind::Gvisor,
            ConformanceLauncher::Microvm => LauncherKind::Microvm,
        },
        ro_paths: args.ro.clone(),
        handshake_timeout: std::time::Duration::from_millis(args.handshake_timeout_ms),
        step_timeout: std::time::Duration::from_millis(args.step_timeout_ms),
    };
    if let Some(calls) = args.bench {
        return conformance_bench(&opts, calls, args.json);
    }
    let report = match sharedos_conformance::run(&opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sharedos conformance: {e}");
            return 2;
        }
    };
    let mut out = std::io::stdout().lock();
    if args.json {
        let text = serde_json::to_string_pretty(&report).unwrap_or_else(|_| "{}".into());
        let _ = writeln!(out, "{text}");
        i32::from(!report.passed)
    } else {
        sharedos_conformance::print_human(&report, &mut out)
    }
}

fn conformance_bench(opts: &sharedos_conformance::Options, calls: usize, json: bool) -> i32 {
    let rows = match sharedos_conformance::bench(opts, calls.max(2)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sharedos conformance --bench: {e}");
            return 1;
        }
    };
    let mut out = std::io::stdout().lock();
    if json {
        let text = serde_json::to_string_pretty(&rows).unwrap_or_else(|_| "[]".into());
        let _ = writeln!(out, "{text}");
    } else {
        let launcher = match opts.launcher {
            LauncherKind::Direct => "direct",
            LauncherKind::Sandbox => "sandbox",
            LauncherKind::Gvisor => "gvisor",
            LauncherKind::Microvm => "microvm",
        };
        sharedos_conformance::print_bench(&rows, launcher, &mut out);
    }
    0
}
