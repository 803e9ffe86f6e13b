//! A hostile probe plugin for the sandbox tests. Each argument is one
//! attempt (`read:/path`, `write:/path`, `socket:inet`, `connect:PORT`,
//! `status`, `env`, `fds`, `exec:/path`, `daemon:TOKEN`, ...). It prints one
//! JSON object mapping each attempt to its outcome (`ok...` or `err:ERRNO`)
//! on stdout. The tests check the effects on the host side as well.

use std::collections::BTreeMap;
use std::io::Write;

fn errno() -> String {
    format!(
        "err:{}",
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    )
}

fn io_res<T>(r: std::io::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("err:{}", e.raw_os_error().unwrap_or(0)),
    }
}

fn socket(family: &str) -> String {
    let (dom, ty) = match family {
        "inet" => (libc::AF_INET, libc::SOCK_STREAM),
        "inet6" => (libc::AF_INET6, libc::SOCK_STREAM),
        "udp" => (libc::AF_INET, libc::SOCK_DGRAM),
        // Creation only: a vsock socket is never connected (it would reach
        // the machine's control ports).
        "vsock" => (libc::AF_VSOCK, libc::SOCK_STREAM),
        "netlink" => (libc::AF_NETLINK, libc::SOCK_RAW),
        "packet" => (libc::AF_PACKET, libc::SOCK_RAW),
        "unix" => (libc::AF_UNIX, libc::SOCK_STREAM),
        _ => return "err:unknown-family".into(),
    };
    // SAFETY: socket() with integer arguments; the fd is closed right away.
    let fd = unsafe { libc::socket(dom, ty, 0) };
    if fd < 0 {
        return errno();
    }
    // SAFETY: closing the fd just created.
    unsafe { libc::close(fd) };
    "ok".into()
}

fn status() -> String {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .filter(|l| {
            [
                "Uid:",
                "CapEff:",
                "CapPrm:",
                "CapBnd:",
                "CapAmb:",
                "NoNewPrivs:",
                "Seccomp:",
            ]
            .iter()
            .any(|p| l.starts_with(p))
        })
        .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join(";")
}

fn fds() -> String {
    let mut v: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    // The directory listing's own fd is the highest one still open after
    // the listing closed it: keep only fds that are still valid.
    v.retain(|fd| {
        // SAFETY: F_GETFD only queries the flags of an fd number.
        unsafe { libc::fcntl(*fd, libc::F_GETFD) >= 0 }
    });
    v.iter()
        .map(|f| f.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn daemon(token: &str) -> ! {
    let _ = token; // only there so the host can find us by cmdline
    // SAFETY: the probe is single-threaded.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: plain syscalls in the single-threaded child.
        unsafe {
            libc::setsid();
            if libc::fork() == 0 {
                // The grandchild keeps stdout open and sleeps forever.
                libc::signal(libc::SIGTERM, libc::SIG_IGN);
                loop {
                    libc::pause();
                }
            }
            libc::_exit(0);
        }
    }
    println!("{{\"daemon\":\"started\"}}");
    let _ = std::io::stdout().flush();
    loop {
        // SAFETY: pause has no preconditions.
        unsafe { libc::pause() };
    }
}

/// Fork up to `n` children that wait; returns how many forks succeeded,
/// then kills and reaps them all.
fn fork_many(n: usize) -> String {
    let mut kids = Vec::new();
    let mut failed = String::new();
    for _ in 0..n {
        // SAFETY: the probe is single-threaded; the child only pauses.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            loop {
                // SAFETY: pause has no preconditions.
                unsafe { libc::pause() };
            }
        }
        if pid < 0 {
            failed = errno();
            break;
        }
        kids.push(pid);
    }
    for pid in &kids {
        // SAFETY: killing and reaping our own children.
        unsafe {
            libc::kill(*pid, libc::SIGKILL);
            libc::waitpid(*pid, std::ptr::null_mut(), 0);
        }
    }
    format!(
        "{}{}",
        kids.len(),
        if failed.is_empty() {
            String::new()
        } else {
            format!(" {failed}")
        }
    )
}

/// Write `mib` MiB to `path`; returns the MiB written and the error.
fn fill(path: &str, mib: usize) -> String {
    // EFBIG instead of death by SIGXFSZ past RLIMIT_FSIZE.
    // SAFETY: ignoring a signal.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let mut f = match std::fs::File::create(path) {
        Ok(f) => f,
        Err(e) => return format!("0 err:{}", e.raw_os_error().unwrap_or(0)),
    };
    let chunk = vec![0x5au8; 1 << 20];
    for i in 0..mib {
        if let Err(e) = f.write_all(&chunk) {
            let _ = std::fs::remove_file(path);
            return format!("{i} err:{}", e.raw_os_error().unwrap_or(0));
        }
    }
    let _ = std::fs::remove_file(path);
    format!("{mib} ok")
}

