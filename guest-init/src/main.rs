//! The init of a sharedos microVM guest (pid 1 of the guest kernel).
//!
//! It reads the launch the host wrote into the initramfs
//! (`/sharedos/launch.json`), mounts `/dev`, `/proc`, `/sys` and the
//! private tmpfs mounts of the policy's sizes, makes the root read-only,
//! sets the stderr line (`ttyS1`) raw, mounts a harness's read-only disk
//! when the launch has one, loads the virtio port's driver and opens the
//! protocol port, says `sharedos-guest-ready` on it (the host writes
//! nothing before it), and runs the plugin as the sandbox uid with its
//! stdin and stdout on pipes this init relays to and from the port (a
//! plugin's stdio is pipes in every engine, and the SDKs refuse to serve a
//! terminal, taking it for a person running the plugin by hand) and its
//! stderr on the serial line. When the plugin has ended it kills whatever
//! the plugin left, sends the rest of its stdout and the end of its
//! output, waits for the host to say it has read it all
//! (`sharedos_chanmux::line`) and the stderr line to drain, and reports
//! how the plugin ended through the `isa-debug-exit` port: QEMU then exits with
//! `(code << 1) | 1`, where `code` is ([`encode`]):
//!
//! - `0..=95`: the plugin's exit code (95 for any code above);
//! - `96 + N`: killed by signal N (`1..=29`);
//! - `126`: this init could not set the guest up (the reason is on the
//!   stderr line);
//! - `127`: the guest kernel's out-of-memory killer killed a process of
//!   the plugin (the VM's RAM is its memory bound).
//!
//! Where the port cannot be used the guest reboots, which QEMU (`-no-reboot`)
//! turns into an exit with status 0: "ended without a report".

mod egress;
mod plugin;
mod port;
mod seed;

use std::ffi::CString;
use std::io::Write;

use serde::Deserialize;
use sharedos_chanmux::line;

/// Where the host puts the launch in the initramfs.
const LAUNCH: &str = "/sharedos/launch.json";
/// The line that tells the host the protocol line is ready (the host
/// strips it; host/src/process/microvm/ready.rs).
const READY: &[u8] = b"sharedos-guest-ready\n";
/// Where the image holds `extraRoPaths` (bound at their own paths).
const RO_DIR: &str = "/sharedos/ro";
/// Where a harness's read-only disk is mounted.
const DISK_DIR: &str = "/sharedos/disk";
/// The disk's device node.
const DISK_DEV: &str = "/dev/vda";
/// Present in the host's accelerator probe image only.
const PROBE: &str = "/sharedos/probe";
/// The `isa-debug-exit` device's port (QEMU `iobase=0xf4`).
const EXIT_PORT: u16 = 0xf4;
const SETUP_FAILED: u8 = 126;
const OUT_OF_MEMORY: u8 = 127;

#[derive(Debug, Deserialize)]
struct Launch {
    /// argv, the program's path inside the guest first.
    argv: Vec<String>,
    /// The complete environment, `KEY=value`.
    env: Vec<String>,
    uid: u32,
    cwd: String,
    /// The policy's inode cap of each tmpfs.
    nr_inodes: u64,
    tmpfs: Vec<Tmpfs>,
    /// `(name, value)`: `RLIMIT_NOFILE` and the like, soft = hard.
    rlimits: Vec<(String, u64)>,
    /// The VM's RAM, for the out-of-memory message.
    ram_mib: u64,
    /// `extraRoPaths`: each is in the image under [`RO_DIR`] and bound
    /// read-only at its own path once the tmpfs mounts are made (so one
    /// under `/tmp` is not hidden by the guest's `/tmp`).
    #[serde(default)]
    binds: Vec<String>,
    /// A harness's read-only disk (`/dev/vda`): its modules loaded, it is
    /// mounted read-only at [`DISK_DIR`] and each of its paths bound
    /// read-only at its own path, as `binds` are.
    #[serde(default)]
    disk: Option<Disk>,
    /// The egress gateway's port: listened on in the guest's loopback and
    /// carried over the virtio port `egress_device` to the host (absent:
    /// no network policy).
    #[serde(default)]
    egress_port: Option<u16>,
    #[serde(default)]
    egress_device: String,
    /// The protocol port: the kernel modules its driver needs (in the
    /// image, in load order) and its device node.
    protocol: Protocol,
}

