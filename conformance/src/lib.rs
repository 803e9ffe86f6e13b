//! `sharedos conformance -- PROGRAM [ARGS]`: runs any plugin through a
//! battery of checks, in the full sandbox (or `--launcher direct`), and
//! says for each what section of docs/PROTOCOL.md it enforces and what to
//! fix. Every check launches the plugin afresh and kills its tree after.
//!
//! `real_turn` (real.rs) runs one turn through the real envelope (the
//! executor, the process runtime, the kernel's file tools); the checks of
//! concurrency, drain, outcome kinds, large lines and noise (calls.rs, edges.rs)
//! run through the same envelope (envelope.rs) with a catalogue of their
//! own and a host-side test tool registered in the kernel; so does the
//! abort (abort.rs), whose seat gives the plugin a grace to exit by itself
//! after `turn/abort` before its kill. The rest speak to the plugin
//! directly (session.rs): the handshake, the versions and a person running
//! the plugin by hand. The checks run in a dependency
//! order (`Gated`): one whose dependency failed is not run and names it,
//! so one defect is one failure.
//!
//! The checks that need the plugin to call tools drive it with the echo
//! payload (`{"calls": [...], "parallel", "outcome", "noise"}`) that the
//! three SDKs' echo examples follow; a plugin that ignores it gets "not
//! applicable" for those, never a pass it did not earn.

#![forbid(unsafe_code)]

mod abort;
mod bench;
mod calls;
mod checks;
mod edges;
mod envelope;
mod lifecycle;
mod notes;
mod real;
mod session;
mod sweep;
mod turn;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use sharedos_protocol::PLUGIN_COOKIE_ENV;
use sharedos_sandbox::SandboxPolicy;

pub use checks::{Check, Status};

use sharedos_host::config::LauncherKind;
use sharedos_host::process::{DirectLauncher, LaunchSpec, Launcher};
use sharedos_host::sandboxed::SandboxLauncher;

/// Where a bare program name is looked up for a sandboxed run: the system
/// directories the sandbox binds (an interpreter under a private home, such
/// as pyenv's or nvm's, is not visible inside).
const SANDBOX_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// What to run and how.
#[derive(Debug, Clone)]
pub struct Options {
    pub command: Vec<String>,
    pub launcher: LauncherKind,
    /// Extra host paths bound read-only into the sandbox.
    pub ro_paths: Vec<PathBuf>,
    pub handshake_timeout: Duration,
    pub step_timeout: Duration,
}

/// The whole report.
#[derive(Debug, Serialize)]
pub struct Report {
    pub command: Vec<String>,
    pub program: String,
    pub launcher: &'static str,
    pub read_only_paths: Vec<String>,
    pub passed: bool,
    pub checks: Vec<Check>,
}

/// The launcher of a run; for the sandbox, the read-only paths and the
/// program are checked as a host configuration's would be, so a path the
/// sandbox cannot bind or read is a usage error naming it, not a plugin
/// that fails every check.
fn launcher_for(
    kind: LauncherKind,
    ro: &[String],
    program: &Path,
) -> Result<Arc<dyn Launcher>, String> {
    Ok(match kind {
        LauncherKind::Direct => Arc::new(DirectLauncher),
        LauncherKind::Gvisor => {
            let policy = SandboxPolicy {
                extra_ro_paths: ro.to_vec(),
                ..SandboxPolicy::default()
            };
            Arc::new(
                sharedos_host::process::GvisorLauncher::new(policy, None)
                    .map_err(|e| e.to_string())?,
            )
        }
        LauncherKind::Microvm => {
            let policy = SandboxPolicy {
                extra_ro_paths: ro.to_vec(),
                ..SandboxPolicy::default()
            };
            let settings = sharedos_host::process::microvm::MicrovmSettings {
                qemu: None,
                kernel: None,
                init: None,
                memory_mib: sharedos_host::config::microvm::DEFAULT_MEMORY_MIB,
                vcpus: 1,
                mkfs: None,
                harness_cli: None,
            };
            Arc::new(
                sharedos_host::process::MicrovmLauncher::new(policy, &settings)
                    .map_err(|e| e.to_string())?,
            )
        }
        LauncherKind::Sandbox => {
            let policy = SandboxPolicy {
                extra_ro_paths: ro.to_vec(),
                ..SandboxPolicy::default()
            };
            let problems = sharedos_sandbox::fsview::check_runtime(&policy, program);
            if !problems.is_empty() {
                let lines: Vec<String> = problems
                    .iter()
                    .map(|p| p.message.replace("sandbox.extraRoPaths", "--ro"))
                    .collect();
                return Err(lines.join("\n"));
            }
            Arc::new(
                SandboxLauncher::current_exe(policy)
                    .map_err(|e| format!("cannot find the sharedos binary: {e}"))?,
            )
        }
    })
}

