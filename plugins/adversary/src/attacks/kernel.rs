//! The kernel's privileged surface: mounts, namespaces, privilege gain,
//! /proc and /sys, hostname and clock, exotic syscalls and ABIs
//! (sandbox.md C46–C50, C52, C53, C55, C58, C59).

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::bait::Bait;
use crate::receipt::{Receipt, describe_errno, describe_io};
use crate::sys;

/// A fresh empty directory to mount on: in /tmp, else in the workspace.
fn scratch_dir(bait: &Bait, stem: &str) -> Option<PathBuf> {
    [PathBuf::from("/tmp"), bait.workspace()]
        .into_iter()
        .map(|d| d.join(sys::unique(stem)))
        .find(|d| std::fs::create_dir(d).is_ok())
}

pub fn c46_mount_tmpfs(bait: &Bait) -> Receipt {
    const A: &str = "C46-mount-tmpfs";
    // The target is our own empty directory, not /tmp: the permission
    // check is the same, and an unsandboxed success hides nothing.
    let Some(dir) = scratch_dir(bait, "mnt") else {
        return Receipt::not_attempted(A, "no writable place for an empty mount point");
    };
    let target = sys::cstring(&dir);
    let (fstype, opts) = (c"tmpfs", c"size=1m");
    // SAFETY: all pointers are NUL-terminated strings alive across the call.
    let r = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            opts.as_ptr().cast(),
        )
    };
    let e = sys::errno();
    if r == 0 && sys::holding() {
        // Left mounted for the host to find in our mount table.
        return Receipt::succeeded(
            A,
            format!(
                "succeeded: mounted a tmpfs on {} (kept while held)",
                dir.display()
            ),
        );
    }
    let receipt = if r == 0 {
        // SAFETY: unmounting what we just mounted, by the same path.
        let u = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        Receipt::succeeded(
            A,
            format!(
                "succeeded: mounted a tmpfs on {} (unmounted: {})",
                dir.display(),
                u == 0
            ),
        )
    } else {
        Receipt::blocked(
            A,
            format!(
                "blocked: mount tmpfs on {}: {}",
                dir.display(),
                describe_errno(e)
            ),
        )
    };
    let _ = std::fs::remove_dir(&dir);
    receipt
}

/// Steps of the nested-namespace probe, reported by the child.
const C47_STEPS: [&str; 6] = [
    "",
    "unshare(USER|NS)",
    "write uid_map",
    "make / private",
    "mount tmpfs",
    "chroot",
];

/// Writes `data` to `path` with raw open/write/close (async-signal-safe,
/// for a forked child); whether all of it was written.
fn write_once(path: &std::ffi::CStr, data: &[u8]) -> bool {
    // SAFETY: raw open/write/close on prepared buffers.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let ok = libc::write(fd, data.as_ptr().cast(), data.len()) == data.len() as isize;
        libc::close(fd);
        ok
    }
}

pub fn c47_nested_userns(bait: &Bait) -> Receipt {
    const A: &str = "C47-nested-userns-mount-chroot";
    let Some(dir) = scratch_dir(bait, "nested") else {
        return Receipt::not_attempted(A, "no writable place for the nested root");
    };
    // Everything the child needs is prepared before the fork.
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let uid_map = format!("0 {uid} 1\n");
    let gid_map = format!("0 {gid} 1\n");
    let target = sys::cstring(&dir);
    let report = sys::in_child(|w| {
        let fail = |step: i32| {
            w.put(step);
            w.put(sys::errno());
            step
        };
        let write = write_once;
        // SAFETY: raw syscalls on strings prepared before the fork.
        unsafe {
            if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) != 0 {
                return fail(1);
            }
            write(c"/proc/self/setgroups", b"deny");
            if !write(c"/proc/self/uid_map", uid_map.as_bytes()) {
                return fail(2);
            }
            write(c"/proc/self/gid_map", gid_map.as_bytes());
            if libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return fail(3);
            }
            if libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                std::ptr::null(),
            ) != 0
            {
                return fail(4);
            }
            if libc::chroot(target.as_ptr()) != 0 {
                return fail(5);
            }
        }
        w.put(0);
        w.put(0);
        0
    });
    let _ = std::fs::remove_dir(&dir);
    match report {
        Err(e) => Receipt::not_attempted(A, format!("fork failed: {}", describe_io(&e))),
        Ok(r) => match r.words.as_slice() {
            [0, 0] => Receipt::succeeded(
                A,
                "succeeded: nested user+mount namespace, tmpfs mounted, chroot done (in a child)",
            ),
            [step, errno] => {
                let name = C47_STEPS.get(*step as usize).copied().unwrap_or("?");
                Receipt::blocked(A, format!("blocked: {name}: {}", describe_errno(*errno)))
            }
            _ => Receipt::unjudged(A, format!("the probe child reported nothing ({})", r.exit)),
        },
    }
}

