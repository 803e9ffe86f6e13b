//! The sharedos host: the envelope, the stdio peer, the process runtime,
//! the registry, the configuration and the CLI.

#![deny(unsafe_code)]

pub mod bench;
pub mod broker;
pub mod cli;
pub mod config;
pub mod conformance;
pub mod egress;
pub mod executor;
pub mod harness;
pub mod observe;
pub mod process;
pub mod registry;
mod runtime_policy;
pub mod sandboxed;
pub mod seat;
pub mod serve;
pub mod session;
