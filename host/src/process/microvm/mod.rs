//! The microVM launcher (`launcher = "microvm"`): each turn's plugin in a
//! QEMU `microvm` guest of its own, booted from a Debian guest kernel and
//! an initramfs sharedos writes ([`image`]): sharedos's guest init, the
//! program and its libraries, the policy's `extraRoPaths`. The guest's RAM
//! (`-m`) is the memory bound of everything the plugin can make; the
//! guest has no network device. The protocol travels over a virtio serial
//! port wired to QEMU's stdio ([`line`] the host's relays and the line's
//! ends); the plugin's stderr over the second ISA serial line, to QEMU's
//! stderr; how the plugin ended through QEMU's exit status ([`vm`]).
//!
//! The tree: `start_kill` SIGKILLs QEMU by its pid (the whole guest is
//! inside that process); `kill_tree` reaps it and removes the run's
//! directory. QEMU is forked with a parent-death signal by the long-lived
//! spawn thread, so a host that dies takes its VMs with it; the first
//! microVM seat of a host process removes what dead hosts left
//! ([`sweep`]).

pub mod config;
pub mod disk;
mod egress;
mod image;
mod line;
pub mod modules;
pub mod qemu;
mod ready;
mod report;
mod sweep;
pub mod vm;
mod warm;

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use sharedos_sandbox::{SandboxLevel, SandboxPolicy};

pub use image::initramfs;
pub use qemu::{MicrovmError, Qemu};
pub use vm::Accel;

use super::launcher::{LaunchError, LaunchSpec, LaunchedChild, Launcher, ProcessTree};

/// The level a microVM reaches (docs/SECURITY.md, "microVM"): a kernel of
/// its own, and its whole memory bounded by the VM's RAM.
pub const MICROVM_LEVEL: SandboxLevel = SandboxLevel::Strong;

/// How long a guest may take to boot to its init's ready line (TCG boots
/// the cloud kernel in seconds; a loaded machine may take many times that).
const BOOT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// The run directories' name prefix (`sharedos-microvm-<host pid>-…`).
const PREFIX: &str = "sharedos-microvm-";

/// The VM's shape, from `[runtimes.<n>.microvm]` and the policy.
#[derive(Debug, Clone)]
pub struct MicrovmSettings {
    pub qemu: Option<PathBuf>,
    pub kernel: Option<PathBuf>,
    pub init: Option<PathBuf>,
    pub memory_mib: u64,
    pub vcpus: u32,
    /// `mkfs.ext4` for the read-only disk (absent: found).
    pub mkfs: Option<PathBuf>,
    /// A harness runtime's CLI: `extraRoPaths` and the CLI's libraries
    /// go on a read-only disk ([`disk`]) instead of into the initramfs.
    pub harness_cli: Option<PathBuf>,
}

/// The image's fixed part and the identity of its inputs.
type CachedImage = (Vec<String>, Arc<Vec<u8>>);

/// Launches plugins in microVMs with one runtime's policy. Its clones
/// share the image cache and the warm VMs (the boots done ahead run on
/// threads of their own with a clone).
#[derive(Debug, Clone)]
pub struct MicrovmLauncher {
    policy: SandboxPolicy,
    qemu: Qemu,
    kernel: PathBuf,
    init: PathBuf,
    memory_mib: u64,
    vcpus: u32,
    /// The kernel modules of the protocol port's driver
    /// ([`modules::PORT_MODULES`]), `(file name, host path)`.
    port_modules: Arc<Vec<(String, PathBuf)>>,
    /// A harness runtime's read-only disk, built at seating.
    disk: Option<Arc<disk::RoDisk>>,
    /// The image's fixed part, by the identity of what went into it.
    base: Arc<Mutex<Option<CachedImage>>>,
    /// VMs booted ahead of turns (`sandbox.warm`).
    warm: Arc<warm::WarmVms>,
}

/// A run's directory (the initramfs of its VM); removed when dropped.
pub(crate) fn run_dir() -> io::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(&format!("{PREFIX}{}-", std::process::id()))
        .tempdir()
}

