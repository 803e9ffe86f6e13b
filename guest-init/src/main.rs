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
/// The host's random seed for this launch (root's, 0400; removed once
/// credited).
const SEED: &str = "/sharedos/seed";
/// `_IOW('R', 0x03, int[2])`: add entropy to the kernel's pool.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
/// Present in the host's accelerator probe image only.
const PROBE: &str = "/sharedos/probe";
/// The `isa-debug-exit` device's port (QEMU `iobase=0xf4`).
const EXIT_PORT: u16 = 0xf4;
const SETUP_FAILED: u8 = 126;
/// How long the init waits, after the end of the plugin's output, for the
/// host to say it has read it all before it powers off regardless.
const TAKEN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
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
    seed_random();
    let proto = open_port(&launch.protocol)?;
    set_up_files(&launch)?;
    // The guest's own loopback: the egress gateway's listener and a
    // harness's MCP listener live on it.
    egress::lo_up()?;
    if let Some(port) = launch.egress_port {
        let line = open_device(&launch.egress_device)?;
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
    write_all(proto, READY);
    let (stdin_r, stdin_w) = pipe()?;
    let (stdout_r, stdout_w) = pipe()?;
    let pid = spawn_plugin(launch, [stdin_r, stdout_w, err])?;
    // The plugin holds its ends now; this init keeps only its own, and
    // its relays are threads started after the fork.
    close(stdin_r);
    close(stdout_w);
    let (taken_tx, taken) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        pump_input(proto, stdin_w);
        let _ = taken_tx.send(());
    });
    let stdout = std::thread::spawn(move || {
        pump_output(stdout_r, proto);
        close(stdout_r);
    });
    let status = reap_until(pid);
    // Whatever the plugin left behind goes with it.
    // SAFETY: kill(-1) signals every process but this init; no memory is touched.
    unsafe { libc::kill(-1, libc::SIGKILL) };
    while reap_any() {}
    // Every writer of the stdout pipe is gone: what it holds is sent,
    // then the end, and the host says when it has read it all (QEMU's
    // exit drops what it has not passed on yet).
    let _ = stdout.join();
    write_all(proto, &[line::END_OF_OUTPUT]);
    let _ = taken.recv_timeout(TAKEN_TIMEOUT);
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
        load_module(m)?;
    }
    await_device(DISK_DEV)?;
    let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    mount(DISK_DEV, DISK_DIR, "ext4", flags, "noload")?;
    for path in &disk.binds {
        bind_read_only(DISK_DIR, path)?;
    }
    Ok(())
}

/// Credits the host's seed ([`SEED`]) to the kernel's random pool
/// (`RNDADDENTROPY`, 256 bits), so that `getrandom` does not wait for the
/// pool to fill itself (seconds under TCG), and removes it: the plugin
/// never reads it. A guest without one (an older host) goes on unseeded.
fn seed_random() {
    let Ok(seed) = std::fs::read(SEED) else {
        return;
    };
    let _ = std::fs::remove_file(SEED);
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let mut info: Vec<u8> = Vec::with_capacity(8 + seed.len());
    info.extend_from_slice(&((seed.len() * 8) as i32).to_ne_bytes());
    info.extend_from_slice(&(seed.len() as i32).to_ne_bytes());
    info.extend_from_slice(&seed);
    let ok = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/urandom")
        .map(|f| {
            // SAFETY: f is open; info is a rand_pool_info of buf_size
            // bytes of buffer, valid for the call.
            unsafe {
                libc::ioctl(
                    std::os::fd::AsRawFd::as_raw_fd(&f),
                    RNDADDENTROPY,
                    info.as_ptr(),
                ) == 0
            }
        })
        .unwrap_or(false);
    if !ok {
        say(&os_err(
            "sharedos-guest-init: the host's seed was not credited to the random pool",
        ));
    }
}

/// The protocol port: its driver's modules loaded, its device node
/// awaited and opened.
fn open_port(p: &Protocol) -> Res<libc::c_int> {
    for m in &p.modules {
        load_module(m)?;
    }
    open_device(&p.device)
}

