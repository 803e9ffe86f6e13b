//! `sharedos sandbox check`'s list of engines: each launcher a runtime can
//! name, whether this machine can run it, and the fix when it cannot; and
//! `sandbox check --runtime` of a runtime under gVisor.

use std::io::Write;

use sharedos_host::config::RuntimeEntry;
use sharedos_host::process::gvisor::{GVISOR_LEVEL, GvisorLauncher, platform};
use sharedos_sandbox::SandboxLevel;

/// One line per engine. `namespace` is the level the check above found.
pub fn print_engines(namespace: Option<SandboxLevel>, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(out, "engines (runtimes.launcher):")?;
    match namespace {
        Some(level) => writeln!(
            out,
            "  namespace (launcher = \"sandbox\"): yes, at level {level} (see the layers above)"
        )?,
        None => writeln!(
            out,
            "  namespace (launcher = \"sandbox\"): no: the check above failed"
        )?,
    }
    match GvisorLauncher::new(sharedos_sandbox::SandboxPolicy::default(), None) {
        Ok(l) => {
            let p = platform(l.runsc());
            writeln!(
                out,
                "  gvisor (launcher = \"gvisor\"): yes, {} ({}), platform {} ({}); level {GVISOR_LEVEL}, memory unbounded (no cgroup)",
                l.runsc().version,
                l.runsc().path.display(),
                p.name,
                p.why
            )?;
        }
        Err(e) => writeln!(out, "  gvisor (launcher = \"gvisor\"): no: {e}")?,
    }
    writeln!(
        out,
        "  direct (launcher = \"direct\"): yes, with no isolation at all (development only)"
    )
}

/// `sandbox check --runtime` of a gVisor runtime: runsc, the platform and
/// the level; 0 when it reaches the runtime's minimum, 1 when it does not
/// or runsc cannot run here.
pub fn check_gvisor(entry: &RuntimeEntry, out: &mut dyn Write) -> std::io::Result<i32> {
    let runsc = entry.gvisor.as_ref().and_then(|g| g.runsc.as_deref());
    let launcher = match GvisorLauncher::new(entry.sandbox_policy(), runsc) {
        Ok(l) => l,
        Err(e) => {
            writeln!(out, "launcher: gvisor: cannot run here: {e}")?;
            return Ok(1);
        }
    };
    let p = platform(launcher.runsc());
    writeln!(
        out,
        "launcher: gvisor: {} ({}), platform {} ({})",
        launcher.runsc().version,
        launcher.runsc().path.display(),
        p.name,
        p.why
    )?;
    writeln!(
        out,
        "level: {GVISOR_LEVEL} (the container's memory is unbounded: runsc --ignore-cgroups)"
    )?;
    let s = &entry.sandbox;
    writeln!(out, "required: {} (runtimes.sandbox.minLevel)", s.min_level)?;
    let ok = s.min_level <= GVISOR_LEVEL && !s.require_memory_bound;
    if !ok {
        writeln!(
            out,
            "refused: a gVisor container here is {GVISOR_LEVEL} with no memory bound"
        )?;
    }
    Ok(if ok { 0 } else { 1 })
}
