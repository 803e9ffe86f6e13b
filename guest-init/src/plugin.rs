//! The plugin's process: prepared before the fork, started as the
//! sandbox uid with its rlimits, and reaped (this init adopts its
//! orphans).

use std::ffi::CString;

use super::{Launch, Res, SETUP_FAILED, cstr, os_err};

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
pub(crate) fn spawn_plugin(launch: &Launch, stdio: [libc::c_int; 3]) -> Res<libc::pid_t> {
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
pub(crate) fn reap_until(pid: libc::pid_t) -> libc::c_int {
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
pub(crate) fn reap_any() -> bool {
    let mut status = 0;
    // SAFETY: status is a valid out-pointer.
    unsafe { libc::waitpid(-1, &mut status, 0) > 0 }
}
