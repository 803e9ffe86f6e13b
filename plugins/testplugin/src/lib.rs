//! The shared, scriptable test plugin: a [`Script`] of [`Step`]s written
//! once and run two ways.
//!
//! - **In process**: [`ScriptPlugin`] is a `RuntimePlugin`; a test seats it
//!   with `Seat::in_process` (host/tests) or serves it over stdio with the
//!   SDK (`sharedos-bench`'s out-of-process figures), and reads what it saw
//!   from its [`PluginLog`].
//! - **Over the protocol**: the `sharedos-testplugin` binary reads the same
//!   steps, as JSON (`{"op": "emit", ...}`), from the turn's
//!   `message.payload.script` and speaks raw NDJSON, so it can also run the
//!   hostile steps a well-behaved SDK cannot send (its own docs list them).
//!
//! [`Script::payload`] turns a script into the payload both read.

#![forbid(unsafe_code)]

mod in_process;
mod script;

pub use in_process::{PluginLog, ScriptPlugin};
pub use script::{ID, Script, Step, VERSION, manifest};
