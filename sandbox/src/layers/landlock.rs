//! Layer: Landlock (filesystem, TCP, and the signal / abstract-socket
//! scopes). The ABI is pinned to the one we test (V6), never derived from
//! the running kernel; `BestEffort` degrades on older kernels, and the
//! returned `RestrictionStatus` is always inspected and reported
//! (NVIDIA/OpenShell#803: best effort silently returned Ok, unenforced).

use super::layer::{Layer, Need, Slot, Stage};
use std::path::PathBuf;

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, LandlockStatus, NetPort,
    RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, path_beneath_rules,
};

use crate::report::{LandlockReport, LayerStatus};

/// The ABI the ruleset is written against.
pub const PINNED_ABI: ABI = ABI::V6;

/// Paths the plugin may reach, as they exist in the namespace the helper
/// is in when it restricts itself.
pub struct Grants {
    /// Read and execute.
    pub read: Vec<PathBuf>,
    /// Everything (create, remove, write, rename within).
    pub write: Vec<PathBuf>,
    /// Single device nodes: read and write the file.
    pub devices: Vec<PathBuf>,
    /// The one TCP port the plugin may connect to (the egress gateway's
    /// listener); `None`: no TCP connect at all. Binding is never granted.
    pub connect_tcp: Option<u16>,
    /// The harness mode's MCP port: bind and connect, on that port only.
    pub bind_connect_tcp: Option<u16>,
}

/// The ABI of the running kernel, or `None` when Landlock is missing or
/// not enabled in `lsm=`.
pub fn kernel_abi() -> Option<i32> {
    // SAFETY: LANDLOCK_CREATE_RULESET_VERSION with a null attr and size 0
    // only returns the ABI version; no memory is read or written.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    (v > 0).then_some(v as i32)
}

/// Restrict the calling process (and its future children).
pub fn apply(g: &Grants) -> LandlockReport {
    let abi = PINNED_ABI;
    let mut report = LandlockReport {
        status: LayerStatus::unavailable("not attempted"),
        kernel_abi: kernel_abi(),
        requested_abi: 6,
        ruleset: "NotEnforced".into(),
        scopes: vec!["signal".into(), "abstract_unix".into()],
        net: match (g.connect_tcp, g.bind_connect_tcp) {
            (Some(port), None) => format!("tcp-connect:{port}"),
            (None, Some(mcp)) => format!("tcp-bind-connect:{mcp}"),
            (Some(port), Some(mcp)) => format!("tcp-connect:{port},tcp-bind-connect:{mcp}"),
            (None, None) => "tcp-deny".into(),
        },
    };
    let result = (|| -> Result<landlock::RestrictionStatus, landlock::RulesetError> {
        landlock::Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(AccessFs::from_all(abi))?
            // No NetPort rule for BindTcp follows but the harness mode's
            // MCP port: every other TCP bind is denied, and every connect
            // but to the egress port and that MCP port, if any.
            .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)?
            // Signals and abstract unix sockets cannot leave the domain.
            .scope(Scope::AbstractUnixSocket | Scope::Signal)?
            .create()?
            .add_rules(path_beneath_rules(&g.read, AccessFs::from_read(abi)))?
            .add_rules(path_beneath_rules(&g.write, AccessFs::from_all(abi)))?
            .add_rules(path_beneath_rules(&g.devices, AccessFs::from_file(abi)))?
            .add_rules(g.connect_tcp.map(|port| {
                Ok::<_, landlock::RulesetError>(NetPort::new(port, AccessNet::ConnectTcp))
            }))?
            .add_rules(g.bind_connect_tcp.map(|port| {
                Ok::<_, landlock::RulesetError>(NetPort::new(
                    port,
                    AccessNet::BindTcp | AccessNet::ConnectTcp,
                ))
            }))?
            .restrict_self()
    })();
    match result {
        Err(e) => report.status = LayerStatus::unavailable(format!("landlock: {e}")),
        Ok(st) => {
            report.ruleset = format!("{:?}", st.ruleset);
            let kernel = match st.landlock {
                LandlockStatus::Available { effective_abi, .. } => {
                    format!("kernel ABI {}", effective_abi as i32)
                }
                LandlockStatus::NotEnabled => "Landlock is built but not in lsm=".into(),
                LandlockStatus::NotImplemented => "Landlock is not built into the kernel".into(),
            };
            report.status = match st.ruleset {
                RulesetStatus::FullyEnforced => LayerStatus::Applied,
                RulesetStatus::PartiallyEnforced => LayerStatus::Degraded {
                    reason: format!("partially enforced: {kernel} < requested ABI 6"),
                },
                RulesetStatus::NotEnforced => {
                    LayerStatus::unavailable(format!("not enforced: {kernel}"))
                }
            };
        }
    }
    report
}

/// Landlock, applied in the plugin's process before seccomp (step 15).
pub(crate) const LAYER: Layer = Layer {
    name: "landlock",
    stage: Stage::Plugin,
    toggle: Some(|p| p.layers.landlock),
    slot: Slot::Status(|r| &r.landlock.status, |r| &mut r.landlock.status),
    need: Need::Applied,
    fix: "boot a kernel >= 5.13 with CONFIG_SECURITY_LANDLOCK=y and `landlock` in the lsm= list",
    detail: |r| {
        format!(
            " (kernel ABI {}, requested {}, {})",
            r.landlock
                .kernel_abi
                .map_or("none".to_string(), |a| a.to_string()),
            r.landlock.requested_abi,
            r.landlock.ruleset
        )
    },
    apply: None,
};
