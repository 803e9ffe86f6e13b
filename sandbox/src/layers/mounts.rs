//! Layer: the minimal root. Runs in pid 1 of the new namespaces, inside the
//! new user and mount namespaces. The plugin sees the read-only paths of the
//! policy (parts of `/usr`, a handful of `/etc` files, what its runtime
//! adds), its own binary, a workspace that is a size- and inode-capped tmpfs
//! of its own, private size-capped `/tmp` and `/dev/shm`, a minimal `/dev`
//! and its own `/proc` with the host-wide files masked ([`crate::procmask`]);
//! nothing else of the host exists for it, and nothing it writes exists on
//! the host.
//!
//! Order matters (claude-code#64182: a later tmpfs hid earlier binds): the
//! binary (and a host workspace, where one is given) come from fds opened
//! before any tmpfs is mounted.

use super::layer::{Layer, Need, Slot, Stage, USERNS_FIX};
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

pub use super::fsview::{PLUGIN_DIR, WORKSPACE};
use super::vfs::{cstr, mount, restrict};

/// Where the new root is assembled (in the private mount namespace, so the
/// host's `/tmp` is untouched).
const STAGING: &str = "/tmp";
const DEV_NODES: [&str; 5] = ["null", "zero", "full", "random", "urandom"];

/// Where a host file or directory that goes into the root comes from.
#[derive(Clone, Copy, Debug)]
pub enum Source {
    /// A detached clone of it (`open_tree(OPEN_TREE_CLONE)`, taken by the
    /// supervisor before it left uid 0, so a path only root can traverse
    /// works), attached with `move_mount`.
    Tree(RawFd),
    /// An `O_PATH` fd opened inside the new mount namespace, bound through
    /// `/proc/self/fd`.
    Path(RawFd),
}

pub struct RootSpec<'a> {
    /// A host directory for the workspace; `None` (the default) makes the
    /// workspace a tmpfs of the sandbox's own.
    pub workspace: Option<Source>,
    pub workspace_size: u64,
    /// The staged plugin binary, bound at `/plugin/<program_name>`; `None`
    /// when the program is executed from its own path inside a read-only
    /// path ([`crate::fsview::program_in_place`]).
    pub program: Option<Source>,
    pub program_name: &'a str,
    pub tmp_size: u64,
    pub shm_size: u64,
    pub home_size: u64,
    pub nr_inodes: u64,
    pub ro_paths: &'a [String],
    pub extra_ro: &'a [String],
    /// Detached clones of the `extra_ro` entries (path, is a directory,
    /// fd), taken by a root helper before the uid drop; empty otherwise,
    /// and then the entries are bound by path.
    pub extras: Vec<(PathBuf, bool, RawFd)>,
    /// What the masked `/proc` shows instead of host-wide figures.
    pub proc_replacements: crate::procmask::Replacements,
    /// Mount a procfs (only with a pid namespace: a procfs of the host's pid
    /// namespace would show every host process).
    pub with_proc: bool,
    /// Record every mount in [`Built::view`] (`policy.describe`).
    pub describe: bool,
}

/// What [`build`] made.
pub struct Built {
    pub warnings: Vec<String>,
    /// Every mount of the root, in the order made (only with `describe`).
    pub view: Vec<crate::fsview::ViewMount>,
}

/// The record of the root being built, kept only when asked for.
struct View {
    on: bool,
    mounts: Vec<crate::fsview::ViewMount>,
}

impl View {
    fn add(&mut self, path: &str, access: &str, source: impl FnOnce() -> String) {
        if self.on {
            self.mounts.push(crate::fsview::ViewMount {
                path: path.to_string(),
                access: access.to_string(),
                source: source(),
            });
        }
    }
}

fn mib(b: u64) -> String {
    format!("{} MiB", b >> 20)
}

