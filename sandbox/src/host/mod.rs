//! What runs in the host process: the spawn, the fork server, the child
//! handle, the plugin's cgroup, the staged program, tree removal and the
//! uid allocation.

pub mod cgroup;
pub(crate) mod forkserver;
pub(crate) mod listener;
pub mod removal;
pub(crate) mod spawn;
pub mod staging;
pub mod statedir;
pub mod uid;
