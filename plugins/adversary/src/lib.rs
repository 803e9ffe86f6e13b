//! `sharedos-adversary`: a hostile runtime plugin for proving the sandbox.
//!
//! It attempts the attacks of `docs/spec/sandbox.md` section C, each once,
//! and reports a [`Receipt`] per attempt. Run unsandboxed (standalone
//! mode), most attempts succeed: that shows they are real. Run as a plugin
//! inside the sandbox, the tests expect them refused, and check the effect
//! on the host side (the receipt is only the plugin's view).
//!
//! The bait (a secret file, listeners, a victim pid, ...) is laid by the
//! test and described by [`Bait`].

pub mod attacks;
pub mod bait;
pub mod plugin;
pub mod receipt;
pub mod run;
pub mod sys;

pub use attacks::{Attack, CATALOGUE};
pub use bait::Bait;
pub use receipt::Receipt;