pub fn c48_setns(bait: &Bait) -> Receipt {
    const A: &str = "C48-setns-via-proc";
    let pid = bait.victim_pid.unwrap_or(1);
    let path = format!("/proc/{pid}/ns/net");
    let c = CString::new(path.clone()).unwrap_or_default();
    let report = sys::in_child(|w| {
        // SAFETY: raw open/setns in the child on a prepared path.
        unsafe {
            let fd = libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if fd < 0 {
                w.put(1);
                w.put(sys::errno());
                return 1;
            }
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                w.put(2);
                w.put(sys::errno());
                return 2;
            }
        }
        w.put(0);
        w.put(0);
        0
    });
    match report {
        Err(e) => Receipt::not_attempted(A, format!("fork failed: {}", describe_io(&e))),
        Ok(r) => match r.words.as_slice() {
            [0, 0] => Receipt::succeeded(A, format!("succeeded: setns into {path} (in a child)")),
            [1, e] => Receipt::blocked(A, format!("blocked: open {path}: {}", describe_errno(*e))),
            [_, e] => Receipt::blocked(A, format!("blocked: setns {path}: {}", describe_errno(*e))),
            _ => Receipt::unjudged(A, format!("the probe child reported nothing ({})", r.exit)),
        },
    }
}

/// `uid=.. euid=.. CapEff=..` of this process: what `--report-ids` prints.
pub fn ids_line() -> String {
    // SAFETY: getuid/geteuid cannot fail.
    let (uid, euid) = unsafe { (libc::getuid(), libc::geteuid()) };
    let cap = sys::status_field("CapEff").unwrap_or_else(|| "?".into());
    format!("uid={uid} euid={euid} CapEff={cap}")
}

/// Runs a bait binary and returns what it printed (first 4 KiB).
fn run_binary(path: &Path, args: &[String]) -> Result<String, String> {
    let out = Command::new(path)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| describe_io(&e))?;
    let mut text = String::from_utf8_lossy(&out.stdout[..out.stdout.len().min(4096)])
        .trim()
        .to_owned();
    text.truncate(300);
    Ok(text)
}

fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .map(|v| v.split('(').next().unwrap_or(v))
}

pub fn c49_setuid_binary(bait: &Bait) -> Receipt {
    const A: &str = "C49-setuid-root-binary";
    let Some(bin) = &bait.setuid_binary else {
        return Receipt::not_attempted(
            A,
            "no setuid_binary in the bait (a root-owned 4755 copy of `id` or of this binary with --report-ids)",
        );
    };
    // SAFETY: geteuid cannot fail.
    let ours = unsafe { libc::geteuid() };
    match run_binary(bin, &bait.setuid_args) {
        Err(e) => Receipt::blocked(A, format!("blocked: exec {}: {e}", bin.display())),
        Ok(out) => {
            let theirs = field(&out, "euid=")
                .or_else(|| field(&out, "uid="))
                .and_then(|v| v.parse::<u32>().ok());
            match theirs {
                _ if ours == 0 => {
                    Receipt::unjudged(A, format!("already euid 0; it printed: {out}"))
                }
                Some(e) if e != ours => Receipt::succeeded(
                    A,
                    format!("succeeded: euid {e} (ours {ours}); it printed: {out}"),
                ),
                Some(_) => {
                    Receipt::blocked(A, format!("blocked: euid stayed {ours}; it printed: {out}"))
                }
                None => Receipt::unjudged(A, format!("ran; no euid in its output: {out}")),
            }
        }
    }
}

