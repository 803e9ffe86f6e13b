//! What the plugin was handed without asking: fds, environment,
//! credentials, capabilities (sandbox.md C27–C29, C60).

use std::path::PathBuf;

use crate::bait::Bait;
use crate::receipt::{Receipt, describe_errno, describe_io};
use crate::sys;

/// Suffixes and names of env vars that carry credentials (sandbox.md B.6).
const SECRET_HINTS: &[&str] = &[
    "_TOKEN",
    "_KEY",
    "SECRET",
    "PASSWORD",
    "AWS_",
    "SSH_AUTH_SOCK",
    "DBUS_SESSION_BUS_ADDRESS",
    "WSL_INTEROP",
    "DOCKER_HOST",
];

/// This process's fds above 2, as `n->target`.
fn fds_above_stdio() -> Vec<String> {
    match std::fs::read_dir("/proc/self/fd") {
        Ok(d) => d
            .flatten()
            .filter_map(|e| {
                let n: i32 = e.file_name().to_str()?.parse().ok()?;
                let target = std::fs::read_link(e.path())
                    .map(|t| t.display().to_string())
                    .unwrap_or_default();
                Some((n, target))
            })
            .filter(|(n, _)| *n > 2)
            .map(|(n, t)| format!("{n}->{t}"))
            .collect(),
        Err(e) => vec![format!("/proc/self/fd: {}", describe_io(&e))],
    }
}

pub fn c27_inherited_fds(bait: &Bait) -> Receipt {
    const A: &str = "C27-inherited-fds";
    let listed = fds_above_stdio();
    let Some(fd) = bait.inherited_fd else {
        return Receipt::unjudged(
            A,
            format!(
                "no inherited_fd in the bait; fds above 2: [{}]",
                listed.join(", ")
            ),
        );
    };
    // SAFETY: F_GETFD only queries the descriptor table.
    let open = unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0;
    if !open {
        return Receipt::blocked(
            A,
            format!(
                "blocked: fd {fd} is not open ({}); fds above 2: [{}]",
                describe_errno(sys::errno()),
                listed.join(", ")
            ),
        );
    }
    let target = std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .map(|t| t.display().to_string())
        .unwrap_or_else(|_| "?".into());
    let fds = listed.join(", ");
    // The host said what its fd pointed to: that decides.
    if let Some(expected) = &bait.inherited_fd_target {
        return if target == *expected {
            Receipt::succeeded(
                A,
                format!("succeeded: fd {fd} -> {target} is the host's; fds above 2: [{fds}]"),
            )
        } else {
            Receipt::blocked(
                A,
                format!(
                    "blocked: fd {fd} -> {target}, not the host's {expected}; fds above 2: [{fds}]"
                ),
            )
        };
    }
    // Our own runtime's fds (epoll, eventfd, a dup of our stdio) may reuse
    // the number.
    let stdio: Vec<String> = (0..=2)
        .filter_map(|n| std::fs::read_link(format!("/proc/self/fd/{n}")).ok())
        .map(|t| t.display().to_string())
        .collect();
    if target.starts_with("anon_inode:") || stdio.contains(&target) {
        return Receipt::unjudged(
            A,
            format!(
                "fd {fd} is open but is {target}, likely this process's own; fds above 2: [{fds}]"
            ),
        );
    }
    let mut buf = [0u8; 64];
    // SAFETY: reading into a live stack buffer of the given length.
    let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    let read = if n >= 0 {
        format!("pread {n} bytes")
    } else {
        format!("pread {}", describe_errno(sys::errno()))
    };
    Receipt::succeeded(
        A,
        format!("succeeded: fd {fd} -> {target} is open, {read}; fds above 2: [{fds}]"),
    )
}

pub fn c28_env_credentials(bait: &Bait) -> Receipt {
    const A: &str = "C28-env-credential-leak";
    let keys: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .collect();
    let bait_hits: Vec<&String> = bait
        .secret_env_names
        .iter()
        .filter(|n| keys.contains(n))
        .collect();
    let hinted: Vec<&String> = keys
        .iter()
        .filter(|k| SECRET_HINTS.iter().any(|h| k.contains(h)))
        .collect();
    let leaked = !bait_hits.is_empty();
    let obs = format!(
        "{} env vars; bait names visible {:?}; credential-like names {:?}",
        keys.len(),
        bait_hits,
        hinted
    );
    if bait.secret_env_names.is_empty() {
        return Receipt::judged(
            A,
            hinted.is_empty(),
            format!(
                "{}: {obs}",
                if hinted.is_empty() {
                    "blocked"
                } else {
                    "succeeded"
                }
            ),
        );
    }
    Receipt::judged(
        A,
        !leaked,
        format!("{}: {obs}", if leaked { "succeeded" } else { "blocked" }),
    )
}

