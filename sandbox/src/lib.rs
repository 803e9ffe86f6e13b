//! The sandbox.
