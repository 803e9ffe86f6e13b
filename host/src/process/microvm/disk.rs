//! The read-only disk of a harness runtime's guest (docs/SECURITY.md,
//! "microVM"): an ext4 image holding the runtime's `extraRoPaths` (the
//! vendor CLI's directory, a node installation) and the shared libraries
//! the CLI needs, at their host paths, attached to the VM as a read-only
//! virtio-blk device. The CLI is read from the disk as it runs (the guest's
//! page cache, inside its RAM, holds what was read), never copied into
//! each turn's initramfs.
//!
//! Built once per content at seating, without root (`mkfs.ext4 -d`, from
//! e2fsprogs), under the host's cache directory
//! (`<cache>/microvm-disks/sha256-<digest>.ext4`, mode 0600 in a 0700
//! directory); the digest covers every path, type, mode, link target and
//! byte the image holds, so a changed CLI gets a new image and an
//! unchanged one is reused. The bytes are read and hashed again only when
//! the sources' identity (each entry's path, type, size, inode, mtime and
//! ctime) has no digest recorded yet (`identity-<hash>` beside the images). The image is written to a temporary file in
//! the same directory, synced and renamed into place: a build that fails
//! half-way leaves no file.
//!
//! The guest kernel (Debian's cloud kernel) has ext4 built in and the
//! virtio drivers as modules: the modules the disk needs are read from the
//! kernel's `lib/modules/<release>` and loaded by the guest init
//! ([`super::modules::MODULES`], in dependency order).

use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::Digest;

use super::modules::modules;

/// Where `mkfs.ext4` is looked for when `runtimes.microvm.mkfs` does not
/// say (a non-root host's `PATH` often lacks the sbin directories).
const MKFS_DIRS: [&str; 4] = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// Why a disk image cannot be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiskError {
    #[error(
        "sandbox.extraRoPaths {path}: {reason}; install the CLI there or fix the path (the microVM's read-only disk holds extraRoPaths)"
    )]
    Source { path: PathBuf, reason: String },
    #[error(
        "mkfs.ext4 is not available ({reason}); install e2fsprogs (`apt-get install e2fsprogs`) or set runtimes.microvm.mkfs to its absolute path"
    )]
    MkfsMissing { reason: String },
    #[error(
        "the read-only disk image could not be built ({reason}); check that {} is writable with room for the CLI (or set SHAREDOS_CACHE_DIR), and that mkfs.ext4 works",
        dir.display()
    )]
    Build { dir: PathBuf, reason: String },
    /// A kernel module the disk needs ([`super::modules`]).
    #[error(transparent)]
    Module(#[from] super::modules::ModuleError),
}

/// A built disk image and what the guest needs to use it.
#[derive(Debug, Clone)]
pub struct RoDisk {
    /// The image (`sha256-<digest>.ext4` in the cache).
    pub image: PathBuf,
    pub bytes: u64,
    /// The host paths it holds, each bound read-only at its own path in
    /// the guest.
    pub binds: Vec<String>,
    /// The modules, `(file name, host path)`, in load order.
    pub modules: Vec<(String, PathBuf)>,
}

/// QEMU's arguments attaching `image` read-only as a virtio-blk device on
/// the microvm machine's virtio-mmio bus (the guest's `/dev/vda`).
pub(super) fn qemu_args(image: &Path) -> Vec<std::ffi::OsString> {
    let mut drive = std::ffi::OsString::from("file=");
    // QEMU's option syntax doubles a comma inside a value.
    drive.push(image.as_os_str().to_string_lossy().replace(',', ",,"));
    drive.push(",format=raw,readonly=on,if=none,id=ro");
    vec![
        "-drive".into(),
        drive,
        "-device".into(),
        "virtio-blk-device,drive=ro".into(),
    ]
}

/// The host's cache directory: `$SHAREDOS_CACHE_DIR`, else
/// `/var/cache/sharedos` for root, else `$XDG_CACHE_HOME/sharedos` or
/// `~/.cache/sharedos`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SHAREDOS_CACHE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if rustix::process::geteuid().is_root() {
        return PathBuf::from("/var/cache/sharedos");
    }
    let home = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")));
    match home {
        Some(h) => h.join("sharedos"),
        None => std::env::temp_dir().join(format!(
            "sharedos-cache-{}",
            rustix::process::geteuid().as_raw()
        )),
    }
}

