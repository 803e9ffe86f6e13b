//! The receipt of one attempt: what was tried and what the kernel said.
//!
//! A receipt is the plugin's own view. `blocked` is only a hint: the
//! sandbox tests judge from the host side (the listener saw nothing, the
//! victim is alive, the file is absent), because some calls report success
//! while delivering nothing (`kill(-1)` returns 0 when every target was
//! refused; a datagram sent inside an empty netns goes nowhere).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The sandbox.md C id and a short name, e.g. `C07-hard-link-host-file`.
    pub attack: String,
    /// False when the attempt could not be made here (missing bait, a
    /// host-side attack); `observed` then says why.
    pub attempted: bool,
    /// What happened: the errno, or what the attempt got.
    pub observed: String,
    /// `Some(true)`: refused. `Some(false)`: it worked from where the
    /// plugin stands. `None`: only the host side can tell.
    pub blocked: Option<bool>,
}

impl Receipt {
    pub fn blocked(attack: &str, observed: impl Into<String>) -> Self {
        Self {
            attack: attack.to_owned(),
            attempted: true,
            observed: observed.into(),
            blocked: Some(true),
        }
    }
    pub fn succeeded(attack: &str, observed: impl Into<String>) -> Self {
        Self {
            attack: attack.to_owned(),
            attempted: true,
            observed: observed.into(),
            blocked: Some(false),
        }
    }
    /// Attempted, but the verdict belongs to the host side.
    pub fn unjudged(attack: &str, observed: impl Into<String>) -> Self {
        Self {
            attack: attack.to_owned(),
            attempted: true,
            observed: observed.into(),
            blocked: None,
        }
    }
    pub fn judged(attack: &str, blocked: bool, observed: impl Into<String>) -> Self {
        Self {
            attack: attack.to_owned(),
            attempted: true,
            observed: observed.into(),
            blocked: Some(blocked),
        }
    }
    pub fn not_attempted(attack: &str, reason: impl Into<String>) -> Self {
        Self {
            attack: attack.to_owned(),
            attempted: false,
            observed: reason.into(),
            blocked: None,
        }
    }
}

/// The symbolic name of an errno, for receipts a test can match on.
pub fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::E2BIG => "E2BIG",
        libc::ENOEXEC => "ENOEXEC",
        libc::EBADF => "EBADF",
        libc::ECHILD => "ECHILD",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::ENFILE => "ENFILE",
        libc::EMFILE => "EMFILE",
        libc::ENOTTY => "ENOTTY",
        libc::ETXTBSY => "ETXTBSY",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::ESPIPE => "ESPIPE",
        libc::EROFS => "EROFS",
        libc::EMLINK => "EMLINK",
        libc::EPIPE => "EPIPE",
        libc::ERANGE => "ERANGE",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOSYS => "ENOSYS",
        libc::ELOOP => "ELOOP",
        libc::ENOTSOCK => "ENOTSOCK",
        libc::EPROTOTYPE => "EPROTOTYPE",
        libc::EPROTONOSUPPORT => "EPROTONOSUPPORT",
        libc::ESOCKTNOSUPPORT => "ESOCKTNOSUPPORT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        libc::ENETDOWN => "ENETDOWN",
        libc::ENETUNREACH => "ENETUNREACH",
        libc::ECONNRESET => "ECONNRESET",
        libc::ENOTCONN => "ENOTCONN",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::EHOSTUNREACH => "EHOSTUNREACH",
        libc::EDQUOT => "EDQUOT",
        libc::ENOMEDIUM => "ENOMEDIUM",
        _ => "E?",
    }
}

/// `EPERM (Operation not permitted)`.
pub fn describe_errno(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    // std appends " (os error N)"; the name already identifies it.
    let text = text.split(" (os error").next().unwrap_or(&text).to_owned();
    format!("{} ({text})", errno_name(errno))
}

/// Describes an `io::Error` by errno when it has one.
pub fn describe_io(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => describe_errno(n),
        None => e.to_string(),
    }
}
