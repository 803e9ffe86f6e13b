//! `sharedos-echo`: the smallest complete sharedos runtime plugin, as a
//! binary. The plugin itself is in `lib.rs` (so the same code also runs in
//! process); `main` hands it to `serve`, which speaks the protocol over
//! stdin/stdout and refuses to run when started by hand.

#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    sharedos_plugin_sdk::serve(sharedos_echo::Echo)
}
