//! Syscall numbers from 424 on, which are the same on every architecture
//! (the unified table); the libc crate does not name all of them yet.

pub const QUOTACTL_FD: i64 = 443;
pub const MEMFD_SECRET: i64 = 447;
pub const FUTEX_WAITV: i64 = 449;
pub const MAP_SHADOW_STACK: i64 = 453;
pub const FUTEX_WAKE: i64 = 454;
pub const FUTEX_WAIT: i64 = 455;
pub const FUTEX_REQUEUE: i64 = 456;
pub const STATMOUNT: i64 = 457;
pub const LISTMOUNT: i64 = 458;
pub const LSM_GET_SELF_ATTR: i64 = 459;
pub const LSM_SET_SELF_ATTR: i64 = 460;
pub const LSM_LIST_MODULES: i64 = 461;
pub const MSEAL: i64 = 462;
pub const SETXATTRAT: i64 = 463;
pub const GETXATTRAT: i64 = 464;
pub const LISTXATTRAT: i64 = 465;
pub const REMOVEXATTRAT: i64 = 466;
pub const OPEN_TREE_ATTR: i64 = 467;
