//! The layers of the sandbox, one module each, in the order of
//! docs/spec/sandbox.md B.2.

pub mod caps;
pub mod fsview;
pub mod landlock;
pub(crate) mod memory;
pub mod mounts;
pub mod namespaces;
pub mod procmask;
pub mod rlimits;
pub mod seccomp;
mod vfs;