#[derive(Debug, Deserialize)]
struct Protocol {
    modules: Vec<String>,
    device: String,
}

#[derive(Debug, Deserialize)]
struct Disk {
    /// Kernel modules in the image, in load order.
    modules: Vec<String>,
    /// Host paths on the disk (at their own paths under [`DISK_DIR`]).
    binds: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct Tmpfs {
    path: String,
    bytes: u64,
    mode: String,
    /// Owned by the sandbox uid (else root).
    owned: bool,
}

fn main() {
    let code = match run() {
        Ok(code) => code,
        Err(e) => {
            say(&format!(
                "sharedos-guest-init: the guest could not be set up: {e}"
            ));
            SETUP_FAILED
        }
    };
    power_off(code)
}

type Res<T> = Result<T, String>;

fn run() -> Res<u8> {
    if std::path::Path::new(PROBE).exists() {
        // The host's accelerator probe: reaching init is all it asks.
        return Ok(0);
    }
    mount("devtmpfs", "/dev", "devtmpfs", 0, "mode=0755")?;
    let err = open_line("/dev/ttyS1")?;
    mount("proc", "/proc", "proc", 0, "")?;
    mount("sysfs", "/sys", "sysfs", 0, "")?;
    let text = std::fs::read_to_string(LAUNCH).map_err(|e| format!("{LAUNCH}: {e}"))?;
    let launch: Launch = serde_json::from_str(&text).map_err(|e| format!("{LAUNCH}: {e}"))?;
    seed::seed_random();
    let proto = port::open_port(&launch.protocol)?;
    set_up_files(&launch)?;
    // The guest's own loopback: the egress gateway's listener and a
    // harness's MCP listener live on it.
    egress::lo_up()?;
    if let Some(port) = launch.egress_port {
        let line = port::open_device(&launch.egress_device)?;
        egress::start(port, line)?;
    }
    remount_root_read_only()?;
    serve(&launch, proto, err)
}

/// The plugin's tmpfs mounts, `extraRoPaths` and a harness's disk.
fn set_up_files(launch: &Launch) -> Res<()> {
    for t in &launch.tmpfs {
        let owner = if t.owned { launch.uid } else { 0 };
        let data = format!(
            "size={},mode={},uid={owner},gid={owner},nr_inodes={}",
            t.bytes, t.mode, launch.nr_inodes
        );
        std::fs::create_dir_all(&t.path).map_err(|e| format!("mkdir {}: {e}", t.path))?;
        let flags = libc::MS_NOSUID | libc::MS_NODEV;
        mount("tmpfs", &t.path, "tmpfs", flags, &data)?;
    }
    // The kernel's built-in initramfs makes an empty `/root`, mode 0700:
    // a path bound under it (a Python installed in root's home) would be
    // out of the sandbox uid's reach. The guest has no use for it; a bind
    // under it makes it again, 0755, as the namespace sandbox's root does.
    let _ = std::fs::remove_dir("/root");
    for path in &launch.binds {
        bind_read_only(RO_DIR, path)?;
    }
    if let Some(disk) = &launch.disk {
        mount_disk(disk)?;
    }
    Ok(())
}

/// Runs the plugin on the protocol port (`proto`) and the stderr line
/// (`err`) to its end; the code QEMU is to report.
fn serve(launch: &Launch, proto: libc::c_int, err: libc::c_int) -> Res<u8> {
    let ooms_before = oom_kills();
    // The host writes nothing before this line (what it would write
    // before the port is open waits in QEMU, but the launch is not up
    // before the guest is).
    port::write_all(proto, READY);
    let (stdin_r, stdin_w) = pipe()?;
    let (stdout_r, stdout_w) = pipe()?;
    let pid = plugin::spawn_plugin(launch, [stdin_r, stdout_w, err])?;
    // The plugin holds its ends now; this init keeps only its own, and
    // its relays are threads started after the fork.
    close(stdin_r);
    close(stdout_w);
    let (taken_tx, taken) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        port::pump_input(proto, stdin_w);
        let _ = taken_tx.send(());
    });
    let stdout = std::thread::spawn(move || {
        port::pump_output(stdout_r, proto);
        close(stdout_r);
    });
    let status = plugin::reap_until(pid);
    // Whatever the plugin left behind goes with it.
    // SAFETY: kill(-1) signals every process but this init; no memory is touched.
    unsafe { libc::kill(-1, libc::SIGKILL) };
    while plugin::reap_any() {}
    // Every writer of the stdout pipe is gone: what it holds is sent,
    // then the end, and the host says when it has read it all (QEMU's
    // exit drops what it has not passed on yet).
    let _ = stdout.join();
    port::write_all(proto, &[line::END_OF_OUTPUT]);
    let _ = taken.recv_timeout(port::TAKEN_TIMEOUT);
    let code = if oom_kills() > ooms_before {
        say(&format!(
            "sharedos-guest-init: out of memory: the guest kernel's OOM killer killed the plugin; the VM's RAM ({} MiB) is its memory bound",
            launch.ram_mib
        ));
        OUT_OF_MEMORY
    } else {
        encode(status)
    };
    drain(err);
    Ok(code)
}

