//! Layer: the minimal root. Runs in pid 1 of the new namespaces, inside the
//! new user and mount namespaces. The plugin sees read-only system
//! directories, a handful of `/etc` files, its own binary, a private rw
//! workspace, private size-capped `/tmp` and `/dev/shm`, a minimal `/dev`
//! and its own `/proc`; nothing else of the host exists for it.
//!
//! Order matters (claude-code#64182: a later tmpfs hid earlier binds): the
//! workspace and the binary are bound from O_PATH fds opened before any
//! tmpfs is mounted, so a workspace under the host's `/tmp` is never hidden.

use std::ffi::CString;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Where the new root is assembled (in the private mount namespace, so the
/// host's `/tmp` is untouched).
const STAGING: &str = "/tmp";
/// System directories bound read-only (or mirrored as symlinks on
/// merged-usr systems).
pub const SYSTEM_DIRS: [&str; 7] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32",
];
/// `/etc` entries a dynamically linked program, a TLS client or a shell
/// commonly needs; nothing with secrets (no shadow, no ssh, no machine-id).
const ETC_ENTRIES: [&str; 14] = [
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/nsswitch.conf",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/mime.types",
    "/etc/protocols",
];
const DEV_NODES: [&str; 5] = ["null", "zero", "full", "random", "urandom"];
/// Where the workspace appears inside.
pub const WORKSPACE: &str = "/workspace";
/// Where the plugin binary appears inside.
pub const PLUGIN_DIR: &str = "/plugin";

pub struct RootSpec<'a> {
    pub workspace_fd: RawFd,
    pub program_fd: RawFd,
    pub program_name: &'a str,
    pub tmp_size: u64,
    pub shm_size: u64,
    pub nr_inodes: u64,
    pub extra_ro: &'a [String],
    /// Mount a procfs (only with a pid namespace: a procfs of the host's pid
    /// namespace would show every host process).
    pub with_proc: bool,
}

fn cstr(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| format!("{p:?} contains NUL"))
}