/// Call a kernel-attack-surface syscall with harmless dummy arguments.
fn sys(name: &str) -> String {
    let null = std::ptr::null::<u8>();
    // SAFETY: each call gets null/zero/invalid arguments, so even where the
    // filter lets it through the kernel only returns an error (or, for
    // userfaultfd, a fd that is leaked until exit).
    let rc = unsafe {
        match name {
            "bpf" => libc::syscall(libc::SYS_bpf, -1i32, null, 0u32),
            "perf_event_open" => libc::syscall(libc::SYS_perf_event_open, null, 0, -1, -1, 0),
            "userfaultfd" => libc::syscall(libc::SYS_userfaultfd, 0),
            "keyctl" => libc::syscall(libc::SYS_keyctl, 0, 0, 0),
            "io_uring_setup" => libc::syscall(libc::SYS_io_uring_setup, 0u32, null),
            "mount" => libc::syscall(libc::SYS_mount, null, null, null, 0, null),
            "setns" => libc::syscall(libc::SYS_setns, -1, 0),
            "clone3" => libc::syscall(libc::SYS_clone3, null, 0usize),
            "pidfd_getfd" => libc::syscall(libc::SYS_pidfd_getfd, -1, 0, 0),
            "sethostname" => libc::syscall(libc::SYS_sethostname, c"pwned".as_ptr(), 5usize),
            // getpid through the x32 ABI: only the guard denies it with EPERM
            // (a kernel without x32 says ENOSYS).
            #[cfg(target_arch = "x86_64")]
            "x32" => libc::syscall(libc::SYS_getpid | 0x4000_0000),
            // TIOCSTI with junk in the upper 32 bits (CVE-2019-10063).
            "tiocsti" => libc::syscall(
                libc::SYS_ioctl,
                0,
                libc::TIOCSTI | (1u64 << 32),
                c"x".as_ptr(),
            ),
            // Newer refusals of the allowlist (numbers of the unified table).
            "open_tree_attr" => libc::syscall(467, -1, null, 0, null, 0usize),
            "listmount" => libc::syscall(458, null, null, 0usize, 0),
            "statmount" => libc::syscall(457, null, null, 0usize, 0),
            "quotactl_fd" => libc::syscall(443, -1, 0, 0, null),
            "memfd_secret" => libc::syscall(447, 0),
            "setxattrat" => libc::syscall(463, -1, null, 0, null, null, 0),
            "lsm_list_modules" => libc::syscall(461, null, null, 0),
            #[cfg(target_arch = "x86_64")]
            "modify_ldt" => libc::syscall(libc::SYS_modify_ldt, 0, null, 0usize),
            "personality_rie" => libc::syscall(libc::SYS_personality, 0x0040_0000),
            "personality_query" => libc::syscall(libc::SYS_personality, 0xffff_ffffu32),
            "memfd_create" => libc::syscall(libc::SYS_memfd_create, c"m".as_ptr(), 1),
            // Lower pid 1's open-file limit to 17 (the sandbox's pid 1 only:
            // only the sandbox tests run this op).
            "prlimit_pid1" => {
                let lim = libc::rlimit64 {
                    rlim_cur: 17,
                    rlim_max: 17,
                };
                libc::syscall(libc::SYS_prlimit64, 1, libc::RLIMIT_NOFILE, &lim, null)
            }
            "unknown470" => libc::syscall(470),
            "fanotify_init" => libc::syscall(libc::SYS_fanotify_init, 0, 0),
            _ => return "err:unknown-syscall".into(),
        }
    };
    if rc < 0 { errno() } else { "ok".into() }
}

fn main() {
    let mut out = BTreeMap::new();
    for op in std::env::args().skip(1) {
        let (kind, arg) = op.split_once(':').unwrap_or((op.as_str(), ""));
        let res = fs_and_net_op(kind, arg)
            .or_else(|| process_info_op(kind))
            .or_else(|| syscall_op(kind, arg))
            .unwrap_or_else(|| "err:unknown-op".into());
        out.insert(op.clone(), res);
    }
    let mut line = String::from("{");
    for (i, (k, v)) in out.iter().enumerate() {
        if i > 0 {
            line.push(',');
        }
        line.push_str(&format!("{:?}:{:?}", k, v));
    }
    line.push('}');
    println!("{line}");
}

