//! The sharedos host: the envelope, the process runtime, the registry and
//! the CLI.

pub mod bench;
pub mod config;
pub mod executor;
pub mod observe;
pub mod registry;