/// A plugin's wait status as the code QEMU reports (see the module doc).
fn encode(status: libc::c_int) -> u8 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status).clamp(0, 95) as u8
    } else if libc::WIFSIGNALED(status) {
        96 + libc::WTERMSIG(status).clamp(1, 29) as u8
    } else {
        SETUP_FAILED
    }
}

fn cstr(s: &str) -> Res<CString> {
    CString::new(s).map_err(|_| format!("{s:?} holds a NUL byte"))
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

fn mount(source: &str, target: &str, fstype: &str, flags: libc::c_ulong, data: &str) -> Res<()> {
    let _ = std::fs::create_dir_all(target);
    let (s, t, f, d) = (cstr(source)?, cstr(target)?, cstr(fstype)?, cstr(data)?);
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let rc = unsafe { libc::mount(s.as_ptr(), t.as_ptr(), f.as_ptr(), flags, d.as_ptr().cast()) };
    if rc != 0 {
        return Err(os_err(&format!("mount {fstype} on {target}")));
    }
    Ok(())
}

/// The disk's modules loaded, `/dev/vda` mounted read-only at
/// [`DISK_DIR`], and each of its paths bound read-only at its own path.
fn mount_disk(disk: &Disk) -> Res<()> {
    for m in &disk.modules {
        port::load_module(m)?;
    }
    port::await_device(DISK_DEV)?;
    let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    mount(DISK_DEV, DISK_DIR, "ext4", flags, "noload")?;
    for path in &disk.binds {
        bind_read_only(DISK_DIR, path)?;
    }
    Ok(())
}

/// `<root><path>` bound read-only at `path`, its mount point made first.
fn bind_read_only(root: &str, path: &str) -> Res<()> {
    let source = format!("{root}{path}");
    let meta = std::fs::symlink_metadata(&source).map_err(|e| format!("{source}: {e}"))?;
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(&source).map_err(|e| format!("{source}: {e}"))?;
        if let Some(parent) = std::path::Path::new(path).parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        return std::os::unix::fs::symlink(target, path)
            .map_err(|e| format!("symlink {path}: {e}"));
    }
    if meta.is_dir() {
        std::fs::create_dir_all(path).map_err(|e| format!("mkdir {path}: {e}"))?;
    } else {
        if let Some(parent) = std::path::Path::new(path).parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("mkdir {}: {e}", parent.display()))?;
        }
        // A file already there (a library the init also uses) is the
        // mount point as it is: never truncated.
        if !std::path::Path::new(path).exists() {
            std::fs::write(path, b"").map_err(|e| format!("create {path}: {e}"))?;
        }
    }
    let (s, t) = (cstr(&source)?, cstr(path)?);
    let ro = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    // SAFETY: NUL-terminated source and target, null type and data, as a
    // bind mount and its remount allow.
    let ok = unsafe {
        libc::mount(
            s.as_ptr(),
            t.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND | libc::MS_REC,
            std::ptr::null(),
        ) == 0
            && libc::mount(
                std::ptr::null(),
                t.as_ptr(),
                std::ptr::null(),
                ro,
                std::ptr::null(),
            ) == 0
    };
    if !ok {
        return Err(os_err(&format!("bind {path} read-only")));
    }
    Ok(())
}