impl MicrovmLauncher {
    /// A launcher for `policy`: QEMU, the kernel and the init located and
    /// checked now.
    /// With a harness CLI, its read-only disk is built now (or found in
    /// the cache): a missing CLI or an unbuildable image is an error here,
    /// at seating, naming the fix.
    pub fn new(policy: SandboxPolicy, s: &MicrovmSettings) -> Result<Self, MicrovmError> {
        let kernel = qemu::kernel(s.kernel.as_deref())?;
        let port_modules = Arc::new(modules::modules_of(&kernel, &modules::PORT_MODULES)?);
        let disk = match &s.harness_cli {
            Some(cli) => {
                let mkfs = disk::mkfs(s.mkfs.as_deref())?;
                let d = disk::image(
                    &policy.extra_ro_paths,
                    Some(cli),
                    &kernel,
                    &mkfs,
                    &disk::cache_dir(),
                )?;
                Some(Arc::new(d))
            }
            None => None,
        };
        Ok(Self {
            qemu: Qemu::locate(s.qemu.as_deref())?,
            kernel,
            init: qemu::init(s.init.as_deref())?,
            port_modules,
            disk,
            policy,
            memory_mib: s.memory_mib,
            vcpus: s.vcpus,
            base: Arc::default(),
            warm: Arc::new(warm::pool()),
        })
    }

    /// Waits up to `timeout` until no VM is being booted ahead; how many
    /// are ready then.
    pub fn wait_warm(&self, timeout: std::time::Duration) -> usize {
        self.warm.wait_idle(timeout)
    }

    /// The accelerator (probed once per host process).
    pub fn accel(&self) -> Accel {
        vm::accel(&self.qemu, &self.kernel, &self.init)
    }

    /// Boots a probe guest under the accelerator launches use, within
    /// the probe's bound (`sandbox check`): its milliseconds, or why not.
    pub fn boot_check(&self) -> Result<(Accel, u128), String> {
        let accel = self.accel();
        let bound = match accel.name {
            "kvm" => vm::KVM_PROBE_TIMEOUT,
            _ => vm::TCG_PROBE_TIMEOUT,
        };
        vm::boot_probe(&self.qemu, &self.kernel, &self.init, accel.name, bound)
            .map(|ms| (accel, ms))
    }

    /// QEMU, the kernel and the VM's RAM, for `sandbox check`.
    pub fn summary(&self) -> String {
        format!(
            "{} ({}), kernel {}, {} MiB RAM, {} vCPU",
            self.qemu.version,
            self.qemu.path.display(),
            self.kernel.display(),
            self.memory_mib,
            self.vcpus
        )
    }

    fn refused(&self, spec: &LaunchSpec, reason: String) -> LaunchError {
        let mut report = report::base(self, &self.accel());
        report["refused"] = true.into();
        report["reason"] = reason.clone().into();
        LaunchError::Refused {
            program: spec.program.clone(),
            reason,
            report: Some(report),
        }
    }

    /// The image's fixed part for `program` (its staged copy when
    /// pinned): built once and reused while the init, the program and the
    /// `extraRoPaths` keep their identity (path, size, mtime, inode).
    fn base_image(&self, program: &Path, inside: &str) -> io::Result<Arc<Vec<u8>>> {
        let mut key = vec![inside.to_owned()];
        for p in [&self.init, program]
            .into_iter()
            .chain(self.policy.extra_ro_paths.iter().map(Path::new))
        {
            let m = std::fs::metadata(p)?;
            key.push(format!(
                "{}:{}:{}:{}",
                p.display(),
                m.len(),
                m.mtime_nsec(),
                m.ino()
            ));
        }
        let mut cached = self.base.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((k, bytes)) = cached.as_ref()
            && *k == key
        {
            return Ok(bytes.clone());
        }
        let bytes = Arc::new(self.build_base(program, inside)?);
        *cached = Some((key, bytes.clone()));
        Ok(bytes)
    }