pub fn c29_vendor_credentials(bait: &Bait) -> Receipt {
    const A: &str = "C29-vendor-cli-credentials";
    let mut paths: Vec<PathBuf> = Vec::new();
    if let Some(p) = &bait.vendor_credential_path {
        paths.push(p.clone());
    } else {
        for home in bait.homes() {
            paths.push(home.join(".codex/auth.json"));
            paths.push(home.join(".claude/.credentials.json"));
        }
    }
    if let Some(home) = std::env::var_os("HOME") {
        let home = PathBuf::from(home);
        for rel in [".codex/auth.json", ".claude/.credentials.json"] {
            let p = home.join(rel);
            if !paths.contains(&p) {
                paths.push(p);
            }
        }
    }
    let mut obs = Vec::new();
    let mut leaked = false;
    for p in &paths {
        match sys::read_prefix(p, 64 * 1024) {
            Ok(b) => {
                leaked = true;
                obs.push(format!("read {} ({} bytes)", p.display(), b.len()));
            }
            Err(e) => obs.push(format!("{}: {}", p.display(), describe_io(&e))),
        }
    }
    let verdict = if leaked { "succeeded" } else { "blocked" };
    Receipt::judged(A, !leaked, format!("{verdict}: {}", obs.join("; ")))
}

/// The bounding set (`PR_CAPBSET_READ`) or the ambient set
/// (`PR_CAP_AMBIENT_IS_SET`) as a mask, probing caps 0..64 until the kernel
/// says EINVAL (past the last capability it knows).
fn cap_set_by_prctl(ambient: bool) -> u64 {
    let mut mask = 0u64;
    for cap in 0..64u64 {
        // SAFETY: prctl with integer arguments only.
        let r = unsafe {
            if ambient {
                libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_IS_SET as libc::c_ulong,
                    cap,
                    0 as libc::c_ulong,
                    0 as libc::c_ulong,
                )
            } else {
                libc::prctl(libc::PR_CAPBSET_READ, cap, 0, 0, 0)
            }
        };
        if r < 0 {
            break;
        }
        if r == 1 {
            mask |= 1 << cap;
        }
    }
    mask
}

pub fn c60_capabilities_left(_: &Bait) -> Receipt {
    const A: &str = "C60-capabilities-left";
    // capget(2) works without /proc.
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Default, Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut hdr = Header {
        version: 0x2008_0522,
        pid: 0,
    }; // _LINUX_CAPABILITY_VERSION_3
    let mut data = [Data::default(); 2];
    // SAFETY: capget with a v3 header and the two data structs it fills.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut hdr as *mut Header, data.as_mut_ptr()) };
    let eff = (u64::from(data[1].effective) << 32) | u64::from(data[0].effective);
    let prm = (u64::from(data[1].permitted) << 32) | u64::from(data[0].permitted);
    let field = |n: &str| sys::status_field(n).unwrap_or_else(|| "?".into());
    // The bounding and ambient sets through prctl(2), which needs no /proc
    // (a sandbox without a pid namespace may leave /proc empty).
    let (bnd, amb) = (cap_set_by_prctl(false), cap_set_by_prctl(true));
    let (bnd, amb) = (format!("{bnd:016x}"), format!("{amb:016x}"));
    let (nnp, seccomp) = (field("NoNewPrivs"), field("Seccomp"));
    let zero = |s: &str| s.trim_start_matches('0').is_empty();
    let obs = if r == 0 {
        format!(
            "CapEff {eff:016x} CapPrm {prm:016x} CapBnd {bnd} CapAmb {amb} NoNewPrivs {nnp} Seccomp {seccomp}"
        )
    } else {
        format!(
            "capget: {}; CapBnd {bnd} CapAmb {amb}",
            describe_errno(sys::errno())
        )
    };
    let none_left = r == 0 && eff == 0 && prm == 0 && zero(&bnd) && zero(&amb);
    Receipt::judged(
        A,
        none_left,
        format!("{}: {obs}", if none_left { "blocked" } else { "succeeded" }),
    )
}

