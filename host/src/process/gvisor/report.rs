//! The sandbox report of a gVisor container: the common shape (`engine`,
//! `level`, `missing`, `memory`, `env_keys`, `warnings`) and the gVisor
//! layer (runsc, platform, container, root). Nothing is claimed that runsc
//! was not told to do; the memory axis says the container is unbounded.

use serde_json::{Value, json};
use sharedos_sandbox::{ProgramDigest, SandboxPolicy};

use super::bundle::{Bundle, rlimit_rows};
use super::{GVISOR_LEVEL, Platform, Runsc};

/// Why the container's memory is not bounded here.
const NO_MEMORY_BOUND: &str = "runsc runs with --ignore-cgroups: no memory controller is delegated to this host, so neither the gVisor kernel's memory nor the plugin's is bounded as a whole";

/// The fields every gVisor report has, a refusal's included.
pub(super) fn base(runsc: &Runsc, platform: &Platform) -> Value {
    json!({
        "engine": "gvisor",
        "level": GVISOR_LEVEL.to_string(),
        "runsc": {
            "path": runsc.path.display().to_string(),
            "version": runsc.version,
            "rootless": runsc.rootless,
        },
        "platform": { "name": platform.name, "why": platform.why },
    })
}

/// The report of a container about to run.
pub(super) fn launched(
    runsc: &Runsc,
    platform: &Platform,
    policy: &SandboxPolicy,
    bundle: &Bundle,
    id: &str,
    pin: Option<&ProgramDigest>,
) -> Value {
    let mut r = base(runsc, platform);
    let rlimits: serde_json::Map<String, Value> = rlimit_rows(policy)
        .into_iter()
        .map(|(k, v)| (k.trim_start_matches("RLIMIT_").to_lowercase(), v.into()))
        .collect();
    let root: Vec<Value> = bundle
        .mounts
        .iter()
        .map(|(dest, mode, what)| json!({ "path": dest, "mode": mode, "what": what }))
        .collect();
    let fields = json!({
        "isolation": "the gVisor kernel (Sentry): the plugin's system calls are served in user space by runsc's sandbox process, never by the host kernel directly; host files reach it only through runsc's gofer, and only the mounts of `root`",
        "container": id,
        "bundle": bundle.dir.path().display().to_string(),
        "uid": policy.uids.first,
        "network": network(policy),
        "caps": "none (every capability set empty)",
        "no_new_privs": true,
        "namespaces": ["pid", "net", "ipc", "uts", "mount"],
        "root": root,
        "program": bundle.program_inside,
        "program_sha256": pin.map(|p| p.to_string()),
        "rlimits": rlimits,
        "memory": memory(policy),
        "missing": [{
            "layer": "memory",
            "reason": NO_MEMORY_BOUND,
            "fix": "delegate a cgroup v2 memory controller and run the gVisor launcher with cgroups (not built yet), or use the namespace sandbox where one is delegated",
        }],
        "env_keys": bundle.env_keys,
        "warnings": bundle.warnings,
    });
    if let (Some(r), Value::Object(f)) = (r.as_object_mut(), fields) {
        r.extend(f);
    }
    r
}

/// What the container's network is: its own loopback, and the egress
/// gateway through the relay when the policy has one.
fn network(policy: &SandboxPolicy) -> String {
    match policy.egress_port {
        None => "none (runsc --network=none: a loopback of the container's own, no interface to the host, no egress gateway)".into(),
        Some(port) => format!(
            "the egress gateway only (runsc --network=none: a loopback of the container's own, no interface to the host; the loopback relay, the container's first process, listens on 127.0.0.1:{port} and carries each connection to the gateway's unix socket at {}/, runsc --host-uds=open)",
            super::bundle::EGRESS_DIR_INSIDE
        ),
    }
}

/// The memory axis: the tmpfs sizes runsc was given, `RLIMIT_AS` if set,
/// and no bound on the whole container.
fn memory(policy: &SandboxPolicy) -> Value {
    let mut layers: Vec<Value> = [
        ("tmpfs /workspace", policy.workspace_size_bytes),
        ("tmpfs HOME (/sandbox/home)", policy.home_size_bytes),
        ("tmpfs /tmp", policy.tmp_size_bytes),
        ("tmpfs /dev/shm", policy.shm_size_bytes),
    ]
    .into_iter()
    .map(|(name, bytes)| {
        json!({
            "name": name,
            "status": { "state": "applied" },
            "bytes": bytes,
            "detail": "the size option of the container's tmpfs, enforced by the gVisor kernel",
        })
    })
    .collect();
    layers.push(json!({
        "name": "the whole container (gVisor kernel and plugin)",
        "status": { "state": "unavailable", "reason": NO_MEMORY_BOUND },
        "bytes": null,
        "detail": "no cgroup",
    }));
    json!({
        "layers": layers,
        "per_process_bytes": policy.rlimits.address_space,
        "tree_bound_bytes": null,
        "unbounded": ["the whole container (gVisor kernel and plugin)"],
    })
}