    fn build_base(&self, program: &Path, inside: &str) -> io::Result<Vec<u8>> {
        let mut tree = image::Tree::default();
        tree.copy(image::INIT, &self.init)?;
        tree.copy(inside, program)?;
        for bin in [&self.init, program] {
            for lib in image::libraries(bin)? {
                tree.copy(&lib.to_string_lossy(), &lib)?;
            }
        }
        let uid = self.policy.uids.first;
        let passwd = sharedos_sandbox::users::passwd(uid, uid);
        tree.file("etc/passwd", 0o444, passwd.into_bytes());
        let group = sharedos_sandbox::users::group(uid);
        tree.file("etc/group", 0o444, group.into_bytes());
        let mut budget = self.image_budget();
        for (name, path) in self.port_modules.iter() {
            tree.copy(&format!("{}/{name}", image::MODULE_DIR), path)?;
        }
        match &self.disk {
            // On the read-only disk: only the modules that read it (those
            // the port has too are in the image once).
            Some(d) => {
                for (name, path) in &d.modules {
                    if !self.port_modules.iter().any(|(n, _)| n == name) {
                        tree.copy(&format!("{}/{name}", image::MODULE_DIR), path)?;
                    }
                }
            }
            None => {
                for p in &self.policy.extra_ro_paths {
                    tree.copy_tree(image::RO_DIR, Path::new(p), &mut budget)
                        .map_err(|e| {
                            io::Error::new(e.kind(), format!("sandbox.extraRoPaths {p}: {e}"))
                        })?;
                }
            }
        }
        for d in [
            "dev",
            "proc",
            "sys",
            "tmp",
            "workspace",
            "sandbox/home",
            "dev/shm",
        ] {
            tree.dir(d, 0o755);
        }
        let bytes = tree.cpio();
        if bytes.len() as u64 > self.image_budget() {
            return Err(io::Error::other(format!(
                "the guest image is {} MiB, more than half the VM's RAM ({} MiB); raise runtimes.microvm.memoryMib",
                bytes.len() >> 20,
                self.memory_mib
            )));
        }
        Ok(bytes)
    }

    /// The image lives in the guest's RAM: at most half of it.
    fn image_budget(&self) -> u64 {
        (self.memory_mib << 20) / 2
    }

