//! The sharedos host as a library: the envelope (executor), the stdio peer,
//! the process runtime and its sandboxed launcher, the registry and seats,
//! the configuration, the event descriptions (observe). Sessions and
//! `serve`'s HTTP API, which keep their state in a store, are the
//! `sharedos-serve` crate. The conformance battery is `sharedos-conformance`; the egress
//! gateway is the `sharedos-egress` crate, which the seats bind. The
//! `sharedos` command is the `sharedos-cli` package, the benchmarks the
//! `sharedos-bench` package; neither is part of this API.

#![deny(unsafe_code)]

pub mod config;
pub mod executor;
pub mod limits;
pub mod observe;
pub mod preflight;
pub mod process;
pub mod provenance;
pub mod registry;
mod runtime_policy;
pub mod sandboxed;
pub mod seat;
pub mod telemetry;