/// Top-level `/proc` files never read by the walk: they block, are huge,
/// or act on being opened.
const PROC_SKIP: &[&str] = &[
    "kmsg",
    "kcore",
    "kpagecount",
    "kpageflags",
    "kpagecgroup",
    "sysrq-trigger",
    "pagemap",
    "mem",
    "clear_refs",
];

/// Up to 64 KiB of `path`, opened non-blocking; `None` if unreadable.
fn peek(path: &std::path::Path) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let mut buf = vec![0u8; 64 << 10];
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    buf.truncate(n);
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// Everything of `/proc` a plugin can read, as (source, text): the
/// top-level files, every process's cmdline, environ, comm, mount tables
/// and exe/cwd/root links, and `/proc/sys` (at most 4000 files).
fn proc_view() -> Vec<(String, String)> {
    let mut seen = Vec::new();
    let mut dirs = vec![PathBuf::from("/proc/sys")];
    if let Ok(top) = std::fs::read_dir("/proc") {
        for e in top.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let p = e.path();
            if name.chars().all(|c| c.is_ascii_digit()) || name == "self" || name == "thread-self" {
                for f in [
                    "cmdline",
                    "environ",
                    "comm",
                    "mountinfo",
                    "mounts",
                    "mountstats",
                    "status",
                ] {
                    if let Some(t) = peek(&p.join(f)) {
                        seen.push((format!("{}/{f}", p.display()), t));
                    }
                }
                for l in ["exe", "cwd", "root"] {
                    if let Ok(t) = std::fs::read_link(p.join(l)) {
                        seen.push((format!("{}/{l}", p.display()), t.display().to_string()));
                    }
                }
            } else if e.file_type().is_ok_and(|t| t.is_dir()) {
                if name != "sys" {
                    dirs.push(p);
                }
            } else if !PROC_SKIP.contains(&name.as_str())
                && let Some(t) = peek(&p)
            {
                seen.push((p.display().to_string(), t));
            }
        }
    }
    let mut budget = 4000;
    while let Some(d) = dirs.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if budget == 0 {
                return seen;
            }
            budget -= 1;
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => dirs.push(p),
                Ok(t) if t.is_file() => {
                    if let Some(t) = peek(&p) {
                        seen.push((p.display().to_string(), t));
                    }
                }
                _ => {}
            }
        }
    }
    seen
}

/// Issue 14, finding 5: host facts the plugin can read. Reads its whole
/// `/proc` view and its environment, and looks for each host fact the host
/// put in the bait (host paths, boot id, kernel command line). The mount
/// table, every command line and the environment go into the receipt
/// verbatim, so the host checks them itself.
pub fn c53b_host_facts(bait: &Bait) -> Receipt {
    const A: &str = "C53b-host-facts-in-proc";
    let mut seen = proc_view();
    seen.extend(std::env::vars().map(|(k, v)| (format!("env {k}"), v)));
    let facts: Vec<&String> = bait.host_facts.iter().filter(|f| f.len() >= 4).collect();
    let hits: Vec<String> = seen
        .iter()
        .flat_map(|(src, text)| {
            facts
                .iter()
                .filter(|f| text.contains(f.as_str()))
                .map(move |f| format!("{f:?} in {src}"))
        })
        .collect();
    let verbatim: Vec<String> = seen
        .iter()
        .filter(|(src, _)| {
            src.starts_with("env ")
                || [
                    "mountinfo",
                    "cmdline",
                    "/exe",
                    "/comm",
                    "boot_id",
                    "/proc/version",
                    "/proc/uptime",
                    "kernel/hostname",
                    "kernel/osrelease",
                    "kernel/version",
                ]
                .iter()
                .any(|s| src.ends_with(s))
        })
        .map(|(src, t)| format!("[{src}] {}", t.replace('\0', " ")))
        .collect();
    let observed = format!(
        "read {} sources; host facts found: [{}]; verbatim: {}",
        seen.len(),
        hits.join(", "),
        verbatim.join(" ")
    );
    if facts.is_empty() {
        Receipt::unjudged(A, observed)
    } else {
        Receipt::judged(A, hits.is_empty(), observed)
    }
}