/// Attach `src` at `target` (an existing file or directory).
fn attach(src: Source, target: &Path) -> Result<(), String> {
    match src {
        Source::Path(fd) => bind_rec(&PathBuf::from(format!("/proc/self/fd/{fd}")), target),
        Source::Tree(fd) => {
            let t = cstr(target)?;
            // SAFETY: `fd` is a detached mount we own, "" and `t` are
            // NUL-terminated; the kernel only reads them.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_move_mount,
                    fd,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    t.as_ptr(),
                    libc::MOVE_MOUNT_F_EMPTY_PATH,
                )
            };
            if rc != 0 {
                return Err(format!(
                    "move_mount(-> {target:?}): {}",
                    std::io::Error::last_os_error()
                ));
            }
            Ok(())
        }
    }
}

/// A recursive bind, without attributes yet: the read-only part of the
/// root gets them in one recursive `mount_setattr` once it is complete.
fn bind_rec(src: &Path, target: &Path) -> Result<(), String> {
    mount(Some(src), target, None, libc::MS_BIND | libc::MS_REC, None)
}

/// The directories already created in the staging root (one `mkdir` each,
/// instead of a `create_dir_all` walk per entry).
#[derive(Default)]
struct Dirs(std::collections::HashSet<PathBuf>);

impl Dirs {
    fn ensure(&mut self, dir: &Path) -> Result<(), String> {
        if self.0.contains(dir) {
            return Ok(());
        }
        std::fs::create_dir_all(dir).map_err(|e| format!("mkdir {dir:?}: {e}"))?;
        let mut d = Some(dir);
        while let Some(p) = d {
            self.0.insert(p.to_path_buf());
            d = p.parent();
        }
        Ok(())
    }

    /// Create an empty file or directory (`is_dir`) at `target`.
    fn mountpoint(&mut self, target: &Path, is_dir: bool) -> Result<(), String> {
        if let Some(parent) = target.parent() {
            self.ensure(parent)?;
        }
        if is_dir {
            self.ensure(target)
        } else {
            std::fs::write(target, b"").map_err(|e| format!("create {target:?}: {e}"))
        }
    }
}

fn inside(root: &Path, p: &str) -> PathBuf {
    root.join(p.trim_start_matches('/'))
}

/// Build the root and `pivot_root` into it.
///
/// Two phases: first the read-only part (the policy's paths, the plugin
/// binary, and the mountpoints of the rest), sealed with one recursive
/// `mount_setattr` (read-only, nosuid, nodev) on the staging root; then the
/// writable and special mounts on top of it (workspace, home, `/tmp`,
/// `/dev`, `/proc`), each with its own flags. Nothing is written below a
/// bind: a path that already exists in the staging root (because a bound
/// directory holds it) is never created again.
pub fn build(spec: &RootSpec) -> Result<Built, String> {
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
    crate::timing::stamp("pid1", "root: staging tmpfs");
    let mut dirs = Dirs::default();
    dirs.0.insert(root.to_path_buf());
    let mut view = View {
        on: spec.describe,
        mounts: Vec::new(),
    };
    // The sandbox's own users, never the host's (sealed with the rest).
    super::users::write(root)?;
    dirs.0.insert(root.join("etc"));
    for path in super::users::GENERATED {
        view.add(path, "ro", || {
            format!("generated: the user `{}` and nobody", super::users::USER)
        });
    }
    bind_read_only(spec, root, &mut dirs, &mut view)?;
    crate::timing::stamp("pid1", "root: read-only paths bound");
    // The staged plugin binary, from the fd taken before any tmpfs.
    if let Some(program) = spec.program {
        let plugin_target = inside(root, PLUGIN_DIR).join(spec.program_name);
        dirs.mountpoint(&plugin_target, false)?;
        attach(program, &plugin_target)?;
        view.add(&format!("{PLUGIN_DIR}/{}", spec.program_name), "ro", || {
            "the program, staged (a copy in the host's state directory)".into()
        });
    }

    // Mountpoints of the second phase, while the staging root is writable.
    let ws_target = inside(root, WORKSPACE);
    let home = inside(root, crate::fsview::HOME);
    let tmp = inside(root, "/tmp");
    let dev = inside(root, "/dev");
    let proc_dir = inside(root, "/proc");
    for d in [&ws_target, &home, &tmp, &dev, &proc_dir] {
        dirs.ensure(d)?;
    }
    crate::timing::stamp("pid1", "root: plugin bound, mountpoints");
    // Seal the first phase: the skeleton (mountpoints, /etc files) and every
    // bind in it become read-only, nosuid and nodev, submounts included.
    restrict(
        root,
        libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV,
        true,
    )?;
    crate::timing::stamp("pid1", "root: sealed read-only");
    let warnings = writable_part(spec, root, &mut view)?;
    pivot(root)?;
    Ok(Built {
        warnings,
        view: view.mounts,
    })
}

