//! The descriptor of one sandbox layer: its name, its switch in the
//! policy, where its outcome sits in the report, what `strong` asks of it,
//! the operator's fix, and (for a layer the helper builds in a step of
//! its own) how it is applied. The registry ([`super::LAYERS`]) is the
//! one list the report's initial state, its `missing` list and level,
//! `sandbox check` and the helper's generic steps read.

use crate::policy::SandboxPolicy;
use crate::report::{LayerStatus, MissingLayer, SandboxReport};
use crate::request::HelperRequest;

/// Where a layer is built (docs/spec/sandbox.md B.1 and B.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// In the host, before the helper starts (the cgroup).
    Host,
    /// In the supervisor, for the whole tree (after the namespaces and
    /// the limits of step 7, before pid 1 is forked).
    Supervisor,
    /// In pid 1 (the minimal root, the hostname).
    PidOne,
    /// In the plugin's process, before no_new_privs, Landlock and
    /// seccomp (which stay last, in that order).
    Plugin,
}

/// What the level `strong` asks of a layer (docs/spec/sandbox.md B.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    /// Listed in `missing` unless applied.
    Applied,
    /// Listed in `missing` unless applied or degraded: a kernel without
    /// part of it keeps the rest, reported.
    AppliedOrDegraded,
    /// Reported only; the level does not depend on it.
    Reported,
}

/// Where a layer's outcome is in the report.
pub(crate) enum Slot {
    /// A [`LayerStatus`] field.
    Status(
        fn(&SandboxReport) -> &LayerStatus,
        fn(&mut SandboxReport) -> &mut LayerStatus,
    ),
    /// A flag: enforced when true; the reason it is missing otherwise.
    Flag(
        fn(&SandboxReport) -> bool,
        fn(&mut SandboxReport, bool),
        &'static str,
    ),
}

/// A layer's own step: what it enforced, or why the spawn fails.
pub(crate) type Apply = fn(&HelperRequest, &mut SandboxReport) -> Result<LayerStatus, String>;

/// One layer of the sandbox.
pub(crate) struct Layer {
    /// Its name in the report's `missing` list and in `sandbox check`.
    pub name: &'static str,
    /// Where it is built.
    pub stage: Stage,
    /// Its switch in the policy (`layers.*`); `None`: always attempted.
    pub toggle: Option<fn(&SandboxPolicy) -> bool>,
    /// Its outcome in the report.
    pub slot: Slot,
    /// What `strong` asks of it.
    pub need: Need,
    /// What the operator can do when it is missing.
    pub fix: &'static str,
    /// What `sandbox check` prints after its state (may be empty).
    pub detail: fn(&SandboxReport) -> String,
    /// Its step, run by the helper at `stage` in registry order; `None`
    /// for a layer the helper's choreography builds in a step of its own
    /// (namespaces in one `unshare`, the root, Landlock, seccomp, ...).
    pub apply: Option<Apply>,
}

/// No detail in `sandbox check`.
pub(crate) fn no_detail(_: &SandboxReport) -> String {
    String::new()
}

/// `sandbox check`'s detail for a map of values written: ` (a=1, b=2)`.
pub(crate) fn listing(m: &std::collections::BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return String::new();
    }
    let items: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!(" ({})", items.join(", "))
}

/// The fix for the namespaces and the root, which all need a user
/// namespace as a non-root host.
pub(crate) const USERNS_FIX: &str = "allow unprivileged user namespaces (sysctl \
     user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1, no AppArmor userns \
     restriction) or, in a container, run with a seccomp profile that permits unshare/clone \
     namespace flags";

impl Layer {
    /// Whether the policy asks for this layer.
    pub(crate) fn wanted(&self, policy: &SandboxPolicy) -> bool {
        self.toggle.is_none_or(|on| on(policy))
    }

    /// Its state in `r` (a flag reads as applied or unavailable).
    pub(crate) fn status(&self, r: &SandboxReport) -> LayerStatus {
        match &self.slot {
            Slot::Status(get, _) => get(r).clone(),
            Slot::Flag(get, _, _) if get(r) => LayerStatus::Applied,
            Slot::Flag(_, _, unset) => LayerStatus::unavailable(unset),
        }
    }

    /// Record its state in `r` (a flag is set when applied).
    pub(crate) fn set(&self, r: &mut SandboxReport, st: LayerStatus) {
        match &self.slot {
            Slot::Status(_, slot) => *slot(r) = st,
            Slot::Flag(_, set, _) => set(r, st == LayerStatus::Applied),
        }
    }

    /// Its entry in `missing` when `r` falls short of what `strong` asks.
    pub(crate) fn missing(&self, r: &SandboxReport) -> Option<MissingLayer> {
        let st = self.status(r);
        let reason = match (self.need, st) {
            (Need::Reported, _) | (_, LayerStatus::Applied) => return None,
            (Need::AppliedOrDegraded, LayerStatus::Degraded { .. }) => return None,
            (_, LayerStatus::Disabled) => "disabled by the sandbox policy".to_string(),
            (_, LayerStatus::Degraded { reason } | LayerStatus::Unavailable { reason }) => reason,
        };
        Some(MissingLayer {
            layer: self.name.to_string(),
            reason,
            fix: self.fix.to_string(),
        })
    }
}
