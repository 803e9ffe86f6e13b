//! The guest's initramfs, written by sharedos as a `newc` cpio archive (no
//! external tool): the init, the plugin program (its staged copy when
//! pinned), the shared libraries both need, the policy's `extraRoPaths`
//! copied read-only, and an `/etc/passwd` and `/etc/group` naming the
//! sandbox uid only. The per-launch part (the argv, the environment, the
//! mounts) is a second archive appended to it: the kernel unpacks
//! concatenated archives in order.
//!
//! Libraries are found by asking the program's own ELF interpreter
//! (`PT_INTERP`, e.g. `/lib64/ld-linux-x86-64.so.2`) to `--list` it: the
//! loader resolves the needs as it would at run time and exits without
//! running the program's code. A static program lists none.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where the init and the plugin live in the guest.
pub(super) const INIT: &str = "init";
pub(super) const PLUGIN_DIR: &str = "sharedos/bin";
pub(super) const LAUNCH: &str = "sharedos/launch.json";
/// 32 bytes from the host's random source, per launch, root's and mode
/// 0400: the init credits them to the guest kernel's random pool and
/// removes the file (guest-init/src/main.rs, `seed_random`).
pub(super) const SEED: &str = "sharedos/seed";
/// Where `extraRoPaths` are in the image (the init binds each read-only at
/// its own path, after its tmpfs mounts).
pub(super) const RO_DIR: &str = "sharedos/ro";
/// Where the modules of a harness's read-only disk are in the image
/// (host/src/process/microvm/disk.rs).
pub(super) const MODULE_DIR: &str = "sharedos/modules";

/// Files of the image by path inside (no leading `/`): contents and mode.
#[derive(Debug, Default)]
pub(super) struct Tree {
    entries: BTreeMap<String, Entry>,
}

#[derive(Debug)]
enum Entry {
    Dir(u32),
    File(u32, Vec<u8>),
    Symlink(String),
}

impl Tree {
    fn parents(&mut self, path: &str) {
        let mut at = String::new();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            if !at.is_empty() {
                self.entries.entry(at.clone()).or_insert(Entry::Dir(0o755));
                at.push('/');
            }
            at.push_str(part);
        }
    }

    pub(super) fn dir(&mut self, path: &str, mode: u32) {
        let path = path.trim_start_matches('/');
        self.parents(path);
        self.entries.insert(path.to_owned(), Entry::Dir(mode));
    }

    pub(super) fn file(&mut self, path: &str, mode: u32, data: Vec<u8>) {
        let path = path.trim_start_matches('/');
        self.parents(path);
        self.entries
            .insert(path.to_owned(), Entry::File(mode, data));
    }

    /// Host file `source` at `path` inside, its bytes and its mode with the
    /// write bits cleared (owned by root inside: read-only to the plugin).
    pub(super) fn copy(&mut self, path: &str, source: &Path) -> io::Result<()> {
        let data = std::fs::read(source)?;
        let mode = std::fs::metadata(source)?.permissions().mode() & 0o555;
        self.file(path, mode, data);
        Ok(())
    }

    /// A host directory tree under `prefix` + its own path, read-only;
    /// symlinks kept as symlinks. `budget` bounds the bytes copied.
    pub(super) fn copy_tree(
        &mut self,
        prefix: &str,
        root: &Path,
        budget: &mut u64,
    ) -> io::Result<()> {
        let meta = std::fs::symlink_metadata(root)?;
        let inside = format!("{prefix}{}", root.to_string_lossy());
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(root)?;
            self.parents(inside.trim_start_matches('/'));
            let key = inside.trim_start_matches('/').to_owned();
            self.entries
                .insert(key, Entry::Symlink(target.to_string_lossy().into_owned()));
            return Ok(());
        }
        if meta.is_dir() {
            self.dir(&inside, meta.mode() & 0o555);
            for e in std::fs::read_dir(root)? {
                self.copy_tree(prefix, &e?.path(), budget)?;
            }
            return Ok(());
        }
        if meta.is_file() {
            *budget = budget.checked_sub(meta.len()).ok_or_else(|| {
                io::Error::other("extraRoPaths hold more than the image may (half the VM's RAM)")
            })?;
            self.copy(&inside, root)?;
        }
        Ok(())
    }

    /// The tree as a `newc` cpio archive, its trailer included.
    pub(super) fn cpio(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (ino, (path, entry)) in self.entries.iter().enumerate() {
            let (mode, data): (u32, &[u8]) = match entry {
                Entry::Dir(m) => (0o040000 | m, &[]),
                Entry::File(m, d) => (0o100000 | m, d),
                Entry::Symlink(t) => (0o120777, t.as_bytes()),
            };
            header(&mut out, ino as u32 + 1, mode, path, data);
        }
        header(&mut out, 0, 0, "TRAILER!!!", &[]);
        out
    }
}

