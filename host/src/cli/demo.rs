//! `sharedos demo`: one real turn on the embedded defaults.

use std::sync::Arc;

use crate::cli::{LauncherFor, print_result, run_turn};
use crate::config::HostConfig;

/// The embedded demo configuration.
pub const DEMO_CONFIG: &str = include_str!("../../demo/host.toml");
/// The embedded demo request.
pub const DEMO_REQUEST: &str = include_str!("../../demo/turn.json");

/// Runs the demo; returns the exit code.
pub async fn demo(keep: bool, launcher_for: &LauncherFor) -> i32 {
    let dir = match tempfile::Builder::new().prefix("sharedos-demo-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("sharedos demo: cannot create a temporary directory: {e}");
            return 2;
        }
    };
    let config = match HostConfig::parse(DEMO_CONFIG, "<embedded demo/host.toml>", dir.path()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sharedos demo: {e}");
            return 2;
        }
    };
    eprintln!(
        "sharedos demo: agent alice, runtime sharedos.standard (transcript driver) in a sandboxed child process"
    );
    eprintln!(
        "sharedos demo: files and audit trail under {}",
        dir.path().display()
    );
    let printer: Arc<dyn Fn(String) + Send + Sync> = Arc::new(|line| eprintln!("  {line}"));
    let run = match run_turn(
        &config,
        DEMO_REQUEST,
        "<embedded demo/turn.json>",
        launcher_for,
        Some(printer),
    )
    .await
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sharedos demo: {e}");
            return 2;
        }
    };
    let code = print_result(&run.result);
    let sandbox = &run
        .result
        .metadata
        .get("runtime")
        .and_then(|r| r.get("sandbox"))
        .cloned()
        .unwrap_or_default();
    eprintln!(
        "sharedos demo: the plugin ran in a sandbox of level {} (see metadata.runtime.sandbox)",
        sandbox
            .get("level")
            .and_then(|l| l.as_str())
            .unwrap_or("unknown")
    );
    let records = std::fs::read_to_string(&run.audit_path)
        .map(|t| t.lines().count())
        .unwrap_or(0);
    eprintln!(
        "sharedos demo: turn {} {}; {} audit records in {}",
        run.result.execution_id,
        run.result.status.as_str(),
        records,
        run.audit_path.display()
    );
    if keep {
        let kept = dir.keep();
        eprintln!("sharedos demo: kept {}", kept.display());
    }
    code
}
