//! Layer: the host-wide files of the sandbox's own `/proc`, masked or
//! replaced. The procfs of a new pid namespace shows only the sandbox's
//! processes, but some of its files describe the whole machine: the boot
//! id, the kernel command line, load, pressure, memory, disks, interrupts,
//! kernel symbols and modules, the kernel's build host, the uptime. Each is
//! covered by a read-only bind of a file of a tiny tmpfs of our own (a fresh
//! boot id, a small `meminfo` with the sandbox's own bound, a `version`
//! with only what `uname(2)` says, a zero `uptime`, empty files for the
//! rest), and the directories of
//! host-wide figures by an empty read-only directory of the same tmpfs.
//! Runs in pid 1, before `pivot_root`.

use std::path::Path;

use super::vfs::{cstr, mount, restrict};

/// Files replaced by an empty one (those that exist on this kernel).
/// Files only root can read (`kcore`, `slabinfo`, `pagetypeinfo`, ...)
/// stay unreadable without a mask.
pub const EMPTIED: [&str; 19] = [
    "cmdline",
    "loadavg",
    "stat",
    "config.gz",
    "interrupts",
    "softirqs",
    "zoneinfo",
    "buddyinfo",
    "vmstat",
    "diskstats",
    "partitions",
    "swaps",
    "sched_debug",
    "schedstat",
    "timer_list",
    "kallsyms",
    "modules",
    "keys",
    "key-users",
];

/// Directories of host-wide figures, covered by an empty read-only
/// directory.
pub const HIDDEN_DIRS: [&str; 8] = [
    "pressure", "acpi", "scsi", "irq", "bus", "fs", "driver", "tty",
];

/// What the masked `/proc` shows instead of the host's.
pub struct Replacements {
    /// `sys/kernel/random/boot_id`: a fresh id per sandbox.
    pub boot_id: String,
    /// `MemTotal` of the replaced `meminfo`, KiB.
    pub mem_total_kib: u64,
    /// `version`: the kernel's release and version as `uname(2)` gives
    /// them anyway, without the builder's user, host and compiler.
    pub version: String,
}

/// `/proc/uptime` inside: the sandbox has just started. A fixed file (a
/// time namespace would make the first figure live, but the second, the
/// idle time summed over every CPU, stays the host's).
const UPTIME: &str = "0.00 0.00\n";

/// `Linux version <release> <version>` from `uname(2)`, which the seccomp
/// filter allows (glibc, Python and Node read it), so it adds nothing.
fn uname_version() -> String {
    let u = rustix::system::uname();
    format!(
        "Linux version {} {}\n",
        u.release().to_string_lossy(),
        u.version().to_string_lossy()
    )
}

impl Replacements {
    /// A fresh boot id and `mem_total_kib`.
    pub fn new(mem_total_kib: u64) -> Replacements {
        let mut b = [0u8; 16];
        // SAFETY: getrandom writes at most `b.len()` bytes into `b`.
        let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
        if n != b.len() as isize {
            // A boot id only has to differ from the host's, which a
            // per-process value does.
            let t = crate::timing::now_ns().to_le_bytes();
            b[..8].copy_from_slice(&t);
        }
        b[6] = (b[6] & 0x0f) | 0x40;
        b[8] = (b[8] & 0x3f) | 0x80;
        let h: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
        let boot_id = format!(
            "{}-{}-{}-{}-{}\n",
            h[..4].concat(),
            h[4..6].concat(),
            h[6..8].concat(),
            h[8..10].concat(),
            h[10..].concat()
        );
        Replacements {
            boot_id,
            mem_total_kib,
            version: uname_version(),
        }
    }
}

/// Mount the sandbox's procfs at `proc_dir` with its host-wide files
/// masked. The replacement files live on a tiny tmpfs mounted at
/// `proc_dir` first and sealed read-only; the procfs is mounted over it and
/// each file is bound from an fd taken before. The tmpfs stays below the
/// procfs, unreachable by path: no unmount, which would cost an RCU grace
/// period per spawn.
pub fn mount_masked(proc_dir: &Path, with: &Replacements) -> Result<(), String> {
    let fds = replacements(proc_dir, with)?;
    mount(
        Some(Path::new("proc")),
        proc_dir,
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )?;
    let srcs = fds
        .iter()
        .map(|f| {
            use std::os::fd::AsRawFd;
            cstr(Path::new(&format!("/proc/self/fd/{}", f.as_raw_fd())))
        })
        .collect::<Result<Vec<_>, String>>()?;
    // One `mount` per file, no `stat` first: a file this kernel does not
    // have answers ENOENT, which is skipped.
    let cover = |i: usize, target: &Path| -> Result<(), String> {
        match rustix::mount::mount_bind(srcs[i].as_c_str(), target) {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::NOENT) => Ok(()), // not on this kernel
            Err(e) => Err(format!("bind over {target:?}: {}", std::io::Error::from(e))),
        }
    };
    for name in EMPTIED {
        cover(0, &proc_dir.join(name))?;
    }
    cover(1, &proc_dir.join("sys/kernel/random/boot_id"))?;
    cover(2, &proc_dir.join("meminfo"))?;
    cover(3, &proc_dir.join("version"))?;
    cover(4, &proc_dir.join("uptime"))?;
    for dir in HIDDEN_DIRS {
        cover(5, &proc_dir.join(dir))?;
    }
    Ok(())
}

/// The replacement files, written in a small tmpfs at `proc_dir` (sealed
/// read-only), then opened: an empty file, the boot id, meminfo, version,
/// uptime, an empty directory. The fds outlive the `proc` mount that
/// hides the tmpfs next.
fn replacements(proc_dir: &Path, with: &Replacements) -> Result<Vec<std::fs::File>, String> {
    mount(
        Some(Path::new("tmpfs")),
        proc_dir,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some("size=64k,nr_inodes=16,mode=0555"),
    )?;
    let write = |name: &str, body: &str| {
        let p = proc_dir.join(name);
        std::fs::write(&p, body).map_err(|e| format!("write {p:?}: {e}"))?;
        Ok::<_, String>(p)
    };
    let kib = with.mem_total_kib;
    let sources = [
        write("empty", "")?,
        write("boot_id", &with.boot_id)?,
        write(
            "meminfo",
            &format!("MemTotal: {kib:>15} kB\nMemFree: {kib:>16} kB\nMemAvailable: {kib:>11} kB\n"),
        )?,
        write("version", &with.version)?,
        write("uptime", UPTIME)?,
        {
            let d = proc_dir.join("dir");
            std::fs::create_dir(&d).map_err(|e| format!("mkdir {d:?}: {e}"))?;
            d
        },
    ];
    // Sealed once: every bind below copies this mount's flags (read-only,
    // nosuid, nodev, noexec), so no bind needs its own call.
    restrict(
        proc_dir,
        libc::MOUNT_ATTR_RDONLY
            | libc::MOUNT_ATTR_NOSUID
            | libc::MOUNT_ATTR_NODEV
            | libc::MOUNT_ATTR_NOEXEC,
        false,
    )?;
    let mut fds = Vec::with_capacity(sources.len());
    for p in &sources {
        let f = std::fs::File::open(p).map_err(|e| format!("open {p:?}: {e}"))?;
        fds.push(f);
    }
    Ok(fds)
}
