//! The layers of the sandbox: one module per layer (or family of layers),
//! each with its [`Layer`] descriptor, and the registry [`LAYERS`] that the
//! report's initial state, its `missing` list and level, `sandbox check`
//! and the helper's generic steps read. A new layer is a module here, a
//! line in [`LAYERS`], and its switch ([`crate::LayerToggles`]) and
//! status field in `report.rs` (docs/ARCHITECTURE.md, "Where to change X").

pub mod caps;
pub mod fsview;
mod identity;
pub(crate) mod inside;
pub mod landlock;
pub(crate) mod layer;
pub(crate) mod memory;
pub mod mounts;
pub mod namespaces;
pub mod procmask;
pub mod rlimits;
pub mod seccomp;
pub mod users;
mod vfs;

pub(crate) use layer::{Layer, Stage};

use crate::host::cgroup;
use crate::report::{LayerStatus, SandboxLevel, SandboxReport};
use crate::request::HelperRequest;

/// Every layer, in the order the report's `missing` list and `sandbox
/// check` name them.
pub(crate) const LAYERS: &[&Layer] = &[
    &identity::LIFELINE,
    &identity::SETSID,
    &identity::SUPERVISOR,
    &namespaces::USERNS,
    &namespaces::MOUNTNS,
    &namespaces::PIDNS,
    &namespaces::NETNS,
    &namespaces::IPCNS,
    &namespaces::IPC_LIMITS,
    &namespaces::UTSNS,
    &namespaces::CGROUPNS,
    &mounts::LAYER,
    &landlock::LAYER,
    &seccomp::LAYER,
    &caps::LAYER,
    &rlimits::LAYER,
    &namespaces::CEILINGS,
    &identity::UID_DROP,
    &identity::OWN_UID,
    &identity::NO_NEW_PRIVS,
    &cgroup::LAYER,
];

/// Run the steps of the layers built at `stage` that have one, in
/// registry order; the first that fails names its layer.
pub(crate) fn apply_at(
    stage: Stage,
    req: &HelperRequest,
    rep: &mut SandboxReport,
) -> Result<(), (&'static str, String)> {
    for layer in LAYERS.iter().filter(|l| l.stage == stage) {
        if let Some(apply) = layer.apply
            && layer.wanted(&req.policy)
        {
            let st = apply(req, rep).map_err(|e| (layer.name, e))?;
            layer.set(rep, st);
        }
    }
    Ok(())
}

