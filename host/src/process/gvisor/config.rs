//! `launcher = "gvisor"` of a runtime entry checked at load: where runsc
//! is (docs/SECURITY.md, "gVisor"). A network policy, a harness over MCP
//! HTTP and prepared containers (`warm`) are carried by the launcher.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[runtimes.gvisor]`: the gVisor launcher's own settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GvisorSection {
    /// The runsc binary, an absolute path. Absent: `runsc` is looked up on
    /// the host's `PATH` when the runtime is seated.
    #[serde(default)]
    pub runsc: Option<PathBuf>,
}

/// The `[runtimes.gvisor]` table of entry `i` (`section`): for the gVisor
/// launcher only (`gvisor`: the entry's launcher is it), its runsc an
/// absolute path.
pub(crate) fn check(i: usize, gvisor: bool, section: Option<&GvisorSection>) -> Result<(), String> {
    if !gvisor {
        if section.is_some() {
            return Err(format!(
                "runtimes[{i}].gvisor: applies to launcher = \"gvisor\" only; remove it or set the launcher"
            ));
        }
        return Ok(());
    }
    if let Some(runsc) = section.and_then(|g| g.runsc.as_ref())
        && !runsc.is_absolute()
    {
        return Err(format!(
            "runtimes[{i}].gvisor.runsc: must be an absolute path, got {:?}",
            runsc.display()
        ));
    }
    Ok(())
}
