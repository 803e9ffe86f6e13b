//! `sharedos-harness`: the MCP harness runtime's plugin binary
//! (`sharedos_harness::command`), built and installed beside `sharedos`.

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    sharedos_harness::command::run()
}