/// Runs the battery. `Err` is a usage or setup error (exit 2).
pub fn run(opts: &Options) -> Result<Report, String> {
    let (spec, ro) = launch_spec(&opts.command, opts)?;
    let launcher = launcher_for(opts.launcher, &ro, &spec.program)?;
    let subreaper = sweep::become_subreaper();
    let battery = checks::Battery {
        launcher: &*launcher,
        spec: spec.clone(),
        handshake: opts.handshake_timeout,
        step: opts.step_timeout,
        leftovers: Default::default(),
        last_stderr: Default::default(),
    };
    let (mut results, manifest) = battery.handshake();
    attach_stderr(&mut results, &battery);
    let mut gated = Gated {
        results,
        battery: &battery,
        // The real envelope exists once the handshake stated a manifest,
        // which every check through it depends on.
        envelope: manifest.map(|manifest| envelope::Envelope {
            launcher: launcher.clone(),
            spec: spec.clone(),
            manifest,
            handshake: opts.handshake_timeout,
            allowance: Duration::ZERO,
        }),
        timeout: opts.step_timeout.max(Duration::from_secs(30)),
    };
    gated.run(
        &["handshake"],
        &[
            ("version_newer_host", "4.1"),
            ("version_unsupported", "4.1, 6"),
        ],
        |b| b.versions(),
    );
    gated.real(
        &["handshake", "silent_before_initialize"],
        ("real_turn", "4"),
        real_turn_check,
    );
    let after_turn = ["real_turn"];
    gated.real(
        &after_turn,
        ("tool_call_round_trip", "4.2, 4.3"),
        notes::round_trip,
    );
    gated.real(&after_turn, ("emit_annotate", "4.4, 5"), notes::notes);
    gated.real(
        &after_turn,
        ("concurrent_calls_out_of_order", "4.3, 5"),
        calls::concurrent,
    );
    if let Some(e) = gated.envelope.as_mut() {
        e.allowance = envelope::launch_allowance(&*e.launcher, &e.spec);
    }
    gated.real(&after_turn, ("drain", "4.5"), calls::drain);
    gated.real(&after_turn, ("abort", "1, 4.5"), abort::abort);
    gated.real(&after_turn, ("outcome_kinds", "4.2"), calls::outcome_kinds);
    gated.real(&after_turn, ("large_messages", "2, 6"), edges::large);
    gated.real(&after_turn, ("stderr_noise", "1"), edges::noise);
    gated.run(&[], &[("run_by_hand", "1")], |b| vec![b.by_hand()]);
    let mut results = gated.results;
    results.push(battery.nothing_left(subreaper));
    Ok(Report {
        command: opts.command.clone(),
        program: spec.program.display().to_string(),
        launcher: match opts.launcher {
            LauncherKind::Direct => "direct",
            LauncherKind::Sandbox => "sandbox",
            LauncherKind::Gvisor => "gvisor",
            LauncherKind::Microvm => "microvm",
        },
        read_only_paths: ro,
        passed: results
            .iter()
            .all(|c| c.status != Status::Fail && c.status != Status::NotRun),
        checks: results,
    })
}

/// `real_turn`: the plugin through the real envelope (`real.rs`).
fn real_turn_check(envelope: &envelope::Envelope, timeout: Duration) -> Check {
    let real = real::real_turn(envelope, timeout);
    let mut c = checks::check("real_turn", "4", REAL_TURN_FIX).verdict(real.verdict);
    if c.status == Status::Fail {
        c.stderr = real.stderr;
        c.fix = real.fix.unwrap_or(REAL_TURN_FIX);
    }
    c
}

const REAL_TURN_FIX: &str = "pass one turn of the real host (sharedos run's code path) with the catalogue [files.write, files.read]: call only the tools the request lists, with ids that are strings or numbers, lines within maxMessageBytes, and answer turn/run with a valid outcome";

/// The checks in their dependency order: a group whose dependency failed
/// (or was itself not run) is not run, naming the failed check.
struct Gated<'a, 'b> {
    results: Vec<Check>,
    battery: &'a checks::Battery<'b>,
    envelope: Option<envelope::Envelope>,
    /// The deadline of a turn through the envelope.
    timeout: Duration,
}

