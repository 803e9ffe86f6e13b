//! The engines a plugin can run in, for suites that run the same cases in
//! each (tests/tests/engines.rs): the launcher an entry gets in each, in a
//! test process (whose own binary does not serve `__sandbox-exec`).
//! Every engine listed runs: a machine without its tool (runsc; QEMU or
//! the guest kernel) fails the case with the fix, never skips it.

use std::sync::Arc;

use sharedos_host::config::RuntimeEntry;
use sharedos_host::config::microvm::MicrovmSection;
use sharedos_host::process::{GvisorLauncher, Launcher, MicrovmLauncher};
use sharedos_host::sandboxed::SandboxLauncher;

use crate::bait::helper_exe;
use crate::binaries::workspace_bin;

/// An engine of the suites.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// sharedos's own namespace sandbox (`launcher = "sandbox"`).
    Sandbox,
    /// runsc (`launcher = "gvisor"`).
    Gvisor,
    /// A QEMU microVM (`launcher = "microvm"`): QEMU on `PATH`, the guest
    /// kernel `SHAREDOS_MICROVM_KERNEL` names (`scripts/test` provisions
    /// both) or the newest `/boot/vmlinuz-*-cloud-amd64`, the workspace's
    /// `sharedos-guest-init`.
    Microvm,
}

/// Every engine the shared cases run in.
pub const ENGINES: [Engine; 3] = [Engine::Sandbox, Engine::Gvisor, Engine::Microvm];

/// The microVM's RAM in the suites: enough for the guest kernel, the
/// image (the program, its libraries, the init) and the plugin; the
/// default policy's `cgroup.memoryMax` (4 GiB) would be the default.
pub const MICROVM_MEMORY_MIB: u64 = 256;

/// How long a plugin in a microVM may take to answer `initialize` once
/// the guest is up (the plugin starts under TCG on a loaded machine).
const MICROVM_HANDSHAKE_MS: u64 = 60_000;

impl Engine {
    /// The `launcher = ...` value of a runtime entry.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Sandbox => "sandbox",
            Engine::Gvisor => "gvisor",
            Engine::Microvm => "microvm",
        }
    }

    /// Whether a harness runtime (`[runtimes.harness]`, a vendor CLI or
    /// an MCP client) runs in this engine: in every engine now (the
    /// microVM carries the CLI on a read-only disk image,
    /// host/src/process/microvm/disk.rs). An engine that refused one would
    /// answer `false` here and the harness cases would check its refusal.
    pub fn runs_harness(self) -> bool {
        match self {
            Engine::Sandbox | Engine::Gvisor | Engine::Microvm => true,
        }
    }

    /// The `engine` field of the engine's sandbox report.
    pub fn report_engine(self) -> &'static str {
        match self {
            Engine::Sandbox => "namespace",
            Engine::Gvisor => "gvisor",
            Engine::Microvm => "microvm",
        }
    }

    /// The keys a runtime entry gets in this engine: its `launcher`, and
    /// for the microVM the guest's RAM and a handshake bound for TCG.
    pub fn entry_keys(self) -> String {
        let mut keys = format!("launcher = \"{}\"\n", self.name());
        if self == Engine::Microvm {
            keys.push_str(&format!(
                "handshakeTimeoutMs = {MICROVM_HANDSHAKE_MS}\nmicrovm = {{ memoryMib = {MICROVM_MEMORY_MIB} }}\n"
            ));
        }
        keys
    }

    /// `entry` (built in code) set to run in this engine, as
    /// [`Engine::entry_keys`] would configure it.
    pub fn set_up(self, entry: &mut RuntimeEntry) {
        use sharedos_host::config::LauncherKind;
        entry.launcher = match self {
            Engine::Sandbox => LauncherKind::Sandbox,
            Engine::Gvisor => LauncherKind::Gvisor,
            Engine::Microvm => LauncherKind::Microvm,
        };
        if self == Engine::Microvm {
            entry.handshake_timeout_ms = MICROVM_HANDSHAKE_MS;
            entry.microvm = Some(MicrovmSection {
                memory_mib: Some(MICROVM_MEMORY_MIB),
                ..MicrovmSection::default()
            });
        }
    }

    /// The launcher of `entry` in this engine, its helper the workspace's
    /// `sharedos` binary. Panics with the fix when the engine's tool is
    /// missing.
    pub fn launcher(self, entry: &RuntimeEntry) -> Arc<dyn Launcher> {
        let policy = entry.sandbox_policy();
        match self {
            Engine::Sandbox => Arc::new(SandboxLauncher::new(helper_exe(), policy)),
            Engine::Gvisor => {
                let runsc = entry.gvisor.as_ref().and_then(|g| g.runsc.as_deref());
                let l = GvisorLauncher::new(policy, runsc)
                    .unwrap_or_else(|e| panic!("the gVisor engine: {e}"));
                Arc::new(l.with_helper_exe(helper_exe()))
            }
            Engine::Microvm => {
                let mut settings = entry.microvm_settings();
                // The test binary has no `sharedos-guest-init` beside it.
                settings
                    .init
                    .get_or_insert_with(|| workspace_bin("sharedos-guest-init"));
                let l = MicrovmLauncher::new(policy, &settings)
                    .unwrap_or_else(|e| panic!("the microVM engine: {e}"));
                Arc::new(l)
            }
        }
    }

    /// `text` (a host.toml with `[[runtimes]]` entries) with every runtime
    /// in this engine: [`Engine::entry_keys`] after each `[[runtimes]]`
    /// header.
    pub fn configure(self, text: &str) -> String {
        let keys = self.entry_keys();
        let mut out = String::with_capacity(text.len() + 64);
        for line in text.lines() {
            out.push_str(line);
            out.push('\n');
            if line.trim() == "[[runtimes]]" {
                out.push_str(&keys);
            }
        }
        out
    }
}
