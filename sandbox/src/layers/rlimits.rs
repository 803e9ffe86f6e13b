//! Layer: resource limits, set by the supervisor on itself before it forks
//! pid 1, so the whole tree inherits them as hard limits. RLIMIT_NPROC only binds a
//! non-root uid (observed: uid 0 forked past it), which is one more reason
//! the helper leaves uid 0 first.

use std::collections::BTreeMap;

use rustix::process::{Resource, Rlimit, setrlimit};

use super::layer::{Layer, Need, Slot, Stage, no_detail};
use crate::policy::Rlimits;
use crate::report::LayerStatus;

/// Apply every configured limit (soft = hard, but for `RLIMIT_CPU`, whose
/// hard limit is one second past the soft one: the kernel sends `SIGXCPU`
/// at the soft limit, which names the limit in how the plugin ended, and
/// `SIGKILL` at the hard one, which names nothing). Returns what was set.
pub fn apply(r: &Rlimits) -> Result<BTreeMap<String, u64>, String> {
    let table: [(&str, Resource, Option<u64>); 11] = [
        ("core", Resource::Core, r.core),
        ("nofile", Resource::Nofile, r.nofile),
        ("fsize", Resource::Fsize, r.fsize),
        ("data", Resource::Data, r.data),
        ("as", Resource::As, r.address_space),
        ("nproc", Resource::Nproc, r.nproc),
        ("cpu", Resource::Cpu, r.cpu_seconds),
        ("memlock", Resource::Memlock, r.memlock),
        ("msgqueue", Resource::Msgqueue, r.msgqueue),
        ("rtprio", Resource::Rtprio, r.rtprio),
        ("sigpending", Resource::Sigpending, r.sigpending),
    ];
    let mut set = BTreeMap::new();
    for (name, res, value) in table {
        let Some(v) = value else { continue };
        let lim = Rlimit {
            current: Some(v),
            maximum: Some(if matches!(res, Resource::Cpu) {
                v.saturating_add(1)
            } else {
                v
            }),
        };
        if let Err(e) = setrlimit(res, lim) {
            return Err(format!(
                "setrlimit({name}, {v}): {}",
                std::io::Error::from(e)
            ));
        }
        set.insert(name.to_string(), v);
    }
    Ok(set)
}

/// The rlimits, set on the supervisor so the whole tree inherits them as
/// hard limits (step 7).
pub(crate) const LAYER: Layer = Layer {
    name: "rlimits",
    stage: Stage::Supervisor,
    toggle: Some(|p| p.layers.rlimits),
    slot: Slot::Status(|r| &r.rlimits_status, |r| &mut r.rlimits_status),
    need: Need::Applied,
    fix: "enable the rlimits layer in the runtime's sandbox policy",
    detail: no_detail,
    apply: Some(|req, rep| {
        rep.rlimits = apply(&req.policy.rlimits)?;
        Ok(LayerStatus::Applied)
    }),
};