    /// The run `spec` would be: its directory with the initramfs written,
    /// and its report; refused with a pin the program does not match.
    fn prepare(&self, spec: &LaunchSpec) -> Result<(tempfile::TempDir, Value), LaunchError> {
        let p = &self.policy;
        let pin = spec.program_sha256.or(p.program_sha256);
        let staged = match &pin {
            Some(pin) => Some(
                super::stage_pinned(&spec.program, pin)
                    .map_err(|e| self.refused(spec, e.to_string()))?,
            ),
            None => None,
        };
        let name = spec
            .program
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "plugin".into());
        let inside = format!("/{}/{name}", image::PLUGIN_DIR);
        let source = staged.as_deref().unwrap_or(&spec.program);
        let base = self
            .base_image(source, &inside)
            .map_err(|e| self.refused(spec, format!("the guest image: {e}")))?;
        let (mut launch, env_keys, warnings) = launch_json(p, spec, &inside, self.memory_mib);
        launch["protocol"] = json!({
            "modules": self.port_modules.iter().map(|(n, _)| format!("/{}/{n}", image::MODULE_DIR)).collect::<Vec<_>>(),
            "device": vm::PORT_DEVICE,
        });
        if let Some(d) = &self.disk {
            launch["binds"] = json!([]);
            launch["disk"] = json!({
                "modules": d.modules.iter().map(|(n, _)| format!("/{}/{n}", image::MODULE_DIR)).collect::<Vec<_>>(),
                "binds": d.binds,
            });
        }
        let mut tail = image::Tree::default();
        tail.file(image::LAUNCH, 0o444, launch.to_string().into_bytes());
        tail.file(
            image::SEED,
            0o400,
            seed().map_err(|e| {
                self.refused(
                    spec,
                    format!("32 bytes from /dev/urandom for the guest's random pool: {e}"),
                )
            })?,
        );
        let dir = run_dir().map_err(|e| self.refused(spec, format!("the run directory: {e}")))?;
        let mut initrd = Vec::with_capacity(base.len() + 4096);
        initrd.extend_from_slice(&base);
        initrd.extend_from_slice(&tail.cpio());
        std::fs::write(dir.path().join("initrd"), initrd)
            .map_err(|e| self.refused(spec, format!("the guest image: {e}")))?;
        let run = report::Run {
            dir: dir.path(),
            program_inside: &inside,
            pin: pin.as_ref(),
            image_bytes: base.len() as u64,
            disk: self.disk.as_deref(),
            env_keys,
            warnings,
        };
        let report = report::launched(self, &self.accel(), &run);
        Ok((dir, report))
    }

    /// The report a launch of `spec` would have (its image written and
    /// removed again; nothing runs): `sharedos sandbox check --runtime`.
    pub fn describe(&self, spec: &LaunchSpec) -> Result<Value, LaunchError> {
        self.prepare(spec).map(|(_, r)| r)
    }

    /// A guest that did not come up (`why`): QEMU killed and reaped, the
    /// refusal naming its status and the console's last lines (`stderr`).
    fn not_up(
        &self,
        spec: &LaunchSpec,
        child: &mut Child,
        stderr: OwnedFd,
        why: impl std::fmt::Display,
    ) -> LaunchError {
        let _ = child.kill();
        let status = child.wait().ok().map(vm::plugin_status);
        let tail = stderr_now(stderr);
        let reason = format!(
            "the guest did not come up: {why} (QEMU: {}); its console: {tail}",
            status.map_or("killed".into(), |s| s.to_string())
        );
        self.refused(spec, reason)
    }

    fn launch_blocking(&self, spec: &LaunchSpec) -> Result<LaunchedChild, LaunchError> {
        let (dir, mut report) = self.prepare(spec)?;
        let spawn_error = |source| LaunchError::Spawn {
            program: spec.program.clone(),
            source,
        };
        let initrd = dir.path().join("initrd");
        let machine = vm::Machine {
            qemu: &self.qemu,
            kernel: &self.kernel,
            initrd: &initrd,
            accel: self.accel().name,
            memory_mib: self.memory_mib,
            vcpus: self.vcpus,
        };
        let mut cmd = machine.command();
        // With a network policy: the channel to the gateway, and a write
        // end of the stderr pipe kept for the channel's own complaint.
        let egress = match self.policy.egress_port {
            Some(_) => Some(egress::prepare(dir.path()).map_err(spawn_error)?),
            None => None,
        };
        if egress.is_some() {
            cmd.args(egress::qemu_args(dir.path()));
        }
        if let Some(d) = &self.disk {
            cmd.args(disk::qemu_args(&d.image));
        }
        let (err_r, err_w) = std::io::pipe().map_err(spawn_error)?;
        let err_keep = egress
            .as_ref()
            .map(|_| err_w.try_clone().map(OwnedFd::from))
            .transpose()
            .map_err(spawn_error)?;
        cmd.current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err_w));
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        super::gvisor::runsc::dies_with_host(&mut cmd);
        let started = std::time::Instant::now();
        let mut child = super::direct::on_spawn_thread(move || cmd.spawn())
            .and_then(|r| r)
            .map_err(spawn_error)?;
        let (Some(i), Some(o)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(spawn_error(io::Error::other(
                "a stdio pipe of QEMU is missing",
            )));
        };
        let e = OwnedFd::from(err_r);
        let up = ready::wait_ready(std::os::fd::AsFd::as_fd(&o), BOOT_TIMEOUT)
            .and_then(|()| serve_egress(&child, egress.zip(err_keep)));
        let egress_listener = match up {
            Ok(l) => l,
            Err(why) => return Err(self.not_up(spec, &mut child, e, why)),
        };
        // QEMU's start to the guest init's ready line: the boot.
        report["boot_ms"] = (started.elapsed().as_millis() as u64).into();
        let (stdin, stdout) = line::relays(i, o).map_err(spawn_error)?;
        Ok(LaunchedChild {
            stdin,
            stdout,
            stderr: e,
            tree: Box::new(MicrovmTree {
                child,
                dir: Some(dir),
            }),
            report: Some(report),
            egress_listener,
        })
    }
}