fn pad4(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

/// One `newc` entry: the 110-byte ASCII header, the name, the data, each
/// padded to four bytes. Owner root, one link, mtime 0.
fn header(out: &mut Vec<u8>, ino: u32, mode: u32, name: &str, data: &[u8]) {
    let fields = [
        ino,
        mode,
        0,
        0,
        1,
        0,
        data.len() as u32,
        0,
        0,
        0,
        0,
        name.len() as u32 + 1,
        0,
    ];
    out.extend_from_slice(b"070701");
    for f in fields {
        out.extend_from_slice(format!("{f:08x}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    pad4(out);
    out.extend_from_slice(data);
    pad4(out);
}

/// The ELF interpreter `program` names (`PT_INTERP`), `None` for a static
/// program.
pub(super) fn interpreter(program: &Path) -> io::Result<Option<PathBuf>> {
    let bytes = std::fs::read(program)?;
    let bad = || io::Error::other(format!("{} is not a 64-bit ELF file", program.display()));
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 {
        return Err(bad());
    }
    let u = |at: usize, n: usize| -> io::Result<u64> {
        let s = bytes.get(at..at + n).ok_or_else(bad)?;
        Ok(s.iter().rev().fold(0, |acc, b| (acc << 8) | u64::from(*b)))
    };
    let (phoff, phentsize, phnum) = (u(0x20, 8)? as usize, u(0x36, 2)? as usize, u(0x38, 2)?);
    for i in 0..phnum as usize {
        let ph = phoff + i * phentsize;
        if u(ph, 4)? == 3 {
            let (off, size) = (u(ph + 8, 8)? as usize, u(ph + 32, 8)? as usize);
            let raw = bytes.get(off..off + size).ok_or_else(bad)?;
            let text = String::from_utf8_lossy(raw.split(|b| *b == 0).next().unwrap_or(raw));
            return Ok(Some(PathBuf::from(text.into_owned())));
        }
    }
    Ok(None)
}

/// The shared libraries `program` needs, with its interpreter: the paths
/// `<interpreter> --list <program>` resolves.
pub(super) fn libraries(program: &Path) -> io::Result<Vec<PathBuf>> {
    let Some(interp) = interpreter(program)? else {
        return Ok(Vec::new());
    };
    listed(&interp, program)
}

/// The loader `interp` and the libraries it lists for `program` (an
/// executable or a shared object), each once; a library it cannot find is
/// an error naming it.
pub(super) fn listed(interp: &Path, program: &Path) -> io::Result<Vec<PathBuf>> {
    let interp = interp.to_path_buf();
    let out = Command::new(&interp)
        .arg("--list")
        .arg(program)
        .env_clear()
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{} --list {} exited {}",
            interp.display(),
            program.display(),
            out.status
        )));
    }
    let mut libs = vec![interp];
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let line = line.trim();
        if line.contains("not found") {
            return Err(io::Error::other(format!(
                "{}: a library is missing: {line}",
                program.display()
            )));
        }
        let path = match line.split_once("=>") {
            Some((_, right)) => right.trim(),
            None => line,
        };
        let path = path.split(" (").next().unwrap_or_default().trim();
        if path.starts_with('/') && !libs.iter().any(|l| l == Path::new(path)) {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

/// An initramfs (`newc` cpio) of `files`, each `(path inside, host file)`,
/// with the shared libraries every ELF program among them needs at their
/// host paths: the image of a guest that runs something other than a
/// plugin (tests/tests/memory_controller_guest.rs boots the host itself
/// in a guest kernel that delegates it a memory controller). A file that
/// is not a 64-bit ELF program is copied as it is.
pub fn initramfs(files: &[(&str, &Path)]) -> io::Result<Vec<u8>> {
    let mut tree = Tree::default();
    for (inside, source) in files {
        tree.copy(inside, source)?;
        if interpreter(source).is_ok() {
            for lib in libraries(source)? {
                tree.copy(&lib.to_string_lossy(), &lib)?;
            }
        }
    }
    Ok(tree.cpio())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpio_entry_is_a_newc_header_name_and_data_padded() {
        let mut t = Tree::default();
        t.file("/a/b", 0o644, b"xyz".to_vec());
        let c = t.cpio();
        assert_eq!(&c[..6], b"070701");
        // The parent directory first, then the file, then the trailer.
        let text = String::from_utf8_lossy(&c);
        let (a, b, end) = (
            text.find("a\0").unwrap(),
            text.find("a/b\0").unwrap(),
            text.find("TRAILER!!!").unwrap(),
        );
        assert!(a < b && b < end);
        assert_eq!(c.len() % 4, 0);
        assert!(text.contains("000081a4"), "the file's mode 0100644");
    }

    #[test]
    fn a_dynamic_program_lists_its_loader_and_libc() {
        let me = std::env::current_exe().unwrap();
        let libs = libraries(&me).unwrap();
        assert!(libs[0].to_string_lossy().contains("ld-linux"), "{libs:?}");
        assert!(
            libs.iter().any(|l| l.to_string_lossy().contains("libc.so")),
            "{libs:?}"
        );
        let not_elf = tempfile::NamedTempFile::new().unwrap();
        assert!(interpreter(not_elf.path()).is_err());
    }
}
