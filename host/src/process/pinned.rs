//! A pinned program under the direct launcher: the staged copy (a copy in
//! the host-private state directory, keyed by its digest) opened once,
//! hashed through that descriptor, and executed through the same
//! descriptor with `execveat(fd, "", AT_EMPTY_PATH)`, so no path is
//! resolved between the check and the exec (docs/SECURITY.md, "Content
//! pin").

// The exec runs between fork and exec of the plugin's child: a system call
// std has no form for.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;

use sharedos_sandbox::ProgramDigest;

use super::launcher::{LaunchError, LaunchSpec};

/// The checked descriptor of a pinned program and the exec's arguments,
/// all built before the fork (the child allocates nothing).
pub(super) struct PinnedExec {
    file: std::fs::File,
    _strings: Vec<CString>,
    /// `argv` and `envp` as null-terminated arrays of the addresses of
    /// `_strings`' buffers (addresses, so the closure that holds them is
    /// `Send`; a CString's buffer does not move with it).
    argv: Vec<usize>,
    envp: Vec<usize>,
}

impl PinnedExec {
    /// Stages `spec.program` against `pin` (a replaced file is refused
    /// here), opens the staged copy and checks the bytes read through that
    /// descriptor. Every refusal names both digests.
    pub(super) fn open(spec: &LaunchSpec, pin: &ProgramDigest) -> Result<Self, LaunchError> {
        let refused = |reason: String| LaunchError::Refused {
            program: spec.program.clone(),
            report: Some(serde_json::json!({
                "launcher": "direct",
                "level": "none",
                "refused": true,
                "reason": reason,
            })),
            reason,
        };
        let staged = super::stage_pinned(&spec.program, pin).map_err(|e| refused(e.to_string()))?;
        let file = std::fs::File::open(&staged)
            .map_err(|e| refused(format!("cannot open the staged copy: {e}")))?;
        let actual = ProgramDigest::of_file(&file)
            .map_err(|e| refused(format!("cannot read the staged copy: {e}")))?;
        if actual != *pin {
            return Err(refused(format!(
                "the staged copy of {} has sha256 {actual}, the pin is {pin}; it was not executed",
                spec.program.display()
            )));
        }
        let c = |b: &[u8]| {
            CString::new(b).map_err(|_| LaunchError::Spawn {
                program: spec.program.clone(),
                source: io::Error::other("a NUL byte in the program, an argument or the env"),
            })
        };
        let mut strings = vec![c(spec.program.as_os_str().as_bytes())?];
        for a in &spec.args {
            strings.push(c(a.as_bytes())?);
        }
        let argc = strings.len();
        for (k, v) in &spec.env {
            strings.push(c(format!("{k}={v}").as_bytes())?);
        }
        let addr = |s: &CString| s.as_ptr() as usize;
        let argv = strings[..argc].iter().map(addr).chain([0]).collect();
        let envp = strings[argc..].iter().map(addr).chain([0]).collect();
        Ok(Self {
            file,
            _strings: strings,
            argv,
            envp,
        })
    }

    /// In the forked child, last before std's own exec: executes the
    /// checked descriptor; returns only the error of a failed exec.
    ///
    /// # Safety
    ///
    /// Only between fork and exec (it replaces the calling process).
    pub(super) unsafe fn exec(&self) -> io::Error {
        // SAFETY: an empty NUL-terminated path with AT_EMPTY_PATH executes
        // the open file itself; `argv` and `envp` are null-terminated
        // arrays of addresses of NUL-terminated strings `self` owns, alive
        // for the call (a usize has a pointer's size and layout). The
        // descriptor is close-on-exec: the plugin does not inherit it.
        unsafe {
            libc::syscall(
                libc::SYS_execveat,
                self.file.as_raw_fd(),
                c"".as_ptr(),
                self.argv.as_ptr(),
                self.envp.as_ptr(),
                libc::AT_EMPTY_PATH,
            );
        }
        io::Error::last_os_error()
    }
}