/// With a network policy, once the guest is up: the channel served (QEMU
/// killed through `child`'s pidfd if the guest breaks it, saying so on
/// the kept stderr write end) and the gateway's listener for the turn.
fn serve_egress(
    child: &Child,
    egress: Option<(egress::Prepared, OwnedFd)>,
) -> io::Result<Option<OwnedFd>> {
    let Some((p, stderr)) = egress else {
        return Ok(None);
    };
    let pid = rustix::process::Pid::from_child(child);
    let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?;
    let listener = p.gateway.try_clone()?;
    egress::serve(p, pidfd, stderr)?;
    Ok(Some(listener))
}

/// The end of what QEMU wrote to its stderr so far (the guest's console
/// and the init's message), for a guest that did not come up.
fn stderr_now(fd: OwnedFd) -> String {
    use std::io::Read;
    let _ = nix::fcntl::fcntl(
        &fd,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    );
    let mut text = Vec::new();
    let _ = std::fs::File::from(fd)
        .take(64 * 1024)
        .read_to_end(&mut text);
    let text = String::from_utf8_lossy(&text);
    let start = text.len().saturating_sub(1024);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(0);
    text[start..].trim().to_owned()
}

/// The guest init's launch (guest-init/src/main.rs): argv, environment,
/// uid, mounts and rlimits; with the environment's keys and the warnings.
fn launch_json(
    p: &SandboxPolicy,
    spec: &LaunchSpec,
    inside: &str,
    memory_mib: u64,
) -> (Value, Vec<String>, Vec<String>) {
    use sharedos_sandbox::fsview;
    let (env, warnings) = environment(p, &spec.env);
    let env_keys = env.iter().map(|(k, _)| k.clone()).collect();
    let mut argv = vec![inside.to_owned()];
    argv.extend(spec.args.iter().cloned());
    let tmpfs = [
        (fsview::WORKSPACE, p.workspace_size_bytes, "0700", true),
        (fsview::HOME, p.home_size_bytes, "0700", true),
        (fsview::TMP, p.tmp_size_bytes, "1777", false),
        ("/dev/shm", p.shm_size_bytes, "1777", false),
    ]
    .map(|(path, bytes, mode, owned)| json!({"path": path, "bytes": bytes, "mode": mode, "owned": owned}));
    let launch = json!({
        "argv": argv,
        "env": env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "uid": p.uids.first,
        "cwd": fsview::WORKSPACE,
        "nr_inodes": p.tmpfs_nr_inodes,
        "tmpfs": tmpfs,
        "rlimits": super::gvisor::rlimit_rows(p),
        "ram_mib": memory_mib,
        "binds": p.extra_ro_paths,
        "egress_port": p.egress_port,
        "egress_device": vm::EGRESS_DEVICE,
    });
    (launch, env_keys, warnings)
}

/// The spec's environment through the policy's allowlist, with the
/// guest's own `HOME` and `TMPDIR`, and `PATH` and `LANG` defaulted; with
/// a warning for each key dropped or replaced.
fn environment(
    policy: &SandboxPolicy,
    env: &[(String, String)],
) -> (Vec<(String, String)>, Vec<String>) {
    use sharedos_sandbox::fsview;
    let mut out: Vec<(String, String)> = Vec::new();
    let mut warnings = Vec::new();
    for (k, v) in env {
        if k == "HOME" || k == "TMPDIR" {
            warnings.push(format!("{k} from the host replaced by the guest's own"));
        } else if policy.env_allowed(k) {
            out.push((k.clone(), v.clone()));
        } else {
            warnings.push(format!("env key {k:?} is not in envAllowlist; dropped"));
        }
    }
    for (k, v) in [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("LANG", "C.UTF-8"),
    ] {
        if !out.iter().any(|(key, _)| key == k) {
            out.push((k.into(), v.into()));
        }
    }
    out.push(("HOME".into(), fsview::HOME.into()));
    out.push(("TMPDIR".into(), fsview::TMP.into()));
    (out, warnings)
}

