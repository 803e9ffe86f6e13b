//! `launcher = "gvisor"` of a runtime entry checked at load: where runsc
//! is (docs/SECURITY.md, "gVisor"). A network policy, a harness over MCP
//! HTTP and prepared containers (`warm`) are carried by the launcher.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{LauncherKind, RuntimeEntry};

/// `[runtimes.gvisor]`: the gVisor launcher's own settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GvisorSection {
    /// The runsc binary, an absolute path. Absent: `runsc` is looked up on
    /// the host's `PATH` when the runtime is seated.
    #[serde(default)]
    pub runsc: Option<PathBuf>,
}

/// The `[runtimes.gvisor]` table of entry `i`: for the gVisor launcher
/// only, its runsc an absolute path.
pub(super) fn check(i: usize, r: &RuntimeEntry) -> Result<(), String> {
    if r.launcher != LauncherKind::Gvisor {
        if r.gvisor.is_some() {
            return Err(format!(
                "runtimes[{i}].gvisor: applies to launcher = \"gvisor\" only; remove it or set the launcher"
            ));
        }
        return Ok(());
    }
    if let Some(runsc) = r.gvisor.as_ref().and_then(|g| g.runsc.as_ref())
        && !runsc.is_absolute()
    {
        return Err(format!(
            "runtimes[{i}].gvisor.runsc: must be an absolute path, got {:?}",
            runsc.display()
        ));
    }
    Ok(())
}
