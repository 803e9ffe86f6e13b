//! The platform runsc runs this host's plugins on: `ptrace` unless a
//! probe guest really runs under `kvm` (an openable `/dev/kvm` is not
//! enough: in a VM without nested virtualization the guest never runs and
//! runsc hangs, so the probe is bounded and killed by its pid). Chosen
//! once per host process.

use std::io;
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sharedos_sandbox::SandboxPolicy;

use super::bundle;
use super::runsc::{COMMAND_TIMEOUT, Runsc, dies_with_host, wait_bounded};

/// How long the KVM probe guest may take to run `/bin/true`.
const KVM_PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// The platform runsc runs the plugins of this host on, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// `ptrace` or `kvm`.
    pub name: &'static str,
    pub why: String,
}

/// The platform, probed once per host process (the first runsc asked
/// decides): `kvm` when a probe guest ran `/bin/true` to its end within
/// [`KVM_PROBE_TIMEOUT`], `ptrace` otherwise.
pub fn platform(runsc: &Runsc) -> Platform {
    static CHOSEN: OnceLock<Platform> = OnceLock::new();
    CHOSEN.get_or_init(|| probe_kvm(runsc)).clone()
}

fn probe_kvm(runsc: &Runsc) -> Platform {
    let ptrace = |why: String| Platform {
        name: "ptrace",
        why,
    };
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        return ptrace("/dev/kvm cannot be opened here, so the kvm platform is out".into());
    }
    let started = Instant::now();
    match probe_run(runsc, "kvm", KVM_PROBE_TIMEOUT) {
        Ok(true) => Platform {
            name: "kvm",
            why: format!(
                "a probe guest under --platform=kvm ran /bin/true in {} ms",
                started.elapsed().as_millis()
            ),
        },
        Ok(false) => ptrace(format!(
            "/dev/kvm opens, but a probe guest under --platform=kvm did not run /bin/true to its \
             end within {} s (a VM without nested virtualization); it was killed",
            KVM_PROBE_TIMEOUT.as_secs()
        )),
        Err(e) => ptrace(format!("the kvm probe could not run: {e}")),
    }
}

/// Runs `/bin/true` in a container of its own under `--platform=<platform>`
/// within `bound`: `Ok(true)` when it ran to a clean exit, `Ok(false)` when
/// it failed or was killed (by pid) at the bound. Its container state and
/// bundle are removed either way.
fn probe_run(runsc: &Runsc, platform: &str, bound: Duration) -> io::Result<bool> {
    let policy = SandboxPolicy::default();
    let process = bundle::Process {
        program: Path::new("/bin/true"),
        staged: None,
        args: &[],
        env: &[],
        relay: None,
        gate: false,
    };
    let bundle = bundle::write(&policy, &process, policy.uids.first)?;
    let id = format!("sharedos-probe-{}", std::process::id());
    let mut cmd = runsc.command(&bundle.state_dir());
    cmd.args(["--network=none", "--ignore-cgroups"])
        .arg(format!("--platform={platform}"))
        .arg("run")
        .arg("--bundle")
        .arg(bundle.bundle_dir())
        .arg(&id)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // Forked like a turn's runsc: a host that dies mid-probe takes it along.
    dies_with_host(&mut cmd);
    let child = super::super::direct::on_spawn_thread(move || cmd.spawn()).and_then(|r| r)?;
    let status = wait_bounded(child, bound)?;
    let state = bundle.state_dir();
    let bound = COMMAND_TIMEOUT;
    let _ = runsc.bounded(&state, &["kill", "--all", &id, "KILL"], bound);
    let _ = runsc.bounded(&state, &["delete", "--force", &id], bound);
    Ok(status.is_some_and(|s| s.success()))
}