/// The second phase, on top of the sealed read-only part: the workspace,
/// the home, `/tmp` (and the runtime's paths under it), `/dev` and
/// `/proc`, each with its own flags. Returns warnings.
fn writable_part(spec: &RootSpec, root: &Path, view: &mut View) -> Result<Vec<String>, String> {
    let ws_target = inside(root, WORKSPACE);
    let home = inside(root, crate::fsview::HOME);
    let tmp = inside(root, "/tmp");
    let dev = inside(root, "/dev");
    let proc_dir = inside(root, "/proc");
    let mut warnings = Vec::new();
    workspace(spec, &ws_target)?;
    view.add(WORKSPACE, "rw", || match spec.workspace {
        None => format!("tmpfs {}, the working directory", mib(spec.workspace_size)),
        Some(_) => "a host directory given by the host, the working directory".into(),
    });
    crate::timing::stamp("pid1", "root: workspace mounted");
    // The per-turn home, private and capped like /tmp.
    private_tmpfs(&home, spec.home_size, spec.nr_inodes, "0777")?;
    view.add(crate::fsview::HOME, "rw", || {
        format!("tmpfs {}, HOME", mib(spec.home_size))
    });
    // Private /tmp with size and inode caps (memory-backed: count it in the
    // memory budget).
    private_tmpfs(&tmp, spec.tmp_size, spec.nr_inodes, "1777")?;
    view.add("/tmp", "rw", || {
        format!("tmpfs {}, TMPDIR", mib(spec.tmp_size))
    });
    // A runtime's extra paths under /tmp (a checkout in a temp dir), on
    // top of the private /tmp.
    attach_tmp_extras(root, &spec.extras, view)?;
    crate::timing::stamp("pid1", "root: /tmp mounted");
    build_dev(spec, &dev)?;
    view.add("/dev", "ro", || {
        format!("tmpfs: {} and the std links", DEV_NODES.join(" "))
    });
    view.add("/dev/shm", "rw", || format!("tmpfs {}", mib(spec.shm_size)));
    crate::timing::stamp("pid1", "root: /dev built");
    // Our own procfs: only the processes of the new pid namespace, its
    // host-wide files masked.
    if !spec.with_proc {
        warnings.push("no pid namespace: /proc is left empty inside the sandbox".into());
    } else {
        crate::procmask::mount_masked(&proc_dir, &spec.proc_replacements)?;
        view.add("/proc", "rw", || {
            "the sandbox's own procfs, host-wide files masked".into()
        });
    }
    restrict(&dev, libc::MOUNT_ATTR_RDONLY, false)?;
    crate::timing::stamp("pid1", "root: /proc mounted and masked");
    Ok(warnings)
}

/// A private tmpfs (nosuid, nodev) with size and inode caps.
fn private_tmpfs(target: &Path, size: u64, nr_inodes: u64, mode: &str) -> Result<(), String> {
    mount(
        Some(Path::new("tmpfs")),
        target,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&format!("size={size},nr_inodes={nr_inodes},mode={mode}")),
    )
}