impl<'b> Gated<'_, 'b> {
    /// Runs `group` (the checks `ids` names, with their sections) unless
    /// one of `deps` failed; its failures carry the stderr of the group's
    /// last launch when they have none of their own.
    fn run(
        &mut self,
        deps: &[&str],
        ids: &[(&'static str, &'static str)],
        group: impl FnOnce(&checks::Battery<'b>) -> Vec<Check>,
    ) {
        let blocker = deps.iter().find_map(|d| {
            let c = self.results.iter().find(|c| c.id == *d)?;
            match c.status {
                Status::Fail => Some(c.id),
                Status::NotRun => c.blocked_by,
                _ => None,
            }
        });
        if let Some(b) = blocker {
            self.results.extend(
                ids.iter()
                    .map(|(id, section)| checks::check(id, section, NOT_RUN_FIX).not_run(b)),
            );
            return;
        }
        let mut checks = group(self.battery);
        attach_stderr(&mut checks, self.battery);
        self.results.extend(checks);
    }
}

impl Gated<'_, '_> {
    /// Runs `check` through the real envelope unless one of `deps` failed.
    fn real(
        &mut self,
        deps: &[&str],
        check: (&'static str, &'static str),
        f: fn(&envelope::Envelope, Duration) -> Check,
    ) {
        let (id, section) = check;
        let timeout = self.timeout;
        let envelope = self.envelope.take();
        self.run(deps, &[check], |_| match &envelope {
            Some(e) => vec![f(e, timeout)],
            None => vec![checks::check(id, section, NOT_RUN_FIX).not_run("manifest")],
        });
        self.envelope = envelope;
    }
}

/// The fix of a check that was not run.
const NOT_RUN_FIX: &str = "fix the check named in blocked_by first";

fn attach_stderr(checks: &mut [Check], battery: &checks::Battery<'_>) {
    for c in checks.iter_mut() {
        if c.status == Status::Fail && c.stderr.is_empty() {
            c.stderr = battery.last_stderr.borrow().clone();
        }
    }
}

/// `--bench CALLS`: the round trip of each command (separated by `:::`),
/// printed as a table; the rows for `--json`.
pub fn bench(opts: &Options, calls: usize) -> Result<Vec<bench::BenchRow>, String> {
    let commands: Vec<Vec<String>> = opts
        .command
        .split(|a| a == ":::")
        .filter(|c| !c.is_empty())
        .map(<[String]>::to_vec)
        .collect();
    let mut seats = Vec::new();
    for c in &commands {
        let (spec, ro) = launch_spec(c, opts)?;
        let launcher = launcher_for(opts.launcher, &ro, &spec.program)?;
        seats.push((c.join(" "), spec, launcher));
    }
    let _ = sweep::become_subreaper();
    let leftovers = std::rc::Rc::new(std::cell::Cell::new(0));
    let mut samples = vec![Vec::new(); seats.len()];
    for _ in 0..bench::ROUND_COUNT {
        for (i, (name, spec, launcher)) in seats.iter().enumerate() {
            let battery = checks::Battery {
                launcher: &**launcher,
                spec: spec.clone(),
                handshake: opts.handshake_timeout,
                step: opts.step_timeout,
                leftovers: leftovers.clone(),
                last_stderr: Default::default(),
            };
            let round = bench::one_round(&battery, calls).map_err(|e| format!("{name}: {e}"))?;
            samples[i].extend(round);
        }
    }
    Ok(seats
        .into_iter()
        .zip(samples)
        .map(|((name, _, _), s)| bench::row(name, s))
        .collect())
}

pub use bench::{BenchRow, print_table as print_bench};

/// The launch of `opts.command`: the program resolved, path arguments made
/// absolute, and (for the sandbox) the read-only paths that make a script
/// and its SDK visible inside.
fn launch_spec(command: &[String], opts: &Options) -> Result<(LaunchSpec, Vec<String>), String> {
    let (first, rest) = command
        .split_first()
        .ok_or("give the plugin's command after --, e.g. sharedos conformance -- ./my-plugin")?;
    let search = match opts.launcher {
        LauncherKind::Sandbox | LauncherKind::Gvisor | LauncherKind::Microvm => {
            SANDBOX_PATH.to_owned()
        }
        LauncherKind::Direct => std::env::var("PATH").unwrap_or_else(|_| SANDBOX_PATH.into()),
    };
    let program = resolve_program(first, &search)?;
    let mut ro: Vec<String> = Vec::new();
    let mut args = Vec::with_capacity(rest.len());
    for a in rest {
        args.push(path_argument(a, &mut ro));
    }
    for extra in &opts.ro_paths {
        let abs = extra
            .canonicalize()
            .map_err(|e| format!("--ro {}: {e}", extra.display()))?;
        push_unique(&mut ro, abs.display().to_string());
    }
    let env = vec![
        (PLUGIN_COOKIE_ENV.to_owned(), "1".to_owned()),
        ("PATH".to_owned(), SANDBOX_PATH.to_owned()),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
    ];
    let spec = LaunchSpec {
        program,
        args,
        env,
        program_sha256: None,
        runtime_id: "conformance".into(),
        execution_id: "exec-conformance".into(),
        turn_id: turn::TURN_ID.into(),
    };
    Ok((spec, ro))
}