/// A virtio port's device node, once it appears, opened.
fn open_device(dev: &str) -> Res<libc::c_int> {
    await_device(dev)?;
    let path = cstr(dev)?;
    // The node appears before the driver lists the port, which opens
    // fail with ENXIO until then.
    for _ in 0..1000 {
        // SAFETY: a NUL-terminated path; the descriptor is owned by this init.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd >= 0 {
            return Ok(fd);
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::ENXIO) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Err(os_err(&format!("open {dev}")))
}

/// Waits until the device node `dev` appears (its driver has probed the
/// device), up to 10 s.
fn await_device(dev: &str) -> Res<()> {
    let mut tries = 0;
    while !std::path::Path::new(dev).exists() {
        tries += 1;
        if tries > 1000 {
            return Err(format!(
                "{dev} did not appear after the virtio modules were loaded"
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Ok(())
}

/// Loads the kernel module at `path` (`finit_module`).
fn load_module(path: &str) -> Res<()> {
    let file = std::fs::File::open(path).map_err(|e| format!("{path}: {e}"))?;
    let params = cstr("")?;
    // SAFETY: a valid open descriptor and a NUL-terminated parameter
    // string that outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_finit_module,
            std::os::fd::AsRawFd::as_raw_fd(&file),
            params.as_ptr(),
            0,
        )
    };
    if rc != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
        return Err(os_err(&format!("load module {path}")));
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

/// One read of `from` into `buf`: `None` at its end or on an error.
fn read_some(from: libc::c_int, buf: &mut [u8]) -> Option<usize> {
    loop {
        // SAFETY: buf is valid for its length; from is open.
        let n = unsafe { libc::read(from, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        return usize::try_from(n).ok().filter(|&n| n > 0);
    }
}

/// Copies the plugin's stdout (`from`) to the protocol port until it
/// ends or a write fails, its control bytes escaped
/// ([`sharedos_chanmux::line`]).
fn pump_output(from: libc::c_int, to: libc::c_int) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut escaped = Vec::new();
    while let Some(n) = read_some(from, &mut buf) {
        let data = &buf[..n];
        let sent = if line::needs_escape(data) {
            escaped.clear();
            line::escape_output(data, &mut escaped);
            write_all(to, &escaped)
        } else {
            write_all(to, data)
        };
        if !sent {
            return;
        }
    }
}

/// Relays the host's protocol bytes to the plugin's stdin (`to`, closed
/// here) until the host closes it with [`line::END_OF_INPUT`] (which no
/// JSON text contains), then reads on until the host says it has taken
/// the guest's output ([`line::OUTPUT_TAKEN`]) or the port fails. A
/// plugin that stops reading its stdin does not stop the port's reads.
fn pump_input(from: libc::c_int, to: libc::c_int) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut to = Some(to);
    while let Some(n) = read_some(from, &mut buf) {
        let mut data = &buf[..n];
        if let Some(fd) = to {
            let end = data.iter().position(|&c| c == line::END_OF_INPUT);
            let sent = write_all(fd, &data[..end.unwrap_or(n)]);
            if !sent || end.is_some() {
                close(fd);
                to = None;
            }
            data = end.map_or(&[][..], |e| &data[e + 1..]);
        }
        if to.is_none() && data.contains(&line::OUTPUT_TAKEN) {
            break;
        }
    }
    if let Some(fd) = to {
        close(fd);
    }
}

/// Writes all of `data` to `to`; `false` when a write fails.
fn write_all(to: libc::c_int, data: &[u8]) -> bool {
    let mut sent = 0;
    while sent < data.len() {
        let rest = &data[sent..];
        // SAFETY: rest is initialized and in bounds; to is open.
        let w = unsafe { libc::write(to, rest.as_ptr().cast(), rest.len()) };
        if w < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        match usize::try_from(w) {
            Ok(w) if w > 0 => sent += w,
            _ => return false,
        }
    }
    true
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

/// Everything the plugin's exec needs, prepared before the fork (the
/// child only makes system calls).
struct Exec {
    argv: Vec<CString>,
    env: Vec<CString>,
    cwd: CString,
    rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
}

fn rlimit_resource(name: &str) -> Res<libc::__rlimit_resource_t> {
    Ok(match name {
        "RLIMIT_CORE" => libc::RLIMIT_CORE,
        "RLIMIT_NOFILE" => libc::RLIMIT_NOFILE,
        "RLIMIT_FSIZE" => libc::RLIMIT_FSIZE,
        "RLIMIT_DATA" => libc::RLIMIT_DATA,
        "RLIMIT_AS" => libc::RLIMIT_AS,
        "RLIMIT_NPROC" => libc::RLIMIT_NPROC,
        "RLIMIT_CPU" => libc::RLIMIT_CPU,
        "RLIMIT_MEMLOCK" => libc::RLIMIT_MEMLOCK,
        "RLIMIT_MSGQUEUE" => libc::RLIMIT_MSGQUEUE,
        "RLIMIT_RTPRIO" => libc::RLIMIT_RTPRIO,
        "RLIMIT_SIGPENDING" => libc::RLIMIT_SIGPENDING,
        other => return Err(format!("unknown rlimit {other}")),
    })
}

fn prepare(launch: &Launch) -> Res<Exec> {
    if launch.argv.is_empty() {
        return Err("the launch names no program".into());
    }
    let all = |v: &[String]| v.iter().map(|s| cstr(s)).collect::<Res<Vec<_>>>();
    let rlimits = launch
        .rlimits
        .iter()
        .map(|(n, v)| Ok((rlimit_resource(n)?, *v)))
        .collect::<Res<Vec<_>>>()?;
    Ok(Exec {
        argv: all(&launch.argv)?,
        env: all(&launch.env)?,
        cwd: cstr(&launch.cwd)?,
        rlimits,
    })
}

/// Forks the plugin: `stdio` its stdin, stdout and stderr (the relayed
/// pipes and the stderr line), its rlimits, no supplementary groups, the
/// sandbox uid and gid, no new privileges, then exec.
fn spawn_plugin(launch: &Launch, stdio: [libc::c_int; 3]) -> Res<libc::pid_t> {
    let [stdin, stdout, err] = stdio;
    let exec = prepare(launch)?;
    let mut argv: Vec<*const libc::c_char> = exec.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = exec.env.iter().map(|a| a.as_ptr()).collect();
    envp.push(std::ptr::null());
    let uid = launch.uid;
    // SAFETY: this init has one thread, so the child may run any code;
    // it only makes system calls on data prepared before the fork and
    // ends in execve or _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(os_err("fork"));
    }
    if pid > 0 {
        return Ok(pid);
    }
    // SAFETY: in the child: system calls on valid descriptors and on
    // pointers into `exec`, `argv` and `envp`, alive until execve.
    unsafe {
        let ok = libc::dup2(stdin, 0) == 0
            && libc::dup2(stdout, 1) == 1
            && libc::dup2(err, 2) == 2
            && exec.rlimits.iter().all(|(r, v)| {
                let lim = libc::rlimit {
                    rlim_cur: *v,
                    rlim_max: *v,
                };
                libc::setrlimit(*r, &lim) == 0
            })
            && libc::setgroups(0, std::ptr::null()) == 0
            && libc::setgid(uid) == 0
            && libc::setuid(uid) == 0
            && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
            && libc::chdir(exec.cwd.as_ptr()) == 0
            // This init ignores SIGPIPE (a Rust program's default); the
            // plugin starts with the default, as in every other engine.
            && libc::signal(libc::SIGPIPE, libc::SIG_DFL) != libc::SIG_ERR;
        if ok {
            libc::execve(argv[0], argv.as_ptr(), envp.as_ptr());
        }
        let msg = b"sharedos-guest-init: the plugin could not be started\n";
        libc::write(err, msg.as_ptr().cast(), msg.len());
        libc::_exit(SETUP_FAILED as libc::c_int);
    }
}

/// Reaps every child (init adopts the plugin's orphans) until `pid` has
/// ended; returns its wait status.
fn reap_until(pid: libc::pid_t) -> libc::c_int {
    loop {
        let mut status = 0;
        // SAFETY: status is a valid out-pointer.
        let got = unsafe { libc::waitpid(-1, &mut status, 0) };
        if got == pid {
            return status;
        }
        if got < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return 0;
        }
    }
}

/// Reaps one ended child; `false` once none is left.
fn reap_any() -> bool {
    let mut status = 0;
    // SAFETY: status is a valid out-pointer.
    unsafe { libc::waitpid(-1, &mut status, 0) > 0 }
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