/// `configured`, or `mkfs.ext4` in the usual directories, then on `PATH`.
pub fn mkfs(configured: Option<&Path>) -> Result<PathBuf, DiskError> {
    if let Some(p) = configured {
        return match std::fs::metadata(p) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => Ok(p.to_path_buf()),
            Ok(_) => Err(DiskError::MkfsMissing {
                reason: format!("{} is not an executable file", p.display()),
            }),
            Err(e) => Err(DiskError::MkfsMissing {
                reason: format!("{}: {e}", p.display()),
            }),
        };
    }
    let path_dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    MKFS_DIRS
        .iter()
        .map(PathBuf::from)
        .chain(path_dirs)
        .map(|d| d.join("mkfs.ext4"))
        .find(|p| p.is_file())
        .ok_or_else(|| DiskError::MkfsMissing {
            reason: "no mkfs.ext4 in /usr/sbin, /sbin or on PATH".into(),
        })
}

/// One thing the image holds: the host path (its path inside too) and
/// whether symlinks under it are followed (a library is, a tree is not).
#[derive(Debug)]
struct Source {
    path: PathBuf,
    follow: bool,
}

/// The image holding `ro_paths` and the shared libraries of `cli` (when it
/// is a dynamically linked ELF file), from the cache or built now with
/// `mkfs` in `cache`.
pub fn image(
    ro_paths: &[String],
    cli: Option<&Path>,
    kernel: &Path,
    mkfs: &Path,
    cache: &Path,
) -> Result<RoDisk, DiskError> {
    let modules = modules(kernel)?;
    let sources = sources(ro_paths, cli)?;
    let binds: Vec<String> = sources
        .iter()
        .map(|s| s.path.to_string_lossy().into_owned())
        .collect();
    let dir = cache.join("microvm-disks");
    let build = |reason: String| DiskError::Build {
        dir: dir.clone(),
        reason,
    };
    private_dir(cache).map_err(|e| build(format!("{}: {e}", cache.display())))?;
    private_dir(&dir).map_err(|e| build(format!("{}: {e}", dir.display())))?;
    let (identity, stats) = identity(&sources)?;
    // What the identity's content hash was, when it was computed before:
    // the content is read and hashed only when some entry changed.
    let memo = dir.join(format!("identity-{identity}"));
    let known = std::fs::read_to_string(&memo)
        .ok()
        .filter(|d| d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit()));
    let (digest, fresh) = match known {
        Some(d) if dir.join(format!("sha256-{d}.ext4")).is_file() => (d, false),
        _ => (content_digest(&sources)?, true),
    };
    let image = dir.join(format!("sha256-{digest}.ext4"));
    let bytes = match std::fs::metadata(&image) {
        Ok(md) if md.is_file() => md.len(),
        _ => write_image(&sources, &stats, mkfs, &dir, &image).map_err(build)?,
    };
    if fresh {
        // Written once the image exists; one that cannot be written costs
        // a hash at the next seating only.
        let _ = write_memo(&dir, &memo, &digest);
    }
    Ok(RoDisk {
        image,
        bytes,
        binds,
        modules,
    })
}

