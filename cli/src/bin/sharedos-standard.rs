//! `sharedos-standard`: the standard runtime's plugin binary
//! (`sharedos_standard::command`), built and installed beside `sharedos`.

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    sharedos_standard::command::run()
}