/// Compute `level` and `missing` from the layers and the self-check
/// (docs/spec/sandbox.md B.7).
pub(crate) fn finalize(rep: &mut SandboxReport) {
    let mut missing: Vec<_> = LAYERS.iter().filter_map(|l| l.missing(rep)).collect();
    let memory = memory::missing(rep);
    let sc = &rep.self_check;
    let kernel_ok = sc.no_new_privs == Some(true)
        && sc.seccomp == Some(2)
        && sc.cap_eff == Some(0)
        && sc.cap_prm == Some(0)
        && sc.uid.is_some_and(|u| u != 0);
    if !kernel_ok {
        rep.warnings.push(format!(
            "self-check disagrees with the layers: NoNewPrivs={:?} Seccomp={:?} CapEff={:?} CapPrm={:?} Uid={:?}",
            sc.no_new_privs, sc.seccomp, sc.cap_eff, sc.cap_prm, sc.uid
        ));
    }
    let base = kernel_ok
        && rep.seccomp.status.is_enforced()
        && rep.caps.is_enforced()
        && rep.no_new_privs
        && rep.rlimits_status.is_enforced();
    // Reduced still needs a filesystem boundary (Landlock, or the
    // minimal root) and no network (the strict filter, or a netns).
    let fs_boundary = rep.landlock.status.is_enforced() || rep.root == LayerStatus::Applied;
    let no_network = rep.seccomp.mode == "strict" || rep.netns == LayerStatus::Applied;
    // Strong also needs the whole tree's memory bounded; every isolation
    // layer without it is `isolated`.
    rep.level = if base && missing.is_empty() {
        match memory {
            None => SandboxLevel::Strong,
            Some(_) => SandboxLevel::Isolated,
        }
    } else if base && fs_boundary && no_network && rep.uid_drop != LayerStatus::Disabled {
        SandboxLevel::Reduced
    } else {
        SandboxLevel::Minimal
    };
    missing.extend(memory);
    rep.missing = missing;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixes `missing` carried before the layers had descriptors; the
    /// report's JSON must not change.
    const USERNS_FIX: &str = "allow unprivileged user namespaces (sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1, no AppArmor userns restriction) or, in a container, run with a seccomp profile that permits unshare/clone namespace flags";

    /// Every layer the helper builds not reached, as the helper's
    /// initial report has them.
    fn nothing_applied() -> SandboxReport {
        let mut rep = SandboxReport::default();
        for layer in LAYERS.iter().filter(|l| l.stage != Stage::Host) {
            layer.set(&mut rep, LayerStatus::unavailable("not reached"));
        }
        rep
    }

    #[test]
    fn missing_keeps_its_order_names_and_fixes() {
        let mut rep = nothing_applied();
        finalize(&mut rep);
        let got: Vec<(&str, &str)> = rep
            .missing
            .iter()
            .map(|m| (m.layer.as_str(), m.fix.as_str()))
            .collect();
        let expected = [
            ("userns", USERNS_FIX),
            ("mountns", USERNS_FIX),
            ("pidns", USERNS_FIX),
            ("netns", USERNS_FIX),
            ("ipcns", USERNS_FIX),
            ("utsns", USERNS_FIX),
            ("root", USERNS_FIX),
            (
                "landlock",
                "boot a kernel >= 5.13 with CONFIG_SECURITY_LANDLOCK=y and `landlock` in the lsm= list",
            ),
            ("seccomp", "use a kernel with CONFIG_SECCOMP_FILTER=y"),
            (
                "caps",
                "do not run the helper with ambient capabilities or a locked bounding set",
            ),
            (
                "rlimits",
                "enable the rlimits layer in the runtime's sandbox policy",
            ),
            (
                "ceilings",
                "give the sandbox a user namespace of its own (layers.userns) on a kernel with /proc/sys/user",
            ),
            (
                "uid_drop",
                "run the host as root or as a dedicated non-root user",
            ),
            (
                "no_new_privs",
                "use a kernel with PR_SET_NO_NEW_PRIVS (3.5+)",
            ),
            ("memory", memory::FIX),
        ];
        assert_eq!(got, expected);
        assert_eq!(rep.missing[0].reason, "not reached");
        assert_eq!(rep.missing[13].reason, "PR_SET_NO_NEW_PRIVS is not set");
        assert_eq!(rep.level, SandboxLevel::Minimal);
    }

    #[test]
    fn a_degraded_ceiling_is_reported_not_missing() {
        let mut rep = nothing_applied();
        rep.ceilings_status = LayerStatus::Degraded {
            reason: "no fanotify".into(),
        };
        finalize(&mut rep);
        assert!(!rep.missing.iter().any(|m| m.layer == "ceilings"));
        rep.ceilings_status = LayerStatus::Disabled;
        finalize(&mut rep);
        let ceilings = rep.missing.iter().find(|m| m.layer == "ceilings");
        assert_eq!(
            ceilings.map(|m| m.reason.as_str()),
            Some("disabled by the sandbox policy")
        );
    }

    #[test]
    fn every_layer_without_a_memory_bound_is_isolated_and_with_one_strong() {
        let mut rep = nothing_applied();
        for layer in LAYERS.iter().filter(|l| l.stage != Stage::Host) {
            layer.set(&mut rep, LayerStatus::Applied);
        }
        rep.seccomp.status = LayerStatus::Applied;
        rep.no_new_privs = true;
        rep.self_check = crate::report::SelfCheck {
            uid: Some(1000),
            cap_eff: Some(0),
            cap_prm: Some(0),
            no_new_privs: Some(true),
            seccomp: Some(2),
            ..Default::default()
        };
        rep.memory.unbounded = vec!["kernel objects".into()];
        finalize(&mut rep);
        assert_eq!(rep.level, SandboxLevel::Isolated, "{:?}", rep.missing);
        let layers: Vec<&str> = rep.missing.iter().map(|m| m.layer.as_str()).collect();
        assert_eq!(layers, ["memory"]);
        assert!(rep.missing[0].reason.ends_with("unbounded: kernel objects"));
        rep.memory.tree_bound_bytes = Some(1 << 30);
        finalize(&mut rep);
        assert_eq!(rep.level, SandboxLevel::Strong);
        assert!(rep.missing.is_empty());
    }

    #[test]
    fn layer_names_are_unique() {
        let mut names: Vec<&str> = LAYERS.iter().map(|l| l.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before);
    }
}