/// An extra read-only path strictly below `/tmp`, made absolute and clean.
pub(crate) fn is_tmp_extra(entry: &str) -> bool {
    let p = Path::new(entry);
    p.is_absolute()
        && p != Path::new("/tmp")
        && p.starts_with("/tmp")
        && !p
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
}

/// Whether `entry` lies strictly below another of `all` (whose bind holds
/// it already, whatever the order the runtime listed them in).
fn below_another(entry: &str, all: &[String]) -> bool {
    let p = Path::new(entry);
    all.iter()
        .any(|o| Path::new(o) != p && p.starts_with(Path::new(o)))
}

/// The helper's clones of the extra paths under `/tmp` (taken before
/// anything hides the host's `/tmp`), attached at their own path inside
/// the private `/tmp` and made read-only, nosuid and nodev.
fn attach_tmp_extras(
    root: &Path,
    binds: &[(PathBuf, bool, RawFd)],
    view: &mut View,
) -> Result<(), String> {
    let names: Vec<String> = binds
        .iter()
        .map(|(p, _, _)| p.to_string_lossy().into_owned())
        .collect();
    for (entry, is_dir, fd) in binds {
        let name = entry.to_string_lossy();
        if !is_tmp_extra(&name) || below_another(&name, &names) {
            continue;
        }
        let target = inside(root, &entry.to_string_lossy());
        let made = if *is_dir {
            std::fs::create_dir_all(&target)
        } else {
            target
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| std::fs::File::create(&target).map(drop))
        };
        made.map_err(|e| format!("mountpoint {target:?}: {e}"))?;
        attach(Source::Tree(*fd), &target)?;
        restrict(
            &target,
            libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV,
            true,
        )?;
        view.add(&entry.to_string_lossy(), "ro", || {
            "extraRoPaths (on top of the private /tmp)".into()
        });
    }
    Ok(())
}

/// The policy's read-only paths (and the runtime's extra ones), bound at
/// the same path in the staging root; a top-level symlink is mirrored. A
/// missing system path is skipped (they differ between distributions); a
/// runtime's extra path must be there (the host checked it at load, so
/// one missing now vanished since: the spawn fails, never runs without it).
fn bind_read_only(
    spec: &RootSpec,
    root: &Path,
    dirs: &mut Dirs,
    view: &mut View,
) -> Result<(), String> {
    let all = spec.ro_paths.iter().map(|p| (p, false));
    for (entry, extra) in all.chain(spec.extra_ro.iter().map(|p| (p, true))) {
        let src = Path::new(entry);
        let label = if extra { "extraRoPaths" } else { "roPaths" };
        if super::users::replaces(entry)? {
            continue; // the sandbox's own file is there
        }
        if extra && below_another(entry, spec.extra_ro) {
            continue; // bound with the directory that holds it
        }
        if extra && is_tmp_extra(entry) {
            // Attached on top of the private /tmp from the helper's clone,
            // which only a root host takes.
            if !spec.extras.iter().any(|(p, _, _)| p == src) {
                return Err(format!(
                    "extra read-only path {entry} is under /tmp on a host not running as root                      (only root can clone it before /tmp is hidden)"
                ));
            }
            continue;
        }
        // Paths the sandbox mounts over (or stages its root in) cannot be
        // binds: the bind would be hidden or would hide sandbox state.
        if crate::fsview::clean(entry).is_none()
            || ["/tmp", "/dev", "/proc", "/sandbox", WORKSPACE, PLUGIN_DIR]
                .iter()
                .any(|p| src.starts_with(p))
        {
            if extra {
                return Err(format!(
                    "extra read-only path {entry} is relative or under a directory the sandbox                      mounts itself"
                ));
            }
            continue;
        }
        let target = inside(root, entry);
        if std::fs::symlink_metadata(&target).is_ok() {
            continue; // already visible through another bind
        }
        if let Some((_, is_dir, fd)) = spec.extras.iter().find(|(p, _, _)| p == src) {
            // The helper's clone, taken as root (a parent only root may
            // traverse is no obstacle).
            dirs.mountpoint(&target, *is_dir)?;
            attach(Source::Tree(*fd), &target)?;
            view.add(entry, "ro", || label.into());
            continue;
        }
        let top_level = src.parent() == Some(Path::new("/"));
        match std::fs::symlink_metadata(src) {
            Ok(md) if md.file_type().is_symlink() && top_level => {
                // Merged /usr: mirror the link, its target is bound anyway.
                let link = std::fs::read_link(src).map_err(|e| format!("readlink {entry}: {e}"))?;
                std::os::unix::fs::symlink(&link, &target)
                    .map_err(|e| format!("symlink {target:?}: {e}"))?;
                view.add(entry, "ro", || {
                    format!("{label}: a link to {}", link.display())
                });
                continue;
            }
            _ => {}
        }
        let md = match std::fs::metadata(src) {
            Ok(md) => md,
            Err(e) if extra => return Err(format!("extra read-only path {entry}: {e}")),
            Err(_) => continue,
        };
        dirs.mountpoint(&target, md.is_dir())?;
        bind_rec(src, &target)?;
        view.add(entry, "ro", || label.into());
    }
    Ok(())
}