pub fn c50_filecap_binary(bait: &Bait) -> Receipt {
    const A: &str = "C50-file-capabilities-binary";
    let Some(bin) = &bait.filecap_binary else {
        return Receipt::not_attempted(
            A,
            "no filecap_binary in the bait (a copy of this binary with file caps, run with --report-ids)",
        );
    };
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    let ours = sys::status_field("CapEff").unwrap_or_default();
    match run_binary(bin, &bait.filecap_args) {
        Err(e) => Receipt::blocked(A, format!("blocked: exec {}: {e}", bin.display())),
        // Escalation is a capability it has and we lack.
        Ok(out) => match (field(&out, "CapEff=").and_then(hex), hex(&ours)) {
            (Some(theirs), Some(mine)) if theirs & !mine != 0 => Receipt::succeeded(
                A,
                format!(
                    "succeeded: CapEff {theirs:016x} (ours {ours}): gained {:016x}",
                    theirs & !mine
                ),
            ),
            (Some(theirs), Some(mine)) if mine != 0 => Receipt::unjudged(
                A,
                format!("CapEff {theirs:016x}: we already hold {ours}, so no gain can show"),
            ),
            (Some(theirs), Some(_)) => Receipt::blocked(
                A,
                format!("blocked: CapEff {theirs:016x}, nothing beyond ours ({ours})"),
            ),
            _ => Receipt::unjudged(A, format!("ran; no CapEff to compare in its output: {out}")),
        },
    }
}

pub fn c52_proc_sys_writes(_: &Bait) -> Receipt {
    const A: &str = "C52-proc-sysrq-and-sys-writes";
    let mut obs = Vec::new();
    let mut opened = false;
    // Opened for writing, nothing written.
    for p in [
        "/proc/sysrq-trigger",
        "/proc/sys/kernel/hostname",
        "/proc/sys/vm/drop_caches",
    ] {
        match sys::open(Path::new(p), libc::O_WRONLY, 0) {
            Ok(_) => {
                opened = true;
                obs.push(format!("{p}: opened for write"));
            }
            Err(e) => obs.push(format!("{p}: {}", describe_errno(e))),
        }
    }
    let verdict = if opened { "succeeded" } else { "blocked" };
    Receipt::judged(A, !opened, format!("{verdict}: {}", obs.join("; ")))
}

pub fn c53_sys_access(_: &Bait) -> Receipt {
    const A: &str = "C53-sys-access";
    let mut obs = Vec::new();
    let mut listed = false;
    for p in ["/sys/fs/cgroup", "/sys/class/net", "/sys/block"] {
        match std::fs::read_dir(p) {
            Ok(d) => {
                listed = true;
                obs.push(format!("{p}: {} entries", d.count()));
            }
            Err(e) => obs.push(format!("{p}: {}", describe_io(&e))),
        }
    }
    let verdict = if listed { "succeeded" } else { "blocked" };
    Receipt::judged(A, !listed, format!("{verdict}: {}", obs.join("; ")))
}

pub fn c55_hostname_and_time(bait: &Bait) -> Receipt {
    const A: &str = "C55-change-hostname-and-time";
    let mut buf = [0u8; 256];
    // SAFETY: gethostname into a live buffer of the given length.
    unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let current =
        String::from_utf8_lossy(&buf[..buf.iter().position(|&b| b == 0).unwrap_or(0)]).into_owned();
    // Where we might share the host's UTS namespace, set the name it
    // already has: the same permission check, no change on a host.
    let private = bait.hostname.as_ref().is_some_and(|h| *h != current);
    let new = if private {
        "sharedos-pwned".to_owned()
    } else {
        current.clone()
    };
    // SAFETY: sethostname from a live byte slice.
    let h = unsafe { libc::sethostname(new.as_ptr().cast(), new.len()) };
    let host_obs = if h == 0 {
        format!("sethostname({new:?}) ok")
    } else {
        format!("sethostname: {}", describe_errno(sys::errno()))
    };
    // settimeofday(NULL, NULL) makes the kernel's CAP_SYS_TIME check and
    // changes nothing. Only where it is refused is clock_settime tried, set
    // to the time just read (a step of microseconds at most, and only
    // where a filter forgot clock_settime while the capability is there).
    // SAFETY: settimeofday with two null pointers.
    let s = unsafe {
        libc::syscall(
            libc::SYS_settimeofday,
            std::ptr::null::<u8>(),
            std::ptr::null::<u8>(),
        )
    };
    let (time_ok, time_obs) = if s == 0 {
        (
            true,
            "settimeofday permitted (nothing changed); clock_settime not tried".to_owned(),
        )
    } else {
        let s_err = describe_errno(sys::errno());
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime/clock_settime on a live timespec.
        let t = unsafe {
            libc::clock_gettime(libc::CLOCK_REALTIME, &mut now);
            libc::clock_settime(libc::CLOCK_REALTIME, &now)
        };
        if t == 0 {
            (true, format!("settimeofday: {s_err}; clock_settime ok"))
        } else {
            let t_err = describe_errno(sys::errno());
            (
                false,
                format!("settimeofday: {s_err}; clock_settime: {t_err}"),
            )
        }
    };
    let worked = h == 0 || time_ok;
    let verdict = if worked { "succeeded" } else { "blocked" };
    Receipt::judged(
        A,
        !worked,
        format!("{verdict}: hostname seen {current:?}; {host_obs}; {time_obs}"),
    )
}