/// Files, sockets and exec. `None` when `kind` is not one of them.
fn fs_and_net_op(kind: &str, arg: &str) -> Option<String> {
    Some(match kind {
        "read" => io_res(std::fs::read(arg)),
        "write" => io_res(std::fs::write(arg, b"pwned")),
        "mkdir" => io_res(std::fs::create_dir(arg)),
        "socket" => socket(arg),
        "connect" => io_res(std::net::TcpStream::connect((
            "127.0.0.1",
            arg.parse().unwrap_or(1),
        ))),
        "exec" => match std::process::Command::new(arg).output() {
            Ok(o) => format!("ok:{}", String::from_utf8_lossy(&o.stdout).trim()),
            Err(e) => format!("err:{}", e.raw_os_error().unwrap_or(0)),
        },
        "uconnect" => io_res(std::os::unix::net::UnixStream::connect(arg)),
        "aconnect" => {
            use std::os::linux::net::SocketAddrExt;
            match std::os::unix::net::SocketAddr::from_abstract_name(arg.as_bytes()) {
                Ok(addr) => io_res(std::os::unix::net::UnixStream::connect_addr(&addr)),
                Err(e) => format!("err:{}", e.raw_os_error().unwrap_or(0)),
            }
        }
        _ => return None,
    })
}

/// What the process sees of itself. `None` when `kind` is not one of them.
fn process_info_op(kind: &str) -> Option<String> {
    Some(match kind {
        "status" => status(),
        "fds" => fds(),
        "env" => {
            let mut keys: Vec<String> = std::env::vars().map(|(k, _)| k).collect();
            keys.sort();
            keys.join(",")
        }
        "uid" => {
            // SAFETY: getuid has no preconditions.
            unsafe { libc::getuid() }.to_string()
        }
        "hostname" => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap_or_default()
            .trim()
            .to_string(),
        "cwd" => std::env::current_dir()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        "procs" => std::fs::read_dir("/proc")
            .map(|d| {
                d.filter(|e| {
                    e.as_ref()
                        .ok()
                        .and_then(|e| e.file_name().to_str()?.parse::<u32>().ok())
                        .is_some()
                })
                .count()
                .to_string()
            })
            .unwrap_or_else(|e| format!("err:{}", e.raw_os_error().unwrap_or(0))),
        _ => return None,
    })
}

/// System calls a sandbox must refuse or bound. `None` when `kind` is not one of them.
fn syscall_op(kind: &str, arg: &str) -> Option<String> {
    Some(match kind {
        "unshare" => {
            // SAFETY: unshare with a flag word.
            if unsafe { libc::unshare(libc::CLONE_NEWUSER) } == 0 {
                "ok".into()
            } else {
                errno()
            }
        }
        "ptrace" => {
            // SAFETY: PTRACE_TRACEME with null pointers.
            if unsafe { libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) } == 0 {
                "ok".into()
            } else {
                errno()
            }
        }
        "daemon" => daemon(arg),
        "sys" => sys(arg),
        "mmap" => {
            let len = arg.parse::<usize>().unwrap_or(1) << 20;
            // SAFETY: an anonymous private mapping, unmapped right away;
            // it is never touched, so it costs no memory.
            unsafe {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                if p == libc::MAP_FAILED {
                    errno()
                } else {
                    libc::munmap(p, len);
                    "ok".into()
                }
            }
        }
        "fdmax" => {
            let mut files = Vec::new();
            let err = loop {
                match std::fs::File::open("/dev/null") {
                    Ok(f) => files.push(f),
                    Err(e) => break e.raw_os_error().unwrap_or(0),
                }
                if files.len() > 100_000 {
                    break 0;
                }
            };
            format!("{} err:{err}", files.len())
        }
        "shmget" => {
            // SAFETY: shmget with an integer key and no creation flag.
            let id = unsafe { libc::shmget(arg.parse().unwrap_or(0), 0, 0) };
            if id < 0 { errno() } else { "ok".into() }
        }
        "kill" => {
            // SAFETY: kill with a pid; the test passes a victim it owns.
            if unsafe { libc::kill(arg.parse().unwrap_or(-2), libc::SIGKILL) } == 0 {
                "ok".into()
            } else {
                errno()
            }
        }
        "fork" => fork_many(arg.parse().unwrap_or(1)),
        "fill" => {
            let (path, mib) = arg.rsplit_once(':').unwrap_or((arg, "1"));
            fill(path, mib.parse().unwrap_or(1))
        }
        "exit" => std::process::exit(arg.parse().unwrap_or(0)),
        _ => return None,
    })
}
