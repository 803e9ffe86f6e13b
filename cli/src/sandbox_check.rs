//! `sharedos sandbox check --runtime ID --config host.toml`: exactly what
//! one configured runtime will see. The sandbox is built for real, with
//! the runtime's policy, program, arguments and environment, and the
//! plugin process stops right before its `execve` (a prepared sandbox
//! that is never started): every bound path, the program's path inside,
//! the environment keys and the layers are what a turn would get, and no
//! plugin code runs.

use std::io::Write;
use std::path::Path;

use sharedos_sandbox::SandboxReport;

use sharedos_host::config::{HostConfig, LauncherKind, RuntimeEntry};
use sharedos_host::preflight;

/// Prints what runtime `id` of `config_path` sees. Exit code: 0 when its
/// sandbox reaches the runtime's `minLevel` (and bounds the tree's memory
/// where `requireMemoryBound` asks it to), 1 when it does not, 2 on a
/// configuration or setup error.
pub fn check_runtime(config_path: &Path, id: &str, out: &mut dyn Write) -> i32 {
    match check(config_path, id, out) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sharedos sandbox check: {e}");
            2
        }
    }
}

fn check(config_path: &Path, id: &str, out: &mut dyn Write) -> Result<i32, String> {
    let config = HostConfig::load(config_path).map_err(|e| e.to_string())?;
    let entry = config
        .runtimes
        .iter()
        .find(|r| r.id.as_str() == id)
        .ok_or_else(|| {
            let ids: Vec<&str> = config.runtimes.iter().map(|r| r.id.as_str()).collect();
            format!(
                "{}: no runtime {id:?} (defined: {})",
                config_path.display(),
                ids.join(", ")
            )
        })?;
    // The seat's own launch spec: program, arguments, environment and the
    // plugin cookie exactly as a turn gets them.
    let spec = preflight::launch_spec(&config, entry)?;
    let w = |e: std::io::Error| e.to_string();
    writeln!(
        out,
        "sharedos sandbox check --runtime {id} ({})",
        config_path.display()
    )
    .map_err(w)?;
    if entry.launcher == LauncherKind::Gvisor {
        return crate::engines::check_gvisor(entry, &spec, out).map_err(w);
    }
    if entry.launcher == LauncherKind::Microvm {
        return crate::engines::check_microvm(entry, &spec, out).map_err(w);
    }
    if entry.launcher == LauncherKind::Direct {
        writeln!(
            out,
            "launcher: direct: NO sandbox. The plugin runs as the host's uid ({}) in the host's \
             working directory and sees the host's whole filesystem (docs/PLUGINS.md, section 6).\n\
             program: {}\nenvironment keys: {}",
            rustix::process::geteuid().as_raw(),
            spec.program.display(),
            keys(spec.env.iter().map(|(k, _)| k.as_str()))
        )
        .map_err(w)?;
        return Ok(1);
    }
    let report = preflight::probe_sandbox(entry, &spec)?;
    print_view(entry, &spec.args, &report, out).map_err(w)?;
    writeln!(
        out,
        "policy: seccomp {} mode, network {}",
        report.seccomp.mode, report.landlock.net
    )
    .map_err(w)?;
    sharedos_sandbox::check::print_report(&report, out).map_err(w)?;
    let required = entry.sandbox.min_level;
    writeln!(out, "required: {required} (runtimes.sandbox.minLevel)").map_err(w)?;
    // The verdict `GET /v1/preflight` gives too.
    let verdict = preflight::sandbox_verdict(entry, &report);
    if let Err(e) = report.require_memory_bound(entry.sandbox.require_memory_bound) {
        writeln!(out, "refused: {e}").map_err(w)?;
    }
    Ok(if verdict.meets_min_level && verdict.meets_memory_bound {
        0
    } else {
        1
    })
}

fn keys<'a>(k: impl Iterator<Item = &'a str>) -> String {
    let mut v: Vec<&str> = k.collect();
    v.sort_unstable();
    v.join(", ")
}

fn print_view(
    entry: &RuntimeEntry,
    args: &[String],
    r: &SandboxReport,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    writeln!(out, "launcher: sandbox")?;
    let Some(view) = &r.view else {
        writeln!(
            out,
            "filesystem: no minimal root on this host (the mount namespace is missing: see the \
             layers below); the plugin sees the host's filesystem through Landlock only"
        )?;
        return Ok(());
    };
    let how = if view.program_in_place {
        "executed from its own path: it lies inside a read-only path"
    } else {
        "a staged copy of the configured file, bound read-only"
    };
    writeln!(out, "program: {} ({how})", view.program)?;
    writeln!(out, "  configured: {}", entry.program)?;
    writeln!(out, "args: {args:?}")?;
    writeln!(out, "working directory: {}", view.workdir)?;
    writeln!(
        out,
        "environment keys: {} (HOME={}, TMPDIR={})",
        keys(r.env_keys.iter().map(String::as_str)),
        sharedos_sandbox::fsview::HOME,
        sharedos_sandbox::fsview::TMP
    )?;
    writeln!(
        out,
        "filesystem (every mount; nothing else of the host exists inside):"
    )?;
    for m in &view.mounts {
        writeln!(out, "  {:<3} {:<40} {}", m.access, m.path, m.source)?;
    }
    Ok(())
}
