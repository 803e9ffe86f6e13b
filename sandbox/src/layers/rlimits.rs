//! Layer: resource limits, set by the supervisor on itself before it forks
//! pid 1, so the whole tree inherits them as hard limits. RLIMIT_NPROC only binds a
//! non-root uid (observed: uid 0 forked past it), which is one more reason
//! the helper leaves uid 0 first.

use std::collections::BTreeMap;

use super::layer::{Layer, Need, Slot, Stage, no_detail};
use crate::policy::Rlimits;
use crate::report::LayerStatus;

/// Apply every configured limit (soft = hard). Returns what was set.
pub fn apply(r: &Rlimits) -> Result<BTreeMap<String, u64>, String> {
    let table: [(&str, libc::__rlimit_resource_t, Option<u64>); 11] = [
        ("core", libc::RLIMIT_CORE, r.core),
        ("nofile", libc::RLIMIT_NOFILE, r.nofile),
        ("fsize", libc::RLIMIT_FSIZE, r.fsize),
        ("data", libc::RLIMIT_DATA, r.data),
        ("as", libc::RLIMIT_AS, r.address_space),
        ("nproc", libc::RLIMIT_NPROC, r.nproc),
        ("cpu", libc::RLIMIT_CPU, r.cpu_seconds),
        ("memlock", libc::RLIMIT_MEMLOCK, r.memlock),
        ("msgqueue", libc::RLIMIT_MSGQUEUE, r.msgqueue),
        ("rtprio", libc::RLIMIT_RTPRIO, r.rtprio),
        ("sigpending", libc::RLIMIT_SIGPENDING, r.sigpending),
    ];
    let mut set = BTreeMap::new();
    for (name, res, value) in table {
        let Some(v) = value else { continue };
        let lim = libc::rlimit {
            rlim_cur: v,
            rlim_max: v,
        };
        // SAFETY: `lim` is a valid rlimit struct that outlives the call.
        if unsafe { libc::setrlimit(res, &lim) } != 0 {
            return Err(format!(
                "setrlimit({name}, {v}): {}",
                std::io::Error::last_os_error()
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
    toggle: Some(|t| t.rlimits),
    slot: Slot::Status(|r| &r.rlimits_status, |r| &mut r.rlimits_status),
    need: Need::Applied,
    fix: "enable the rlimits layer in the runtime's sandbox policy",
    detail: no_detail,
    apply: Some(|req, rep| {
        rep.rlimits = apply(&req.policy.rlimits)?;
        Ok(LayerStatus::Applied)
    }),
};
