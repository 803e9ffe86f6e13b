//! The init (pid 1) of the guest that tests/tests/memory_controller_guest.rs
//! boots under QEMU: a kernel of its own, where cgroup v2 and its memory
//! controller are the test's to mount and delegate (on the development
//! machines no process may be moved between the machine's memory cgroups,
//! and none is delegated).
//!
//! It mounts `/dev`, `/proc`, `/sys`, cgroup2 on `/sys/fs/cgroup` and
//! tmpfs on `/run` (the test's files are under `/tmp`, in the image); makes the root a mount of its own (a bind of
//! the initramfs moved onto `/`: the sandbox's `pivot_root` refuses the
//! initramfs itself); enables `+memory +pids` in the root cgroup's
//! `cgroup.subtree_control`. Then, for each step of `/cgroup-guest/job.json`
//! (written by the test), it creates the step's delegated parent cgroup
//! (`+memory +pids` in its `cgroup.subtree_control`, no process in it),
//! runs the step's command (the real `sharedos` binary, whose sandboxes name
//! that parent in `cgroup.parent`) and writes one line to the first serial
//! port (QEMU's stdout): `cgroup-guest-step <JSON>`, with the command's exit
//! code, stdout and stderr and the parent's `memory.peak` and
//! `memory.events` as the guest kernel keeps them. The last line is
//! `cgroup-guest-done`; then the guest reboots, which QEMU (`-no-reboot`)
//! turns into its exit.
//!
//! A test-only program, in the tests crate: the product's guest init
//! (guest-init/) runs one plugin as the sandbox uid with the protocol on the
//! serial line; this one runs the host itself as root, and ships nowhere.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

const JOB: &str = "/cgroup-guest/job.json";
const CGROUP: &str = "/sys/fs/cgroup";
const STEP: &str = "cgroup-guest-step ";
const DONE: &str = "cgroup-guest-done";

fn main() {
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/ttyS0")
        .or_else(|_| {
            mount("devtmpfs", "/dev", "devtmpfs", 0, "mode=0755").map_err(std::io::Error::other)?;
            std::fs::OpenOptions::new().write(true).open("/dev/ttyS0")
        });
    let result = run(&mut out);
    if let Ok(out) = &mut out {
        let line = match result {
            Ok(()) => format!("{DONE} {}\n", json!({"ok": true})),
            Err(e) => format!("{DONE} {}\n", json!({"ok": false, "error": e})),
        };
        let _ = out.write_all(line.as_bytes());
        let _ = out.flush();
    }
    // SAFETY: sync and reboot take no pointers; pid 1 ends the guest here.
    unsafe {
        libc::sync();
        libc::reboot(libc::RB_AUTOBOOT);
    }
}

fn run(out: &mut std::io::Result<std::fs::File>) -> Result<(), String> {
    let out = out.as_mut().map_err(|e| format!("/dev/ttyS0: {e}"))?;
    own_root()?;
    mount("proc", "/proc", "proc", 0, "")?;
    mount("sysfs", "/sys", "sysfs", 0, "")?;
    mount("cgroup2", CGROUP, "cgroup2", 0, "")?;
    mount("tmpfs", "/run", "tmpfs", 0, "mode=0755")?;
    write(&format!("{CGROUP}/cgroup.subtree_control"), "+memory +pids")?;
    let job: Value = std::fs::read_to_string(JOB)
        .map_err(|e| format!("{JOB}: {e}"))
        .and_then(|t| serde_json::from_str(&t).map_err(|e| format!("{JOB}: {e}")))?;
    let steps = job["steps"].as_array().cloned().unwrap_or_default();
    for step in &steps {
        let line = format!("{STEP}{}\n", run_step(step));
        out.write_all(line.as_bytes())
            .and_then(|()| out.flush())
            .map_err(|e| format!("/dev/ttyS0: {e}"))?;
    }
    Ok(())
}

/// One step: its parent cgroup made and delegated, its command run, and
/// what the guest kernel says of the parent afterwards.
fn run_step(step: &Value) -> Value {
    let name = step["name"].as_str().unwrap_or("step");
    let parent = format!("{CGROUP}/{}", step["cgroup"].as_str().unwrap_or(name));
    let setup = std::fs::create_dir_all(&parent)
        .map_err(|e| format!("mkdir {parent}: {e}"))
        .and_then(|()| write(&format!("{parent}/cgroup.subtree_control"), "+memory +pids"));
    if let Err(e) = setup {
        return json!({"name": name, "error": e});
    }
    let argv: Vec<&str> = step["argv"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some((program, args)) = argv.split_first() else {
        return json!({"name": name, "error": "the step has no argv"});
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .stdin(Stdio::null())
        .current_dir(step["cwd"].as_str().unwrap_or("/"));
    for (k, v) in step["env"].as_object().into_iter().flatten() {
        cmd.env(k, v.as_str().unwrap_or_default());
    }
    let (code, stdout, stderr) = match cmd.output() {
        Ok(o) => (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        ),
        Err(e) => (None, String::new(), format!("cannot run {program}: {e}")),
    };
    let read = |f: &str| std::fs::read_to_string(format!("{parent}/{f}")).ok();
    let children: Vec<String> = std::fs::read_dir(&parent)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    json!({
        "name": name,
        "parent": parent,
        "code": code,
        "stdout": stdout,
        "stderr": stderr,
        "memory.peak": read("memory.peak").map(|s| s.trim().to_string()),
        "memory.events": read("memory.events"),
        "memory.current": read("memory.current").map(|s| s.trim().to_string()),
        "cgroup.subtree_control": read("cgroup.subtree_control").map(|s| s.trim().to_string()),
        "children_left": children,
    })
}

/// The root as a mount of its own: the initramfs bound on `/newroot`,
/// moved onto `/`, and entered. `pivot_root` (the sandbox's minimal root)
/// refuses a root that is the initramfs itself, and accepts a bind of it.
fn own_root() -> Result<(), String> {
    mount("/", "/newroot", "", libc::MS_BIND | libc::MS_REC, "")?;
    std::env::set_current_dir("/newroot").map_err(|e| format!("chdir /newroot: {e}"))?;
    mount(".", "/", "", libc::MS_MOVE, "")?;
    let dot = cstr(".")?;
    // SAFETY: a NUL-terminated path that outlives the call.
    if unsafe { libc::chroot(dot.as_ptr()) } != 0 {
        return Err(format!("chroot: {}", std::io::Error::last_os_error()));
    }
    std::env::set_current_dir("/").map_err(|e| format!("chdir /: {e}"))
}

fn write(path: &str, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("write {text:?} to {path}: {e}"))
}

fn cstr(s: &str) -> Result<std::ffi::CString, String> {
    std::ffi::CString::new(s).map_err(|_| format!("{s:?} holds a NUL byte"))
}

fn mount(
    source: &str,
    target: &str,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> Result<(), String> {
    let _ = std::fs::create_dir_all(target);
    let (s, t, f, d) = (cstr(source)?, cstr(target)?, cstr(fstype)?, cstr(data)?);
    let null = |x: &std::ffi::CString, empty: bool| {
        if empty { std::ptr::null() } else { x.as_ptr() }
    };
    // SAFETY: every pointer is null or a NUL-terminated string that
    // outlives the call.
    let rc = unsafe {
        libc::mount(
            s.as_ptr(),
            t.as_ptr(),
            null(&f, fstype.is_empty()),
            flags,
            null(&d, data.is_empty()).cast(),
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("mount {fstype} {source} on {target}: {e}"));
    }
    Ok(())
}
