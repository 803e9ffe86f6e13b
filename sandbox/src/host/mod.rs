//! What runs in the host process: the spawn, the fork server, the child
//! handle, the plugin's cgroup, the staged program, tree removal and the
//! uid allocation.

pub mod cgroup;
pub(crate) mod child;
mod forkserver;
mod launch;
pub(crate) mod listener;
pub mod removal;
mod report_reader;
pub(crate) mod spawn;
pub(crate) mod spawner;
pub mod staging;
pub mod statedir;
pub mod uid;
