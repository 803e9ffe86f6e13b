//! The engines a plugin can run in, for suites that run the same cases in
//! each (tests/tests/engines.rs): the launcher an entry gets in each, in a
//! test process (whose own binary does not serve `__sandbox-exec`).
//! Every engine listed runs: a machine without its tool fails the case
//! with the fix, never skips it.

use std::sync::Arc;

use sharedos_host::config::RuntimeEntry;
use sharedos_host::process::{GvisorLauncher, Launcher};
use sharedos_host::sandboxed::SandboxLauncher;

use crate::bait::helper_exe;

/// An engine of the suites.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// sharedos's own namespace sandbox (`launcher = "sandbox"`).
    Sandbox,
    /// runsc (`launcher = "gvisor"`).
    Gvisor,
}

/// Every engine the shared cases run in.
pub const ENGINES: [Engine; 2] = [Engine::Sandbox, Engine::Gvisor];

impl Engine {
    /// The `launcher = ...` value of a runtime entry.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Sandbox => "sandbox",
            Engine::Gvisor => "gvisor",
        }
    }

    /// The `engine` field of the engine's sandbox report.
    pub fn report_engine(self) -> &'static str {
        match self {
            Engine::Sandbox => "namespace",
            Engine::Gvisor => "gvisor",
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
        }
    }

    /// `text` (a host.toml with `[[runtimes]]` entries) with every runtime
    /// in this engine: `launcher = ...` after each `[[runtimes]]` header.
    pub fn configure(self, text: &str) -> String {
        let mut out = String::with_capacity(text.len() + 64);
        for line in text.lines() {
            out.push_str(line);
            out.push('\n');
            if line.trim() == "[[runtimes]]" {
                out.push_str(&format!("launcher = \"{}\"\n", self.name()));
            }
        }
        out
    }
}
