//! Test scaffolding shared by the workspace's suites, one of each kind
//! (a dev-dependency only; nothing here ships):
//!
//! - [`XorShift`]: a small seeded generator, so a generated case names its
//!   seed and a failure replays.
//! - [`RecordingHost`]: a `RuntimeHost` double that records what a plugin
//!   asked of it and answers tools by name.
//! - [`FaultySink`]: an audit sink that fails (or is slow) for the record
//!   kinds it is told, over any inner sink.
//!
//! It sits above `protocol`, `plugin-sdk` and `kernel`: their integration
//! tests (`tests/`) may use it; their unit tests keep a local copy, since a
//! crate's unit tests would see a second copy of the crate's own types
//! through it.

#![forbid(unsafe_code)]

mod host;
mod rng;
mod sink;

pub use host::{Record, RecordingHost};
pub use rng::XorShift;
pub use sink::FaultySink;