/// What the disk holds: each of `ro_paths` as it is, then the CLI's shared
/// libraries that are outside them (their links followed).
fn sources(ro_paths: &[String], cli: Option<&Path>) -> Result<Vec<Source>, DiskError> {
    let mut sources: Vec<Source> = Vec::new();
    for p in ro_paths {
        let path = PathBuf::from(p);
        std::fs::symlink_metadata(&path).map_err(|e| DiskError::Source {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        sources.push(Source {
            path,
            follow: false,
        });
    }
    if let Some(cli) = cli {
        let libs = super::image::libraries(cli).map_err(|e| DiskError::Source {
            path: cli.to_path_buf(),
            reason: format!("its shared libraries: {e}"),
        })?;
        let objects = match super::image::interpreter(cli) {
            Ok(Some(interp)) => object_libraries(&sources, &interp),
            _ => Vec::new(),
        };
        for lib in libs.into_iter().chain(objects) {
            if !sources.iter().any(|s| lib.starts_with(&s.path)) {
                sources.push(Source {
                    path: lib,
                    follow: true,
                });
            }
        }
    }
    Ok(sources)
}

/// The libraries the ELF shared objects under `sources` need (a Python
/// installation's extension modules need libssl, libffi and the like from
/// the system, which the CLI itself does not), as `interp` resolves them.
/// A shared object the loader cannot list (another machine's, a library
/// missing on this host) adds nothing: it would not load in the guest,
/// as it would not on the host.
fn object_libraries(sources: &[Source], interp: &Path) -> Vec<PathBuf> {
    let mut objects = Vec::new();
    for s in sources {
        let _ = walk(&s.path, false, &mut |path, kind, _| {
            if matches!(kind, Kind::File(..)) && is_shared_object(path) {
                objects.push(path.to_path_buf());
            }
            Ok(())
        });
    }
    let mut libs: Vec<PathBuf> = Vec::new();
    for o in objects {
        for lib in super::image::listed(interp, &o).unwrap_or_default() {
            if !libs.contains(&lib) {
                libs.push(lib);
            }
        }
    }
    libs
}

/// Named like a shared object (`*.so`, `*.so.N`, a Node addon `*.node`)
/// and starting with the ELF magic.
fn is_shared_object(path: &Path) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    if !(name.ends_with(".so") || name.contains(".so.") || name.ends_with(".node")) {
        return false;
    }
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == *b"\x7fELF"
}

/// The identity of every entry (path, type, mode, size, inode, mtime,
/// ctime: a write to a file changes its ctime), from metadata alone, in
/// hex; and the counts the image is sized by.
fn identity(sources: &[Source]) -> Result<(String, Stats), DiskError> {
    let mut identity = sha2::Sha256::new();
    let mut stats = Stats::default();
    for s in sources {
        walk(&s.path, s.follow, &mut |path, kind, md| {
            identity.update(path.as_os_str().as_encoded_bytes());
            identity.update(format!(
                "\0{kind:?}:{}:{}.{}:{}.{}\0",
                md.ino(),
                md.mtime(),
                md.mtime_nsec(),
                md.ctime(),
                md.ctime_nsec()
            ));
            stats.add(kind);
            Ok(())
        })
        .map_err(|e| DiskError::Source {
            path: s.path.clone(),
            reason: e.to_string(),
        })?;
    }
    Ok((hex(&identity.finalize()), stats))
}

/// The content hash of everything the disk holds, in hex (every byte read).
fn content_digest(sources: &[Source]) -> Result<String, DiskError> {
    let mut hasher = sha2::Sha256::new();
    for s in sources {
        walk(&s.path, s.follow, &mut |path, kind, _| {
            hash_entry(&mut hasher, path, kind)
        })
        .map_err(|e| DiskError::Source {
            path: s.path.clone(),
            reason: e.to_string(),
        })?;
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `digest` written to `memo` (a temporary file renamed into place).
fn write_memo(dir: &Path, memo: &Path, digest: &str) -> io::Result<()> {
    use std::io::Write;
    let mut tmp = tempfile::Builder::new().prefix(".memo-").tempfile_in(dir)?;
    tmp.write_all(digest.as_bytes())?;
    tmp.persist(memo).map_err(|e| e.error)?;
    Ok(())
}

/// What a walk met.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Dir(u32),
    File(u32, u64),
    Symlink,
}

#[derive(Debug, Default)]
struct Stats {
    entries: u64,
    blocks: u64,
}

impl Stats {
    fn add(&mut self, kind: Kind) {
        self.entries += 1;
        self.blocks += match kind {
            Kind::File(_, len) => len.div_ceil(4096) + 1,
            Kind::Dir(_) | Kind::Symlink => 1,
        };
    }
}

/// Calls `f` for `path` and everything under it (sorted by name);
/// symlinks are followed only when `follow`.
fn walk(
    path: &Path,
    follow: bool,
    f: &mut dyn FnMut(&Path, Kind, &std::fs::Metadata) -> io::Result<()>,
) -> io::Result<()> {
    let md = if follow {
        std::fs::metadata(path)?
    } else {
        std::fs::symlink_metadata(path)?
    };
    let mode = md.mode() & 0o7777;
    if md.file_type().is_symlink() {
        return f(path, Kind::Symlink, &md);
    }
    if md.is_dir() {
        f(path, Kind::Dir(mode), &md)?;
        let mut names: Vec<PathBuf> = std::fs::read_dir(path)?
            .map(|e| e.map(|e| e.path()))
            .collect::<io::Result<_>>()?;
        names.sort();
        for n in names {
            walk(&n, follow, f)?;
        }
        return Ok(());
    }
    if md.is_file() {
        return f(path, Kind::File(mode, md.len()), &md);
    }
    // Sockets, fifos and devices are not carried.
    Ok(())
}

fn hash_entry(h: &mut sha2::Sha256, path: &Path, kind: Kind) -> io::Result<()> {
    h.update(path.as_os_str().as_encoded_bytes());
    h.update([0]);
    match kind {
        Kind::Dir(mode) => h.update(format!("d{mode:o}\0")),
        Kind::Symlink => {
            h.update(b"l");
            h.update(std::fs::read_link(path)?.as_os_str().as_encoded_bytes());
            h.update([0]);
        }
        Kind::File(mode, len) => {
            h.update(format!("f{mode:o}:{len}\0"));
            let mut f = std::fs::File::open(path)?;
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
        }
    }
    Ok(())
}

/// A directory of mode 0700 (created if missing, its mode set if not).
fn private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let md = std::fs::symlink_metadata(dir)?;
    if !md.is_dir() {
        return Err(io::Error::other("not a directory"));
    }
    if md.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Copies `sources` into a staging tree, runs `mkfs` on a temporary file
/// in `dir`, syncs it and renames it to `image`; its size.
fn write_image(
    sources: &[Source],
    stats: &Stats,
    mkfs: &Path,
    dir: &Path,
    image: &Path,
) -> Result<u64, String> {
    let staging = tempfile::Builder::new()
        .prefix(".staging-")
        .tempdir_in(dir)
        .map_err(|e| format!("a staging directory: {e}"))?;
    for s in sources {
        walk(&s.path, s.follow, &mut |path, kind, _| {
            stage(staging.path(), path, kind)
        })
        .map_err(|e| format!("copying {}: {e}", s.path.display()))?;
    }
    let tmp = tempfile::Builder::new()
        .prefix(".building-")
        .suffix(".ext4")
        .tempfile_in(dir)
        .map_err(|e| format!("a temporary image: {e}"))?;
    // Blocks of 4 KiB: the data, an inode of 256 bytes per entry, and a
    // margin for ext4's own metadata (group descriptors, bitmaps, the
    // directory blocks).
    let inodes = stats.entries + 64;
    let blocks = stats.blocks + inodes.div_ceil(16);
    let kib = (blocks + blocks / 10) * 4 + 16 * 1024;
    let out = Command::new(mkfs)
        .args([
            "-q", "-F", "-t", "ext4", "-b", "4096", "-I", "256", "-m", "0",
        ])
        .args(["-O", "^has_journal,^resize_inode", "-E", "root_owner=0:0"])
        .arg("-N")
        .arg(inodes.to_string())
        .arg("-L")
        .arg("sharedos-ro")
        .arg("-d")
        .arg(staging.path())
        .arg(tmp.path())
        .arg(format!("{kib}k"))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", mkfs.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "{} exited {}: {}",
            mkfs.display(),
            out.status,
            err.trim()
        ));
    }
    drop(staging);
    let file = tmp.as_file();
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("syncing the image: {e}"))?;
    let bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
    tmp.persist(image)
        .map_err(|e| format!("renaming the image into place: {}", e.error))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(bytes)
}

