//! The supervisor's identity: steps 5–7 of spec B.2. The ipc namespace and
//! its limits while still root, the drop to the sandbox's own uid, the user
//! namespace, non-dumpable from then on, the other namespaces, the user
//! namespace's ceilings and the rlimits the whole tree inherits.

use rustix::process::{DumpableBehavior, Gid, Pid, Uid};

use super::process::{Fail, arm_parent_death_signal, errno_fail, fail, set_dumpable};
use crate::caps;
use crate::layers::{self, Layer, Stage};
use crate::namespaces;
use crate::report::{LayerStatus, SandboxReport};
use crate::request::HelperRequest;
use crate::timing::stamp;

pub(super) fn identity_and_namespaces(
    req: &HelperRequest,
    rep: &mut SandboxReport,
    parent: i32,
) -> Result<(), Fail> {
    let l = &req.policy.layers;
    // 5. Leave uid 0 for this sandbox's own uid (held by the host).
    // Root without capabilities still reads /etc/shadow and writes
    // root-owned files (DAC owner), and RLIMIT_NPROC ignores uid 0.
    let root = rustix::process::geteuid().is_root();
    if root && l.ipcns {
        // The ipc namespace first, while still root: its sysctls are
        // writable only by the namespace's root uid, which an identity-
        // mapped user namespace does not have. Owned by the initial user
        // namespace, it gives the plugin no capability over its objects.
        rep.ipcns = ipc_namespace_as_root(&req.policy.ipc, rep)?;
    }
    if root && l.drop_uid {
        let uid = req
            .uid
            .ok_or_else(|| fail("uid_drop", "the host sent no uid for this sandbox"))?;
        drop_uid(uid)?;
        rep.uid_drop = LayerStatus::Applied;
        rep.own_uid = LayerStatus::Applied;
        // The signal was re-armed after setresuid cleared it: close the
        // window in which the host could have died unnoticed.
        if Pid::as_raw(rustix::process::getppid()) != parent {
            return Err(fail("lifeline", "the host exited during the uid change"));
        }
    } else if !root {
        rep.uid_drop = LayerStatus::Applied; // nothing to leave
    }
    let (uid, gid) = (
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    );
    rep.host_uid = uid;
    if uid == 0 {
        rep.warnings
            .push("the plugin runs as host uid 0 (drop_uid is off)".into());
    } else if !root {
        rep.own_uid = LayerStatus::unavailable(format!(
            "the host is not root: every sandbox of this host runs as its uid {uid}"
        ));
    }

    stamp("helper", "uid_dropped");
    // 6. User namespace.
    if l.userns {
        rep.userns = match namespaces::enter_user(uid, gid) {
            Ok(()) => LayerStatus::Applied,
            Err(e) => LayerStatus::unavailable(format!("unshare(CLONE_NEWUSER): {e}")),
        };
        stamp("helper", "userns_entered");
    }
    // The uid maps are written: no credential change follows in this
    // process, so from here on nobody but host root can read its memory,
    // environment or fds, or open its namespaces (/proc/<pid>/ns/*).
    let _ = set_dumpable(false);
    rep.supervisor_non_dumpable = matches!(
        rustix::process::dumpable_behavior(),
        Ok(DumpableBehavior::NotDumpable)
    );
    if !rep.supervisor_non_dumpable {
        return Err(fail("dumpable", "PR_SET_DUMPABLE 0 did not hold"));
    }
    // 7. The other namespaces (need the user namespace unless still root).
    enter_others(&req.policy, rep, root);
    stamp("helper", "other_namespaces_entered");
    if rep.mountns != LayerStatus::Applied && l.mountns {
        rep.root = LayerStatus::unavailable("no mount namespace");
    }
    own_limits(req, rep, root)?;
    stamp("helper", "limits_applied");

    Ok(())
}