/// The initramfs root is read-only from here on: the plugin writes only
/// to its tmpfs mounts.
fn remount_root_read_only() -> Res<()> {
    let root = cstr("/")?;
    let flags = libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    // SAFETY: a NUL-terminated target and null source, type and data, as
    // a remount allows.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(os_err("remount / read-only"));
    }
    Ok(())
}

/// A serial line opened (not as a controlling terminal) and set raw: no
/// echo, no line editing, no CR/LF translation, no signals from bytes.
fn open_line(path: &str) -> Res<libc::c_int> {
    let p = cstr(path)?;
    // SAFETY: a NUL-terminated path; the descriptor is owned by this init.
    let fd = unsafe { libc::open(p.as_ptr(), libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(os_err(&format!("open {path}")));
    }
    // SAFETY: termios is plain data, filled by tcgetattr before use.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open; t is a valid termios to write and read.
    let ok = unsafe {
        libc::tcgetattr(fd, &mut t) == 0 && {
            libc::cfmakeraw(&mut t);
            t.c_cflag |= libc::CLOCAL | libc::CREAD;
            libc::tcsetattr(fd, libc::TCSANOW, &t) == 0
        }
    };
    if !ok {
        return Err(os_err(&format!("set {path} raw")));
    }
    Ok(fd)
}

/// Writes a line to the stderr line (the kernel log if that is not open).
fn say(line: &str) {
    let sent = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/ttyS1")
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    if sent.is_err() {
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/kmsg")
            .and_then(|mut f| f.write_all(line.as_bytes()));
    }
}

/// A pipe, both ends close-on-exec (the plugin gets its ends by `dup2`).
fn pipe() -> Res<(libc::c_int, libc::c_int)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid out-array of two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(os_err("pipe"));
    }
    Ok((fds[0], fds[1]))
}

fn close(fd: libc::c_int) {
    // SAFETY: fd is a descriptor this init owns and no longer uses.
    unsafe { libc::close(fd) };
}

/// Waits until the stderr line has sent what was written to it.
fn drain(err: libc::c_int) {
    // SAFETY: err is an open terminal of this init.
    unsafe { libc::tcdrain(err) };
}

/// The guest kernel's count of out-of-memory kills (`oom_kill` of
/// `/proc/vmstat`).
fn oom_kills() -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Reports `code` through the `isa-debug-exit` port, which ends QEMU; a
/// reboot (QEMU exits 0 under `-no-reboot`) if the port cannot be used.
fn power_off(code: u8) -> ! {
    // SAFETY: ioperm and the port write only touch the debug-exit port
    // this init was given by the VM; reboot ends the guest.
    unsafe {
        if libc::ioperm(EXIT_PORT.into(), 1, 1) == 0 {
            std::arch::asm!("out dx, al", in("dx") EXIT_PORT, in("al") code);
        }
        libc::reboot(libc::RB_AUTOBOOT);
    }
    loop {
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_wait_status_becomes_the_reported_code() {
        assert_eq!(super::encode(0), 0);
        assert_eq!(super::encode(3 << 8), 3);
        assert_eq!(super::encode(200 << 8), 95);
        assert_eq!(super::encode(9), 105);
        assert_eq!(super::encode(31), 125);
    }
}