/// The workspace: a tmpfs of its own (or the host directory given), rw,
/// never setuid or device files.
fn workspace(spec: &RootSpec, target: &Path) -> Result<(), String> {
    match spec.workspace {
        None => mount(
            Some(Path::new("tmpfs")),
            target,
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(&format!(
                "size={},nr_inodes={},mode=0755",
                spec.workspace_size, spec.nr_inodes
            )),
        ),
        Some(src) => {
            attach(src, target)?;
            restrict(
                target,
                libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV,
                true,
            )
        }
    }
}

/// Minimal /dev: a tmpfs with five nodes bound from the host, the std*
/// links, and a private /dev/shm (POSIX semaphores need it, codex#7251).
/// Left writable: the caller seals it read-only once `/proc` is masked.
fn build_dev(spec: &RootSpec, dev: &Path) -> Result<(), String> {
    mount(
        Some(Path::new("tmpfs")),
        dev,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("size=64k,nr_inodes=64,mode=0755"),
    )?;
    for node in DEV_NODES {
        let src = Path::new("/dev").join(node);
        let target = dev.join(node);
        std::fs::write(&target, b"").map_err(|e| format!("create {target:?}: {e}"))?;
        mount(Some(&src), &target, None, libc::MS_BIND, None)?;
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
    // The node binds (and /dev/shm, already so) nosuid and noexec in one
    // call.
    restrict(dev, libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NOEXEC, true)
}

/// Switch roots and drop the old one entirely. The new root is the staging
/// tmpfs, sealed read-only.
fn pivot(root: &Path) -> Result<(), String> {
    std::env::set_current_dir(root).map_err(|e| format!("chdir {root:?}: {e}"))?;
    rustix::process::pivot_root(".", ".")
        .map_err(|e| format!("pivot_root: {}", std::io::Error::from(e)))?;
    // After pivot_root(".", ".") the old root is stacked on "." and
    // detaching it leaves only the new tree.
    rustix::mount::unmount(".", rustix::mount::UnmountFlags::DETACH)
        .map_err(|e| format!("umount old root: {}", std::io::Error::from(e)))?;
    crate::timing::stamp("pid1", "root: pivoted, old root detached");
    std::env::set_current_dir("/").map_err(|e| format!("chdir /: {e}"))?;
    Ok(())
}

/// The minimal root (`pivot_root`), built by pid 1 (step 9).
pub(crate) const LAYER: Layer = Layer {
    name: "root",
    stage: Stage::PidOne,
    toggle: Some(|p| p.layers.mountns),
    slot: Slot::Status(|r| &r.root, |r| &mut r.root),
    need: Need::Applied,
    fix: USERNS_FIX,
    detail: |_| " (pivot_root into a minimal tree)".into(),
    apply: None,
};
