//! `sharedos sandbox check`'s list of engines: each launcher a runtime can
//! name, whether this machine can run it, and the fix when it cannot; and
//! `sandbox check --runtime` of a runtime under gVisor.

use std::io::Write;

use serde_json::Value;
use sharedos_host::config::RuntimeEntry;
use sharedos_host::process::LaunchSpec;
use sharedos_host::process::gvisor::{GVISOR_LEVEL, GvisorLauncher, platform};
use sharedos_host::process::microvm::{MICROVM_LEVEL, MicrovmLauncher, MicrovmSettings};
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
    print_microvm(out)?;
    writeln!(
        out,
        "  direct (launcher = \"direct\"): yes, with no isolation at all (development only)"
    )
}

/// The microVM engine: QEMU, the guest kernel and init found, and a probe
/// guest booted under the accelerator launches would use.
fn print_microvm(out: &mut dyn Write) -> std::io::Result<()> {
    let settings = MicrovmSettings {
        qemu: None,
        kernel: None,
        init: None,
        memory_mib: sharedos_host::config::microvm::DEFAULT_MEMORY_MIB,
        vcpus: 1,
        mkfs: None,
        harness_cli: None,
    };
    let launcher = match MicrovmLauncher::new(sharedos_sandbox::SandboxPolicy::default(), &settings)
    {
        Ok(l) => l,
        Err(e) => return writeln!(out, "  microvm (launcher = \"microvm\"): no: {e}"),
    };
    match launcher.boot_check() {
        Ok((accel, ms)) => writeln!(
            out,
            "  microvm (launcher = \"microvm\"): yes, {}; accelerator {} ({}), a probe guest booted to its init in {ms} ms; level {MICROVM_LEVEL}, memory bounded by the VM's RAM",
            launcher.summary(),
            accel.name,
            accel.why
        ),
        Err(e) => writeln!(
            out,
            "  microvm (launcher = \"microvm\"): no: {}; a probe guest did not boot: {e}; check the kernel (runtimes.microvm.kernel) and that QEMU runs (`qemu-system-x86_64 -M microvm -accel tcg`)",
            launcher.summary()
        ),
    }
}

/// `sandbox check --runtime` of a gVisor runtime: runsc, the platform and
/// the level; 0 when it reaches the runtime's minimum, 1 when it does not
/// or runsc cannot run here.
pub fn check_gvisor(
    entry: &RuntimeEntry,
    spec: &LaunchSpec,
    out: &mut dyn Write,
) -> std::io::Result<i32> {
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
    match launcher.describe(spec) {
        Ok(report) => print_container(&report, out)?,
        Err(e) => writeln!(out, "refused: {e}")?,
    }
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

/// `sandbox check --runtime` of a microVM runtime: QEMU, the kernel, the
/// accelerator, and the report a launch would have; 0 when it would
/// launch, 1 when it cannot run here or would be refused.
pub fn check_microvm(
    entry: &RuntimeEntry,
    spec: &LaunchSpec,
    out: &mut dyn Write,
) -> std::io::Result<i32> {
    let settings = entry.microvm_settings();
    let launcher = match MicrovmLauncher::new(entry.sandbox_policy(), &settings) {
        Ok(l) => l,
        Err(e) => {
            writeln!(out, "launcher: microvm: cannot run here: {e}")?;
            return Ok(1);
        }
    };
    let accel = launcher.accel();
    writeln!(out, "launcher: microvm: {}", launcher.summary())?;
    writeln!(out, "accelerator: {} ({})", accel.name, accel.why)?;
    writeln!(
        out,
        "level: {MICROVM_LEVEL} (memory bounded by the VM's RAM)"
    )?;
    match launcher.describe(spec) {
        Ok(report) => {
            let text = serde_json::to_string_pretty(&report).unwrap_or_default();
            writeln!(out, "report: {text}")?;
            Ok(0)
        }
        Err(e) => {
            writeln!(out, "refused: {e}")?;
            Ok(1)
        }
    }
}

/// What the container of a runtime holds: the program, the environment
/// keys and every mount of its root.
fn print_container(report: &Value, out: &mut dyn Write) -> std::io::Result<()> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    writeln!(out, "program: {}", text(&report["program"]))?;
    let keys: Vec<String> = report["env_keys"]
        .as_array()
        .into_iter()
        .flatten()
        .map(text)
        .collect();
    writeln!(out, "environment keys: {}", keys.join(", "))?;
    writeln!(out, "network: {}", text(&report["network"]))?;
    writeln!(
        out,
        "filesystem (every mount; nothing else of the host exists inside):"
    )?;
    for m in report["root"].as_array().into_iter().flatten() {
        writeln!(
            out,
            "  {:<3} {:<40} {}",
            text(&m["mode"]),
            text(&m["path"]),
            text(&m["what"])
        )?;
    }
    Ok(())
}