impl MicrovmLauncher {
    fn warm_target(&self) -> usize {
        self.policy.warm.min(sharedos_sandbox::MAX_WARM) as usize
    }

    /// A warm VM for `spec` (its report marked `warm`), its pinned
    /// program checked again now; `None`: none is live.
    fn take_warm(&self, spec: &LaunchSpec) -> Result<Option<LaunchedChild>, LaunchError> {
        if let Some(pin) = spec.program_sha256.or(self.policy.program_sha256) {
            super::stage_pinned(&spec.program, &pin)
                .map_err(|e| self.refused(spec, e.to_string()))?;
        }
        let Some(mut vm) = self.warm.take(&warm::key(self, spec)) else {
            return Ok(None);
        };
        if let Some(r) = vm.report.as_mut() {
            r["warm"] = true.into();
        }
        Ok(Some(vm))
    }
}

impl Launcher for MicrovmLauncher {
    /// With `warm`: a VM booted ahead when one is live (a replacement is
    /// ordered either way), else one booted now.
    fn launch(&self, spec: &LaunchSpec) -> Result<LaunchedChild, LaunchError> {
        let target = self.warm_target();
        if target == 0 {
            return self.launch_blocking(spec);
        }
        if let Some(vm) = self.take_warm(spec)? {
            self.warm
                .refill(&warm::key(self, spec), target, warm::booter(self, spec));
            return Ok(vm);
        }
        let out = self.launch_blocking(spec);
        if out.is_ok() {
            self.warm.succeeded();
        }
        self.warm
            .refill(&warm::key(self, spec), target, warm::booter(self, spec));
        out
    }

    /// At seating: what dead hosts left is removed, the accelerator is
    /// chosen (a KVM probe may take a few seconds once per host process)
    /// and the image's fixed part is built, not in the first turn.
    fn prewarm(&self, spec: &LaunchSpec) {
        sweep::sweep_once();
        let accel = self.accel();
        tracing::info!(accel = accel.name, why = %accel.why, "microvm accelerator");
        let target = self.warm_target();
        if target > 0 {
            self.warm.adopt(&warm::key(self, spec));
            self.warm
                .refill(&warm::key(self, spec), target, warm::booter(self, spec));
        }
        if spec.program_sha256.or(self.policy.program_sha256).is_none() {
            let name = spec
                .program
                .file_name()
                .unwrap_or_default()
                .to_string_lossy();
            let inside = format!("/{}/{name}", image::PLUGIN_DIR);
            if let Err(e) = self.base_image(&spec.program, &inside) {
                tracing::warn!(program = %spec.program.display(), "microvm image: {e}");
            }
        }
    }
}

/// One VM: the QEMU process and the run's directory.
struct MicrovmTree {
    child: Child,
    /// Present until the VM is torn down.
    dir: Option<tempfile::TempDir>,
}

impl ProcessTree for MicrovmTree {
    fn pid(&self) -> u32 {
        self.child.id()
    }
    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?.map(vm::plugin_status))
    }
    fn start_kill(&mut self) {
        // SIGKILL to QEMU by its pid: the guest is inside it. Never blocks.
        let _ = self.child.kill();
    }
    fn kill_tree(&mut self) -> io::Result<()> {
        let _ = self.child.kill();
        self.child.wait()?;
        self.dir.take();
        Ok(())
    }
}

impl Drop for MicrovmTree {
    fn drop(&mut self) {
        if self.dir.is_some() {
            let _ = self.kill_tree();
        }
    }
}

/// A guest's random seed: 32 bytes of the host's random source. Without
/// it the guest kernel's random pool is initialized only from what it
/// gathers itself, which under TCG takes seconds after boot, and a
/// plugin whose start reads `getrandom` (a Rust program's hash maps do)
/// waits for it.
fn seed() -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut seed = vec![0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut seed)?;
    Ok(seed)
}
