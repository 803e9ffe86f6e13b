//! The sharedos host.