fn mount(
    src: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), String> {
    let src_c = src.map(cstr).transpose()?;
    let target_c = cstr(target)?;
    let fs_c = fstype.map(|s| CString::new(s).unwrap());
    let data_c = data.map(|s| CString::new(s).unwrap());
    // SAFETY: every pointer is either null or a NUL-terminated string that
    // lives until the call returns.
    let rc = unsafe {
        libc::mount(
            src_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            target_c.as_ptr(),
            fs_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            flags,
            data_c
                .as_ref()
                .map_or(std::ptr::null(), |c| c.as_ptr().cast()),
        )
    };
    if rc != 0 {
        return Err(format!(
            "mount({src:?} -> {target:?}, {fstype:?}): {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// `mount_setattr(2)`: add attributes to a mount (and, with `recursive`,
/// its submounts). Only adds restrictions, so the flags a user namespace
/// locks on the source (nosuid, nodev, noexec) are never cleared
/// (openai/codex#9254 hit EPERM remounting without them).
fn restrict(target: &Path, attrs: u64, recursive: bool) -> Result<(), String> {
    let t = cstr(target)?;
    let attr = libc::mount_attr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = if recursive { libc::AT_RECURSIVE } else { 0 };
    // SAFETY: `t` is NUL-terminated, `attr` is a valid mount_attr and its
    // size is passed; the kernel only reads both.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            t.as_ptr(),
            flags as libc::c_uint,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if rc != 0 {
        return Err(format!(
            "mount_setattr({target:?}): {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn bind(src: &Path, target: &Path, ro: bool) -> Result<(), String> {
    mount(Some(src), target, None, libc::MS_BIND | libc::MS_REC, None)?;
    let mut attrs = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
    if ro {
        attrs |= libc::MOUNT_ATTR_RDONLY;
    }
    restrict(target, attrs, true)
}

/// Create an empty file or directory matching `src` at `target`.
fn mountpoint_for(src: &Path, target: &Path) -> Result<(), String> {
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("mkdir {parent:?}: {e}"))?;
    }
    let md = std::fs::metadata(src).map_err(|e| format!("stat {src:?}: {e}"))?;
    if md.is_dir() {
        std::fs::create_dir_all(target).map_err(|e| format!("mkdir {target:?}: {e}"))
    } else {
        std::fs::write(target, b"").map_err(|e| format!("create {target:?}: {e}"))
    }
}

fn inside(root: &Path, p: &str) -> PathBuf {
    root.join(p.trim_start_matches('/'))
}

/// Build the root and `pivot_root` into it. Returns warnings.
pub fn build(spec: &RootSpec) -> Result<Vec<String>, String> {
    let mut warnings = Vec::new();
    // Nothing we mount may propagate back to the host.
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;
    let root = Path::new(STAGING);
    mount(
        Some(Path::new("tmpfs")),
        root,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("size=1m,nr_inodes=4096,mode=0755"),
    )?;

    for dir in SYSTEM_DIRS {
        let src = Path::new(dir);
        let Ok(md) = std::fs::symlink_metadata(src) else {
            continue;
        };
        let target = inside(root, dir);
        if md.file_type().is_symlink() {
            // Merged /usr: mirror the link, the target is bound anyway.
            let link = std::fs::read_link(src).map_err(|e| format!("readlink {dir}: {e}"))?;
            std::os::unix::fs::symlink(&link, &target)
                .map_err(|e| format!("symlink {target:?}: {e}"))?;
        } else if md.is_dir() {
            mountpoint_for(src, &target)?;
            bind(src, &target, true)?;
        }
    }
    for entry in ETC_ENTRIES
        .iter()
        .map(|s| s.to_string())
        .chain(spec.extra_ro.iter().cloned())
    {
        let src = Path::new(&entry);
        // Paths the sandbox mounts over (or stages its root in) cannot be
        // extra binds: the bind would be hidden or would hide sandbox state.
        if spec.extra_ro.contains(&entry)
            && ["/tmp", "/dev", "/proc", WORKSPACE, PLUGIN_DIR]
                .iter()
                .any(|p| src.starts_with(p))
        {
            warnings.push(format!(
                "extra read-only path {entry} is under a sandbox-managed directory; skipped"
            ));
            continue;
        }
        if !src.is_absolute() || !src.exists() {
            if spec.extra_ro.contains(&entry) {
                warnings.push(format!(
                    "extra read-only path {entry} does not exist; skipped"
                ));
            }
            continue;
        }
        let target = inside(root, &entry);
        if target.exists() {
            continue; // already visible through a system dir bind
        }
        mountpoint_for(src, &target)?;
        bind(src, &target, true)?;
    }

    // The plugin binary, read-only, from the fd opened before any tmpfs.
    let plugin_target = inside(root, PLUGIN_DIR).join(spec.program_name);
    let prog_src = PathBuf::from(format!("/proc/self/fd/{}", spec.program_fd));
    mountpoint_for(&prog_src, &plugin_target)?;
    mount(Some(&prog_src), &plugin_target, None, libc::MS_BIND, None)?;
    restrict(
        &plugin_target,
        libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV,
        false,
    )?;

    // The workspace: rw, but never setuid or device files.
    let ws_target = inside(root, WORKSPACE);
    let ws_src = PathBuf::from(format!("/proc/self/fd/{}", spec.workspace_fd));
    mountpoint_for(&ws_src, &ws_target)?;
    bind(&ws_src, &ws_target, false)?;

    // Private /tmp with size and inode caps (memory-backed: count it in the
    // memory budget).
    let tmp = inside(root, "/tmp");
    std::fs::create_dir_all(&tmp).map_err(|e| format!("mkdir {tmp:?}: {e}"))?;
    mount(
        Some(Path::new("tmpfs")),
        &tmp,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&format!(
            "size={},nr_inodes={},mode=1777",
            spec.tmp_size, spec.nr_inodes
        )),
    )?;

    // Minimal /dev: a tmpfs with five nodes bound from the host, the std*
    // links, and a private /dev/shm (POSIX semaphores need it, codex#7251).
    let dev = inside(root, "/dev");
    std::fs::create_dir_all(&dev).map_err(|e| format!("mkdir {dev:?}: {e}"))?;
    mount(
        Some(Path::new("tmpfs")),
        &dev,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("size=64k,nr_inodes=64,mode=0755"),
    )?;
    for node in DEV_NODES {
        let src = Path::new("/dev").join(node);
        let target = dev.join(node);
        std::fs::write(&target, b"").map_err(|e| format!("create {target:?}: {e}"))?;
        mount(Some(&src), &target, None, libc::MS_BIND, None)?;
        restrict(
            &target,
            libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NOEXEC,
            false,
        )?;
    }
    for (name, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(to, dev.join(name))
            .map_err(|e| format!("symlink /dev/{name}: {e}"))?;
    }
    let shm = dev.join("shm");
    std::fs::create_dir(&shm).map_err(|e| format!("mkdir {shm:?}: {e}"))?;
    mount(
        Some(Path::new("tmpfs")),
        &shm,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some(&format!(
            "size={},nr_inodes={},mode=1777",
            spec.shm_size, spec.nr_inodes
        )),
    )?;
    restrict(&dev, libc::MOUNT_ATTR_RDONLY, false)?;

    // Our own procfs: only the processes of the new pid namespace.
    let proc_dir = inside(root, "/proc");
    std::fs::create_dir_all(&proc_dir).map_err(|e| format!("mkdir {proc_dir:?}: {e}"))?;
    if !spec.with_proc {
        warnings.push("no pid namespace: /proc is left empty inside the sandbox".into());
    } else {
        mount(
            Some(Path::new("proc")),
            &proc_dir,
            Some("proc"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            None,
        )?;
    }

    // Switch roots and drop the old one entirely.
    std::env::set_current_dir(root).map_err(|e| format!("chdir {root:?}: {e}"))?;
    let dot = CString::new(".").unwrap();
    // SAFETY: both arguments are the NUL-terminated string ".".
    if unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) } != 0 {
        return Err(format!("pivot_root: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: "." is NUL-terminated; after pivot_root(".", ".") the old root
    // is stacked on "." and detaching it leaves only the new tree.
    if unsafe { libc::umount2(dot.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(format!(
            "umount old root: {}",
            std::io::Error::last_os_error()
        ));
    }
    std::env::set_current_dir("/").map_err(|e| format!("chdir /: {e}"))?;
    // The skeleton itself (mountpoints, /etc files) becomes read-only.
    restrict(Path::new("/"), libc::MOUNT_ATTR_RDONLY, false)?;
    Ok(warnings)
}
