//! Shared support for the workspace integration tests.

/// The sandbox suites' bait, turn runner and host-side checks.
pub mod bait;