/// The ipc namespace made as root, with the policy's limits (a failed
/// write fails the spawn: the namespace is ours, so it cannot be the
/// kernel's refusal of a missing feature).
fn ipc_namespace_as_root(
    limits: &crate::policy::IpcLimits,
    rep: &mut SandboxReport,
) -> Result<LayerStatus, Fail> {
    // SAFETY: unshare takes a flag word; the helper is single-threaded.
    if unsafe { libc::unshare(libc::CLONE_NEWIPC) } != 0 {
        let e = std::io::Error::last_os_error();
        rep.ipc_limits_status = LayerStatus::unavailable("no ipc namespace of its own");
        return Ok(LayerStatus::unavailable(format!("unshare(ipcns): {e}")));
    }
    let values = namespaces::ipc_values(limits);
    (rep.ipc_limits, rep.ipc_limits_status) = namespaces::write_sysctls("kernel", &values);
    if let LayerStatus::Unavailable { reason } = &rep.ipc_limits_status {
        return Err(fail("ipc_limits", reason));
    }
    Ok(LayerStatus::Applied)
}

/// Step 7; `root`: the ipc namespace was made before the uid drop.
fn enter_others(policy: &crate::policy::SandboxPolicy, rep: &mut SandboxReport, root: bool) {
    let made_as_root = |layer: &Layer| root && layer.name == namespaces::IPCNS.name;
    let wanted = |layer: &Layer| layer.wanted(policy) && !made_as_root(layer);
    for (layer, st) in namespaces::enter_others(wanted) {
        if !made_as_root(layer) {
            layer.set(rep, st);
        }
    }
}

/// The limits of the sandbox's own namespaces, written while this process
/// still holds every capability in them, and the rlimits, set here so pid
/// 1 and the plugin inherit them as hard limits none of them can raise.
/// Namespaces the sandbox does not own are never written: that would
/// change the host's values.
fn own_limits(req: &HelperRequest, rep: &mut SandboxReport, root: bool) -> Result<(), Fail> {
    if rep.userns == LayerStatus::Applied {
        let values = namespaces::ceiling_values(&req.policy.ceilings);
        (rep.ceilings, rep.ceilings_status) = namespaces::write_sysctls("user", &values);
    } else if req.policy.layers.userns {
        rep.ceilings_status = LayerStatus::unavailable("no user namespace of its own");
    }
    if rep.ipcns == LayerStatus::Applied && !root {
        // Without root the ipc namespace belongs to the user namespace,
        // whose root uid is unmapped: the kernel lets nobody write its
        // sysctls (reported, and the memory bound says SysV is unbounded).
        rep.ipc_limits_status = LayerStatus::unavailable(
            "the host is not root: the ipc namespace's sysctls are writable only by its root uid",
        );
    }
    // The socket sysctls of its own network namespace: needs
    // CAP_NET_ADMIN there (the helper's, in its user namespace). Reported,
    // not fatal: the memory axis then says they were not applied.
    if rep.netns == LayerStatus::Applied {
        let values = namespaces::net_values(&req.policy.net);
        (rep.net_limits, rep.net_limits_status) = namespaces::write_text_sysctls("net", &values);
    } else if req.policy.layers.netns {
        rep.net_limits_status = LayerStatus::unavailable("no network namespace of its own");
    }
    // The layers with a step of their own (the rlimits).
    layers::apply_at(Stage::Supervisor, req, rep).map_err(|(layer, e)| fail(layer, e))
}

fn drop_uid(uid: u32) -> Result<(), Fail> {
    // The bounding set must go before the uid change: PR_CAPBSET_DROP needs
    // CAP_SETPCAP, which setresuid takes away (observed: CapBnd stayed full).
    caps::drop_bounding().map_err(|e| fail("uid_drop", e))?;
    // The helper is single-threaded: the thread's credentials are the
    // process's.
    rustix::thread::set_thread_groups(&[])
        .map_err(|e| errno_fail("uid_drop", "setgroups([])", e))?;
    let gid = Gid::from_raw(uid);
    rustix::thread::set_thread_res_gid(gid, gid, gid)
        .map_err(|e| errno_fail("uid_drop", "setresgid", e))?;
    let id = Uid::from_raw(uid);
    rustix::thread::set_thread_res_uid(id, id, id)
        .map_err(|e| errno_fail("uid_drop", "setresuid", e))?;
    // setresuid clears the parent-death signal and dumpability: re-arm the
    // first, and restore the second for as long as /proc/self/uid_map must
    // stay writable by us (cleared again once the maps are written). The
    // uid is this sandbox's own, so no other process can use the window.
    arm_parent_death_signal();
    let _ = set_dumpable(true);
    Ok(())
}