/// `path` (of `kind`) copied to `staging` + its own path.
fn stage(staging: &Path, path: &Path, kind: Kind) -> io::Result<()> {
    let rel = path.strip_prefix("/").unwrap_or(path);
    let to = staging.join(rel);
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match kind {
        Kind::Dir(mode) => {
            std::fs::create_dir_all(&to)?;
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode & 0o755))
        }
        Kind::Symlink => std::os::unix::fs::symlink(std::fs::read_link(path)?, &to),
        Kind::File(mode, _) => {
            std::fs::copy(path, &to)?;
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode & 0o755))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::modules::MODULES;
    use super::*;

    /// A shared object under `extraRoPaths` brings the system libraries
    /// it needs (here: a copy of the C library needs the loader); a file
    /// named like one that is not ELF brings nothing.
    #[test]
    fn shared_objects_under_the_ro_paths_bring_their_libraries() {
        let exe = std::env::current_exe().unwrap();
        let interp = super::super::image::interpreter(&exe).unwrap().unwrap();
        let libs = super::super::image::libraries(&exe).unwrap();
        let libc = libs
            .iter()
            .find(|l| l.to_string_lossy().contains("libc.so"))
            .expect("the test binary links the C library");
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(libc, dir.path().join("ext.cpython-311.so")).unwrap();
        std::fs::write(dir.path().join("fake.so"), b"not an ELF file").unwrap();
        assert!(is_shared_object(&dir.path().join("ext.cpython-311.so")));
        assert!(!is_shared_object(&dir.path().join("fake.so")));
        let source = [Source {
            path: dir.path().to_path_buf(),
            follow: false,
        }];
        let found = object_libraries(&source, &interp);
        assert!(found.contains(&interp), "{found:?}");
    }

    /// A kernel path whose `lib/modules/<release>` holds the modules.
    fn fake_kernel(root: &Path) -> PathBuf {
        let m = root.join("lib/modules/9.9-test/kernel");
        for module in MODULES {
            let p = m.join(module);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b"\x7fELF").unwrap();
        }
        std::fs::create_dir_all(root.join("boot")).unwrap();
        root.join("boot/vmlinuz-9.9-test")
    }

    fn cli_dir(root: &Path, content: &str) -> PathBuf {
        let d = root.join("cli");
        std::fs::create_dir_all(d.join("bin")).unwrap();
        std::fs::write(d.join("bin/cli"), content).unwrap();
        std::fs::set_permissions(d.join("bin/cli"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        std::os::unix::fs::symlink("bin/cli", d.join("cli")).unwrap_or(());
        d
    }

    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// The image holds the CLI's directory (read back from it with
    /// debugfs), mode 0600 in a 0700 directory; the same content is the
    /// same file, a changed CLI a new one.
    #[test]
    fn the_image_holds_the_cli_and_is_cached_by_its_content() {
        let root = tempfile::tempdir().unwrap();
        let kernel = fake_kernel(root.path());
        let cli = cli_dir(root.path(), "#!/bin/sh\necho first\n");
        let cache = root.path().join("cache");
        let mkfs = mkfs(None).expect("mkfs.ext4 (e2fsprogs)");
        let ro = vec![cli.to_string_lossy().into_owned()];
        let d = image(&ro, None, &kernel, &mkfs, &cache).unwrap();
        assert_eq!(d.binds, ro);
        assert_eq!(d.modules.len(), 4);
        assert_eq!(d.modules[3].0, "virtio_blk.ko");
        let md = std::fs::metadata(&d.image).unwrap();
        assert_eq!(md.mode() & 0o777, 0o600);
        let dir_md = std::fs::metadata(cache.join("microvm-disks")).unwrap();
        assert_eq!(dir_md.mode() & 0o777, 0o700);
        let inside = format!("{}/bin/cli", cli.display());
        let out = Command::new(mkfs.with_file_name("debugfs"))
            .args(["-R", &format!("cat {inside}")])
            .arg(&d.image)
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "#!/bin/sh\necho first\n"
        );
        let again = image(&ro, None, &kernel, &mkfs, &cache).unwrap();
        assert_eq!(again.image, d.image);
        assert_eq!(
            std::fs::metadata(&again.image).unwrap().ino(),
            md.ino(),
            "rebuilt"
        );
        std::fs::write(cli.join("bin/cli"), "#!/bin/sh\necho second\n").unwrap();
        let changed = image(&ro, None, &kernel, &mkfs, &cache).unwrap();
        assert_ne!(changed.image, d.image);
        let images: Vec<String> = listing(&cache.join("microvm-disks"))
            .into_iter()
            .filter(|n| n.ends_with(".ext4"))
            .collect();
        assert_eq!(images.len(), 2, "{images:?}");
    }

    /// A missing CLI directory, a missing mkfs.ext4 and missing kernel
    /// modules are errors naming the fix; an mkfs that fails half-way
    /// leaves no file in the cache.
    #[test]
    fn bad_input_is_a_typed_error_and_a_failed_build_leaves_nothing() {
        let root = tempfile::tempdir().unwrap();
        let kernel = fake_kernel(root.path());
        let cache = root.path().join("cache");
        let mkfs_ok = mkfs(None).expect("mkfs.ext4 (e2fsprogs)");
        let e = image(
            &["/nonexistent/cli".into()],
            None,
            &kernel,
            &mkfs_ok,
            &cache,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("extraRoPaths /nonexistent/cli: No such file or directory"),
            "{e}"
        );
        assert!(e.to_string().contains("install the CLI there"), "{e}");

        let e = super::mkfs(Some(Path::new("/nonexistent/mkfs.ext4"))).unwrap_err();
        assert!(e.to_string().contains("apt-get install e2fsprogs"), "{e}");

        let cli = cli_dir(root.path(), "x");
        let ro = vec![cli.to_string_lossy().into_owned()];
        let e = image(&ro, None, &root.path().join("vmlinuz-0"), &mkfs_ok, &cache).unwrap_err();
        assert!(
            e.to_string().contains("virtio_ring.ko cannot be read"),
            "{e}"
        );

        // An mkfs that writes part of the image, then fails.
        let broken = root.path().join("mkfs-broken");
        std::fs::write(
            &broken,
            "#!/bin/sh\nfor a; do last=$prev; prev=$a; done\nhead -c 65536 /dev/zero > \"$last\"\necho 'no space left' >&2\nexit 1\n",
        )
        .unwrap();
        std::fs::set_permissions(&broken, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = image(&ro, None, &kernel, &broken, &cache).unwrap_err();
        assert!(matches!(e, DiskError::Build { .. }), "{e}");
        assert!(e.to_string().contains("no space left"), "{e}");
        assert!(e.to_string().contains("SHAREDOS_CACHE_DIR"), "{e}");
        assert_eq!(listing(&cache.join("microvm-disks")), Vec::<String>::new());
    }
}
