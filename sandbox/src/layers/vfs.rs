//! The mount system calls the minimal root and the masked `/proc` are
//! built with: `mount(2)` and `mount_setattr(2)`, with errors that name
//! the paths.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

pub(crate) fn cstr(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| format!("{p:?} contains NUL"))
}

pub(crate) fn mount(
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
pub(crate) fn restrict(target: &Path, attrs: u64, recursive: bool) -> Result<(), String> {
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
