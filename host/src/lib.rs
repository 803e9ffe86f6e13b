//! The sharedos host.

pub mod broker;
pub mod process;