pub fn c58_kernel_surface(_: &Bait) -> Receipt {
    const A: &str = "C58-kernel-attack-surface-syscalls";
    let mut obs = Vec::new();
    let mut reached = false;
    let mut note = |name: &str, r: i64| {
        match sys::owned(r) {
            Ok(fd) => {
                sys::keep(fd);
                reached = true;
                obs.push(format!("{name}: ok"));
            }
            Err(e) => obs.push(format!("{name}: {}", describe_errno(e))),
        };
    };
    // bpf(BPF_MAP_CREATE): a one-entry array map.
    let mut attr = [0u32; 32];
    attr[..4].copy_from_slice(&[2, 4, 4, 1]); // BPF_MAP_TYPE_ARRAY, key 4, value 4, 1 entry
    // SAFETY: bpf(cmd, attr, size) with a zeroed 128-byte attr we own.
    note("bpf(MAP_CREATE)", unsafe {
        libc::syscall(libc::SYS_bpf, 0, attr.as_mut_ptr(), 128u32)
    });
    // perf_event_open: a disabled software clock on ourselves.
    let mut pattr = [0u8; 128];
    pattr[0..4].copy_from_slice(&1u32.to_ne_bytes()); // PERF_TYPE_SOFTWARE
    pattr[4..8].copy_from_slice(&128u32.to_ne_bytes()); // size
    pattr[40..48].copy_from_slice(&(1u64 | 1 << 5 | 1 << 6).to_ne_bytes()); // disabled, exclude_kernel, exclude_hv
    // SAFETY: perf_event_open(attr, pid 0, cpu -1, group -1, FD_CLOEXEC).
    note("perf_event_open", unsafe {
        libc::syscall(libc::SYS_perf_event_open, pattr.as_mut_ptr(), 0, -1, -1, 8)
    });
    // SAFETY: userfaultfd(flags).
    note("userfaultfd", unsafe {
        libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK)
    });
    // keyctl returns a key id, not an fd: judge by sign only.
    // SAFETY: keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0).
    let k = unsafe { libc::syscall(libc::SYS_keyctl, 0, -3, 0) };
    if k >= 0 {
        reached = true;
        obs.push("keyctl(GET_KEYRING_ID): ok".into());
    } else {
        obs.push(format!("keyctl: {}", describe_errno(sys::errno())));
    }
    let verdict = if reached { "succeeded" } else { "blocked" };
    Receipt::judged(A, !reached, format!("{verdict}: {}", obs.join("; ")))
}

pub fn c59_x32_and_i386(_: &Bait) -> Receipt {
    const A: &str = "C59-x32-and-i386-abi";
    // x32 getpid: 39 | __X32_SYSCALL_BIT.
    // SAFETY: a syscall number without arguments.
    let x = unsafe { libc::syscall(39 | 0x4000_0000) };
    let x32 = if x >= 0 {
        format!("x32 getpid returned {x}")
    } else {
        format!("x32 getpid: {}", describe_errno(sys::errno()))
    };
    // i386 getpid through int 0x80, in a child: a seccomp arch check kills it.
    let child = sys::in_child(|w| {
        #[cfg(target_arch = "x86_64")]
        {
            let mut ret: i64 = 20; // __NR_getpid on i386
            // SAFETY: the i386 syscall gate with getpid, which takes no
            // arguments and touches no memory.
            unsafe { std::arch::asm!("int 0x80", inout("rax") ret, options(nostack)) };
            w.put(1);
            w.put(ret as i32);
        }
        0
    });
    let (i386_ok, i386) = match child {
        Err(e) => (false, format!("fork failed: {}", describe_io(&e))),
        Ok(r) => match (r.words.as_slice(), r.exit) {
            ([1, v], _) if *v >= 0 => (true, format!("int 0x80 getpid returned {v}")),
            ([1, v], _) => (false, format!("int 0x80 getpid: {}", describe_errno(-*v))),
            (_, exit) => (false, format!("int 0x80 child {exit}")),
        },
    };
    let worked = x >= 0 || i386_ok;
    let verdict = if worked { "succeeded" } else { "blocked" };
    Receipt::judged(A, !worked, format!("{verdict}: {x32}; {i386}"))
}
