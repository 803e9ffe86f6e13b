//! Sessions and `sharedos serve`'s HTTP API: a host application's runs,
//! kept in a store (`sharedos-store`), each turn through the host's
//! envelope (`sharedos-host`). The `[serve]` section of host.toml is this
//! crate's ([`config`]); the host keeps it unread.

#![forbid(unsafe_code)]

pub mod config;
pub mod limits;
pub mod preflight;
pub mod serve;
pub mod session;

/// The store this crate keeps sessions, runs, grants and tokens in: the
/// store-managing commands (`sharedos grants`, `sharedos tokens`) reach it
/// through here, so `sharedos-serve` is the one product crate on it.
pub use sharedos_store as store;
