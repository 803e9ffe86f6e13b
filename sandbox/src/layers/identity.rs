//! Layers of the processes' own state: the lifeline to the host, a
//! session of its own, the uid the tree runs as, the supervisor's
//! dumpability and no_new_privs. Each is built in a step of the helper's
//! choreography (helper/supervisor.rs, helper/credentials.rs,
//! helper/plugin.rs).

use super::layer::{Layer, Need, Slot, Stage, no_detail};

pub(crate) const LIFELINE: Layer = Layer {
    name: "lifeline",
    stage: Stage::Supervisor,
    toggle: None,
    slot: Slot::Status(|r| &r.lifeline, |r| &mut r.lifeline),
    need: Need::Reported,
    fix: "keep the host alive while the helper starts",
    detail: no_detail,
    apply: None,
};

pub(crate) const SETSID: Layer = Layer {
    name: "setsid",
    stage: Stage::Supervisor,
    toggle: None,
    slot: Slot::Status(|r| &r.setsid, |r| &mut r.setsid),
    need: Need::Reported,
    fix: "enable the layer in the runtime's sandbox policy",
    detail: no_detail,
    apply: None,
};

pub(crate) const SUPERVISOR: Layer = Layer {
    name: "supervisor",
    stage: Stage::Supervisor,
    toggle: None,
    slot: Slot::Flag(
        |r| r.supervisor_non_dumpable,
        |r, on| r.supervisor_non_dumpable = on,
        "dumpable",
    ),
    need: Need::Reported,
    fix: "enable the layer in the runtime's sandbox policy",
    detail: |r| {
        if r.supervisor_non_dumpable {
            " (non-dumpable)".into()
        } else {
            String::new()
        }
    },
    apply: None,
};

pub(crate) const UID_DROP: Layer = Layer {
    name: "uid_drop",
    stage: Stage::Supervisor,
    toggle: Some(|p| p.layers.drop_uid),
    slot: Slot::Status(|r| &r.uid_drop, |r| &mut r.uid_drop),
    need: Need::Applied,
    fix: "run the host as root or as a dedicated non-root user",
    detail: |r| format!(" (plugin uid {})", r.host_uid),
    apply: None,
};

pub(crate) const OWN_UID: Layer = Layer {
    name: "own_uid",
    stage: Stage::Supervisor,
    toggle: Some(|p| p.layers.drop_uid),
    slot: Slot::Status(|r| &r.own_uid, |r| &mut r.own_uid),
    need: Need::Reported,
    fix: "run the host as root",
    detail: |_| " (no other live sandbox has it)".into(),
    apply: None,
};

pub(crate) const NO_NEW_PRIVS: Layer = Layer {
    name: "no_new_privs",
    stage: Stage::Plugin,
    toggle: None,
    slot: Slot::Flag(
        |r| r.no_new_privs,
        |r, on| r.no_new_privs = on,
        "PR_SET_NO_NEW_PRIVS is not set",
    ),
    need: Need::Applied,
    fix: "use a kernel with PR_SET_NO_NEW_PRIVS (3.5+)",
    detail: no_detail,
    apply: None,
};