/// An argument as given, or, when it names an existing file, its absolute
/// path with its last component's symlink kept (a venv's `bin/python` must stay that path
/// to find its `pyvenv.cfg`). The package roots of the path and of its
/// target are bound read-only, so both are visible in the sandbox.
fn path_argument(a: &str, ro: &mut Vec<String>) -> String {
    let p = Path::new(a);
    if a.starts_with('-') || !p.exists() {
        return a.to_owned();
    }
    // The directory is resolved (so `..` goes), the last component kept.
    let abs = match (p.parent(), p.file_name()) {
        (Some(dir), Some(name)) => {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            dir.canonicalize().map(|d| d.join(name))
        }
        _ => p.canonicalize(),
    };
    let Ok(abs) = abs else {
        return a.to_owned();
    };
    push_unique(ro, package_root(&abs).display().to_string());
    if let Ok(target) = abs.canonicalize()
        && target != abs
    {
        push_unique(ro, package_root(&target).display().to_string());
    }
    abs.display().to_string()
}

fn push_unique(v: &mut Vec<String>, s: String) {
    if !v.contains(&s) {
        v.push(s);
    }
}

/// The program's absolute path, its symlinks kept: a venv's `bin/python`
/// must be executed by that path to find its `pyvenv.cfg` (the sandbox runs
/// it from there when it lies inside a `--ro` path).
fn resolve_program(name: &str, search: &str) -> Result<PathBuf, String> {
    if name.contains('/') {
        let abs = std::path::absolute(name).map_err(|e| format!("{name}: {e}"))?;
        std::fs::metadata(&abs).map_err(|e| format!("{name}: {e}"))?;
        return Ok(abs);
    }
    search
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("{name}: not found in {search} (give a path)"))
}

/// The directory a script belongs to: the nearest ancestor (up to four
/// levels) holding a package manifest, so the SDK next to an example is
/// visible too; otherwise the script's own directory.
fn package_root(file: &Path) -> PathBuf {
    let start = if file.is_dir() {
        file
    } else {
        file.parent().unwrap_or(file)
    };
    let mut dir = start;
    for _ in 0..4 {
        if ["pyproject.toml", "package.json", "Cargo.toml", "setup.py"]
            .iter()
            .any(|m| dir.join(m).is_file())
        {
            return dir.to_path_buf();
        }
        match dir.parent() {
            Some(p) => dir = p,
            None => break,
        }
    }
    start.to_path_buf()
}

/// The human report; returns the exit code (0 passed, 1 failed).
pub fn print_human(report: &Report, out: &mut dyn Write) -> i32 {
    let _ = writeln!(
        out,
        "sharedos conformance: {} ({} launcher)",
        report.command.join(" "),
        report.launcher
    );
    if !report.read_only_paths.is_empty() {
        let _ = writeln!(
            out,
            "  read-only inside the sandbox: {}",
            report.read_only_paths.join(", ")
        );
    }
    for c in &report.checks {
        let tag = match c.status {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::NotApplicable => "N/A ",
            Status::NotRun => "----",
        };
        let _ = writeln!(out, "  {tag} {:<30} §{:<8} {}", c.id, c.section, c.detail);
        if c.status == Status::Fail {
            let _ = writeln!(out, "       fix: {}", c.fix);
            if !c.stderr.is_empty() {
                let _ = writeln!(out, "       the plugin's last stderr lines:");
            }
            for line in &c.stderr {
                let _ = writeln!(out, "         | {line}");
            }
        }
    }
    let count = |s| report.checks.iter().filter(|c| c.status == s).count();
    let _ = writeln!(
        out,
        "{}: {} passed, {} failed, {} not applicable, {} not run",
        if report.passed {
            "CONFORMS"
        } else {
            "DOES NOT CONFORM"
        },
        count(Status::Pass),
        count(Status::Fail),
        count(Status::NotApplicable),
        count(Status::NotRun)
    );
    i32::from(!report.passed)
}
